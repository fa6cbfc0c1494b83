"""The target as the one loop reads it (issue 60 item 1): a protocol of at most 10 members, the view that offers it
over every base, and the loop on a stub that implements only it (and the heads network) decoding greedy's tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from lightning_bpd.decoding import Exact, decode, greedy_decode
from lightning_bpd.decoding.proposers import DynamicHeadTree, Heads, HeadTree, PromptLookup
from lightning_bpd.decoding.protocol import HeadsNetwork
from lightning_bpd.decoding.target import Features, Target, TargetRules, TargetSpec, TargetView, target_of
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree
from tests.models import StubModel, pick_eos, random_model, random_sources, stub_sources

NARROW = {"spec", "rules", "prefill", "new_cache", "verify", "logits_first", "argmax_first", "embed_tokens"}


def members(protocol: type) -> set[str]:
    """The members a protocol declares: its annotated attributes and its methods (its own, not Protocol's)."""
    own = {name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_")}
    return own | set(protocol.__annotations__)


def test_the_target_has_at_most_ten_members():
    assert members(Target) == NARROW
    assert len(members(Target)) <= 10


class NarrowTarget:
    """Implements the :class:`Target` members and the :class:`HeadsNetwork` ones, nothing else (``__slots__``: no
    other attribute can be read or set), over a model kept out of reach of the loop (``_wide``, read only here)."""

    __slots__ = ("_wide", "calls", "chained_heads", "k", "rules", "spec")

    draft_tokens = draft_ranks = restrict_draft = chain_source = chain_draft = chain_drafts = chain_ranks = None

    def __init__(self, wide: Any) -> None:
        self._wide, self.k, self.chained_heads, self.calls = wide, wide.k, False, 0
        self.spec = TargetSpec(wide.pad_id, wide.bos_id, wide.eos_id, wide.vocab_size, trees=True)
        self.rules = TargetRules()

    def prefill(self, src: Tensor, layers: tuple[int, ...] = ()) -> tuple[Any, Features | None]:
        assert not layers
        return self._wide.encode(src), None

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> Any:
        return self._wide.new_cache(batch_size, capacity, extra_slots)

    def verify(self, tokens: Tensor, context: Any, cache: Any, tree: tuple[Tensor, Tensor] | None = None,
               layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        assert not layers
        self.calls += 1
        if tree is None:
            return self._wide.decode_step(tokens, context, cache), None  # (B, T, D)
        return self._wide.tree_pass(tokens, *tree, context, cache), None  # (B, N, D)

    def logits_first(self, h: Tensor) -> Tensor:
        return self._wide.logits_first(h)

    def argmax_first(self, h: Tensor) -> Tensor:
        return self.logits_first(h).argmax(dim=-1)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self._wide.embed_tokens(tokens)

    def logits_heads(self, h: Tensor, heads: Any = None, prev_tokens: Tensor | None = None,
                     source: Any = None) -> Tensor:
        return self._wide.logits_heads(h, heads)

    def chain_step(self, z: Tensor, token: Tensor, i: int, source: Any = None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


def implements(cls: type, protocol: type) -> bool:
    return all(hasattr(cls, name) or name in cls.__slots__ for name in members(protocol))


@pytest.mark.parametrize("proposer", [Heads(), PromptLookup(2, 4), HeadTree(Tree.path(3)),
                                      HeadTree(Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])),
                                      DynamicHeadTree(DynamicTree(nodes=6, depth=3, width=2))],
                         ids=["heads", "prompt-lookup", "path-tree", "tree", "dynamic-tree"])
def test_the_loop_on_a_target_of_the_narrow_protocol_alone_decodes_greedys_tokens(proposer):
    assert implements(NarrowTarget, Target) and implements(NarrowTarget, HeadsNetwork)
    assert set(NarrowTarget.__slots__) - {"_wide", "calls"} <= members(Target) | members(HeadsNetwork)
    model, src, max_len = random_model(k=4, seed=2), random_sources(6, seed=4), 16
    pick_eos(model, src, max_len)
    narrow = NarrowTarget(model)
    assert target_of(narrow) is narrow
    out = decode(narrow, src, Exact(), proposer, max_len=max_len)
    want = greedy_decode(model, src, max_len)
    assert out.sequences() == want.sequences()
    assert narrow.calls == out.model_calls


def test_the_view_offers_the_narrow_members_over_a_base():
    stub = StubModel([[5, 6, 7], [8, 9]], k=2)  # no optional member offered
    view = target_of(stub)
    assert isinstance(view, TargetView) and target_of(view) is view
    assert view.spec == TargetSpec(stub.pad_id, stub.bos_id, stub.eos_id, None)
    assert view.rules == TargetRules()
    src = stub_sources(2)
    context, features = view.prefill(src)
    assert features is None
    cache = view.new_cache(2, capacity=6)
    hidden, layers = view.verify(torch.full((2, 1), stub.bos_id), context, cache)
    assert layers is None and view.argmax_first(hidden[:, -1]).tolist() == [5, 8]  # the argmax of p_1
    with pytest.raises(ValueError, match="no tree verify pass"):
        view.verify(torch.zeros(2, 2, dtype=torch.long), context, cache, (torch.zeros(2), torch.eye(2).bool()))
    model = random_model(k=2, seed=1)
    assert target_of(model).spec.trees and not target_of(model).spec.layers
