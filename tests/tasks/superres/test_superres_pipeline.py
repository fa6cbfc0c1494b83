"""Super-resolution end to end on synthetic faces: a tiny fit with the per-eps decode table in W&B."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_bpd.commands.cli import main
from lightning_bpd.decoding import blockwise_decode, greedy_decode
from tests.task_modules import superres_module
from tests.wandb_reader import rows_with

TINY = [
    "--config", "conf/superres/default.yaml",
    "--model.init_args.architecture.d_model=16", "--model.init_args.architecture.n_heads=2", "--model.init_args.architecture.d_ff=32",
    "--model.init_args.architecture.n_encoder_layers=1", "--model.init_args.architecture.n_decoder_layers=1", "--model.init_args.architecture.window=32",
    "--model.init_args.architecture.head_hidden=8", "--model.init_args.architecture.k=3",
    "--data.init_args.synthetic_sizes={train: 16, val: 2, test: 2}", "--data.init_args.batch_size=4",
    "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.log_every_n_steps=1",
    "--decode_eval.subset=1", "--decode_eval.batch_size=1", "--decode_eval.criteria=[exact, eps8]",
    "--decode_eval.num_samples=1",
]


def test_superres_fit_logs_per_eps_acceptance(tmp_path, monkeypatch):
    from lightning_bpd.commands.cli import REPO_ROOT

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    args = [a.replace("conf/", f"{REPO_ROOT}/conf/") for a in TINY]
    cli = main(["fit", *args, "--run_dir=runs/sr"])
    callback = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "DecodeEval")
    m = callback.last_metrics
    assert m["exact/matches_greedy"] == 1.0 and math.isinf(m["exact/psnr_vs_greedy"])
    assert m["eps8/mean_accepted_block_size"] >= m["exact/mean_accepted_block_size"] >= 1.0
    assert m["greedy/model_calls"] == 3072
    assert m["nearest/psnr"] > 0 and "nearest/mean_accepted_block_size" not in m  # the no-model baseline row
    rows = rows_with(tmp_path / "runs/sr", "val/eps8/mean_accepted_block_size")
    assert rows, "the decode metrics never reached the W&B run file"
    logged = rows[-1]
    assert logged["val/eps8/mean_accepted_block_size"] == pytest.approx(m["eps8/mean_accepted_block_size"], rel=1e-6)
    assert logged["val/greedy/psnr"] == pytest.approx(m["greedy/psnr"], rel=1e-5)
    from PIL import Image

    grid = Image.open(tmp_path / "runs/sr/samples_val_step2.png")  # 1 image: input, greedy, exact, eps8, truth
    assert grid.size == (2 + 5 * 34, 2 + 34)


def test_image_transformer_cached_decoding_matches_the_full_pass():
    torch.manual_seed(0)
    module = superres_module(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=2, d_ff=32, window=8, k=3,
                             head_hidden=8).double().eval()
    model = module.model
    src = torch.randint(3, 259, (2, 192))
    out = blockwise_decode(model, src, module.make_criterion("exact"), max_len=40)
    assert torch.equal(out.tokens, greedy_decode(model, src, 40).tokens)
    tgt_in = torch.cat([torch.full((2, 1), model.bos_id), out.tokens[:, :-1]], dim=1)
    full = model.logits_first(model.decode_full(tgt_in, model.encode(src)))
    assert torch.equal(full.argmax(-1), out.tokens)
