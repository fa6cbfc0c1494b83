"""Mid-epoch resume of a super-resolution run: fit 2N steps == fit N, resume from last.ckpt, fit N more."""

from __future__ import annotations

import torch

from lightning_bpd.commands.cli import REPO_ROOT, main
from tests.batch_recorder import CLASS_PATH, seen_batches

TINY = [
    "--config", f"{REPO_ROOT}/conf/superres/default.yaml",
    "--model.init_args.architecture.d_model=16", "--model.init_args.architecture.n_heads=2", "--model.init_args.architecture.d_ff=32",
    "--model.init_args.architecture.n_encoder_layers=1", "--model.init_args.architecture.n_decoder_layers=1", "--model.init_args.architecture.window=32",
    "--model.init_args.architecture.head_hidden=8", "--model.init_args.architecture.k=3", "--model.init_args.architecture.dropout=0.1",
    "--model.init_args.training.loss_mode=random", "--model.init_args.training.loss_fraction=0.5",
    "--data.init_args.synthetic_sizes={train: 18, val: 2, test: 2}", "--data.init_args.batch_size=4",
    "--trainer.val_check_interval=1000", "--trainer.logger=false", "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false", f"--trainer.callbacks+={CLASS_PATH}",
]
N = 3  # an epoch has 4 batches (18 images, 4 a batch, the last 2 dropped): the stop falls mid-epoch


def test_resumed_run_sees_the_same_batches_and_ends_with_the_same_weights(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    full = main(["fit", *TINY, f"--trainer.max_steps={2 * N}", "--run_dir=runs/full"])
    half = main(["fit", *TINY, f"--trainer.max_steps={N}", "--run_dir=runs/half"])
    resumed = main(["fit", *TINY, f"--trainer.max_steps={2 * N}", "--run_dir=runs/resumed",
                    "--ckpt_path=runs/half/last.ckpt"])
    epoch = len(full.trainer.train_dataloader)
    assert N < epoch < 2 * N

    seen = seen_batches(full)
    assert seen_batches(half) + seen_batches(resumed) == seen
    assert len(seen) == 2 * N and resumed.trainer.global_step == 2 * N
    assert len({i for b in seen[:epoch] for i in b}) == 4 * epoch  # no image twice in an epoch
    assert seen[epoch:] != seen[: 2 * N - epoch]  # epoch 1 has an order of its own

    ours, theirs = full.model.state_dict(), resumed.model.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
