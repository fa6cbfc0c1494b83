import math

import pytest
import torch

from lightning_bpd.decoding import greedy_decode
from lightning_bpd.decoding.beam import beam_search
from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.decoding.reference.beam import beam_search_reference
from lightning_bpd.nn.kv_cache import KVCache
from tests.models import BOS, EOS, PAD, StubContext, Wrapped, pick_eos, random_model, random_sources

pytestmark = pytest.mark.usefixtures("one_thread")


def lp(length: int, alpha: float) -> float:
    """The length penalty of Wu et al. (2016), written out independently of the module."""
    return ((5 + length) / 6) ** alpha


class BigramStub(OptionalCapabilities):
    """A k = 1 model whose next-token distribution depends only on the previous token (BOS first).

    ``table[prev] = {token: probability}``; unlisted tokens get probability 1e-12 and an unlisted
    ``prev`` ends at once (EOS with probability 1). The hidden state of a position is its input token.
    """

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 12) -> None:
        self.k, self.pad_id, self.bos_id, self.eos_id = 1, PAD, BOS, EOS
        probs = torch.full((vocab, vocab), 1e-12, dtype=torch.float64)  # (prev, next)
        probs[:, EOS] = 1.0
        for prev, row in table.items():
            probs[prev, EOS] = 1e-12
            for tok, p in row.items():
                probs[prev, tok] = p
        self.log_table = probs.log()

    def encode(self, src):
        return StubContext(torch.arange(src.shape[0]))

    def new_cache(self, batch_size, capacity, extra_slots=0):
        return KVCache(1, batch_size, capacity + extra_slots, 1, 1, dtype=torch.float64)

    def decode_step(self, tokens, context, cache):
        assert tokens.shape[0] == context.rows.shape[0] == cache.batch_size
        cache.check_room(tokens.shape[1])
        cache.advance(tokens.shape[1])
        return tokens[..., None].double()  # (B, T, 1)

    def decode_full(self, tgt_in, context):
        return tgt_in[..., None].double()

    def logits_first(self, h):
        return self.log_table[h[..., 0].long()]  # (..., V)

    def logits_heads(self, h, heads=None):
        return self.logits_first(h)[..., None, :]

    def log_prob(self, seq: list[int]) -> float:
        """Raw score (sum of log p_1) of a generated sequence."""
        logp = torch.log_softmax(self.log_table, dim=-1)
        return sum(float(logp[prev, tok]) for prev, tok in zip([BOS, *seq], seq))


def sharpened(seed: int, src, max_len: int, scale: float = 20.0) -> Wrapped:
    model = random_model(k=1, seed=seed)
    pick_eos(model, src, max_len)
    return Wrapped(model, scale)


def assert_same(fast, slow, tol=1e-9):
    assert fast.sequences() == slow.sequences()
    assert torch.equal(fast.tokens, slow.tokens)
    assert torch.equal(fast.lengths, slow.lengths)
    torch.testing.assert_close(fast.scores, slow.scores, rtol=0, atol=tol)


# ---- 1. beam 1 is greedy --------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [1.0, 20.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_beam_one_without_length_penalty_equals_greedy(seed, scale):
    src = random_sources(6, seed=seed)
    model = sharpened(seed, src, 16, scale)
    greedy = greedy_decode(model, src, 16)
    beam = beam_search(model, src, 16, beam_size=1, alpha=0.0)
    assert len(set(greedy.lengths.tolist())) > 1  # rows end at different times
    assert torch.equal(beam.tokens, greedy.tokens)
    assert torch.equal(beam.lengths, greedy.lengths)
    assert beam.model_calls == greedy.model_calls == int(greedy.lengths.max())
    assert beam.block_sizes == greedy.block_sizes


def test_beam_one_without_eos_equals_greedy_for_any_alpha():
    model = random_model(k=1, seed=3)
    model.eos_id = None
    src = random_sources(5, seed=3)
    greedy = greedy_decode(model, src, 12)
    beam = beam_search(model, src, 12, beam_size=1, alpha=1.5)
    assert torch.equal(beam.tokens, greedy.tokens)
    assert beam.lengths.tolist() == [12] * 5


