"""Lossless speculative sampling: whole output sequences follow ancestral sampling from p_1 exactly.

The statistical tests use a 6-token vocabulary and outputs of at most 4 tokens, so the exact
probability of every output sequence can be enumerated. A few thousand samples (one batched decode
of copies of one source, at a fixed seed) are compared with it by a chi-square test; sequences
expected fewer than 5 times are pooled into one bin. A test fails when p < 0.001.
"""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode, greedy_decode_reference
from lightning_bpd.decoding.acceptance import Block, MinBlock, SpeculativeSampling, parse_criterion
from lightning_bpd.decoding.sampling import (
    accept_draws,
    ancestral_sample,
    new_generator,
    probabilities,
    residual,
    sample,
    sample_decode,
    top_p_filter,
)
from tests.decoding.sampling_helpers import (
    MAX_LEN,
    N_SAMPLES,
    P_MIN,
    SRC,
    VOCAB,
    K,
    chi_square_p_value,
    copies,
    sequence_probabilities,
    tiny_model,
)
from tests.models import random_model, random_sources

# ---- the distribution helpers -------------------------------------------------------------------


def test_top_p_keeps_the_smallest_set_reaching_top_p():
    probs = torch.tensor([[0.1, 0.5, 0.3, 0.1]])
    assert torch.allclose(top_p_filter(probs, 0.8), torch.tensor([[0.0, 0.625, 0.375, 0.0]]))
    assert torch.allclose(top_p_filter(probs, 0.81), torch.tensor([[1 / 9, 5 / 9, 3 / 9, 0.0]]))  # tie: lower id
    assert torch.equal(top_p_filter(probs, 0.01), torch.tensor([[0.0, 1.0, 0.0, 0.0]]))  # always one token
    assert torch.equal(top_p_filter(probs, 1.0), probs)


def test_temperature_zero_is_one_hot_and_temperature_sharpens():
    logits = torch.tensor([1.0, 3.0, 2.0])
    assert probabilities(logits, 0.0).tolist() == [0.0, 1.0, 0.0]
    assert probabilities(logits, 0.5)[1] > probabilities(logits, 1.0)[1]
    assert torch.allclose(probabilities(logits, 2.0), torch.softmax(logits / 2, dim=-1))


def test_residual_and_acceptance_reconstruct_p():
    # P(output = x) = q(x) min(1, p/q) + P(reject) * residual(x) = p(x), checked in closed form
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.1, 0.6, 0.1, 0.2])
    keep = torch.minimum(q, p)
    assert torch.allclose(keep + (1 - keep.sum()) * residual(p, q), p)
    assert torch.equal(residual(p, p), p)  # nothing to reject: falls back to p
    tokens = torch.tensor([[0, 1, 2, 3]])
    ok = accept_draws(tokens, p.expand(1, 4, 4), q.expand(1, 4, 4), new_generator(0))
    assert ok[0, 0] and ok[0, 2] and not ok[0, 3]  # p >= q always accepts, p = 0 never
    assert sample(torch.tensor([[0.0, 0.0, 1.0]]), new_generator(1)).tolist() == [2]


@pytest.mark.parametrize("kwargs, message", [({"temperature": -1.0}, "temperature must be"),
                                             ({"top_p": 0.0}, r"top_p must lie in \(0, 1\]"),
                                             ({"top_p": 1.5}, r"top_p must lie in \(0, 1\]")])
def test_invalid_sampling_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SpeculativeSampling(**kwargs)


def test_sampling_is_not_a_min_block_inner_rule_and_parses():
    with pytest.raises(ValueError, match="deterministic inner rule"):
        MinBlock(2, SpeculativeSampling()).validate(3)
    rule = parse_criterion("sample_t0.7_p0.9")
    assert isinstance(rule, SpeculativeSampling) and (rule.temperature, rule.top_p) == (0.7, 0.9)
    assert parse_criterion(rule.name).name == rule.name == "sample_t0.7_p0.9"
    with pytest.raises(ValueError, match="unknown criterion"):
        parse_criterion("sample_x2")


def test_judge_carries_the_residual_token_after_a_rejection():
    # q_2 puts all its mass on token 0, where p has none: token 2 is always rejected and the
    # carried token is drawn from p itself (the residual of a disjoint q)
    rule = SpeculativeSampling()
    rule.reset()
    q = torch.tensor([[[0.2, 0.8, 0.0], [1.0, 0.0, 0.0]]])  # (1, 2, 3)
    verdict = rule.judge(Block(torch.tensor([[1, 0]]), q), torch.tensor([[[-1e9, 0.0, -1e9]]]))
    assert verdict.accepted.tolist() == [1] and verdict.next_first.tolist() == [1]
    q = torch.tensor([[[0.2, 0.8, 0.0], [0.0, 1.0, 0.0]]])  # q_2 = p: always accepted
    verdict = rule.judge(Block(torch.tensor([[1, 1]]), q), torch.tensor([[[-1e9, 0.0, -1e9]]]))
    assert verdict.accepted.tolist() == [2] and verdict.next_first.tolist() == [-1]


