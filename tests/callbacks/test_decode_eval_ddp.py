"""DDP on CPU (gloo): 2 processes validate a checkpoint and count every example exactly once.

The validation decode metrics (BLEU, mean accepted block size per rule, model calls, example count)
of a 2-process run must equal those of a 1-process run on the same checkpoint. 13 validation
examples in batches of 2 give 7 batches: one rank gets 4, the other 3, so a sampler that pads
(repeats examples to even the ranks out) would show up in the counts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_bpd.commands.cli import REPO_ROOT, main

TINY = [
    "--model.init_args.architecture.d_model=32", "--model.init_args.architecture.n_heads=2", "--model.init_args.architecture.d_ff=64",
    "--model.init_args.architecture.n_encoder_layers=1", "--model.init_args.architecture.n_decoder_layers=1",
    "--model.init_args.architecture.head_hidden=16", "--model.init_args.training.warmup_steps=5", "--model.init_args.architecture.k=3",
    "--data.init_args.vocab_size=120", "--data.init_args.max_tokens=600", "--data.init_args.eval_max_tokens=100",
    "--data.init_args.synthetic_sizes={train: 300, val: 13, test: 13}",
    "--trainer.logger=false", "--decode_eval.batch_size=2", "--decode_eval.criteria=[exact, top2]",
]
TIMING = ("seconds", "speedup", "tokens_per_second")


def test_two_processes_count_every_example_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    main(["fit", *TINY, "--trainer.max_steps=10", "--trainer.val_check_interval=10", "--decode_eval.subset=4",
          "--run_dir=runs/fit"])
    ckpt = "runs/fit/last.ckpt"
    main(["validate", *TINY, f"--ckpt_path={ckpt}", "--run_dir=runs/one"])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline",  # the code under test, not an installed copy
           "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(Path.cwd())])}
    env.pop("LOCAL_RANK", None)
    done = subprocess.run(
        [sys.executable, "-m", "lightning_bpd", "validate", *TINY, f"--ckpt_path={ckpt}", "--run_dir=runs/two",
         "--trainer.devices=2", "--trainer.strategy=ddp", "--trainer.accelerator=cpu"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2 process(es)" in done.stdout
    one = json.loads(Path("runs/one/decode_val.json").read_text())["metrics"]
    two = json.loads(Path("runs/two/decode_val.json").read_text())["metrics"]
    assert one["examples"] == two["examples"] == 13
    # a duplicated or missing example changes the summed model calls (and the block sizes)
    assert one["greedy/model_calls"] > 13 and one["exact/model_calls"] < one["greedy/model_calls"]
    compared = [key for key in one if not key.endswith(TIMING)]
    assert {key: two[key] for key in compared} == pytest.approx({key: one[key] for key in compared}, abs=1e-9)
