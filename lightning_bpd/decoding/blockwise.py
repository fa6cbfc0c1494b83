"""Blockwise parallel decoding (Stern et al., 2018), batched and KV-cached. Torch only.

The combined scoring and proposal model of section 4: after a first call on BOS, every iteration
is ONE decoder call on the k proposed tokens of each row. That call both verifies the proposals
(p_1 at each proposed position) and, at the last accepted position, yields the next k proposals
(p_1..p_k), so n tokens cost one call. Rejected positions are cropped from the KV cache.

One iteration, in named steps::

    hidden         = model.decode_step(block.tokens, context, cache)    # verify pass, (b, k, D)
    accepted, first = verify(model, criterion, block, hidden)            # on the device
    n, done        = book.commit(block.tokens, accepted)                 # on the device
    keep           = book.settle(n, done)      # the iteration's one device-to-host read
    compact(keep); cache.crop(...)                                       # finished rows leave
    block          = propose(model, criterion, hidden[accepted - 1], k, first)

Only p_1 is projected at the verified positions and the heads at one position per row, not the
naive k*k. For the deterministic rules, p_1 at every position of the verify pass gives both the
verdict (a match, cumulative product and sum) and, at the last accepted position, the token greedy
decoding emits next: it opens the next block, so only heads 2..k are projected for the proposals.
:func:`verify_lazily` is the other choice for per-position prefix rules (exact, top-n, eps): it
projects position j only for rows whose checks 2..j passed (fewer projections when few tokens are
accepted, but a host read per position). :class:`~lightning_bpd.decoding.criteria.SpeculativeSampling`
draws the block from the heads and, when it rejects a token, returns the replacement drawn from the
residual distribution as ``first``: that token opens the row's next block in place of a p_1 sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion, Exact
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.protocol import (
    BlockwiseModel,
    Context,
    DecodeResult,
    Source,
    check_decode_args,
    first_argmax,
    source_room,
)
from lightning_bpd.decoding.row_book import RowBook
from lightning_bpd.decoding.trees.tree import Tree

if TYPE_CHECKING:
    from lightning_bpd.decoding.dynamic_tree import DynamicTree


def resolve_k(model: BlockwiseModel, k: int | None) -> int:
    """The block size to decode with: the model's own k, or fewer heads of it."""
    if k is None:
        return model.k
    if not isinstance(k, int) or not 1 <= k <= model.k:
        raise ValueError(f"k must be an integer in [1, {model.k}] (the model's number of heads), got {k!r}")
    return k


def check_stop_below(stop_below: float | None, criterion: Criterion) -> None:
    """The confidence stop is a probability in (0, 1) and needs a deterministic rule."""
    if stop_below is None:
        return
    if not 0.0 < stop_below < 1.0:
        raise ValueError(f"stop_below (the confidence stop) must lie in (0, 1), got {stop_below}")
    if criterion.stochastic:
        raise ValueError(f"the confidence stop takes deterministic rules (exact, topN, epsX, ...), not {criterion.name}")


def chain_source(model: BlockwiseModel, context: Context) -> Source | None:
    """What source-attending chained heads read (``model.chain_source``, when offered), or None."""
    get = model.chain_source
    return get(context) if get is not None else None


def restricted(model: BlockwiseModel, logits: Tensor) -> Tensor:
    """A proposing head's logits (..., V) over the model's draft vocabulary (-inf outside it), when it has one."""
    return logits if model.restrict_draft is None else model.restrict_draft(logits)