# ---- 2. fast equals reference -----------------------------------------------------------------------
@pytest.mark.parametrize("beam_size", [2, 4])
@pytest.mark.parametrize("seed,alpha", [(0, 0.6), (1, 0.0), (2, 1.2)])
def test_fast_beam_equals_reference(seed, alpha, beam_size):
    src = random_sources(6, seed=seed + 10)
    model = sharpened(seed, src, 14)
    fast = beam_search(model, src, 14, beam_size=beam_size, alpha=alpha)
    slow = beam_search_reference(model, src, 14, beam_size=beam_size, alpha=alpha)
    assert_same(fast, slow)
    assert len(set(fast.lengths.tolist())) >= 2  # rows end at different times, some at max_len
    assert model.batch_sizes[0] == 6 * beam_size and min(model.batch_sizes) < model.batch_sizes[0]  # sources left
    # the returned score is the normalized log-probability of the returned sequence
    for row, (seq, score) in enumerate(zip(fast.sequences(), fast.scores.tolist())):
        tgt_in = torch.tensor([[BOS, *seq[:-1]]])
        src_row = src[row : row + 1, : int((src[row] != PAD).sum())]
        with torch.no_grad():
            logp = torch.log_softmax(model.logits_first(model.decode_full(tgt_in, model.encode(src_row))), -1)[0]
        raw = float(logp[torch.arange(len(seq)), torch.tensor(seq)].sum())
        assert score == pytest.approx(raw / lp(len(seq), alpha), abs=1e-9)


def test_fast_beam_equals_reference_without_eos_and_with_window():
    model = random_model(k=1, seed=5, window=3)
    model.eos_id = None
    src = random_sources(4, seed=5)
    assert_same(beam_search(model, src, 9, 3, 0.6), beam_search_reference(model, src, 9, 3, 0.6))


def test_beam_never_scores_below_greedy_sequence():
    model = random_model(k=1, seed=7)
    src = random_sources(6, seed=7)
    pick_eos(model, src, 14)
    one = beam_search(model, src, 14, beam_size=1, alpha=0.0)
    four = beam_search(model, src, 14, beam_size=4, alpha=0.0)
    assert bool((four.scores >= one.scores - 1e-12).all())


# ---- 3. beam finds what greedy misses ---------------------------------------------------------------
def test_beam_beats_greedy_on_a_garden_path():
    # BOS -> 3 (0.6) -> {5: 0.32, 6: 0.30, 7: 0.28, EOS: 0.10}; BOS -> 4 (0.4) -> 8 (0.95) -> EOS
    table = {BOS: {3: 0.6, 4: 0.4}, 3: {5: 0.32, 6: 0.30, 7: 0.28, EOS: 0.10}, 4: {8: 0.95, 9: 0.05}}
    model = BigramStub(table)
    src = torch.tensor([[5, 6], [7, PAD]])
    greedy = greedy_decode(model, src, 6)
    assert greedy.sequences() == [[3, 5, EOS]] * 2
    beam = beam_search(model, src, 6, beam_size=2, alpha=0.6)
    assert beam.sequences() == [[4, 8, EOS]] * 2
    assert beam.scores.tolist() == pytest.approx([math.log(0.4 * 0.95) / lp(3, 0.6)] * 2, abs=1e-6)
    assert float(beam.scores[0]) > model.log_prob([3, 5, EOS]) / lp(3, 0.6)
    assert beam.model_calls == 3  # stopped by the bound, not by max_len
    assert_same(beam, beam_search_reference(model, src, 6, beam_size=2, alpha=0.6))


