"""Progress of a zoo build: a rich bar per model (batches, with the epoch), or nothing."""

from __future__ import annotations

from types import TracebackType
from typing import Any, Protocol, Self


class BuildReporter(Protocol):
    """Called by the builder from its one thread, in order: ``begin``, then ``batch`` once
    per training batch, ``stage`` as export / evaluation start, ``end`` once per model."""

    def begin(self, model: str, epochs: int, batches_per_epoch: int) -> None: ...

    def batch(self, model: str, epoch: int, loss: float) -> None: ...

    def stage(self, model: str, text: str) -> None: ...

    def end(self, model: str, summary: str) -> None: ...


class NullReporter:
    """Reports nothing (``progress=False``)."""

    def begin(self, model: str, epochs: int, batches_per_epoch: int) -> None:
        pass

    def batch(self, model: str, epoch: int, loss: float) -> None:
        pass

    def stage(self, model: str, text: str) -> None:
        pass

    def end(self, model: str, summary: str) -> None:
        pass


class RichReporter:
    """One rich progress bar per model, on stderr. Use as a context manager."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]{task.fields[model]:<14}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"), TimeElapsedColumn(), TimeRemainingColumn(),
            console=Console(stderr=True))
        self._tasks: dict[str, Any] = {}
        self._epochs: dict[str, int] = {}

    def __enter__(self) -> Self:
        self._progress.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._progress.stop()

    def begin(self, model: str, epochs: int, batches_per_epoch: int) -> None:
        self._epochs[model] = epochs
        self._tasks[model] = self._progress.add_task(
            model, total=epochs * batches_per_epoch, model=model, status="training")

    def batch(self, model: str, epoch: int, loss: float) -> None:
        status = f"epoch {epoch + 1}/{self._epochs[model]} loss {loss:.3f}"
        self._progress.update(self._tasks[model], advance=1, status=status)

    def stage(self, model: str, text: str) -> None:
        self._progress.update(self._tasks[model], status=text)

    def end(self, model: str, summary: str) -> None:
        self._progress.update(self._tasks[model], status=summary)
