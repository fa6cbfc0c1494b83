"""A static tree of the heads' candidates as a proposer (Medusa-style), verified in one pass. Torch only.

Each iteration proposes a :class:`~lightning_bpd.decoding.trees.tree.Tree` of tokens per row instead of one block: parallel
heads give every node at depth d the rank-r token of head d (the same head for every branch, as in Medusa); chained
heads run each expanded node's own link, fed that node's token (batched over the expanded nodes of a depth). The root
is greedy's token (from the verdict). The loop verifies all nodes in one ``decode_tree`` call under the tree mask and
keeps the longest root-to-node path the rule accepts (:func:`~lightning_bpd.decoding.verify.verify_tree`); for the
single path (:meth:`Tree.path`) this is the heads' block, token for token and block for block. Rules: the
deterministic prefix rules (exact, top-n, eps) and lossless speculative sampling
(:class:`~lightning_bpd.decoding.acceptance.SpeculativeSampling`: the candidates are drawn, not ranked, and judged by
SpecInfer's walk, :mod:`~lightning_bpd.decoding.tree_sampling`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, SpeculativeSampling
from lightning_bpd.decoding.candidates import SharedTree
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.proposers.dynamic_tree import check_dynamic_args
from lightning_bpd.decoding.proposers.heads import propose
from lightning_bpd.decoding.protocol import BlockwiseModel, Source, resolve_k, restricted
from lightning_bpd.decoding.sampling import sample
from lightning_bpd.decoding.state import DecodeState, Features
from lightning_bpd.decoding.target import target_of
from lightning_bpd.decoding.tree_sampling import propose_sampled_tree
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree
from lightning_bpd.nn.argmax import top_ranks


@dataclass(frozen=True)
class HeadTree(Proposer):
    """The heads' candidates as the static ``tree`` at every iteration (``k``: the heads used, default all)."""

    tree: Tree
    k: int | None = None

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.tree.depth + 1

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.tree.size - self.tree.depth - 1

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        check_tree_args(model, criterion, self.tree, self.k)
        if isinstance(criterion, SpeculativeSampling) and criterion.greedy is not None:
            criterion = criterion.greedy  # temperature 0: exact
        criterion.validate(self.width)
        return criterion

    def propose(self, state: DecodeState, features: Features) -> SharedTree:
        """The heads read the last hidden state ``features.last`` (b, D); the tree is cut to ``state.width``."""
        model, criterion, h, first = state.heads, state.criterion, features.last, features.first
        device = h.device
        tree, depths, ancestors, table = shaped(self.tree, state.width, device)
        if first is None:  # the opening: p_1 of the first token, under the rules
            opening = state.reader()
            if criterion.stochastic:
                first = sample(criterion.distribution(opening.logits_first(h)), criterion.rng(device))  # (b,)
            else:
                first = criterion.first_token(opening, h)  # (b,)
        source = state.chain_source()
        if criterion.stochastic:
            tokens, q = propose_sampled_tree(model, criterion, tree, h, first, source)
        else:
            tokens, q = propose_tree(model, criterion, tree, h, first, source), None
        return SharedTree(tokens, tree, depths, ancestors, table, q, model.chained_heads)


def check_tree_args(model: BlockwiseModel, criterion: Criterion, tree: Tree | DynamicTree, k: int | None,
                    verify_pass: bool = True) -> None:
    """Raise ValueError, in one line, where this tree cannot decode with this model and rule (``verify_pass``: and
    the model must offer the tree verify pass, ``decode_tree``)."""
    if isinstance(tree, DynamicTree):
        check_dynamic_args(model, criterion, tree, k)
        return
    if not isinstance(tree, Tree):
        raise TypeError(f"tree must be a Tree (Tree.from_paths, Tree.from_budget) or a DynamicTree, got "
                        f"{type(tree).__name__}")
    heads = resolve_k(model, k)
    if tree.depth > heads - 1:
        raise ValueError(f"a tree {tree.depth} deep needs k >= {tree.depth + 1} heads, decoding with k={heads}")
    if not (criterion.prefix_checks or isinstance(criterion, SpeculativeSampling)):
        raise ValueError(f"tree decoding takes the deterministic prefix rules (exact, topN, epsX) and sampling, "
                         f"not {criterion.name}")
    if verify_pass and not target_of(model).spec.trees:
        raise ValueError(f"{type(model).__name__} has no tree verify pass (decode_tree; e.g. a local attention window): "
                         "decode it with tree=None")


