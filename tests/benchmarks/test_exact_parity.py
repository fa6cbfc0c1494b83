from types import SimpleNamespace

import torch

from lightning_bpd.benchmarks.exact_parity import differing_tokens, parity
from lightning_bpd.decoding import parse_criterion
from lightning_bpd.decoding.protocol import DecodeResult
from tests.models import random_model, random_sources


def result(rows: list[list[int]]) -> DecodeResult:
    width = max(len(r) for r in rows)
    tokens = torch.tensor([r + [0] * (width - len(r)) for r in rows])
    return DecodeResult(tokens, torch.tensor([len(r) for r in rows]), torch.ones(len(rows)), 1)


def test_differing_tokens_counts_mismatches_and_length_differences():
    a = result([[5, 6, 7], [5, 6, 7], [5, 6, 7]])
    b = result([[5, 6, 7], [5, 9, 7], [5, 6]])
    assert differing_tokens(a, b) == [0, 1, 1]


def test_parity_per_dtype_and_the_model_keeps_its_dtype():
    """Exact blockwise == greedy on a random model in float64 (every row identical); the model is cast back
    to its own dtype afterwards."""
    model = random_model(k=3, seed=2)
    model.eos_id = 5
    module = SimpleNamespace(model=model, make_criterion=parse_criterion, max_decode_len=lambda src: 12)
    inputs = [row[None] for row in random_sources(5, seed=2)]
    r = parity(module, inputs, ["float32", "float64", "float32-invariant"], batch_size=2)
    counts = lambda name: {key: r[name][key] for key in ("rows", "identical_rows", "differing_tokens")}
    assert counts("float64") == counts("float32-invariant") == {"rows": 5, "identical_rows": 5, "differing_tokens": 0}
    assert r["float32"]["rows"] == 5 and 0 <= r["float32"]["identical_rows"] <= 5
    assert r["float64"]["greedy_seconds"] > 0 and r["float64"]["exact_seconds"] > 0
    assert next(model.parameters()).dtype == torch.float64
