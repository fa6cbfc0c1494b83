"""EAGLE-3 dynamic trees (EAGLE-2's expand and rerank, the drafter's own confidence): per row and iteration, the
``nodes`` most confident candidates of a ``width``-ary tree ``depth`` deep. Torch only.

The tree is rooted at greedy's next token ``first``, whose entry (the target's features of the last accepted
position with ``first``) goes into the drafter's cache with the positions the last verify pass accepted
(:meth:`~lightning_bpd.drafters.eagle3.proposer.Eagle3Drafting.settle`); its logits give depth 1's candidates.
Depth by depth, the last depth's expanded nodes go into the cache in one call, each seeing the committed entries,
its own ancestors' entries and itself (a tree mask), each fed its parent's output state and its own token; their
logits give the next depth's candidates (each node's ``width`` most likely tokens, confidence = the product of the
probabilities along its path), of which the ``expand`` most confident (default ``width``) are expanded in turn:
EAGLE-2's expansion, whose cost per depth is one drafter call of ``expand`` nodes, however large the tree. The tree is
the ``nodes`` most confident of all candidates (:func:`~lightning_bpd.decoding.proposers.dynamic_tree.select`; all of
them where there are fewer). With ``chain_first`` (the default) the drafter's own chain (the top child of the top
child ..., what :class:`~lightning_bpd.drafters.eagle3.proposer.Eagle3` drafts) is always expanded and always in the
tree, its ``depth`` nodes first, so a tree accepts at least what the chain of ``depth + 1`` would; the confidence
ranks the rest. The tree's entries leave the
drafter's cache once it is drafted. The loop verifies the tree in one pass of the target, with the layers the drafter
reads, and the features along the accepted path wait for the next iteration.

Exact only, as every dynamic tree: the deepest node whose path is greedy's wins, so the output is greedy's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact
from lightning_bpd.decoding.candidates import Outcome, RowTree
from lightning_bpd.decoding.proposers.base import opening_token
from lightning_bpd.decoding.proposers.dynamic_tree import log_probs, select
from lightning_bpd.decoding.protocol import BlockwiseModel
from lightning_bpd.decoding.state import DecodeState, Features
from lightning_bpd.decoding.target import target_of
from lightning_bpd.decoding.trees.rows import RowTrees
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree
from lightning_bpd.drafters.eagle3.proposer import Eagle3, Eagle3Drafting
from lightning_bpd.nn.argmax import top_ranks

DEFAULT_TREE = DynamicTree(nodes=16, depth=6, width=4)
CHAIN_TREE = Tree.path(3)  # a static tree's default: the chain of 4


def check_tree_target(drafter: Any, model: BlockwiseModel, criterion: Criterion, kind: str) -> None:
    """What every EAGLE-3 tree (``kind``: dynamic or static) needs of its target and rule: the target's features on
    a tree, exact acceptance (the accepted path is unique only under it), the drafter's vocabulary; ValueError, one
    line."""
    spec = target_of(model).spec
    if not spec.tree_layers:
        raise ValueError(f"{type(model).__name__} offers no target features on a tree (encode_features, "
                         "decode_tree_features): an EAGLE-3 tree needs a causal base")
    if not isinstance(criterion, Exact):
        raise ValueError(  # noqa: TRY004 (a rule this proposer cannot serve: the decoders' one-line ValueError)
            f"EAGLE-3 {kind} trees take exact acceptance, not {criterion.name}")
    if spec.vocab_size is not None and int(drafter.config.vocab_size) != spec.vocab_size:
        raise ValueError(f"the EAGLE-3 drafter's vocabulary ({drafter.config.vocab_size}) is not the "
                         f"target's ({spec.vocab_size}): it was trained on another target")


@dataclass(frozen=True)
class Eagle3Tree(Eagle3):
    """``drafter`` grows ``spec`` (a :class:`~lightning_bpd.decoding.trees.tree.DynamicTree`: nodes, depth, width)
    per row at every iteration; exact acceptance only."""

    spec: DynamicTree = DEFAULT_TREE
    expand: int | None = None  # nodes expanded per depth (EAGLE-2's top-k); None: the tree's width
    chain_first: bool = True  # the drafter's own chain (each depth's top child of the last) always in the tree

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.spec.depth + 1

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.spec.size - self.spec.depth - 1

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        check_tree_target(self.drafter, model, criterion, "dynamic")
        if self.expand is not None and (isinstance(self.expand, bool) or not isinstance(self.expand, int)
                                        or self.expand < 1):
            raise ValueError(f"an EAGLE-3 tree expands an integer >= 1 of nodes per depth, got {self.expand!r}")
        if self.spec.nodes > self.candidates:
            raise ValueError(f"an EAGLE-3 tree {self.spec.depth} deep and {self.spec.width} wide that expands "
                             f"{self.expand or self.spec.width} nodes per depth has {self.candidates} candidates, fewer "
                             f"than its {self.spec.nodes} nodes: ask for fewer nodes, or expand more (expand=)")
        return criterion

    @property
    def candidates(self) -> int:
        """The candidates a proposal ranks (the root's not counted): each depth's expanded nodes' children."""
        spec, expand = self.spec, self.expand or self.spec.width
        front, total = 1, 0
        for _ in range(spec.depth):
            total += front * spec.width
            front = min(expand, front * spec.width)
        return total

    def start(self, state: DecodeState, prompt: Features) -> Eagle3TreeDrafting:
        drafting = Eagle3TreeDrafting(self.drafter, self.width, self.reads, spec=self.spec, expand=self.expand,
                                      chain_first=self.chain_first)
        drafting.fill(state, prompt)
        return drafting


@dataclass
class Eagle3TreeDrafting(Eagle3Drafting):
    """One decode's drafter state (:class:`Eagle3Drafting`'s), growing a tree per row at each iteration."""

    spec: DynamicTree = DEFAULT_TREE
    expand: int | None = None
    chain_first: bool = True
    trees: Any = None
    candidates: list[Tensor] | None = None
    slots: Tensor | None = None

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.spec.size - self.spec.depth - 1

    @property
    def draft_slots(self) -> int:  # type: ignore[override]
        """The tree's entries: the expanded nodes, at most ``expand`` per depth."""
        return (self.expand or self.spec.width) * self.spec.depth + 1

    def propose(self, state: DecodeState, features: Features) -> RowTree:
        target, spec, expand = state.target, self.spec, self.expand or self.spec.width
        first = opening_token(state, features)  # (b,)
        root, logits = self.settle(state, first)  # (b, D), (b, Vd): the root's entry, depth 1's logits
        committed, span = self.cache.lengths.clone(), self.cache.span  # (b,), host
        b = first.shape[0]
        zero = first.new_zeros(b, 1)
        front, front_tokens = zero, first[:, None]  # (b, m): the nodes expanded at this depth, their tokens
        front_scores = root.new_zeros(b, 1).float()
        states, logits = root[:, None], logits[:, None]  # (b, m, D), (b, m, Vd): each front node's entry
        tokens, scores, depths, parents = [first[:, None]], [front_scores], [zero], [zero]
        ranks = [front_scores]  # (b, m) per depth: what the selection ranks by (the chain's nodes first, +inf)
        self.candidates = tokens  # the candidates' tokens by depth so far (read by tests of the tree's entries)
        self.slots = zero[:, :0]  # (b, s): the candidate in each tree slot of the cache (after ``committed``)
        ancestors = torch.ones(b, 1, 1, dtype=torch.bool, device=first.device)  # (b, M, M) over the candidates
        count = 1
        for d in range(1, spec.depth + 1):
            if d > 1:  # the last depth's expanded nodes into the cache: their states and logits
                states, logits = self.grow_entries(states, front_tokens, front, ancestors, committed, d)
                self.slots = torch.cat([self.slots, front], dim=1)
            drafted = self.target_logits(target, logits)  # (b, m, V)
            kids = top_ranks(drafted, spec.width)  # (b, m, W) target ids
            kid_logp = log_probs(drafted).gather(-1, kids)  # (b, m, W)
            score = (front_scores[:, :, None] + kid_logp).reshape(b, -1)  # (b, m * W): every child a candidate
            kid_tokens = kids.reshape(b, -1)
            new = score.shape[1]
            parent = (torch.arange(new, device=first.device) // spec.width).expand(b, -1)  # (b, m * W): in the front
            tokens.append(kid_tokens)
            scores.append(score)
            rank = score.clone()
            if self.chain_first:  # front[:, 0] is the chain's node: its top child (kid 0) continues the chain
                rank[:, 0] = float("inf")
            ranks.append(rank)
            depths.append(torch.full_like(kid_tokens, d))
            parents.append(front.gather(1, parent))
            ancestors = grown(ancestors, front.gather(1, parent))  # (b, count + m * W, count + m * W)
            if d < spec.depth:  # EAGLE-2's expansion: the ``expand`` most confident children go on
                keep = rank.sort(dim=1, descending=True, stable=True).indices[:, :expand]  # (b, e), the chain's first
                states = states.gather(1, (keep // spec.width)[:, :, None].expand(-1, -1, states.shape[-1]))
                front, front_tokens, front_scores = count + keep, kid_tokens.gather(1, keep), score.gather(1, keep)
            count += new
        self.cache.crop(committed, span)  # the tree's entries go; the verify pass's features replace them
        trees = select(torch.cat(tokens, 1), torch.cat(ranks, 1), torch.cat(depths, 1), torch.cat(parents, 1), spec)
        self.trees = trees
        return RowTree(trees)

    def grow_entries(self, states: Tensor, tokens: Tensor, front: Tensor, ancestors: Tensor, committed: Tensor,
                     d: int) -> tuple[Tensor, Tensor]:
        """Nodes ``front`` (b, m) (candidate ids) of depth d - 1 into the cache, each fed its parent's output state
        ``states`` (b, m, D) and its token ``tokens`` (b, m) at the row's position + d - 1, seeing the committed
        entries, its ancestors' entries (tree slot j, at ``committed + j``, holds candidate ``self.slots[:, j]``)
        and itself -> their output states (b, m, D) and logits (b, m, Vd)."""
        b, m = front.shape
        c = self.cache.span  # a host bound on the longest row's entries, the tree's so far included (the view's)
        rel = torch.arange(c, device=front.device)[None, :] - committed[:, None]  # (b, C): < 0 committed
        s = self.slots.shape[1]
        in_tree = (rel >= 0) & (rel < s)  # (b, C): the row's tree slots so far
        cand = self.slots.gather(1, rel.clamp(0, s - 1)) if s else torch.zeros_like(rel)  # (b, C)
        mine = ancestors.gather(1, front[:, :, None].expand(-1, -1, ancestors.shape[-1]))  # (b, m, M)
        seen_tree = mine.gather(2, cand[:, None, :].expand(-1, m, -1))  # (b, m, C)
        seen = (rel < 0)[:, None, :] | (in_tree[:, None, :] & seen_tree)
        itself = torch.eye(m, dtype=torch.bool, device=front.device).expand(b, m, m)
        positions = (committed + d - 1)[:, None].expand(b, m)  # the root sits at position ``committed``
        return self.drafter.extend(self.cache, states, tokens, positions, mask=torch.cat([seen, itself], dim=-1))

    def advance(self, state: DecodeState, outcome: Outcome, features: Features, rows: Tensor | None) -> None:
        """The verify pass's features along each row's accepted path wait for the next proposal, with the accepted
        tokens after the root."""
        if rows is not None:
            self.cache.select(rows)
        layers, path = features.layers, outcome.path  # (b, N, A*D), (b, depth + 1): the accepted nodes, root first
        self.features = layers.gather(1, path[:, :, None].expand(-1, -1, layers.shape[-1]))  # type: ignore[union-attr,index]
        self.tokens = outcome.tokens[:, 1:]  # (b, depth)
        self.counts = outcome.accepted.to(torch.long)


@dataclass(frozen=True)
class Eagle3StaticTree(Eagle3):
    """``drafter`` fills ``tree`` (a static :class:`~lightning_bpd.decoding.trees.tree.Tree`: paths of ranks, Medusa's
    format) at every iteration: node ``(.., r)`` holds the drafter's (r+1)-th most likely token after its parent, each
    node with children extended (fed its parent's state and its own token, seeing its ancestors) depth by depth;
    exact acceptance only. A path of ranks 0 is the chain."""

    tree: Tree = CHAIN_TREE

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.tree.depth + 1

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.tree.size - self.tree.depth - 1

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        check_tree_target(self.drafter, model, criterion, "static")
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> Eagle3StaticTreeDrafting:
        drafting = Eagle3StaticTreeDrafting(self.drafter, self.width, self.reads, tree=self.tree)
        drafting.fill(state, prompt)
        return drafting


@dataclass
class Eagle3StaticTreeDrafting(Eagle3TreeDrafting):
    """One decode's drafter state, filling a static tree per row at each iteration."""

    tree: Tree = CHAIN_TREE

    @property
    def draft_slots(self) -> int:  # type: ignore[override]
        """The tree's entries: its nodes with children, the root's in the committed ones."""
        return sum(1 for n in range(1, self.tree.size) if self.tree.children(n)) + 1

    def propose(self, state: DecodeState, features: Features) -> RowTree:
        tree, target = self.tree, state.target
        first = opening_token(state, features)  # (b,)
        root, logits = self.settle(state, first)  # (b, D), (b, Vd): the root's entry, its children's logits
        committed, span = self.cache.lengths.clone(), self.cache.span
        b, device = first.shape[0], first.device
        tokens = first.new_zeros(b, tree.size)  # (b, N): each node's token, in the tree's order
        tokens[:, 0] = first
        self.candidates = [tokens]  # the nodes' tokens as they are filled (read by tests of the tree's entries)
        ancestors = tree.ancestors(device).expand(b, -1, -1)  # (b, N, N): a node and its ancestors
        states, node_logits = {0: root}, {0: logits}  # each extended node's output state and logits (b, D), (b, Vd)
        self.slots = first.new_zeros(b, 0)
        for d in range(1, tree.depth + 1):
            parents = [n for n in tree.at_depth(d - 1) if tree.children(n)]
            if d > 1:  # depth d - 1's nodes with children into the cache, each fed its parent's state
                front = torch.tensor(parents, device=device).expand(b, -1)  # (b, m)
                fed = torch.stack([states[tree.parents[n]] for n in parents], dim=1)  # (b, m, D)
                out, drafted = self.grow_entries(fed, tokens[:, parents], front, ancestors, committed, d)
                self.slots = torch.cat([self.slots, front], dim=1)
                for i, n in enumerate(parents):
                    states[n], node_logits[n] = out[:, i], drafted[:, i]
            ranked = top_ranks(self.target_logits(target, torch.stack([node_logits[n] for n in parents], dim=1)),
                               1 + max(tree.ranks[c] for n in parents for c in tree.children(n)))  # (b, m, R)
            for i, n in enumerate(parents):
                for c in tree.children(n):
                    tokens[:, c] = ranked[:, i, tree.ranks[c]]
        self.cache.crop(committed, span)  # the tree's entries go; the verify pass's features replace them
        parent_ids = torch.tensor([max(p, 0) for p in tree.parents], device=device).expand(b, -1)  # the root's: 0
        depths = torch.tensor(tree.depths, device=device).expand(b, -1)
        self.trees = RowTrees.of(tokens, depths.contiguous(), parent_ids.contiguous(), tree.depth)
        return RowTree(self.trees)


def grown(ancestors: Tensor, parents: Tensor) -> Tensor:
    """The ancestor mask (b, M, M) (a candidate and its ancestors) of M candidates with m' more (b, m') appended,
    each a child of candidate ``parents`` -> (b, M + m', M + m')."""
    b, big = ancestors.shape[:2]
    new = parents.shape[1]
    out = torch.zeros(b, big + new, big + new, dtype=torch.bool, device=ancestors.device)
    out[:, :big, :big] = ancestors
    out[:, big:, :big] = ancestors.gather(1, parents[:, :, None].expand(-1, -1, big))
    out[:, big:, big:] = torch.eye(new, dtype=torch.bool, device=ancestors.device)
    return out


__all__ = ["Eagle3StaticTree", "Eagle3Tree", "grown"]
