"""The training clock of every fit's checkpoints (TrainingClock): resumed from its own state, or from the Timer of a
checkpoint saved before fit kept it; read back by training_seconds."""

from __future__ import annotations

import pytest

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
