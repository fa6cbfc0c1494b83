"""Mid-epoch resume of a translation run: fit 2N steps == fit N, resume from last.ckpt, fit N more."""

from __future__ import annotations

import torch

from lightning_bpd.callbacks.training_clock import TrainingClock, training_seconds
from lightning_bpd.commands.cli import main
from tests.batch_recorder import CLASS_PATH, seen_batches

TINY = [
    "--model.init_args.architecture.d_model=32", "--model.init_args.architecture.n_heads=2", "--model.init_args.architecture.d_ff=64",
    "--model.init_args.architecture.n_encoder_layers=1", "--model.init_args.architecture.n_decoder_layers=1",
    "--model.init_args.architecture.head_hidden=16", "--model.init_args.training.warmup_steps=2", "--model.init_args.training.loss_mode=random",
    "--data.init_args.vocab_size=120", "--data.init_args.max_tokens=600",
    "--data.init_args.synthetic_sizes={train: 120, val: 4, test: 4}",
    "--trainer.val_check_interval=1000", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false", f"--trainer.callbacks+={CLASS_PATH}",
]
N = 8  # an epoch has 12 batches: the stop falls mid-epoch and the resumed run goes on into epoch 1


def test_resumed_run_sees_the_same_batches_and_ends_with_the_same_weights(tmp_path, monkeypatch, recwarn):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    full = main(["fit", *TINY, f"--trainer.max_steps={2 * N}", "--run_dir=runs/full"])
    half = main(["fit", *TINY, f"--trainer.max_steps={N}", "--run_dir=runs/half"])
    resumed = main(["fit", *TINY, f"--trainer.max_steps={2 * N}", "--run_dir=runs/resumed",
                    "--ckpt_path=runs/half/last.ckpt"])
    assert not [w for w in recwarn if "dataloader is not resumable" in str(w.message)]
    epoch = len(full.trainer.train_dataloader)
    assert N < epoch < 2 * N
    assert full.model.model.config.dropout > 0  # the resumed run must draw the same dropout masks

    seen = seen_batches(full)
    assert seen_batches(half) + seen_batches(resumed) == seen
    assert len(seen) == 2 * N and resumed.trainer.global_step == 2 * N
    assert sorted(i for b in seen[:epoch] for i in b) == list(range(120))  # epoch 0: every example once
    assert seen[epoch:] != seen[: 2 * N - epoch]  # epoch 1 has an order of its own

    ours, theirs = full.model.state_dict(), resumed.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)

    # every fit's checkpoints keep its training seconds (TrainingClock), summed over the run it resumed
    half_clock = training_seconds(torch.load("runs/half/last.ckpt", weights_only=False))
    resumed_clock = training_seconds(torch.load("runs/resumed/last.ckpt", weights_only=False))
    full_clock = training_seconds(torch.load("runs/full/last.ckpt", weights_only=False))
    assert half_clock is not None and 0 < half_clock < resumed_clock and full_clock > 0
    clock = next(cb for cb in resumed.trainer.callbacks if isinstance(cb, TrainingClock))
    assert clock.seconds() == resumed_clock  # stopped at the fit's end: what its last.ckpt holds