# ---- 4. length penalty -------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.5, 2.0])
def test_length_penalty_flips_the_winner_where_the_formula_says(alpha):
    # short: [EOS] with p = 0.52; long: [3, 4, 5, EOS] with p = 0.48 * 0.99^3 (raw score lower)
    table = {BOS: {EOS: 0.52, 3: 0.48}, 3: {4: 0.99, 6: 0.01}, 4: {5: 0.99, 6: 0.01}, 5: {EOS: 0.99, 6: 0.01}}
    model = BigramStub(table)
    short, long = [EOS], [3, 4, 5, EOS]
    raw_short, raw_long = model.log_prob(short), model.log_prob(long)
    assert raw_short > raw_long
    crossover = math.log(raw_long / raw_short) / math.log(lp(4, 1.0))  # about 0.38
    assert 0.3 < crossover < 0.5
    norm_short, norm_long = raw_short / lp(1, alpha), raw_long / lp(4, alpha)
    expected = short if norm_short > norm_long else long
    assert (expected is short) == (alpha < crossover)
    src = torch.tensor([[5]])
    out = beam_search(model, src, 8, beam_size=2, alpha=alpha)
    assert out.sequences() == [expected]
    assert float(out.scores[0]) == pytest.approx(max(norm_short, norm_long), abs=1e-9)
    assert_same(out, beam_search_reference(model, src, 8, beam_size=2, alpha=alpha))


def test_stopping_bound_uses_lp_of_max_len():
    # After step 2 the finished set {[3, EOS], [EOS]} is full and the alive [4, 5] has raw log 0.25:
    # log(0.25) / lp(2) is below the worst finished score, but log(0.25) / lp(max_len) is not, and
    # indeed its near-certain continuation [4, 5, 6, 7, 8, EOS] wins once normalized (alpha = 2).
    table = {BOS: {EOS: 0.4, 3: 0.35, 4: 0.25}, 3: {EOS: 1.0}, 4: {5: 1.0}, 5: {6: 1.0}, 6: {7: 1.0},
             7: {8: 1.0}, 8: {EOS: 1.0}}
    model = BigramStub(table)
    alpha, src = 2.0, torch.tensor([[5]])
    worst = min(math.log(0.4) / lp(1, alpha), math.log(0.35) / lp(2, alpha))
    assert math.log(0.25) / lp(2, alpha) < worst < math.log(0.25) / lp(8, alpha)
    out = beam_search(model, src, 8, beam_size=2, alpha=alpha)
    assert out.sequences() == [[4, 5, 6, 7, 8, EOS]] and out.model_calls == 6
    assert float(out.scores[0]) == pytest.approx(math.log(0.25) / lp(6, alpha), abs=1e-9)
    assert_same(out, beam_search_reference(model, src, 8, beam_size=2, alpha=alpha))
    assert beam_search(model, src, 8, beam_size=2, alpha=0.0).sequences() == [[EOS]]


def test_hypotheses_at_max_len_count_as_finished():
    table = {BOS: {3: 0.9, EOS: 0.1}, 3: {3: 0.95, EOS: 0.05}}  # the best path never stops by itself
    model = BigramStub(table)
    src = torch.tensor([[5]])
    out = beam_search(model, src, 4, beam_size=2, alpha=0.0)
    assert out.sequences() == [[3, 3, 3, 3]] and out.model_calls == 4
    assert float(out.scores[0]) == pytest.approx(math.log(0.9 * 0.95**3), abs=1e-9)
    assert_same(out, beam_search_reference(model, src, 4, beam_size=2, alpha=0.0))


# ---- 5. arguments --------------------------------------------------------------------------------------
def test_invalid_arguments_raise_value_error_naming_them():
    model = random_model(k=1)
    src = random_sources(2)
    for fn in (beam_search, beam_search_reference):
        with pytest.raises(ValueError, match=r"beam_size must be an integer >= 1"):
            fn(model, src, 5, beam_size=0)
        with pytest.raises(ValueError, match=r"beam_size"):
            fn(model, src, 5, beam_size=2.0)
        with pytest.raises(ValueError, match=r"alpha must be a finite number >= 0"):
            fn(model, src, 5, alpha=-0.1)
        with pytest.raises(ValueError, match=r"alpha"):
            fn(model, src, 5, alpha=float("nan"))
        with pytest.raises(ValueError, match=r"max_len must be an integer >= 1"):
            fn(model, src, 0)
        with pytest.raises(ValueError, match="empty source"):
            fn(model, torch.tensor([[5, 6], [0, 0]]), 4)
