"""The confidence stop (``stop_below``): blocks end before the first head that is unsure of its token."""

import pytest
import torch

from lightning_bpd.decoding import (
    Exact,
    MinBlock,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    parse_criterion,
)
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.inference import build_runtime
from tests.models import pick_eos, random_model, random_sources

MAX_LEN = 24


def spread_chain(model, seed: int) -> None:
    """Chains far from p_1, so that heads are sure of some tokens and unsure of others."""
    with torch.no_grad():
        for cell in model.head.cells:
            cell.out.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize("criterion", [Exact(), TopK(2), MinBlock(2)], ids=lambda c: c.name)
@pytest.mark.parametrize("stop_below", [0.05, 0.2, 0.5])
def test_fast_decoder_equals_reference_with_a_confidence_stop(head_type, criterion, stop_below):
    model = random_model(k=5, seed=31, head_type=head_type)
    if head_type != "paper":
        spread_chain(model, 31)
    src = random_sources(6, seed=31)
    pick_eos(model, src, MAX_LEN)
    fast = blockwise_decode(model, src, criterion, MAX_LEN, stop_below=stop_below)
    slow = blockwise_decode_reference(model, src, criterion, MAX_LEN, stop_below=stop_below)
    assert torch.equal(fast.tokens, slow.tokens)
    assert fast.block_sizes == slow.block_sizes
    if isinstance(criterion, Exact):
        assert torch.equal(fast.tokens, greedy_decode(model, src, MAX_LEN).tokens)
    # a row's output does not depend on the rows decoded beside it
    one = [blockwise_decode(model, row[None], criterion, MAX_LEN, stop_below=stop_below) for row in src]
    assert [o.sequences()[0] for o in one] == fast.sequences()


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_the_stop_shortens_blocks_and_costs_no_exactness(head_type):
    """A high threshold stops before every unsure head: fewer accepted tokens per call than without the
    stop, yet the same output; at 1 - 1e-12 no head is ever sure enough and every block is one token."""
    model = random_model(k=4, seed=32, head_type=head_type)
    if head_type != "paper":
        spread_chain(model, 32)
    src = random_sources(6, seed=32)
    pick_eos(model, src, MAX_LEN)
    greedy = greedy_decode(model, src, MAX_LEN)
    free = blockwise_decode(model, src, Exact(), MAX_LEN)
    never = blockwise_decode(model, src, Exact(), MAX_LEN, stop_below=1 - 1e-12)
    assert torch.equal(never.tokens, greedy.tokens) and torch.equal(free.tokens, greedy.tokens)
    assert free.mean_accepted_block_size > 1.0
    assert all(size == 1 for row in never.block_sizes for size in row)


class CountingModel:
    """Forwards to a model; records the width of every decoder call and counts chain links."""

    def __init__(self, model) -> None:
        self.model, self.widths, self.links = model, [], 0

    def __getattr__(self, name):
        return getattr(self.model, name)

    def decode_step(self, tokens, context, cache):
        self.widths.append(tokens.shape[1])
        return self.model.decode_step(tokens, context, cache)

    def chain_draft(self, *args, **kwargs):
        self.links += 1
        return self.model.chain_draft(*args, **kwargs)

    def chain_drafts(self, h, first, k, source=None):  # the whole chain at once: k - 1 links
        out = self.model.chain_drafts(h, first, k, source)
        self.links += 0 if out is None else k - 1
        return out


def test_a_stopped_chain_computes_fewer_links_and_verifies_fewer_tokens():
    model = random_model(k=6, seed=33, head_type="chained_attn")
    spread_chain(model, 33)
    src = random_sources(1, seed=33)
    pick_eos(model, src, MAX_LEN)
    full, stopped = CountingModel(build_runtime(model)), CountingModel(build_runtime(model))
    a = blockwise_decode(full, src, Exact(), MAX_LEN)
    b = blockwise_decode(stopped, src, Exact(), MAX_LEN, stop_below=0.5)
    assert a.sequences() == b.sequences()
    assert set(full.widths[1:]) == {6} and max(stopped.widths[1:]) <= 6 and min(stopped.widths[1:]) < 6
    assert stopped.links < full.links


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"stop_below": 0.0}, "must lie in"), ({"stop_below": 1.5}, "must lie in"),
])
def test_bad_thresholds_are_refused(kwargs, message):
    model = random_model(k=3, seed=34)
    with pytest.raises(ValueError, match=message):
        blockwise_decode(model, random_sources(2, seed=34), Exact(), MAX_LEN, **kwargs)


def test_methods_take_the_stop_for_deterministic_rules_only():
    model = random_model(k=3, seed=35)
    assert make_method("exact", parse_criterion, model, stop_below=0.3).stop_below == 0.3
    assert make_method("greedy", parse_criterion, model, stop_below=0.3).stop_below is None
    assert make_method("sample_t1", parse_criterion, model, stop_below=0.3).stop_below is None
    with pytest.raises(ValueError, match="fixed-shape"):
        make_method("exact", parse_criterion, model, fixed_shape=True, stop_below=0.3)
