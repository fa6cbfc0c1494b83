"""The tree verify pass of our Transformer: each node's hidden state is the uncached pass over its own path, and the
cache keeps the accepted path's entries."""

import pytest
import torch

from lightning_bpd.decoding import Tree
from lightning_bpd.nn.attention import cached_span, tree_span
from lightning_bpd.nn.kv_cache import KVCache
from tests.models import assert_close_to_rounding, random_model, random_sources, scramble_chain

TREE = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


def ragged_cache(model, context, prefixes: torch.Tensor, lengths: list[int]):
    """A cache holding prefixes[b, :lengths[b]] of each row (a longer write cropped back)."""
    cache = model.new_cache(prefixes.shape[0], capacity=32)
    model.decode_step(prefixes, context, cache)
    cache.crop(torch.tensor(lengths))
    return cache


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_every_nodes_hidden_state_is_the_uncached_pass_over_its_own_path(head_type):
    model = random_model(k=4, seed=3, head_type=head_type)
    src = random_sources(3, seed=3)
    context = model.encode(src)
    g = torch.Generator().manual_seed(0)
    prefixes = torch.randint(3, 16, (3, 6), generator=g)
    prefixes[:, 0] = model.bos_id
    lengths = [6, 2, 4]
    cache = ragged_cache(model, context, prefixes, lengths)
    tokens = torch.randint(3, 16, (3, TREE.size), generator=g)
    hidden = model.decode_tree(tokens, TREE.table("depths"), TREE.ancestors(), context, cache)  # (3, N, D)
    assert cache.lengths.tolist() == [n + TREE.size for n in lengths]
    for b, n in enumerate(lengths):
        for i in range(TREE.size):
            path = tokens[b, TREE.root_path(i)]
            full = model.decode_full(torch.cat([prefixes[b, :n], path])[None], context.select(torch.tensor([b])))
            assert_close_to_rounding(hidden[b, i], full[0, -1])


def test_keeping_the_accepted_path_then_stepping_on_equals_the_uncached_pass():
    model = random_model(k=4, seed=4)
    scramble_chain(model)
    src = random_sources(2, seed=4)
    context = model.encode(src)
    prefixes = torch.tensor([[1, 5, 6, 7], [1, 8, 9, 10]])
    cache = ragged_cache(model, context, prefixes, [4, 2])
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10], [10, 11, 12, 13, 14, 15, 3, 4]])  # (2, N = 8)
    model.decode_tree(tokens, TREE.table("depths"), TREE.ancestors(), context, cache)
    accepted = torch.tensor([7, 6])  # row 0: the path to node 7 (0, 1, 4, 7); row 1: to node 6 (0, 2, 6)
    path = TREE.path_table()[accepted]
    cache.keep_path(path, torch.tensor([4, 3]), TREE.size)
    assert cache.lengths.tolist() == [8, 5]
    nxt = torch.tensor([[11], [12]])
    h = model.decode_step(nxt, context, cache)[:, -1]  # (2, D)
    rows = [[1, 5, 6, 7, 3, 4, 7, 10, 11], [1, 8, 10, 12, 3, 12]]
    for b, row in enumerate(rows):
        full = model.decode_full(torch.tensor([row]), context.select(torch.tensor([b])))
        assert_close_to_rounding(h[b], full[0, -1])


def test_the_path_mask_is_the_causal_mask():
    cache = KVCache(1, 3, 20, 1, 1)
    cache.advance(2)
    cache.crop(torch.tensor([2, 0, 1]))
    positions = cache.positions(4)
    span, mask = tree_span(positions, Tree.path(3).ancestors(), cache)
    causal_span, causal = cached_span(positions, None, cache)
    assert span == causal_span and torch.equal(mask, causal)
    span, mask = tree_span(positions, TREE.ancestors()[:4, :4], cache)  # nodes 0..3: node 3, (2,), is the root's
    assert span == (0, 6)
    assert mask[0, 0, 3].tolist() == [True, True, True, False, False, True]  # prefix 2, root, node 3 itself
    assert mask[1, 0, 3].tolist() == [True, False, False, True, False, False]  # no prefix
    assert mask[2, 0, 2].tolist() == [True, True, False, True, False, False]  # node 2, (1,), at slot 3


def test_keep_path_moves_each_rows_nodes_up_and_drops_the_rest():
    cache = KVCache(2, 2, 12, 1, 1)
    cache.advance(7)
    cache.crop(torch.tensor([7, 5]))
    cache.k[:, :, :, 0, 0] = torch.arange(12.0)
    cache.v[:, :, :, 0, 0] = -torch.arange(12.0)
    cache.keep_path(torch.tensor([[0, 2, 3], [0, 1, 1]]), torch.tensor([3, 2]), width=4)
    assert cache.lengths.tolist() == [6, 3]
    assert cache.k[0, 0, :6, 0, 0].tolist() == [0, 1, 2, 3, 5, 6]  # row 0: prefix 3, nodes 0, 2, 3
    assert cache.v[1, 0, 3:6, 0, 0].tolist() == [-3, -5, -6]
    assert cache.k[1, 1, :3, 0, 0].tolist() == [0, 1, 2]  # row 1: prefix 1, nodes 0, 1
    with pytest.raises(ValueError, match="keep_path takes a plain KV cache"):
        KVCache(1, 1, 64, 1, 1, ring=8).keep_path(torch.zeros(1, 1, dtype=torch.long), torch.ones(1), 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_lean_tree_pass_is_the_module_pass_bitwise(dtype):
    model = random_model(k=4, vocab=30, seed=8).to(dtype)
    src = random_sources(4, vocab=30, seed=8)
    g = torch.Generator().manual_seed(8)
    prefixes = torch.randint(3, 30, (4, 5), generator=g)
    tokens = torch.randint(3, 30, (4, TREE.size), generator=g)
    outs = []
    for lean in (True, False):
        model.use_lean_steps(lean)
        with torch.no_grad():
            context = model.encode(src)
            cache = ragged_cache(model, context, prefixes, [5, 3, 4, 5])
            assert model.decoder.lean_applies(tokens.new_zeros((), dtype=dtype), cache) == lean
            outs.append(model.decode_tree(tokens, TREE.table("depths"), TREE.ancestors(), context, cache))
    model.use_lean_steps(True)
    assert torch.equal(outs[0], outs[1])