# ---- the reference sampler ----------------------------------------------------------------------


def test_ancestral_sample_at_temperature_zero_is_greedy():
    model = random_model(k=2, seed=3)
    src = random_sources(4, seed=3)
    out = ancestral_sample(model, src, 12, temperature=0.0, generator=new_generator(0))
    assert torch.equal(out.tokens, greedy_decode_reference(model, src, 12).tokens)


def test_ancestral_sample_follows_the_enumerated_distribution():
    model = tiny_model(scale=14.0, k=1)
    exact = sequence_probabilities(model, SRC, 3, 1.0, 1.0)
    samples = ancestral_sample(model, copies(400), 3, generator=new_generator(0)).sequences()
    p_value, _ = chi_square_p_value(samples, exact)
    assert p_value > P_MIN


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_cached_sampler_equals_the_reference_row_by_row(temperature, top_p):
    model = tiny_model(scale=3.0, k=1)
    for row in random_sources(4, vocab=VOCAB, seed=5):
        src = row[row != model.pad_id][None]
        fast = sample_decode(model, src, 8, temperature, top_p, generator=new_generator(11))
        slow = ancestral_sample(model, src, 8, temperature, top_p, generator=new_generator(11))
        assert torch.equal(fast.tokens, slow.tokens) and torch.equal(fast.lengths, slow.lengths)


def test_cached_sampler_follows_the_enumerated_distribution_in_a_batch():
    model = tiny_model(scale=14.0, k=1)
    exact = sequence_probabilities(model, SRC, 3, 0.7, 1.0)
    samples = sample_decode(model, copies(N_SAMPLES), 3, 0.7, generator=new_generator(0)).sequences()
    p_value, bins = chi_square_p_value(samples, exact)
    assert bins >= 10 and p_value > P_MIN, f"chi-square p = {p_value:.2e} over {bins} bins"


def test_cached_sampler_at_temperature_zero_is_greedy():
    model = random_model(k=1, seed=3)
    model.eos_id = 5
    src = random_sources(6, seed=3)
    assert torch.equal(sample_decode(model, src, 12, 0.0).tokens, greedy_decode(model, src, 12).tokens)


# ---- speculative sampling with the blockwise heads ----------------------------------------------


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.8)])
def test_speculative_samples_follow_ancestral_sampling(temperature, top_p):
    model = tiny_model()
    exact = sequence_probabilities(model, SRC, MAX_LEN, temperature, top_p)
    out = blockwise_decode(model, copies(N_SAMPLES), SpeculativeSampling(temperature, top_p, seed=0), MAX_LEN)
    p_value, bins = chi_square_p_value(out.sequences(), exact)
    assert bins >= 20  # enough distinct outputs for the test to have power
    assert p_value > P_MIN, f"chi-square p = {p_value:.2e} over {bins} bins"
    blocks = [s for row in out.block_sizes for s in row]
    assert 1 in blocks and max(blocks) == K  # some rejections, some full blocks


def test_temperature_zero_equals_greedy():
    model = random_model(k=4, seed=2)
    src = random_sources(8, seed=2)
    model.eos_id = 5
    out = blockwise_decode(model, src, SpeculativeSampling(temperature=0.0), 20)
    ref = blockwise_decode(model, src, Exact(), 20)
    assert torch.equal(out.tokens, greedy_decode(model, src, 20).tokens)
    assert out.block_sizes == ref.block_sizes


def test_seeds_reproduce():
    model = tiny_model(scale=4.0)
    src = random_sources(64, vocab=VOCAB, seed=4)
    rule = SpeculativeSampling(seed=7)
    first = blockwise_decode(model, src, rule, 8)
    again = blockwise_decode(model, src, rule, 8)  # the rule reseeds at every decode
    other = blockwise_decode(model, src, SpeculativeSampling(seed=8), 8)
    assert torch.equal(first.tokens, again.tokens) and first.block_sizes == again.block_sizes
    assert not torch.equal(first.tokens, other.tokens)


def test_a_given_generator_is_used_and_not_reseeded():
    model = tiny_model(scale=4.0)
    src = random_sources(64, vocab=VOCAB, seed=4)
    rule = SpeculativeSampling(generator=new_generator(7))
    first, second = blockwise_decode(model, src, rule, 8), blockwise_decode(model, src, rule, 8)
    assert torch.equal(first.tokens, blockwise_decode(model, src, SpeculativeSampling(seed=7), 8).tokens)
    assert not torch.equal(first.tokens, second.tokens)
