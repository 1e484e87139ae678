"""Retraining a model from the fleet's hard examples (``tierlink retrain``).

* :mod:`~tierlink.retrain.job` — what a trainer is given (:class:`TrainJob`), the trainers
  (``tierlink.trainers`` entry points: the zoo's built in, a user's declared the same way),
  the hard examples' labels (the request's own where it carried one, else the most capable
  model's answer), and the verdict on a retrained version against its parent on held-out
  data (:func:`judge`): published only when it is better.

Pure but for the trainers, which import what they train with (torch, for the zoo's).
"""

from tierlink.retrain.job import (
    TRAINERS,
    Judgement,
    Trainer,
    TrainJob,
    judge,
    label_examples,
)

__all__ = ["TRAINERS", "Judgement", "TrainJob", "Trainer", "judge", "label_examples"]
