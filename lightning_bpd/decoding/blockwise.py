"""Blockwise parallel decoding (Stern et al., 2018), batched and KV-cached. Torch only.

The combined scoring and proposal model of section 4: after a first call on BOS, every iteration
is ONE decoder call on the k proposed tokens of each row. That call both verifies the proposals
(p_1 at each proposed position) and, at the last accepted position, yields the next k proposals
(p_1..p_k), so n tokens cost one call. Rejected positions are cropped from the KV cache.

Only p_1 is projected at the verified positions and the heads at one position per row, not the
naive k*k. For rules made of per-position prefix checks (exact, top-n, eps) the verification is
lazy: position j is projected only for rows whose checks 2..j passed, and p_1 at a row's first
failure gives the first token of its next block, so an iteration that accepts n < k tokens costs
n + (k - 1) projections per row instead of 2k - 1 (:func:`verify_lazily`, :func:`propose`).

One iteration, in the words of the algorithm::

    hidden  = model.decode_step(block.tokens, context, cache)   # verify pass, (b, k, D)
    verdict = criterion.judge(block, p_1 at hidden[:, :-1])     # accepted sizes (+ carried tokens)
    commit(block.tokens[:, :accepted]);  cache.crop(...)
    block   = criterion.draft(p_1..p_k at hidden[accepted - 1], verdict.next_first)

For the deterministic rules ``judge``/``draft`` are ``accept``/``propose`` and ``next_first`` is
None. :class:`~lightning_bpd.decoding.criteria.SpeculativeSampling` draws the block from the
heads and, when it rejects a token, returns the replacement drawn from the residual distribution
as ``next_first``: that token opens the row's next block in place of a fresh p_1 sample.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.criteria import Block, Criterion, Exact
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args
from lightning_bpd.decoding.row_book import RowBook


def resolve_k(model: BlockwiseModel, k: int | None) -> int:
    """The block size to decode with: the model's own k, or fewer heads of it."""
    if k is None:
        return model.k
    if not isinstance(k, int) or not 1 <= k <= model.k:
        raise ValueError(f"k must be an integer in [1, {model.k}] (the model's number of heads), got {k!r}")
    return k


def propose(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor | None = None) -> Block:
    """Next block (b, k) from the hidden state (b, D) of each row's last accepted position.

    ``first`` (b,), where >= 0, is a token carried over from the last verdict (the token greedy
    decoding emits next, or a residual draw): it replaces p_1's proposal, and when every row has
    one p_1 is not projected at all. Chained heads (``model.chained_heads``) propose one token at a
    time, each step fed the token before it (:func:`propose_chained`).
    """
    if getattr(model, "chained_heads", False) and k > 1:
        return propose_chained(model, criterion, h, k, first)
    if k > 1 and first is not None and not criterion.stochastic and bool((first >= 0).all()):
        rest = criterion.draft(model.logits_heads(h, range(1, k)))  # tokens (b, k-1)
        return Block.cat([Block(first[:, None]), rest])
    return criterion.draft(model.logits_heads(h, range(k)), first)  # logits (b, k, V)


def propose_chained(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor | None = None) -> Block:
    """Chained heads: token 1 from p_1 (or ``first``), then token i from head i fed token i-1."""
    if first is not None and bool((first >= 0).all()):
        parts = [Block(first[:, None])]
    else:
        parts = [criterion.draft(model.logits_first(h)[:, None], first)]  # (b, 1)
    z = h
    for i in range(1, k):
        z, logits = model.chain_step(z, parts[-1].tokens[:, 0], i)  # (b, D), (b, V)
        parts.append(criterion.draft(logits[:, None]))  # (b, 1)
    return Block.cat(parts)


