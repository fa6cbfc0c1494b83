"""Dynamic trees (EAGLE-2): per row and per iteration, the tree's nodes chosen by the heads' own confidence. Torch only.

A static :class:`~lightning_bpd.decoding.trees.tree.Tree` verifies the same ranks at every iteration. A
:class:`DynamicTree` of ``nodes`` nodes, ``depth`` heads deep and ``width`` children per node instead grows, for each
row at each iteration, the ``nodes`` candidates of highest *confidence*, the product along its path of each token's
probability under the head that proposed it (parallel heads: head d at the last accepted position; chained heads:
the node's parent's own link). A probability is at most 1, so a node is never more confident than its parent, and the
top ``nodes`` of the whole ``width``-ary tree are found depth by depth (EAGLE-2's expand and rerank): at depth d only
the children of depth d - 1's kept nodes compete, and the ``nodes`` most confident stay; the tree is the ``nodes``
most confident of all kept ones (ties to the shallower, then to the earlier candidate, so a parent always precedes
its child). Nodes are ordered by depth (ancestors first); each row has its own parents, depths, ancestor mask and
root-to-node table (:class:`~lightning_bpd.decoding.trees.rows.RowTrees`), and the verify pass (``decode_tree``) takes
them per row.

Exact only: node j passes when its token is greedy's after its parent, and the deepest accepted node wins (with
exact acceptance the accepted path is unique, since siblings hold different tokens). So the output is greedy's.
:func:`~lightning_bpd.decoding.reference.dynamic.dynamic_tree_reference` builds each row's tree by enumerating the
whole ``width``-ary tree through the uncached decoder and checks every candidate path on its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.candidates import RowTree
from lightning_bpd.decoding.proposers.base import Proposer, opening_token
from lightning_bpd.decoding.protocol import BlockwiseModel, Source, resolve_k, restricted
from lightning_bpd.decoding.state import DecodeState, Features
from lightning_bpd.decoding.target import target_of
from lightning_bpd.decoding.trees.rows import RowTrees
from lightning_bpd.decoding.trees.tree import DynamicTree
from lightning_bpd.nn.argmax import top_ranks


@dataclass(frozen=True)
class DynamicHeadTree(Proposer):
    """The heads grow ``spec`` (a :class:`~lightning_bpd.decoding.trees.tree.DynamicTree`) per row at every iteration;
    exact acceptance only (``k``: the heads used, default all)."""

    spec: DynamicTree
    k: int | None = None

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.spec.depth + 1

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.spec.size - self.spec.depth - 1

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        check_dynamic_args(model, criterion, self.spec, self.k)
        return criterion

    def propose(self, state: DecodeState, features: Features) -> RowTree:
        """The heads read the last hidden state ``features.last`` (b, D)."""
        first = opening_token(state, features)
        return RowTree(grow(state.heads, self.spec, features.last, first, state.chain_source()))


def grow(model: BlockwiseModel, spec: DynamicTree, h: Tensor, first: Tensor, source: Source | None) -> RowTrees:
    """Each row's tree at the hidden state h (b, D) of its last accepted position, rooted at greedy's token
    ``first`` (b,): depth by depth, the children (each node's ``width`` most likely tokens under its head) of the
    previous depth's kept nodes, the ``nodes`` most confident kept; then the ``nodes`` most confident of all."""
    b = h.shape[0]
    zero = first.new_zeros(b, 1)
    front = zero  # (b, m): the kept nodes of the last depth, as candidate indices
    front_tokens, front_scores, states = first[:, None], h.new_zeros(b, 1).float(), h[:, None]  # (b, m) x2, (b, m, D)
    tokens, scores, depths, parents = [front_tokens], [front_scores], [zero], [zero]
    count = 1
    if not model.chained_heads:
        logits = restricted(model, model.logits_heads(h, range(1, spec.depth + 1)))  # (b, depth, V)
        top = top_ranks(logits, spec.width)  # (b, depth, W)
        logp = log_probs(logits).gather(-1, top)  # (b, depth, W)
    for d in range(1, spec.depth + 1):
        m = front.shape[1]
        if model.chained_heads:
            z, link = model.chain_step(states.reshape(b * m, -1), front_tokens.reshape(b * m), d,
                                       repeat_rows(source, b, m, h.device))  # (b * m, D), (b * m, V)
            link = restricted(model, link)
            kids = top_ranks(link, spec.width)  # (b * m, W)
            kid_logp = log_probs(link).gather(-1, kids).view(b, m, -1)
            kids, states = kids.view(b, m, -1), z.view(b, m, -1)
        else:
            kids, kid_logp = top[:, d - 1, None, :].expand(b, m, -1), logp[:, d - 1, None, :].expand(b, m, -1)
        score = (front_scores[:, :, None] + kid_logp).reshape(b, -1)  # (b, m * W): candidates by parent, then rank
        keep = score.sort(dim=1, descending=True, stable=True).indices[:, : spec.nodes]  # (b, m')
        parent = keep // spec.width  # (b, m'): the position in the front
        front_tokens = kids.reshape(b, -1).gather(1, keep)
        front_scores = score.gather(1, keep)
        if model.chained_heads:
            states = states.gather(1, parent[:, :, None].expand(-1, -1, states.shape[-1]))
        tokens.append(front_tokens)
        scores.append(front_scores)
        depths.append(torch.full_like(keep, d))
        parents.append(front.gather(1, parent))
        front = count + torch.arange(keep.shape[1], device=h.device).expand(b, -1)
        count += keep.shape[1]
    return select(torch.cat(tokens, 1), torch.cat(scores, 1), torch.cat(depths, 1), torch.cat(parents, 1), spec)


def log_probs(logits: Tensor) -> Tensor:
    """log-softmax over the vocabulary, in at least float32."""
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def select(tokens: Tensor, scores: Tensor, depths: Tensor, parents: Tensor, spec: DynamicTree) -> RowTrees:
    """The root and the ``spec.nodes`` most confident of the candidates 1.. (b, M) (ties to the earlier one, so a
    parent comes before its child), in candidate order (by depth), with parents renumbered among them."""
    b, count = tokens.shape
    order = scores[:, 1:].sort(dim=1, descending=True, stable=True).indices[:, : spec.nodes] + 1  # (b, n)
    chosen = torch.cat([torch.zeros_like(order[:, :1]), order.sort(dim=1).values], dim=1)  # (b, N): the root first
    position = torch.full((b, count), -1, dtype=torch.long, device=tokens.device)
    position.scatter_(1, chosen, torch.arange(chosen.shape[1], device=tokens.device).expand(b, -1))
    parent = position.gather(1, parents.gather(1, chosen))  # (b, N): the root's parent is the root
    return RowTrees.of(tokens.gather(1, chosen), depths.gather(1, chosen), parent, spec.depth)


def repeat_rows(source: Source | None, b: int, m: int, device: torch.device) -> Source | None:
    """The chained heads' source of each of b rows, m times over (row-major), as ``(b * m, ...)``."""
    if source is None or m == 1:
        return source
    return source.take(torch.arange(b, device=device).repeat_interleave(m))


def check_dynamic_args(model: BlockwiseModel, criterion: Criterion, spec: DynamicTree, k: int | None) -> None:
    """ValueError, in one line, where this dynamic tree cannot decode with this model and rule."""
    exact = isinstance(criterion, Exact)
    if not exact:  # the accepted path is unique only under exact acceptance
        raise ValueError(f"dynamic trees take exact acceptance, not {criterion.name}")
    if spec.depth > resolve_k(model, k) - 1:
        raise ValueError(f"a dynamic tree {spec.depth} deep needs k >= {spec.depth + 1} heads, decoding with "
                         f"k={resolve_k(model, k)}")
    if not target_of(model).spec.trees:
        raise ValueError(f"{type(model).__name__} has no tree verify pass (decode_tree): decode it with tree=None")
