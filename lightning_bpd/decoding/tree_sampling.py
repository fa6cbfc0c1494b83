"""Lossless speculative sampling on a tree of candidates (SpecInfer's multi-candidate rejection). Torch only.

The tree decoder (:mod:`~lightning_bpd.decoding.proposers.tree`) hands a
:class:`~lightning_bpd.decoding.acceptance.SpeculativeSampling` rule here. Every iteration::

    tokens, q   = propose_sampled_tree(model, rule, tree, h, first, source)   # draws, and what they came from
    hidden      = model.decode_tree(tokens, ...)                               # the verify pass, as for exact
    node, first = judge_tree(rule, tree, tokens, p, q)                         # the walk: accepted node, next token

How the candidates are drawn. A node n with c children draws them from q_n, the sampling distribution
(temperature, top-p) of the head that proposes the next depth (parallel heads: head d at the root position; chained
heads: n's own link, fed n's token), as an ordered sample of c tokens *without replacement*
(:func:`draw_children`: an exponential race, i.e. x_1 ~ q_n, x_2 ~ q_n without x_1 renormalized, ...). Child j
(in node order) holds the j-th draw; a tree's ranks only order the children. Parallel heads draw once per depth
and every node of that depth shares the draws (only one node per depth is ever judged, so sharing is as good as
independent draws); chained heads draw per node. Where q_n has fewer tokens than n has children, the extra
children are never accepted.

The walk (:func:`judge_tree`). Start at the root (always accepted: a draw from p_1 or the previous residual) with
r = p_n, p_1 after n (under the generation rules, temperature, top-p). Try n's children in order: child x
(drawn from the current q) is accepted when u q(x) < r(x), u uniform (probability min(1, r(x)/q(x))); then move to
it and start again with r = its own p. On rejection r <- normalize(max(r - q, 0)) (:func:`residual`) and
q <- q without x, renormalized (the next child was drawn from exactly that). When every child is rejected, or n
is a leaf, the next token is drawn from r: it opens the next iteration.

Why it is lossless. One round with target r, draft X ~ q and Y drawn from r' = normalize(max(r - q, 0)) on
rejection gives P(out = y) = min(q(y), r(y)) + sum_z max(r(z) - q(z), 0) * r'(y) = r(y), whatever produced Y as
long as Y | (X, rejected) ~ r'. Round j+1 produces that Y: its draft is drawn from q without the tokens drawn
before (exactly the distribution the without-replacement draw gives, given them), its target is r', and by
induction from the last round (a plain draw from the residual) each round outputs its target, so the first
outputs p_n. The children of the accepted node were drawn from q given its path only, with random numbers that
no decision so far has read, so the same argument applies one depth down; by the chain rule the emitted
tokens are distributed as ancestral sampling from p_1, token for token. Temperature 0 is exact decoding.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import BlockwiseModel, Source
from lightning_bpd.decoding.sampling import residual, sample
from lightning_bpd.decoding.trees.tree import Tree


def draw_children(q: Tensor, n: int, generator: torch.Generator | None = None) -> Tensor:
    """An ordered sample of ``n`` tokens without replacement from each distribution q (..., V) -> (..., n).

    An exponential race: token x finishes at E_x / q(x) (E_x ~ Exp(1)); the order of finishing is the order of
    successive draws, each proportional to q over the tokens not drawn yet. Tokens with q = 0 never finish:
    past q's support the sample holds arbitrary tokens of q = 0 (never accepted by :func:`judge_tree`). The times
    are compared as logarithms, so no q > 0, however small, overflows to a token that never finishes."""
    e = torch.empty_like(q).exponential_(generator=generator)  # (..., V)
    keys = torch.where(q > 0, e.log() - q.log(), float("inf"))  # log finishing times
    return keys.topk(min(n, q.shape[-1]), dim=-1, largest=False, sorted=True).indices  # (..., n)


def drop_drawn(q: Tensor, x: Tensor) -> Tensor:
    """q (b, V) without the tokens x (b,), renormalized (all zeros where nothing is left)."""
    q = q.scatter(-1, x[:, None], 0.0)
    total = q.sum(dim=-1, keepdim=True)
    return q / total.clamp(min=torch.finfo(q.dtype).tiny)


def expanded(tree: Tree) -> list[int]:
    """The nodes with children, in node order."""
    return sorted(set(tree.parents[1:]))


def q_slots(tree: Tree, chained: bool, device: torch.device | str = "cpu") -> Tensor:
    """(N,) long: where node i's children's distribution sits in :func:`propose_sampled_tree`'s q, -1 for a leaf
    (chained heads: its place among :func:`expanded`; parallel heads: its depth, one distribution per head)."""
    out = [-1] * tree.size
    for j, node in enumerate(expanded(tree)):
        out[node] = j if chained else tree.depths[node]
    return torch.tensor(out, dtype=torch.long, device=device)


def propose_sampled_tree(model: BlockwiseModel, rule, tree: Tree, h: Tensor, first: Tensor,
                         source: Source | None = None) -> tuple[Tensor, Tensor]:
    """The tree's tokens (b, N), the root ``first`` (b,), and the distributions q (b, M, V) the children were drawn
    from (:func:`q_slots` maps a node to its children's), at the hidden state h (b, D) of each row's last accepted
    position. ``rule``: a :class:`~lightning_bpd.decoding.acceptance.SpeculativeSampling` (its distribution and
    random numbers)."""
    b, g = h.shape[0], rule.rng(h.device)
    tokens = first[:, None].expand(-1, tree.size).clone()  # (b, N)
    if tree.depth == 0:  # the root alone (a tree cut where a row's context ends): nothing drawn
        return tokens, h.new_zeros(b, 0, 1)
    kids = [tree.children(i) for i in range(tree.size)]
    if not model.chained_heads:
        q = rule.distribution(model.logits_heads(h, range(1, tree.depth + 1)))  # (b, depth, V)
        for d in range(1, tree.depth + 1):
            parents = [p for p in expanded(tree) if tree.depths[p] == d - 1]
            drawn = draw_children(q[:, d - 1 : d], max(len(kids[p]) for p in parents), g)[:, 0]  # (b, W)
            for p in parents:  # the draws of depth d, shared by every node there
                for s, c in enumerate(kids[p]):
                    tokens[:, c] = drawn[:, s]
        return tokens, q
    states, qs = {0: h}, []  # node -> the chain state its children's link reads (b, D)
    for d in range(1, tree.depth + 1):
        parents = [p for p in expanded(tree) if tree.depths[p] == d - 1]
        m = len(parents)
        z = torch.stack([states[p] for p in parents], dim=1).reshape(b * m, -1)  # (b * m, D)
        each = torch.arange(b, device=h.device).repeat_interleave(m)  # (b * m,): the row of every parent
        rows = source if source is None or m == 1 else source.take(each)
        z, logits = model.chain_step(z, tokens[:, parents].reshape(b * m), d, rows)  # (b * m, D), (b * m, V)
        q = rule.distribution(logits).view(b, m, -1)  # (b, m, V)
        drawn = draw_children(q, max(len(kids[p]) for p in parents), g)  # (b, m, W)
        z = z.view(b, m, -1)
        for j, p in enumerate(parents):
            for s, c in enumerate(kids[p]):
                tokens[:, c] = drawn[:, j, s]
                states[c] = z[:, j]
        qs.append(q)
    return tokens, torch.cat(qs, dim=1)  # (b, M, V)


def judge_tree(rule, tree: Tree, tokens: Tensor, p: Tensor, q: Tensor, chained: bool) -> tuple[Tensor, Tensor]:
    """The walk: each row's accepted node (b,) and the token after it (b,), drawn from the last residual.

    tokens (b, N) from :func:`propose_sampled_tree` with its q (b, M, V); p (b, N, V): the target after each node
    (p_1's sampling distribution under the generation rules). Draws one uniform per node (b, N), then one token
    per row. No host read."""
    b, device = tokens.shape[0], tokens.device
    g = rule.rng(device)
    u = torch.rand(tokens.shape, generator=g, dtype=p.dtype, device=device)  # (b, N): node c's acceptance draw
    rows = torch.arange(b, device=device)
    children, slots = tree.table("children", device), q_slots(tree, chained, device)  # (N, C), (N,)
    node = torch.zeros(b, dtype=torch.long, device=device)  # (b,)
    r = p[:, 0]  # (b, V): the target at the current node, then its residuals
    going = torch.ones(b, dtype=torch.bool, device=device)  # rows whose walk may still move down
    for _ in range(tree.depth):
        slot = slots[node]  # (b,)
        qn = torch.where((slot >= 0)[:, None], q[rows, slot.clamp(min=0)], 0.0)  # (b, V)
        took = torch.full_like(node, -1)  # (b,): the accepted child
        for j in range(children.shape[1]):
            c = children[node, j]  # (b,)
            x = tokens[rows, c.clamp(min=0)]  # (b,)
            qx, rx = qn[rows, x], r[rows, x]  # (b,) each
            trying = going & (c >= 0) & (took < 0) & (qx > 0)  # a drawn child not yet judged
            ok = trying & (u[rows, c.clamp(min=0)] * qx < rx)
            took = torch.where(ok, c, took)
            rejected = (trying & ~ok)[:, None]
            r = torch.where(rejected, residual(r, qn), r)
            qn = torch.where(rejected, drop_drawn(qn, x), qn)
        moved = took >= 0
        node = torch.where(moved, took, node)
        r = torch.where(moved[:, None], p[rows, node], r)
        going = going & moved
    return node, sample(r, g)
