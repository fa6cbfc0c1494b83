"""Progress of a ``fit`` whose output goes to a file: :class:`ProgressLines`, a callback every ``fit`` carries, prints one
line every ``every`` seconds of training, and one at its end, where no progress bar shows on a terminal (stdout is not a
TTY, or the run has no progress bar): the step of the run's last, steps per second, the mean training loss since the
previous line and the time left until ``max_steps`` or ``max_time``, whichever ends the run first."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, Timer


def clock(seconds: float) -> str:
    """``H:MM:SS`` (hours past a day stay hours)."""
    s = max(0, round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def time_left(step: int, last: int | None, rate: float, timer_left: float | None) -> tuple[float, str] | None:
    """Seconds left and what ends the run first: the ``last`` step at ``rate`` steps per second (``max_steps``), or
    ``max_time`` (``timer_left`` seconds, the Timer's); None where neither is known."""
    left = []
    if last is not None and rate > 0:
        left.append((max(0, last - step) / rate, "max_steps"))
    if timer_left is not None:
        left.append((max(0.0, timer_left), "max_time"))
    return min(left) if left else None


def progress_line(step: int, last: int | None, rate: float, loss: float | None, left: tuple[float, str] | None,
                  elapsed: float | None = None) -> str:
    """``train: step 120/5000, 0.52 steps/s, loss 3.2140, ETA 2:36:10 (max_steps)``; with ``elapsed`` (the end of
    training) ``..., done in 0:12:03`` instead of the ETA."""
    parts = [f"step {step}" + (f"/{last}" if last is not None else ""), f"{rate:.3g} steps/s"]
    if loss is not None:
        parts.append(f"loss {loss:.4f}")
    if elapsed is not None:
        parts.append(f"done in {clock(elapsed)}")
    elif left is not None:
        parts.append(f"ETA {clock(left[0])} ({left[1]})")
    return "train: " + ", ".join(parts)


def shows_a_bar(trainer: pl.Trainer) -> bool:
    """Whether the run's progress bar shows on a terminal (it has one and stdout is a TTY)."""
    isatty = getattr(sys.stdout, "isatty", None)
    return trainer.progress_bar_callback is not None and callable(isatty) and bool(isatty())


def last_step(trainer: pl.Trainer) -> int | None:
    """The step the run ends at: ``max_steps``, else the steps of ``max_epochs`` where known."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return int(trainer.max_steps)
    try:
        total = float(trainer.estimated_stepping_batches)
    except Exception:  # noqa: BLE001 (no length to count: the line shows the step alone)
        return None
    return int(total) if math.isfinite(total) else None


class ProgressLines(Callback):
    """One progress line every ``every`` seconds of training (0: every batch) and one at its end, on global rank 0,
    where the progress bar does not show on a terminal (:func:`shows_a_bar`); nothing otherwise.

    Args:
        every: seconds between two lines.
    """

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        if not every >= 0:
            raise ValueError(f"ProgressLines: every must be >= 0 seconds, got {every}")
        self.every = float(every)
        self.active = False
        self.started = self.last_line = 0.0
        self.first_step = 0
        self.last: int | None = None
        self.timer: Timer | None = None
        self.loss_sum: torch.Tensor | None = None  # the training losses since the last line (on their device)
        self.batches = 0

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.active = trainer.is_global_zero and not shows_a_bar(trainer)
        self.started = self.last_line = time.monotonic()
        self.first_step = trainer.global_step  # a resumed run's rate counts its own steps
        self.last = last_step(trainer) if self.active else None
        self.timer = next((cb for cb in trainer.callbacks if isinstance(cb, Timer)), None)
        self.loss_sum, self.batches = None, 0

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if not self.active:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor) and loss.numel() == 1:
            # Lightning divides the returned loss by accumulate_grad_batches before this hook: undone here
            loss = loss.detach().float().reshape(()) * trainer.accumulate_grad_batches  # summed on its device
            self.loss_sum = loss if self.loss_sum is None else self.loss_sum + loss.to(self.loss_sum.device)
            self.batches += 1
        if time.monotonic() - self.last_line >= self.every:
            self.emit(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.active:
            self.emit(trainer, done=True)
        self.active = False

    def emit(self, trainer: pl.Trainer, done: bool = False) -> None:
        """Print the line of now (and start the next interval's loss)."""
        now = time.monotonic()
        elapsed = now - self.started
        step = trainer.global_step
        rate = (step - self.first_step) / elapsed if elapsed > 0 else 0.0
        loss = float(self.loss_sum) / self.batches if self.loss_sum is not None and self.batches else None
        timer_left = self.timer.time_remaining("train") if self.timer is not None else None
        left = time_left(step, self.last, rate, timer_left)
        print(progress_line(step, self.last, rate, loss, left, elapsed if done else None), flush=True)
        self.last_line, self.loss_sum, self.batches = now, None, 0


__all__ = ["ProgressLines", "progress_line", "time_left"]
