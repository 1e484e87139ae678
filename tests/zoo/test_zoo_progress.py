from tierlink.zoo.progress import NullReporter, RichReporter


def drive(reporter):
    reporter.begin("fmnist-small", epochs=2, batches_per_epoch=3)
    for epoch in range(2):
        for _ in range(3):
            reporter.batch("fmnist-small", epoch, loss=0.5)
    reporter.stage("fmnist-small", "exporting")
    reporter.end("fmnist-small", "test 91.00%")


def test_rich_reporter_counts_batches_per_model():
    with RichReporter() as reporter:
        drive(reporter)
        (task,) = reporter._progress.tasks
        assert (task.completed, task.total) == (6, 6)
        assert task.fields["status"] == "test 91.00%"


def test_null_reporter_accepts_the_same_calls():
    drive(NullReporter())
