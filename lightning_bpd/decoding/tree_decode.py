"""Blockwise parallel decoding with a tree of candidates, verified in one pass (Medusa-style). Torch only.

:func:`blockwise_decode` hands a decode with ``tree=...`` here. Each iteration proposes a
:class:`~lightning_bpd.decoding.tree.Tree` of tokens per row instead of one block, verifies all its nodes in one
decoder call under the tree attention mask, and keeps the longest root-to-node path greedy would take::

    tokens         = propose_tree(model, criterion, tree, h, first, source)  # (b, N): root = greedy's token
    hidden         = model.decode_tree(tokens, depths, ancestors, ctx, cache)  # verify pass, (b, N, D)
    node, first    = verify_tree(model, criterion, tree, tokens, hidden)    # the accepted node (b,), next token
    n, done        = book.commit(tokens along the root-to-node path, depth + 1)
    keep           = book.settle(n, done)            # the iteration's one device-to-host read
    cache.keep_path(path, depth + 1, N)              # the accepted nodes' K/V move up, the rest is dropped

Proposals: parallel heads give every node at depth d the rank-r token of head d (the same head for every
branch, as in Medusa); chained heads run each expanded node's own link, fed that node's token (batched over the
expanded nodes of a depth). Verification: node j is accepted when the rule accepts its token against p_1 at its
parent and its parent is accepted; the accepted node is the deepest accepted one (ties to the lowest index), and
greedy's token there opens the next tree. For the single path (:meth:`Tree.path`) this is today's blockwise
decoding, token for token and block for block. Rules: the deterministic prefix rules (exact, top-n, eps) and
lossless speculative sampling (:class:`~lightning_bpd.decoding.criteria.SpeculativeSampling`: the candidates are
drawn, not ranked, and judged by SpecInfer's walk, :mod:`~lightning_bpd.decoding.tree_sampling`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion, Exact, SpeculativeSampling
from lightning_bpd.decoding.blockwise import chain_source, propose, resolve_k, restricted
from lightning_bpd.decoding.dynamic_tree import DynamicTree, check_dynamic_args
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.protocol import (
    BlockwiseModel,
    DecodeResult,
    Source,
    check_decode_args,
    first_argmax,
    source_room,
)
from lightning_bpd.decoding.row_book import RowBook
from lightning_bpd.decoding.sampling import sample
from lightning_bpd.decoding.tree_advance import advance
from lightning_bpd.decoding.tree_sampling import judge_tree, propose_sampled_tree
from lightning_bpd.decoding.trees.tree import Tree
from lightning_bpd.nn.argmax import argmax, top_ranks


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
    if verify_pass and model.decode_tree is None:
        raise ValueError(f"{type(model).__name__} has no tree verify pass (decode_tree; e.g. a local attention window): "
                         "decode it with tree=None")


def propose_tree(model: BlockwiseModel, criterion: Criterion, tree: Tree, h: Tensor, first: Tensor,
                 source: Source | None = None) -> Tensor:
    """The tree's tokens (b, N) at the hidden state h (b, D) of each row's last accepted position: the root is
    ``first`` (b,), greedy's token; node i at depth d >= 1 is rank ``tree.ranks[i]`` of the head at depth d (over
    the draft vocabulary when the model has one), read at h (parallel heads) or from its parent's own link
    (chained heads). The single path is today's block (:func:`~lightning_bpd.decoding.blockwise.propose`, with the
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


