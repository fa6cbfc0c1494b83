import math

import pytest
import torch

from lightning_bpd.decoding import (
    Distance,
    Exact,
    MinBlock,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    parse_criterion,
)
from tests.models import EOS, StubModel, pick_eos, random_model, random_sources, stub_sources

MAX_LEN = 24


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_exact_blockwise_equals_greedy(k, seed):
    model = random_model(k=k, seed=seed)
    src = random_sources(8, seed=seed)
    pick_eos(model, src, MAX_LEN)
    greedy = greedy_decode(model, src, MAX_LEN)
    block = blockwise_decode(model, src, Exact(), MAX_LEN)
    assert torch.equal(block.tokens, greedy.tokens)
    assert torch.equal(block.lengths, greedy.lengths)
    assert all(sum(b) == n for b, n in zip(block.block_sizes, block.lengths.tolist()))
    assert all(1 <= s <= k for b in block.block_sizes for s in b)


def test_random_cases_cover_eos_inside_a_block_and_max_len():
    model = random_model(k=4, seed=1)
    src = random_sources(8, seed=1)
    pick_eos(model, src, MAX_LEN)
    out = blockwise_decode(model, src, Exact(), MAX_LEN)
    assert (out.lengths == MAX_LEN).any() and (out.lengths < MAX_LEN).any()
    assert out.mean_accepted_block_size > 1.2  # the heads are right some of the time


