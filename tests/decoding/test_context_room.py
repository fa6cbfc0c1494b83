"""Decoding up to the very end of a model's positions (``decode_room``): a verify pass holds fewer proposals (a
shallower tree) where a row's positions run out, so no live row ever feeds an input past them, and the output is
the one decoding without the bound gives; a ``max_len`` past a row's room is refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from lightning_bpd.decoding import Exact, SpeculativeSampling, TopK, blockwise_decode, greedy_decode
from lightning_bpd.decoding.reference.blockwise import blockwise_decode_reference
from lightning_bpd.decoding.reference.tree import tree_decode_reference
from lightning_bpd.decoding.trees.tree import Tree
from lightning_bpd.nn.kv_cache import KVCache
from tests.models import StubContext, TreeStub, stub_sources

TARGETS = [list(range(10, 30)), list(range(40, 60)), list(range(70, 90))]
TREE = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])


class RoomStub(TreeStub):
    """A :class:`TreeStub` whose row r holds inputs up to slot ``room[r]`` after its start token: every call checks
    that no input sits past it, and records the width of the pass."""

    def __init__(self, targets: list[list[int]], k: int, room: list[int], **kwargs) -> None:
        super().__init__(targets, k, **kwargs)
        self.room, self.widths = room, []

    def decode_room(self, src: Tensor) -> list[int]:  # type: ignore[override]
        return [self.room[int(r) - 3] for r in src[:, 0]]

    def check(self, last: Tensor, context: StubContext, width: int) -> None:
        """``last`` (B,): the slot of each row's furthest input in this pass."""
        limit = torch.tensor([self.room[r] for r in context.rows.tolist()])
        assert bool((last <= limit).all()), (last.tolist(), limit.tolist())
        self.widths.append(width)

    def decode_step(self, tokens: Tensor, context: StubContext, cache: KVCache) -> Tensor:
        self.check(cache.lengths + tokens.shape[1] - 1, context, tokens.shape[1])
        return super().decode_step(tokens, context, cache)

    def decode_tree(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: StubContext,
                    cache: KVCache) -> Tensor:
        self.check(cache.lengths + int(depths.max()), context, tokens.shape[1])
        return super().decode_tree(tokens, depths, ancestors, context, cache)


def test_verify_passes_shrink_to_the_positions_left():
    """Heads always right, k = 4, 10 new tokens: row 0 has exactly 10 positions, so the third pass holds 2 tokens
    (4 without the bound); the output and blocks are those of the unbounded model and of the reference."""
    src = stub_sources(3)
    model = RoomStub(TARGETS, k=4, room=[10, 13, 30])
    out = blockwise_decode(model, src, Exact(), 10)
    assert out.sequences() == [t[:10] for t in TARGETS]
    assert model.widths == [1, 4, 4, 2]
    free = blockwise_decode(TreeStub(TARGETS, k=4), src, Exact(), 10)
    assert out.block_sizes == free.block_sizes == [[4, 4, 2]] * 3
    slow = blockwise_decode_reference(model, src, Exact(), 10)
    assert slow.sequences() == out.sequences() and slow.block_sizes == out.block_sizes
    assert greedy_decode(model, src, 10).sequences() == out.sequences()


@pytest.mark.parametrize("criterion", [Exact(), TopK(2)])
def test_a_row_of_its_own_decodes_as_the_reference_at_every_room(criterion):
    """Batch 1, the room from max_len up to max_len + k: the same tokens and blocks as the reference, and wrong
    proposals (every third head) change nothing."""
    for room in range(7, 12):
        model = RoomStub(TARGETS[:1], k=4, room=[room], right=lambda i, t: (i + t) % 3 != 0)
        fast = blockwise_decode(model, stub_sources(1), criterion, 7)
        slow = blockwise_decode_reference(model, stub_sources(1), criterion, 7)
        assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes, room
        assert fast.sequences() == [TARGETS[0][:7]]


def test_trees_are_cut_to_the_positions_left():
    """A tree 3 deep (7 nodes): where row 0 has 2 positions left, the pass verifies the tree cut to 1 deep (3
    nodes), then its root alone; the output is greedy's and the tree reference's."""
    src = stub_sources(2)
    model = RoomStub(TARGETS, k=4, room=[10, 20])
    out = blockwise_decode(model, src, Exact(), 10, tree=TREE)
    assert out.sequences() == [t[:10] for t in TARGETS[:2]]
    assert model.widths == [1, 7, 7, 3]  # the first call on the start token, then two full trees, then the cut one
    slow = tree_decode_reference(model, src, Exact(), 10, tree=TREE)
    assert slow.sequences() == out.sequences() and slow.block_sizes == out.block_sizes
    one = RoomStub(TARGETS, k=4, room=[9], rank_of=lambda i, t, row: 1)  # greedy's token second: the rank-1 nodes
    assert blockwise_decode(one, stub_sources(1), TopK(2), 9, tree=TREE).sequences() == \
        tree_decode_reference(one, stub_sources(1), TopK(2), 9, tree=TREE).sequences()
    assert one.widths[-1] < TREE.size


def test_the_cut_tree_keeps_the_first_nodes():
    assert TREE.cut(1).paths == TREE.paths[:3] and TREE.cut(0).paths == ((),) and TREE.cut(5) is TREE
    assert TREE.cut(0).depth == 0 and TREE.cut(2).size == 6


@pytest.mark.parametrize("tree", [None, TREE])
def test_sampling_stays_within_the_room(tree):
    """Lossless sampling: the draws fit the room too (the stub's p_1 is near one-hot, so the output is greedy's)."""
    model = RoomStub(TARGETS, k=4, room=[8, 9, 12])
    out = blockwise_decode(model, stub_sources(3), SpeculativeSampling(temperature=0.3, seed=1), 8, tree=tree)
    assert out.sequences() == [t[:8] for t in TARGETS]


def test_max_len_past_a_rows_room_is_one_line():
    model = RoomStub(TARGETS, k=4, room=[12, 9, 30])
    for decode in (lambda: blockwise_decode(model, stub_sources(3), Exact(), 10),
                   lambda: greedy_decode(model, stub_sources(3), 10),
                   lambda: blockwise_decode(model, stub_sources(3), Exact(), 10, tree=TREE)):
        with pytest.raises(ValueError, match=r"^src row 1: the model's context holds 9 new tokens after it, fewer "
                                             r"than max_len=10$"):
            decode()