def verify_tree(model: BlockwiseModel, criterion: Criterion, tree: Tree, tokens: Tensor,
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


@torch.no_grad()
def tree_decode(model: BlockwiseModel, src: Tensor, criterion: Criterion, max_len: int, tree: Tree,
                k: int | None = None, lazy: bool = False, stop_below: float | None = None) -> DecodeResult:
    """Decode ``src`` (B, S) proposing and verifying ``tree`` at every iteration (the contract of
    :func:`~lightning_bpd.decoding.blockwise.blockwise_decode`; blocks of at most ``tree.depth + 1`` tokens).
    ``lazy`` and ``stop_below`` are single-path options: a tree takes neither."""
    if lazy or stop_below is not None:
        raise ValueError("tree decoding takes neither lazy verification nor a confidence stop (stop_below)")
    check_decode_args(model, src, max_len)
    check_tree_args(model, criterion, tree, k)
    if isinstance(criterion, SpeculativeSampling) and criterion.greedy is not None:
        criterion = criterion.greedy  # temperature 0: exact
    criterion.validate(tree.depth + 1)
    criterion.reset(src.device)
    sampled = criterion.stochastic
    batch, device, n = src.shape[0], src.device, tree.size
    rules = RuleBook(model, max_len, device, src)  # the generation rules on p_1 (None where there are none)
    room = source_room(model, src)  # None, or each row's inputs before its context ends
    full = tree, tree.table("depths", device), tree.ancestors(device), tree.path_table(device)
    context = model.encode(src)
    cache = model.new_cache(batch, capacity=1 + max_len + tree.depth + 1, extra_slots=n - tree.depth - 1)
    book = RowBook(batch, max_len, tree.depth + 1, model.pad_id, device)
    bos = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=device)
    h = model.decode_step(bos, context, cache)[:, -1]  # (B, D)
    opening = rules.opening(batch) or model  # p_1 of the first token, under the rules
    if sampled:
        first = sample(criterion.distribution(opening.logits_first(h)), criterion.rng(device))  # (B,)
    else:
        first = criterion.first_token(opening, h)  # (B,)
    now, depths, ancestors, table = shaped(full, book.block_width(tree.depth + 1, room), device)
    tokens, q = propose_any(model, criterion, now, h, first, chain_source(model, context))
    calls = 1
    while True:
        hidden = model.decode_tree(tokens, depths, ancestors, context, cache)  # (b, N, D)
        calls += 1
        reader = rules.on_tree(book, tokens, depths, table) or model  # p_1 at every node
        if sampled:  # SpecInfer's walk: the accepted node (b,) and the next token, from its residual (b,)
            p = criterion.distribution(reader.logits_first(hidden))  # (b, N, V)
            node, first = judge_tree(criterion, now, tokens, p, q, model.chained_heads)
        else:
            node, first = verify_tree(reader, criterion, now, tokens, hidden)  # (b,), (b,)
        path, accepted = table[node], depths[node] + 1  # (b, depth + 1), (b,)
        step = advance(book, rules.stops, cache, context, tokens, hidden, node, first, path, accepted, now.size)
        if step is None:
            break
        context, last, first = step
        now, depths, ancestors, table = shaped(full, book.block_width(tree.depth + 1, room), device)
        tokens, q = propose_any(model, criterion, now, last, first, chain_source(model, context))  # (b, N)
    return book.result(calls)


def shaped(full: tuple[Tree, Tensor, Tensor, Tensor], width: int,
           device: torch.device) -> tuple[Tree, Tensor, Tensor, Tensor]:
    """The tree of the next verify pass and its depths (N,), ancestors (N, N) and path table (N, depth + 1): ``full``
    (the tree and its tables), or where a row's context leaves fewer than its depth + 1 positions (``width``), the
    tree cut to ``width - 1`` deep (:meth:`Tree.cut`)."""
    tree = full[0]
    if width > tree.depth:
        return full
    cut = tree.cut(width - 1)
    return cut, cut.table("depths", device), cut.ancestors(device), cut.path_table(device)


def propose_any(model: BlockwiseModel, criterion: Criterion, tree: Tree, h: Tensor, first: Tensor,
                source: Source | None) -> tuple[Tensor, Tensor | None]:
    """The tree's tokens (b, N) and, for sampling, the distributions its children were drawn from (else None)."""
    if criterion.stochastic:
        return propose_sampled_tree(model, criterion, tree, h, first, source)
    return propose_tree(model, criterion, tree, h, first, source), None