def propose_tree(model: BlockwiseModel, criterion: Criterion, tree: Tree, h: Tensor, first: Tensor,
                 source: Source | None = None) -> Tensor:
    """The tree's tokens (b, N) at the hidden state h (b, D) of each row's last accepted position: the root is
    ``first`` (b,), greedy's token; node i at depth d >= 1 is rank ``tree.ranks[i]`` of the head at depth d (over
    the draft vocabulary when the model has one), read at h (parallel heads) or from its parent's own link
    (chained heads). The single path is today's block (:func:`~lightning_bpd.decoding.proposers.heads.propose`, with the
    model's fast proposals where it offers them); the other trees through ``draft_ranks`` / ``chain_ranks`` where
    the model offers them (a runtime's proposal paths), else the heads' logits, and
    :func:`~lightning_bpd.nn.argmax.top_ranks` (a stable descending sort's first n, without the sort)."""
    if tree.is_path:
        return propose(model, criterion, h, tree.depth + 1, first, source).tokens  # (b, depth + 1)
    tokens = first[:, None].expand(-1, tree.size).clone()  # (b, N)
    if model.chained_heads:
        return expand_chains(model, tree, h, tokens, source)
    width, heads = max(tree.widths()), range(1, tree.depth + 1)
    ranked = model.draft_ranks  # a runtime's proposal path (proposal precision, draft vocabulary, int8)
    if ranked is not None:
        top = ranked(h, heads, width)  # (b, depth, W)
    else:
        top = top_ranks(restricted(model, model.logits_heads(h, heads)), width)  # (b, depth, W)
    depth, rank = tree.table("depths", h.device)[1:] - 1, tree.table("ranks", h.device)[1:]  # (N - 1,) each
    tokens[:, 1:] = top[:, depth, rank]
    return tokens


def expand_chains(model: BlockwiseModel, tree: Tree, h: Tensor, tokens: Tensor, source: Source | None) -> Tensor:
    """Chained heads: depth by depth, each node with children runs link d fed its own token (all such nodes of a
    depth in one batched link), and its children take that link's ranked tokens. Fills ``tokens`` (b, N)."""
    b = h.shape[0]
    states = {0: h}  # node -> the chain state its children's link reads (b, D)
    for d in range(1, tree.depth + 1):
        children = tree.at_depth(d)
        parents = sorted({tree.parents[c] for c in children})
        m = len(parents)
        z = torch.stack([states[p] for p in parents], dim=1).reshape(b * m, -1)  # (b * m, D)
        fed = tokens[:, parents].reshape(b * m)  # (b * m,)
        rows = source if source is None or m == 1 else source.take(torch.arange(b, device=h.device).repeat_interleave(m))
        width = 1 + max(tree.ranks[c] for c in children)
        if model.chain_ranks is not None:  # a runtime's links (fused, proposal precision, int8)
            z, top = model.chain_ranks(z, fed, d, rows, width)  # (b * m, D), (b * m, width)
        else:
            z, logits = model.chain_step(z, fed, d, rows)  # (b * m, D), (b * m, V)
            top = top_ranks(restricted(model, logits), width)
        top = top.view(b, m, width)  # (b, m, width)
        z = z.view(b, m, -1)
        for c in children:
            j = parents.index(tree.parents[c])
            tokens[:, c] = top[:, j, tree.ranks[c]]
            states[c] = z[:, j]
    return tokens


def shaped(tree: Tree, width: int, device: torch.device) -> tuple[Tree, Tensor, Tensor, Tensor]:
    """The tree of the next verify pass and its depths (N,), ancestors (N, N) and path table (N, depth + 1): ``tree``,
    or where a row's context leaves fewer than its depth + 1 positions (``width``), the tree cut to ``width - 1``
    deep (:meth:`Tree.cut`). A tree caches its tables per device."""
    cut = tree if width > tree.depth else tree.cut(width - 1)
    return cut, cut.table("depths", device), cut.ancestors(device), cut.path_table(device)
