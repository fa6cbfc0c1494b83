import json

import pytest
import torch

from lightning_bpd.benchmarks.verify_cost import build, main, step_and_verify
from lightning_bpd.kernels import int8, onednn


def test_the_timed_calls_leave_the_cache_as_they_found_it(monkeypatch):
    model = build("tiny", k=4)
    caches = []  # the cache step_and_verify makes, kept to look at
    new_cache = model.new_cache
    monkeypatch.setattr(model, "new_cache", lambda *args, **kwargs: caches.append(new_cache(*args, **kwargs)) or caches[-1])
    with torch.no_grad():
        one, block = step_and_verify(model, 4, prefix=6, src_len=5)
        (cache,) = caches
        lengths, keys, values = cache.lengths.clone(), cache.k[:, :, :6].clone(), cache.v[:, :, :6].clone()
        assert lengths.tolist() == [6]  # the prefix, and nothing else
        for _ in range(3):  # a cache that grew would overflow its capacity of prefix + k + 1
            for call in (one, block):
                call()
                assert torch.equal(cache.lengths, lengths)  # cropped back to the prefix
                assert torch.equal(cache.k[:, :, :6], keys) and torch.equal(cache.v[:, :, :6], values)  # untouched


@pytest.mark.skipif(not (int8.available() and onednn.available()), reason="needs the int8 and oneDNN kernels")
def test_every_runtime_and_the_base_itself_are_timed(tmp_path):
    out = tmp_path / "cost.json"
    report = main(["--shape", "tiny", "--k", "4", "--repeats", "2", "--prefix", "6", "--src-len", "5",
                   "--json", str(out)])
    assert set(report["runtimes"]) == {"float32", "float32-packed", "int8", "hf_own"}
    assert all(r["step_ms"] > 0 and r["verify_ms"] > 0 for r in report["runtimes"].values())
    assert json.loads(out.read_text())["vocab_size"] == 1200 and report["threads"] == 1


def test_an_unknown_precision_is_one_line():
    with pytest.raises(SystemExit, match="verify_cost: unknown precision 'fp16'"):
        main(["--shape", "tiny", "--precisions", "fp16"])
