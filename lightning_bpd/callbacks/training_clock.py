"""How long a fit trained: :class:`TrainingClock`, a callback every ``fit`` carries, keeps the seconds of the
training loop (validation inside it included, start-up and data checks not) in each checkpoint it saves, summed over
the runs that resumed it; :func:`training_seconds` reads them back (or Lightning's ``Timer`` state, which a
``max_time`` run also saves), so that a table of trained proposers can say what each cost to train."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback

STATE_KEY = "TrainingClock"  # the callback's entry in a checkpoint's "callbacks"


class TrainingClock(Callback):
    """Wall-clock seconds in ``fit``'s training loop, carried across resumed runs (``state_dict``)."""

    def __init__(self) -> None:
        self.before = 0.0  # seconds of the runs this one resumed
        self.started: float | None = None

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def seconds(self) -> float:
        running = 0.0 if self.started is None else time.perf_counter() - self.started
        return self.before + running

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.started = time.perf_counter()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.before, self.started = self.seconds(), None

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
    runs), else None."""
    callbacks = checkpoint.get("callbacks") or {}
    if STATE_KEY in callbacks:
        return float(callbacks[STATE_KEY]["train_seconds"])
    timer = callbacks.get("Timer")
    if isinstance(timer, Mapping) and "train" in (timer.get("time_elapsed") or {}):
        return float(timer["time_elapsed"]["train"])
    return None
