"""The training clock of every fit's checkpoints (TrainingClock): the training loop's seconds less its validations
(Lightning's Timer counts those too); resumed from its own state, or from the Timer of a checkpoint saved before fit
kept it; read back by training_seconds."""

from __future__ import annotations

import time

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback, Timer
from torch.utils.data import DataLoader, TensorDataset

from lightning_bpd.callbacks.training_clock import STATE_KEY, TrainingClock, training_seconds


def test_a_resumed_clock_starts_from_its_own_state_else_from_the_timer():
    timer = {"Timer": {"time_elapsed": {"train": 30.0, "validate": 5.0}}}
    clock = TrainingClock()
    clock.on_load_checkpoint(None, None, {"callbacks": timer})  # saved before fit kept a clock
    assert clock.seconds() == 30.0
    clock = TrainingClock()
    saved = {"callbacks": {**timer, STATE_KEY: {"train_seconds": 12.5}}}
    clock.on_load_checkpoint(None, None, saved)
    clock.load_state_dict(saved["callbacks"][STATE_KEY])  # Lightning's order: the hook, then the state
    assert clock.seconds() == 12.5 and training_seconds(saved) == 12.5
    assert training_seconds({"callbacks": timer}) == 30.0 and training_seconds({}) is None
    clock = TrainingClock()
    clock.on_load_checkpoint(None, None, {})
    clock.on_train_start(None, None)
    clock.on_train_end(None, None)
    assert 0.0 <= clock.seconds() < 1.0 and clock.state_dict() == {"train_seconds": pytest.approx(clock.seconds())}


class Sleepy(pl.LightningModule):
    """One linear layer whose validation sleeps ``nap`` seconds (as a long validation or decode evaluation would)."""

    def __init__(self, nap: float) -> None:
        super().__init__()
        self.layer, self.nap = torch.nn.Linear(2, 1), nap

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        time.sleep(self.nap)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Validations(Callback):
    """The seconds of every validation run inside the training loop."""

    def __init__(self) -> None:
        self.seconds, self.start = 0.0, 0.0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = time.monotonic()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.seconds += time.monotonic() - self.start


def test_the_clock_counts_the_timers_training_time_less_the_validations_in_it(tmp_path):
    """A fit of 4 steps validating after steps 2 and 4 (the last one after the loop's last batch, as after a
    max_time stop), each validation sleeping 0.4 s: Lightning's Timer counts them, the clock does not, and the
    checkpoint keeps the clock's seconds."""
    data = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)
    clock, validations = TrainingClock(), Validations()
    trainer = pl.Trainer(accelerator="cpu", max_steps=4, max_time="00:00:10:00", val_check_interval=2,
                         num_sanity_val_steps=0, limit_val_batches=1, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, callbacks=[clock, validations],
                         default_root_dir=tmp_path)
    trainer.fit(Sleepy(0.4), data, data)
    timer = next(cb for cb in trainer.callbacks if isinstance(cb, Timer))
    assert validations.seconds >= 0.8  # two validations inside the training loop
    assert timer.time_elapsed("train") >= validations.seconds  # the Timer counts them
    assert clock.seconds() == pytest.approx(timer.time_elapsed("train") - validations.seconds, abs=0.25)  # hooks, load
    assert clock.seconds() < timer.time_elapsed("train") - 0.75
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    saved = torch.load(tmp_path / "last.ckpt", map_location="cpu", weights_only=False)
    assert training_seconds(saved) == pytest.approx(clock.seconds())