def propose(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor | None = None,
            source: Source | None = None, stop_below: float | None = None, p1: Any = None) -> Block:
    """Next block (b, k) from the hidden state (b, D) of each row's last accepted position.

    Deterministic rules: token 1 is ``first`` (b,), greedy's next token from the verdict, or else the
    rule's :meth:`~lightning_bpd.decoding.criteria.Criterion.first_token` at h (from p_1); tokens 2..k are
    the heads' argmaxes, over the model's draft vocabulary when it has one
    (:mod:`lightning_bpd.inference.draft_vocab`; only p_1's verification needs the whole vocabulary).
    Sampling rules: the heads' draws, ``first`` (-1: none) replacing token 1 where a residual token was
    drawn. Chained heads (``model.chained_heads``) propose one token at a time, each step fed the
    token before it (and, source-attending ones, the ``source`` of each row: :func:`chain_source`).

    ``stop_below`` (deterministic rules, the model's own heads): the confidence stop. A row's proposal
    ends before its first head whose probability of its own token is below it (``Block.widths``; the
    verdict never accepts past it, so a row's output does not depend on the other rows), and the block
    is as wide as the widest row (a chain stops computing links once every row stopped): the verify
    pass checks fewer tokens that would mostly be rejected. Exact decoding stays exact.

    ``p1``: what reads p_1 for token 1 under the generation rules (:class:`~lightning_bpd.decoding.rules.RuleBook`,
    at the index of token 1); None: the model itself.
    """
    chained = model.chained_heads and k > 1
    reader = model if p1 is None else p1
    if criterion.stochastic:
        if chained:
            return propose_chained_sampled(model, criterion, h, k, first, source, reader)
        logits = model.logits_heads(h, range(k))  # (b, k, V): head 1 is p_1
        if p1 is not None:
            logits = torch.cat([p1.rule(logits[:, 0])[:, None], logits[:, 1:]], dim=1)
        return criterion.draft(logits, first)
    if first is None:
        first = criterion.first_token(reader, h)  # (b,)
    if k == 1:
        return Block(first[:, None])
    if chained:
        return chain_tokens(model, criterion, h, k, first, source, stop_below)
    draft = model.draft_tokens
    if stop_below is None:
        rest = draft(h, range(1, k)) if draft is not None else criterion.propose(
            restricted(model, model.logits_heads(h, range(1, k))))
        return Block(torch.cat([first[:, None], rest], dim=1))  # (b, k)
    if draft is not None:
        rest, p = draft(h, range(1, k), confidence=True)  # (b, k - 1) each
    else:
        logits = restricted(model, model.logits_heads(h, range(1, k)))  # (b, k - 1, V)
        rest = criterion.propose(logits)
        p = confidence_of(logits, rest)
    widths = 1 + (p >= stop_below).long().cumprod(dim=1).sum(dim=1)  # (b,): up to the first unsure head
    width = int(widths.max())  # host read: the verify pass's width
    return Block(torch.cat([first[:, None], rest[:, : width - 1]], dim=1), widths=widths)  # (b, width)


def confidence_of(logits: Tensor, tokens: Tensor) -> Tensor:
    """The probability (...) that logits (..., V) give to ``tokens`` (...)."""
    return (logits.gather(-1, tokens[..., None])[..., 0] - logits.logsumexp(dim=-1)).float().exp()


def chain_tokens(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor,
                 source: Source | None = None, stop_below: float | None = None) -> Block:
    """Chained heads, deterministic: the block (b, <= k), token i+1 the argmax of head i+1 fed token i.
    With ``stop_below`` a row's width ends before its first head below that probability, and the chain
    stops once no row is still going (a host read per link)."""
    draft = model.chain_draft
    sure = stop_below is not None
    whole = model.chain_drafts
    rest = whole(h, first, k, source) if whole is not None and not sure else None  # (b, k - 1): all links at once
    if rest is not None:
        return Block(torch.cat([first[:, None], rest], dim=1))
    tokens, z = [first], h
    going = widths = torch.ones_like(first) if sure else None  # (b,) rows whose heads were all sure so far
    for i in range(1, k):
        if draft is not None:
            z, token, *p = draft(z, tokens[-1], i, source, confidence=True) if sure else draft(z, tokens[-1], i, source)
        else:
            z, logits = model.chain_step(z, tokens[-1], i, source)  # (b, D), (b, V)
            logits = restricted(model, logits)
            token = criterion.propose(logits[:, None])[:, 0]
            p = [confidence_of(logits, token)] if sure else []
        if sure:
            going = going * (p[0] >= stop_below).long()
            if not bool(going.any()):
                break
            widths = widths + going
        tokens.append(token)
    return Block(torch.stack(tokens, dim=1), widths=widths)


def propose_chained_sampled(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor | None,
                            source: Source | None = None, reader: Any = None) -> Block:
    """Chained heads, sampling rules: token 1 drawn from p_1 (read by ``reader``, default the model; or the
    carried residual token), token i drawn from head i fed token i-1; the block keeps each draw's distribution."""
    reader = model if reader is None else reader
    parts = [criterion.draft(reader.logits_first(h)[:, None], first)]  # (b, 1)
    z = h
    for i in range(1, k):
        z, logits = model.chain_step(z, parts[-1].tokens[:, 0], i, source)  # (b, D), (b, V)
        parts.append(criterion.draft(logits[:, None]))  # (b, 1)
    return Block.cat(parts)


