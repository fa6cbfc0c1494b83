"""A callback that records the dataset indices of every training batch (``--trainer.callbacks+=...``)."""

from __future__ import annotations

import pytorch_lightning as pl

CLASS_PATH = "tests.batch_recorder.BatchRecorder"


class BatchRecorder(pl.Callback):
    """``seen``: the ``index`` list of each training batch, in training order."""

    def __init__(self) -> None:
        self.seen: list[list[int]] = []

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        self.seen.append(batch["index"].tolist())


def seen_batches(cli) -> list[list[int]]:
    """The batches the :class:`BatchRecorder` of a finished CLI run saw."""
    return next(cb for cb in cli.trainer.callbacks if isinstance(cb, BatchRecorder)).seen
