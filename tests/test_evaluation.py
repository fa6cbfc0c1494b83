"""The one evaluation loop: a method over batches, timed, outputs and counts collected."""

import pytest
import torch

from lightning_bpd.decoding import beam_search, greedy_decode
from lightning_bpd.decoding.acceptance import parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.evaluation import EvalBatch, decode_all, pad_rows, run_batch
from tests.models import StubModel, pick_eos, random_model, random_sources, stub_sources

TARGETS = [[5, 6, 7, 2], [8, 9, 10, 11, 12, 2], [13, 2]]


def test_decode_all_collects_every_batch_in_order():
    model = StubModel(TARGETS, k=4)
    batches = [EvalBatch(stub_sources(3)[:2], 20), EvalBatch(stub_sources(3)[2:], 20)]
    run = decode_all(make_method("exact", parse_criterion, model), model, batches)
    assert run.outputs == TARGETS
    assert run.tokens == 12 and run.iterations == 1 + 2 + 1  # always-right heads: ceil(n / 4) each
    assert run.model_calls == 2 + 3 and run.seconds > 0
    assert run.mean_accepted_block_size == pytest.approx(12 / 4)


def test_run_batch_equals_calling_the_method_and_beam_is_a_method(one_thread):
    model = random_model(k=1, seed=3)
    src = random_sources(4, seed=3)
    pick_eos(model, src, 10)
    result, run = run_batch(make_method("greedy", parse_criterion, model), model, EvalBatch(src, 10))
    assert run.outputs == greedy_decode(model, src, 10).sequences() == result.sequences()
    beam = run_batch(make_method("beam3_a0.5", parse_criterion, model), model, EvalBatch(src, 10))[0]
    assert beam.sequences() == beam_search(model, src, 10, beam_size=3, alpha=0.5).sequences()
    for bad in ("beam0", "beam2_x1", "beamx"):
        with pytest.raises(ValueError, match="bad beam method"):
            make_method(bad, parse_criterion, model)


def test_pad_rows():
    rows = [torch.tensor([[5, 6, 7]]), torch.tensor([[8]])]
    assert pad_rows(rows, 0).tolist() == [[5, 6, 7], [8, 0, 0]]
