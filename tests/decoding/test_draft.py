"""Speculative decoding with a separate draft model: exact under greedy rules, lossless under sampling."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, TopK, greedy_decode
from lightning_bpd.decoding.acceptance import SpeculativeSampling
from lightning_bpd.decoding.draft import draft_decode
from lightning_bpd.decoding.sampling import new_generator
from tests.decoding.sampling_helpers import (
    MAX_LEN,
    N_SAMPLES,
    P_MIN,
    SRC,
    VOCAB,
    chi_square_p_value,
    copies,
    sequence_probabilities,
    tiny_model,
)
from tests.models import Wrapped, pick_eos, random_model, random_sources


def nudge(vocab: int, seed: int, size: float) -> torch.Tensor:
    return torch.randn(vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * size


@torch.no_grad()
def expected_blocks(target, draft, src: torch.Tensor, max_len: int, k: int) -> list[list[int]]:
    """Block sizes of Exact draft decoding, from uncached passes along the target's greedy output.

    Every draft token preceded by accepted ones was proposed after the true greedy prefix, so the
    draft's uncached argmax d[t] after greedy[:t] decides it: a block from L accepts 1 + the run of
    positions t = L+1, L+2, ... (fewer than k, inside the output) with d[t] == greedy[t].
    """
    out = []
    for row_src, g in zip(src, greedy_decode(target, src, max_len).sequences()):
        row_src = row_src[row_src != target.pad_id][None]  # (1, S)
        h = draft.decode_full(torch.tensor([[target.bos_id, *g]]), draft.encode(row_src))  # (1, T + 1, D)
        d = draft.logits_first(h[0, :-1]).argmax(dim=-1).tolist()  # d[t]: the draft's token at t
        blocks, start = [], 0
        while start < len(g):
            n = 1
            while n < k and start + n < len(g) and d[start + n] == g[start + n]:
                n += 1
            blocks.append(n)
            start += n
        out.append(blocks)
    return out


# ---- greedy rules -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_equals_greedy_with_an_unrelated_draft(k, seed):
    target, draft = random_model(k=1, seed=seed), random_model(k=2, seed=seed + 10)
    src = random_sources(6, seed=seed)
    draft.eos_id = pick_eos(target, src, 16)
    out = draft_decode(target, draft, src, Exact(), 16, k)
    greedy = greedy_decode(target, src, 16)
    assert torch.equal(out.tokens, greedy.tokens) and torch.equal(out.lengths, greedy.lengths)
    assert out.model_calls == int(out.iterations.max()) + 1  # target calls: BOS, then one per iteration


@pytest.mark.parametrize("k", [2, 4])
def test_block_sizes_follow_the_draft_and_its_cache_is_cropped(k):
    target = random_model(k=1, seed=3)
    src = random_sources(6, seed=3)
    pick_eos(target, src, 20)
    draft = Wrapped(target, bump=nudge(16, seed=k, size=0.02))
    out = draft_decode(target, draft, src, Exact(), 20, k)
    assert torch.equal(out.tokens, greedy_decode(target, src, 20).tokens)
    assert out.block_sizes == expected_blocks(target, draft, src, 20, k)
    sizes = [s for row in out.block_sizes for s in row]
    assert 1 in sizes and k in sizes  # rejections (and crops) and whole blocks both happen
    assert draft.calls == (k - 1) * int(out.iterations.max())  # k-1 draft steps per target call


def test_a_draft_identical_to_the_target_accepts_every_proposal():
    target = random_model(k=1, seed=4)
    src = random_sources(6, seed=4)
    pick_eos(target, src, 17)
    k = 4
    out = draft_decode(target, target, src, Exact(), 17, k)
    assert torch.equal(out.tokens, greedy_decode(target, src, 17).tokens)
    assert all(b[:-1] == [k] * (len(b) - 1) and 1 <= b[-1] <= k for b in out.block_sizes)
    assert out.mean_accepted_block_size > 3


def test_topk_of_the_whole_vocabulary_accepts_every_proposal():
    target, draft = random_model(k=1, seed=5), random_model(k=1, seed=6)
    target.eos_id = draft.eos_id = None
    out = draft_decode(target, draft, random_sources(4, seed=5), TopK(16), 11, 3)
    assert out.block_sizes == [[3, 3, 3, 2]] * 4


# ---- speculative sampling -----------------------------------------------------------------------


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_draft_samples_follow_ancestral_sampling(temperature, top_p):
    target = tiny_model(seed=2, k=1)
    draft = Wrapped(target, bump=nudge(VOCAB, seed=0, size=0.5))  # q close to p, not equal
    exact = sequence_probabilities(target, SRC, MAX_LEN, temperature, top_p)
    rule = SpeculativeSampling(temperature, top_p, seed=0)
    out = draft_decode(target, draft, copies(N_SAMPLES), rule, MAX_LEN, 3)
    p_value, bins = chi_square_p_value(out.sequences(), exact)
    assert bins >= 15
    assert p_value > P_MIN, f"chi-square p = {p_value:.2e} over {bins} bins"
    sizes = [s for row in out.block_sizes for s in row]
    assert 1 in sizes and 3 in sizes


def test_sampling_with_a_draft_identical_to_the_target_accepts_every_proposal():
    target = tiny_model(seed=2, scale=4.0, k=1)
    src = random_sources(200, vocab=VOCAB, seed=6)
    out = draft_decode(target, target, src, SpeculativeSampling(seed=3), 9, 3)
    assert all(b[:-1] == [3] * (len(b) - 1) for b in out.block_sizes)
    assert (out.lengths > 3).sum() > 50  # many rows needed more than one block


def test_temperature_zero_equals_greedy_and_seeds_reproduce():
    target, draft = tiny_model(seed=2, scale=4.0, k=1), tiny_model(seed=5, scale=4.0, k=1)
    src = random_sources(32, vocab=VOCAB, seed=7)
    greedy = draft_decode(target, draft, src, SpeculativeSampling(temperature=0.0), 9, 3)
    assert torch.equal(greedy.tokens, greedy_decode(target, src, 9).tokens)
    first = draft_decode(target, draft, src, SpeculativeSampling(seed=1), 9, 3)
    again = draft_decode(target, draft, src, SpeculativeSampling(seed=1), 9, 3)
    other = draft_decode(target, draft, src, SpeculativeSampling(generator=new_generator(2)), 9, 3)
    assert torch.equal(first.tokens, again.tokens) and first.block_sizes == again.block_sizes
    assert not torch.equal(first.tokens, other.tokens)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"k": 0}, r"k must be an integer >= 1"),
        ({"eos": 3}, r"draft eos_id=3 differs from the target's 2"),
        ({"vocab": 7}, r"draft vocabulary \(7\) differs from the target's \(6\)"),
    ],
)
def test_invalid_arguments(change, message):
    target = tiny_model(k=1)
    draft = random_model(k=1, vocab=change.get("vocab", VOCAB), seed=9)
    draft.eos_id = change.get("eos", target.eos_id)
    with pytest.raises(ValueError, match=message):
        draft_decode(target, draft, SRC, Exact(), MAX_LEN, change.get("k", 3))