@pytest.mark.parametrize("lazy", [False, True], ids=["full", "lazy"])
@pytest.mark.parametrize("criterion", [Exact(), TopK(2), TopK(3), Distance(2), MinBlock(2), MinBlock(2, TopK(2))],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("k", [2, 4, 8])
def test_fast_decoder_equals_reference_for_every_rule(criterion, k, lazy):
    model = random_model(k=k, seed=k)
    src = random_sources(6, seed=k)
    pick_eos(model, src, MAX_LEN)
    fast = blockwise_decode(model, src, criterion, MAX_LEN, lazy=lazy)
    slow = blockwise_decode_reference(model, src, criterion, MAX_LEN)
    assert torch.equal(fast.tokens, slow.tokens)
    assert fast.block_sizes == slow.block_sizes
    assert torch.equal(fast.iterations, slow.iterations)


def test_local_window_model_blockwise_equals_greedy():
    model = random_model(k=4, seed=5, window=3)
    src = random_sources(5, seed=5)
    pick_eos(model, src, MAX_LEN)
    assert torch.equal(blockwise_decode(model, src, max_len=MAX_LEN).tokens, greedy_decode(model, src, MAX_LEN).tokens)


def test_fewer_heads_than_the_model_has():
    model = random_model(k=8, seed=2)
    src = random_sources(4, seed=2)
    out = blockwise_decode(model, src, max_len=MAX_LEN, k=3)
    assert max(max(b) for b in out.block_sizes) <= 3
    assert torch.equal(out.tokens, greedy_decode(model, src, MAX_LEN).tokens)


# ---- stub models with hand-written logits -----------------------------------------------------

TARGET = [5 + i for i in range(17)] + [EOS]  # 18 tokens ending in EOS


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_always_right_heads_take_ceil_n_over_k_iterations(k):
    model = StubModel([TARGET], k=k)
    out = blockwise_decode(model, stub_sources(1), max_len=50)
    assert out.sequences() == [TARGET]
    assert out.iterations.item() == math.ceil(len(TARGET) / k)
    assert out.model_calls == out.iterations.item() + 1 == model.calls


@pytest.mark.parametrize("k", [2, 4, 8])
def test_never_right_heads_take_n_iterations(k):
    model = StubModel([TARGET], k=k, right=lambda i, t: False)
    out = blockwise_decode(model, stub_sources(1), max_len=50)
    assert out.sequences() == [TARGET]
    assert out.iterations.item() == len(TARGET)
    assert out.block_sizes == [[1] * len(TARGET)]
    assert out.model_calls == len(TARGET) + 1


def test_partial_acceptance_and_rows_finishing_at_different_times():
    # head 3 (i = 2) is wrong at every position: blocks of 2 under exact acceptance
    targets = [[5, 6, 7, 8, 9, EOS], [10, 11, EOS], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
    model = StubModel(targets, k=4, right=lambda i, t: i < 2)
    out = blockwise_decode(model, stub_sources(3), max_len=8)
    assert out.sequences() == [targets[0], targets[1], targets[2][:8]]
    assert out.block_sizes == [[2, 2, 2], [2, 1], [2, 2, 2, 2]]


def test_eos_inside_a_block_ends_the_row():
    model = StubModel([[5, EOS, 6, 7, 8, 9]], k=4)  # heads propose tokens past EOS
    out = blockwise_decode(model, stub_sources(1), max_len=20)
    assert out.sequences() == [[5, EOS]]
    assert out.block_sizes == [[2]]
    assert out.tokens.shape[1] == 2


def test_max_len_cuts_the_last_block():
    model = StubModel([TARGET], k=4)
    out = blockwise_decode(model, stub_sources(1), max_len=6)
    assert out.sequences() == [TARGET[:6]]
    assert out.block_sizes == [[4, 2]]


def test_topk_accepts_the_runner_up_and_exact_does_not():
    # heads 2+ propose the runner-up of p_1: the second most likely token
    wrong = lambda tok: 3 + (tok - 3 + 1) % 200
    model = StubModel([TARGET], k=4, right=lambda i, t: False, wrong=wrong)
    assert blockwise_decode(model, stub_sources(1), Exact(), 50).iterations.item() == len(TARGET)
    top2 = blockwise_decode(model, stub_sources(1), TopK(2), 50)
    assert top2.block_sizes[0][0] == 4  # runner-ups accepted: no longer greedy's output
    assert top2.sequences()[0][:4] == [5, 7, 8, 9]


@pytest.mark.parametrize("eps, block", [(0, 1), (1, 4), (3, 4)])
def test_distance_accepts_within_eps(eps, block):
    # wrong proposals are off by exactly one intensity
    model = StubModel([list(range(10, 40))], k=4, right=lambda i, t: False, wrong=lambda tok: tok + 1)
    out = blockwise_decode(model, stub_sources(1), Distance(eps), max_len=12)
    assert out.block_sizes[0][0] == block


def test_min_block_accepts_at_least_l():
    model = StubModel([TARGET], k=4, right=lambda i, t: False)
    out = blockwise_decode(model, stub_sources(1), MinBlock(3), max_len=12)
    assert out.block_sizes == [[3, 3, 3, 3]]
    assert out.model_calls == 5


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"k": 0}, r"k must be an integer in \[1, 4\]"),
        ({"k": 5}, r"k must be an integer in \[1, 4\]"),
        ({"max_len": 0}, r"max_len must be an integer >= 1"),
        ({"criterion": MinBlock(5)}, r"MinBlock l must lie in \[1, k\] = \[1, 4\]"),
    ],
)
def test_invalid_arguments(kwargs, message):
    model = random_model(k=4)
    with pytest.raises(ValueError, match=message):
        blockwise_decode(model, random_sources(2), **{"max_len": 5, **kwargs})


def test_empty_source_is_refused():
    with pytest.raises(ValueError, match="empty source"):
        blockwise_decode(random_model(k=2), torch.tensor([[0, 0]]), max_len=5)


@pytest.mark.parametrize("rule", ["exact", "top2", "eps3"])
def test_lazy_verification_gives_the_full_verdict(rule):
    from lightning_bpd.decoding.acceptance import Block
    from lightning_bpd.decoding.verify import verify, verify_lazily

    model = random_model(k=4, seed=5)
    criterion = parse_criterion(rule)
    src = random_sources(16, seed=5)
    hidden = model.decode_full(torch.randint(3, 16, (16, 5)), model.encode(src))  # (16, 5, D)
    logits = model.logits_first(hidden[:, :-1])  # (16, 4, V)
    tokens = torch.cat([torch.full((16, 1), 7), logits.argmax(-1)], dim=1)  # (16, 5): token j+1 = argmax at j
    flip = torch.rand(16, 5, generator=torch.Generator().manual_seed(0)) < 0.3
    tokens = torch.where(flip, (tokens + 8) % 16, tokens)  # some checks fail (8 apart: outside eps 3 too)
    accepted, next_first = verify_lazily(model, criterion, tokens, hidden)
    assert torch.equal(accepted, criterion.accept(tokens, logits))
    assert 1 in accepted.tolist() and 5 in accepted.tolist() and len(set(accepted.tolist())) >= 3
    every = model.logits_first(hidden)  # (16, 5, V): p_1 after each of the 5 tokens
    for row, n in enumerate(accepted.tolist()):  # next block opens with greedy's token after the accepted prefix
        assert int(next_first[row]) == int(every[row, n - 1].argmax())
    # the all-positions verification (no host reads) gives the same verdict and next tokens
    full_accepted, full_first = verify(model, criterion, Block(tokens), hidden)
    assert torch.equal(full_accepted, accepted) and torch.equal(full_first, next_first)


