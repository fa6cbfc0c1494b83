"""How long a fit trained: :class:`TrainingClock`, a callback every ``fit`` carries, keeps the seconds of the
training loop less the validations run inside it (their loss and decode evaluation; start-up, data checks and the
sanity check are outside the loop) in each checkpoint it saves, summed over the runs that resumed it;
:func:`training_seconds` reads them back (or Lightning's ``Timer`` state, which a ``max_time`` run also saves), so
that a table of trained proposers can say what each cost to train.

Lightning's ``Timer`` (``max_time``) counts the loop's wall clock, validations included, and checks it at the end of a
training batch only; the validation that follows a stop (and its decode evaluation) runs past ``max_time``. This clock
counts neither: a run stopped by ``max_time`` trained at most about ``max_time`` by it (one step more at the most)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

STATE_KEY = "TrainingClock"  # the callback's entry in a checkpoint's "callbacks"


class TrainingClock(Callback):
    """Wall-clock seconds in ``fit``'s training loop less its validations (``on_validation_start`` to
    ``on_validation_end``, the decode evaluation at their end included), carried across resumed runs
    (``state_dict``)."""

    def __init__(self) -> None:
        self.before = 0.0  # seconds of the runs this one resumed
        self.started: float | None = None
        self.paused: float | None = None  # when the validation under way started
        self.validating = 0.0  # seconds of this run's validations so far

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def seconds(self) -> float:
        if self.started is None:
            return self.before
        now = self.paused if self.paused is not None else time.perf_counter()
        return self.before + (now - self.started) - self.validating

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started, self.paused, self.validating = time.perf_counter(), None, 0.0

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.before, self.started, self.paused, self.validating = self.seconds(), None, None, 0.0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.started is not None and self.paused is None:  # inside the training loop (not a sanity check)
            self.paused = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.paused is not None:
            self.validating += time.perf_counter() - self.paused
            self.paused = None

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        """A checkpoint saved before fit kept this clock: start from its ``Timer``'s training seconds, if any
        (``load_state_dict`` follows where the clock's own state is saved)."""
        if STATE_KEY not in (checkpoint.get("callbacks") or {}):
            self.before = training_seconds(checkpoint) or 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"train_seconds": self.seconds()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.before = float(state_dict.get("train_seconds", 0.0))


def training_seconds(checkpoint: Mapping[str, Any]) -> float | None:
    """A loaded checkpoint's training seconds: :class:`TrainingClock`'s, else Lightning's ``Timer``'s (``max_time``
    runs; the loop's wall clock, its validations included), else None."""
    callbacks = checkpoint.get("callbacks") or {}
    if STATE_KEY in callbacks:
        return float(callbacks[STATE_KEY]["train_seconds"])
    timer = callbacks.get("Timer")
    if isinstance(timer, Mapping) and "train" in (timer.get("time_elapsed") or {}):
        return float(timer["time_elapsed"]["train"])
    return None