def verify(model: BlockwiseModel, criterion: Criterion, block: Block, hidden: Tensor,
           lazy: bool = False, p1: Any = None) -> tuple[Tensor, Tensor | None]:
    """Accepted block sizes (b,) in [1, k] and the token opening each row's next block (b,), from the
    verify pass ``hidden`` (b, k, D) over ``block`` (b, k). No host read (except ``lazy``).

    Deterministic rules: the rule's :meth:`~lightning_bpd.decoding.criteria.Criterion.verify` (p_1 at all k
    positions; token j+1 is judged by p_1 at position j), and greedy's token at the last accepted position
    opens the next block. Sampling rules: their judge, whose ``next_first`` is -1 where p_1 must still be
    sampled.

    ``p1``: what reads p_1 at the block's positions (b, k) under the generation rules
    (:meth:`~lightning_bpd.decoding.rules.RuleBook.verifying`); None: the model itself. With rules the check is never
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


def verify_lazily(model: BlockwiseModel, criterion: Criterion, tokens: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """Check a block position by position, projecting p_1 only where the verdict is still open.

    tokens (b, k), hidden (b, k, D) from the verify pass. Token j+1 is checked against p_1 at
    ``hidden[:, j]`` (the rule's :meth:`~lightning_bpd.decoding.criteria.Criterion.check_position`) for
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


@torch.no_grad()
def blockwise_decode(
    model: BlockwiseModel,
    src: Tensor,
    criterion: Criterion | None = None,
    max_len: int = 256,
    k: int | None = None,
    lazy: bool = False,
    stop_below: float | None = None,
    tree: Tree | DynamicTree | None = None,
) -> DecodeResult:
    """Decode ``src`` (B, S) with blockwise parallel decoding.

    ``criterion`` defaults to :class:`Exact`, which reproduces greedy decoding token for token.
    ``k`` defaults to the model's number of heads. Rows accept different numbers of tokens and
    finish at different times (EOS inside a block ends the row; nothing after it is emitted).
    ``lazy`` verifies prefix rules position by position (:func:`verify_lazily`). ``stop_below`` is the
    confidence stop of deterministic rules (:func:`propose`): blocks may be shorter than k. ``tree``: propose and
    verify a tree of candidates instead (:func:`~lightning_bpd.decoding.tree_decode.tree_decode`), or a dynamic tree
    per row and iteration (:class:`~lightning_bpd.decoding.dynamic_tree.DynamicTree`, exact acceptance).
    """
    criterion = criterion if criterion is not None else Exact()
    if tree is not None:
        from lightning_bpd.decoding.dynamic_tree import DynamicTree, dynamic_tree_decode  # they build on this module
        from lightning_bpd.decoding.tree_decode import tree_decode

        if isinstance(tree, DynamicTree):
            if lazy or stop_below is not None:
                raise ValueError("tree decoding takes neither lazy verification nor a confidence stop (stop_below)")
            return dynamic_tree_decode(model, src, criterion, max_len, tree, k)
        return tree_decode(model, src, criterion, max_len, tree, k, lazy=lazy, stop_below=stop_below)
    check_decode_args(model, src, max_len)
    k = resolve_k(model, k)
    criterion.validate(k)
    check_stop_below(stop_below, criterion)
    criterion.reset(src.device)
    rules = RuleBook(model, max_len, src.device, src)
    batch, room = src.shape[0], source_room(model, src)  # room: None, or each row's inputs before its context ends
    context = model.encode(src)
    cache = model.new_cache(batch, capacity=1 + max_len + k)
    book = RowBook(batch, max_len, k, model.pad_id, src.device)
    bos = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=src.device)
    block = propose(model, criterion, model.decode_step(bos, context, cache)[:, -1], book.block_width(k, room),
                    source=chain_source(model, context), stop_below=stop_below,
                    p1=rules.opening(batch))  # tokens (B, <= k)
    if not criterion.stochastic:
        block.tokens = rules.forced_proposals(book, block.tokens)
    calls = 1
    while True:
        width = block.tokens.shape[1]  # k, or fewer after a confidence stop
        hidden = model.decode_step(block.tokens, context, cache)  # (b, width, D)
        calls += 1
        accepted, first = verify(model, criterion, block, hidden, lazy, rules.verifying(book, block.tokens))
        n, done = book.commit(block.tokens, accepted, rules.stops)
        last = hidden.gather(1, (accepted - 1)[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (b, D)
        keep = book.settle(n, done)  # the one host read of the iteration
        if keep is not None:
            if not keep:
                break
            rows = torch.tensor(keep, dtype=torch.long, device=src.device)
            context, last, accepted = context.select(rows), last[rows], accepted[rows]
            first = first[rows] if first is not None else None
            cache.select(rows)
        # keep BOS and every committed token (a live row kept all it accepted)
        cache.crop(cache.lengths - width + accepted, bounds=book.length_bounds(offset=1), check=False)
        opening = rules.next(book) if criterion.stochastic else None  # p_1 for a sampled token 1
        block = propose(model, criterion, last, book.block_width(k, room), first, chain_source(model, context),
                        stop_below, opening)  # fewer than k proposals where a row's context ends
        if not criterion.stochastic:  # a forced token where a rule forces one (a draw keeps its own distribution)
            block.tokens = rules.forced_proposals(book, block.tokens)
    return book.result(calls)
