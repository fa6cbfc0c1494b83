"""Verdicts: how much of each row's candidates the target accepts, from the verify pass. Torch only.

A path (a block of tokens, :func:`verify`; position by position, :func:`verify_lazily`), a tree shared by every row
(:func:`verify_tree`) and one tree per row (:func:`verify_rows`). Each returns what the row keeps and greedy's (or the
rule's) token after it, which opens the next proposal. No host read, except :func:`verify_lazily`. Each reads p_1
through ``logits_first`` and ``argmax_first`` alone: of the loop's :class:`~lightning_bpd.decoding.target.Target`,
of a base (the fixed-shape decoder, the trees' cost) or of the generation rules' reader.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion, Exact
from lightning_bpd.decoding.protocol import BlockwiseModel, first_argmax
from lightning_bpd.decoding.target import Target
from lightning_bpd.decoding.trees.rows import RowTrees
from lightning_bpd.decoding.trees.tree import Tree
from lightning_bpd.nn.argmax import argmax


def verify(model: Target | BlockwiseModel, criterion: Criterion, block: Block, hidden: Tensor,
           lazy: bool = False, p1: Any = None) -> tuple[Tensor, Tensor | None]:
    """Accepted block sizes (b,) in [1, k] and the token opening each row's next block (b,), from the
    verify pass ``hidden`` (b, k, D) over ``block`` (b, k). No host read (except ``lazy``).

    Deterministic rules: the rule's :meth:`~lightning_bpd.decoding.acceptance.Criterion.verify` (p_1 at all k
    positions; token j+1 is judged by p_1 at position j), and greedy's token at the last accepted position
    opens the next block. Sampling rules: their judge, whose ``next_first`` is -1 where p_1 must still be
    sampled.

    ``p1``: what reads p_1 at the block's positions (b, k) under the generation rules
    (:meth:`~lightning_bpd.decoding.generation_rules.RuleBook.verifying`); None: the model itself. With rules the check is never
    lazy (the verdict is the same).
    """
    if criterion.stochastic:
        verify_logits = model.logits_first(hidden[:, :-1]) if p1 is None else p1.logits_first(hidden)[:, :-1]
        verdict = criterion.judge(block, verify_logits)
        return verdict.accepted, verdict.next_first
    if lazy and criterion.prefix_checks and block.widths is None and p1 is None:
        return verify_lazily(model, criterion, block.tokens, hidden)
    accepted, best = criterion.verify(model if p1 is None else p1, block.tokens, hidden)  # (b,), (b, k)
    if block.widths is not None:  # a confidence stop: nothing past a row's own proposals
        accepted = torch.minimum(accepted, block.widths)
    return accepted, best.gather(1, (accepted - 1)[:, None]).squeeze(1)


def verify_lazily(model: Target | BlockwiseModel, criterion: Criterion, tokens: Tensor,
                  hidden: Tensor) -> tuple[Tensor, Tensor]:
    """Check a block position by position, projecting p_1 only where the verdict is still open.

    tokens (b, k), hidden (b, k, D) from the verify pass. Token j+1 is checked against p_1 at
    ``hidden[:, j]`` (the rule's :meth:`~lightning_bpd.decoding.acceptance.Criterion.check_position`) for
    the rows whose tokens 2..j all passed; a row stops at its first failure, and the argmax of p_1
    there, the token greedy decoding emits next, becomes the first token of its next block (p_1 was
    computed there anyway, and head 1 is p_1); rows that accepted all k get it from p_1 at the last
    position. Same verdict as checking all k-1 positions at once
    (:meth:`Criterion.accept`), with about (accepted size) projections per row instead of k, at the
    price of a host read per position. Returns accepted (b,) in [1, k] and next_first (b,).
    """
    b, k = tokens.shape
    accepted = torch.ones(b, dtype=torch.long, device=tokens.device)  # (b,)
    next_first = torch.full((b,), -1, dtype=torch.long, device=tokens.device)  # (b,)
    rows = torch.arange(b, device=tokens.device)  # rows whose verdict is still open
    for j in range(k - 1):
        ok, best = criterion.check_position(model, tokens[rows, j + 1], hidden[rows, j])  # (a,) each
        if not bool(ok.all()):
            next_first[rows[~ok]] = best[~ok]
            rows = rows[ok]
        accepted[rows] += 1
        if rows.numel() == 0:
            return accepted, next_first
    next_first[rows] = first_argmax(model, hidden[rows, k - 1])  # all k accepted
    return accepted, next_first


def verify_tree(model: Target | BlockwiseModel, criterion: Criterion, tree: Tree, tokens: Tensor,
                hidden: Tensor) -> tuple[Tensor, Tensor]:
    """The accepted node (b,) of each row and greedy's token there (b,), from the verify pass ``hidden`` (b, N, D)
    over the tree's ``tokens`` (b, N). Node j >= 1 passes when the rule accepts its token against p_1 at its
    parent (exact: greedy's token there, :func:`first_argmax`); a node is accepted when it and all its ancestors
    pass; the deepest accepted node wins, ties to the lowest index. No host read."""
    parents = tree.table("parents", tokens.device)  # (N - 1,)
    if isinstance(criterion, Exact):
        best = first_argmax(model, hidden)  # (b, N): greedy's token after each node
        ok = tokens[:, 1:] == best[:, parents]  # (b, N - 1)
    else:
        logits = model.logits_first(hidden)  # (b, N, V)
        best = argmax(logits)
        ok = criterion.matches(tokens[:, 1:], logits[:, parents])  # (b, N - 1)
    ok = torch.cat([ok.new_ones(ok.shape[0], 1), ok], dim=1)  # (b, N): the root always passes
    ancestors = tree.ancestors(tokens.device)  # (N, N)
    accepted = ~((~ok)[:, None, :] & ancestors).any(dim=-1)  # (b, N): no failing node on the way
    key = torch.where(accepted, tree.table("order", tokens.device), -1)  # (b, N)
    node = key.argmax(dim=1)  # (b,)
    return node, best.gather(1, node[:, None])[:, 0]


def verify_rows(reader: Target | BlockwiseModel, trees: RowTrees, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """The accepted node (b,) of each row's tree and greedy's token there (b,), from the verify pass ``hidden``
    (b, N, D): node j passes when its token is greedy's after its parent; the deepest accepted node wins."""
    best = first_argmax(reader, hidden)  # (b, N)
    ok = trees.tokens == best.gather(1, trees.parents)  # (b, N)
    ok[:, 0] = True
    accepted = ~((~ok)[:, None, :] & trees.ancestors).any(dim=-1)  # (b, N)
    n = trees.tokens.shape[1]
    key = torch.where(accepted, trees.depths * n + (n - 1 - torch.arange(n, device=hidden.device)), -1)
    node = key.argmax(dim=1)  # (b,)
    return node, best.gather(1, node[:, None])[:, 0]
