"""Decoding methods by name: parsing, baselines, and that each name runs the decoder it says."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import blockwise_decode, greedy_decode, parse_criterion
from lightning_bpd.decoding.draft import draft_decode
from lightning_bpd.decoding.methods import acceptance_rate, make_method, parse_ancestral, with_baselines
from lightning_bpd.decoding.sampling import new_generator, sample_decode
from tests.models import random_model, random_sources


def make(spec, model, k=None, draft=None):
    return make_method(spec, parse_criterion, model, k, draft)


def test_each_name_runs_its_decoder():
    model, draft = random_model(k=4, seed=1), random_model(k=1, seed=2)
    model.eos_id = draft.eos_id = 5
    src = random_sources(5, seed=1)
    greedy = greedy_decode(model, src, 12)
    assert torch.equal(make("greedy", model)(model, src, 12).tokens, greedy.tokens)
    top2 = make("top2", model, k=3)(model, src, 12)
    assert torch.equal(top2.tokens, blockwise_decode(model, src, parse_criterion("top2"), 12, k=3).tokens)
    via_draft = make("draft:exact", model, k=3, draft=draft)(model, src, 12)
    assert torch.equal(via_draft.tokens, greedy.tokens)  # exact acceptance is greedy whoever proposes
    assert via_draft.block_sizes == draft_decode(model, draft, src, parse_criterion("exact"), 12, k=3).block_sizes
    sampled = make("ancestral_t0.7_p0.9", model)(model, src, 12)
    again = sample_decode(model, src, 12, 0.7, 0.9, new_generator(0))
    assert torch.equal(sampled.tokens, again.tokens)


def test_baselines_and_block_sizes():
    model, draft = random_model(k=4, seed=1), random_model(k=1, seed=2)
    assert make("exact", model).baseline == "greedy" and make("exact", model).block_size(model) == 4
    assert make("exact", model, k=2).block_size(model) == 2
    assert make("sample_t0.7_p0.9", model).baseline == "ancestral_t0.7_p0.9"
    assert make("sample_t0", model).baseline == "greedy"  # temperature 0 is greedy
    assert make("draft:sample_t1", model, k=6, draft=draft).block_size(model) == 6  # a draft is not limited by heads
    methods = {s: make(s, model, draft=draft) for s in ("sample_t1", "exact", "draft:sample_t1")}
    order = with_baselines(list(methods), methods, lambda s: make(s, model))
    assert order == ["ancestral_t1_p1", "greedy", "sample_t1", "exact", "draft:sample_t1"]


@pytest.mark.parametrize(
    "spec, kwargs, message",
    [
        ("draft:exact", {}, "needs a draft model"),
        ("min3", {"k": 2}, "MinBlock l must lie in"),
        ("exact", {"k": 5}, r"k must be an integer in \[1, 4\]"),
        ("ancestral_x3", {}, "bad ancestral sampling option"),
        ("ancestral_t-1", {}, "temperature"),
        ("nonsense", {}, "nonsense"),
    ],
)
def test_bad_names_fail_with_one_message(spec, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(spec, random_model(k=4, seed=1), **kwargs)


def test_a_draft_with_other_special_ids_is_rejected():
    model, draft = random_model(k=2, seed=1), random_model(k=1, seed=2)
    draft.bos_id = 7
    with pytest.raises(ValueError, match="bos_id"):
        make("draft:exact", model, k=3, draft=draft)


def test_parse_ancestral():
    assert parse_ancestral("ancestral") == (1.0, 1.0)
    assert parse_ancestral("ancestral_p0.5_t0.3") == (0.3, 0.5)


def test_acceptance_rate_leaves_out_each_rows_last_block():
    assert acceptance_rate([[4, 4, 2], [1, 3, 1]], 4) == pytest.approx((3 + 3 + 0 + 2) / (4 * 3))
    assert acceptance_rate([[4, 4, 4, 1]], 4) == 1.0
    assert acceptance_rate([[2], [3]], 4) != acceptance_rate([[2], [3]], 4)  # NaN: no complete block


def test_fixed_shape_methods_decode_like_the_eager_ones():
    model = random_model(k=4, seed=1)
    model.eos_id = 5
    src = random_sources(5, seed=1)
    for spec, k in [("greedy", None), ("exact", None), ("top2", 3), ("eps1", 2)]:
        eager = make_method(spec, parse_criterion, model, k)(model, src, 12)
        fixed = make_method(spec, parse_criterion, model, k, fixed_shape=True)
        assert fixed.fixed_shape
        out = fixed(model, src, 12)
        assert torch.equal(out.tokens, eager.tokens) and out.block_sizes == eager.block_sizes
    for spec in ["ancestral", "sample_t0.7", "beam2"]:
        with pytest.raises(ValueError, match="has no fixed-shape decoder"):
            make_method(spec, parse_criterion, model, fixed_shape=True)