def verify_lazily(model: BlockwiseModel, criterion: Criterion, tokens: Tensor, hidden: Tensor) -> tuple[Tensor, Tensor]:
    """Check a block position by position, projecting p_1 only where the verdict is still open.

    tokens (b, k), hidden (b, k, D) from the verify pass. Token j+1 is checked against p_1 at
    ``hidden[:, j]`` for the rows whose tokens 2..j all passed; a row stops at its first failure,
    and the argmax of p_1 there, the token greedy decoding emits next, becomes the first token of
    its next block (p_1 was computed there anyway, and head 1 is p_1). Same verdict as checking all
    k-1 positions at once (:meth:`Criterion.accept`), with about (accepted size) projections per row
    instead of k-1. Returns accepted (b,) in [1, k] and next_first (b,), -1 where all k were accepted.
    """
    b, k = tokens.shape
    accepted = torch.ones(b, dtype=torch.long, device=tokens.device)  # (b,)
    next_first = torch.full((b,), -1, dtype=torch.long, device=tokens.device)  # (b,)
    open_rows = None  # None: every row (avoids indexing while all rows are still open)
    for j in range(k - 1):
        h = hidden[:, j] if open_rows is None else hidden[open_rows, j]  # (a, D)
        logits = model.logits_first(h)[:, None]  # (a, 1, V)
        proposal = tokens[:, j + 1 : j + 2] if open_rows is None else tokens[open_rows, j + 1 : j + 2]  # (a, 1)
        ok = criterion.matches(proposal, logits)[:, 0]  # (a,)
        rows = torch.arange(b, device=tokens.device) if open_rows is None else open_rows
        if bool(ok.all()):
            accepted[rows] += 1
            open_rows = rows
            continue
        failed = ~ok
        next_first[rows[failed]] = logits[failed, 0].argmax(dim=-1)
        open_rows = rows[ok]
        accepted[open_rows] += 1
        if open_rows.numel() == 0:
            break
    return accepted, next_first


@torch.no_grad()
def blockwise_decode(
    model: BlockwiseModel,
    src: Tensor,
    criterion: Criterion | None = None,
    max_len: int = 256,
    k: int | None = None,
) -> DecodeResult:
    """Decode ``src`` (B, S) with blockwise parallel decoding.

    ``criterion`` defaults to :class:`Exact`, which reproduces greedy decoding token for token.
    ``k`` defaults to the model's number of heads. Rows accept different numbers of tokens and
    finish at different times (EOS inside a block ends the row; nothing after it is emitted).
    """
    criterion = criterion if criterion is not None else Exact()
    check_decode_args(model, src, max_len)
    k = resolve_k(model, k)
    criterion.validate(k)
    criterion.reset(src.device)
    batch = src.shape[0]
    context = model.encode(src)
    cache = model.new_cache(batch, capacity=1 + max_len + k)
    book = RowBook(batch, max_len, k, model.pad_id, src.device)
    bos = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=src.device)
    block = propose(model, criterion, model.decode_step(bos, context, cache)[:, -1], k)  # tokens (B, k)
    calls = 1
    lazy = criterion.prefix_checks and not criterion.stochastic
    while book.live.numel() > 0:
        hidden = model.decode_step(block.tokens, context, cache)  # (b, k, D)
        calls += 1
        if lazy:
            accepted, first = verify_lazily(model, criterion, block.tokens, hidden)  # (b,), (b,)
        else:
            verdict = criterion.judge(block, model.logits_first(hidden[:, :-1]))
            accepted, first = verdict.accepted, verdict.next_first  # (b,), (b,) or None
        _, done = book.commit(block.tokens, accepted, model.eos_id)
        cache.crop(cache.lengths - k + accepted)  # keep BOS and every committed token
        last = hidden[torch.arange(hidden.shape[0], device=src.device), accepted - 1]  # (b, D)
        keep = book.drop_finished(done)
        if keep is not None:
            if keep.numel() == 0:
                break
            context, last = context.select(keep), last[keep]
            first = first[keep] if first is not None else None
            cache.select(keep)
        block = propose(model, criterion, last, k, first)
    return book.result(calls)