# ---- chained heads (head i sees the token proposed for head i-1) -------------------------------

@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
@pytest.mark.parametrize("criterion", [Exact(), TopK(2), Distance(2), MinBlock(2)], ids=lambda c: c.name)
@pytest.mark.parametrize("k", [2, 4, 8])
def test_chained_heads_fast_decoder_equals_reference(criterion, k, head_type):
    model = random_model(k=k, seed=k + 10, head_type=head_type)
    with torch.no_grad():  # chains that matter: heads far from p_1
        for cell in model.head.cells:
            cell.out.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(k))
    src = random_sources(6, seed=k)
    pick_eos(model, src, MAX_LEN)
    fast = blockwise_decode(model, src, criterion, MAX_LEN)
    slow = blockwise_decode_reference(model, src, criterion, MAX_LEN)
    assert torch.equal(fast.tokens, slow.tokens)
    assert fast.block_sizes == slow.block_sizes
    if isinstance(criterion, Exact):
        assert torch.equal(fast.tokens, greedy_decode(model, src, MAX_LEN).tokens)


def test_chained_heads_that_copy_greedy_accept_whole_blocks():
    """A chain that is always right (head i's state is the decoder state after y_1..y_{i-1}) takes
    ceil(n / k) iterations: built from the StubModel, whose state is (position, row)."""

    class ChainedStub(StubModel):
        chained_heads = True

        def chain_step(self, z, token, i, source=None):
            z = z + torch.tensor([1.0, 0.0], dtype=z.dtype)  # one position further on
            return z, self.logits_first(z)

    model = ChainedStub([TARGET], k=4, right=lambda i, t: False)  # the paper-style heads are always wrong
    out = blockwise_decode(model, stub_sources(1), max_len=50)
    assert out.sequences() == [TARGET]
    assert out.iterations.item() == math.ceil(len(TARGET) / 4)


# ---- a draft vocabulary: the heads propose only the listed tokens --------------------------------

@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize("criterion", [Exact(), TopK(2), MinBlock(2)], ids=lambda c: c.name)
def test_draft_vocabulary_fast_decoder_equals_reference(criterion, head_type):
    model = random_model(k=4, seed=21, head_type=head_type)
    src = random_sources(6, seed=21)
    pick_eos(model, src, MAX_LEN)
    greedy = greedy_decode(model, src, MAX_LEN)
    used = sorted(set(greedy.tokens.flatten().tolist()) - {0})
    model.set_draft_ids(torch.tensor((used + [t for t in range(16) if t not in used])[:10]))
    fast = blockwise_decode(model, src, criterion, MAX_LEN)
    slow = blockwise_decode_reference(model, src, criterion, MAX_LEN)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes
    if isinstance(criterion, Exact):
        assert torch.equal(fast.tokens, greedy.tokens)


def test_a_draft_vocabulary_without_greedy_tokens_accepts_one_token_per_iteration_and_stays_exact():
    model = random_model(k=4, seed=22)
    src = random_sources(5, seed=22)
    pick_eos(model, src, MAX_LEN)
    greedy = greedy_decode(model, src, MAX_LEN)
    unused = [t for t in range(16) if t not in set(greedy.tokens.flatten().tolist())]
    assert unused
    model.set_draft_ids(torch.tensor(unused))
    out = blockwise_decode(model, src, Exact(), MAX_LEN)
    assert torch.equal(out.tokens, greedy.tokens)
    assert all(size == 1 for row in out.block_sizes for size in row)  # every proposal is wrong
