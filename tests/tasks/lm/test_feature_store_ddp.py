"""``python -m lightning_bpd store --devices 2`` on CPU (gloo): two ranks write one store, each shard once, equal to a
single process's store of the same options. 10 windows in shards of 2 make 5 shards: one rank gets 3, the other 2
(the loader is padded with an empty slot so that Lightning's prediction sampler splits it evenly)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.commands.cli import REPO_ROOT
from lightning_bpd.commands.store import main as store_main
from lightning_bpd.tasks.lm.feature_store import FeatureStore, shard_name
from tests.tasks.lm.tiny_lm import write_checkpoint, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

OPTIONS = ["--seq-len", "32", "--layers", "0,2", "--shard-size", "2", "--batch-size", "2", "--sequences", "10",
           "--seed", "2"]


@pytest.mark.slow  # two ranks as subprocesses: about 30 s (the default suite stays under 10 minutes on 2 cores)
def test_two_ranks_write_the_single_process_store(tmp_path):
    target = write_checkpoint(tmp_path / "llama4", layers=4)
    data = write_corpus(tmp_path / "code")
    common = ["--pretrained", str(target), "--data-root", str(data), *OPTIONS]
    store_main([*common, "--out", str(tmp_path / "one")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}  # the code under test
    for key in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-m", "lightning_bpd", "store", *common, "--out", str(tmp_path / "two"),
                           "--devices", "2", "--accelerator", "cpu"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    one, two = FeatureStore(tmp_path / "one"), FeatureStore(tmp_path / "two")
    assert one.meta == two.meta and one.meta["n_shards"] == 5
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == [*(shard_name(s) for s in range(5)), "store.json"]
    for s in range(5):
        a, b = one.shard(s), two.shard(s)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), f"shard {s}"
    out = done.stdout
    assert out.count("to compute, about") == 1 and out.count("complete; train with") == 1  # rank 0 only
    assert out.count("rank 0: shard") == 3 and out.count("rank 1: shard") == 2  # each rank its own shards, tagged
    assert "each of 2 processes" in out
