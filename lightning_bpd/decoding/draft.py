"""Speculative decoding with a separate draft model: the second proposer. Torch only.

A small draft model (any :class:`~lightning_bpd.decoding.protocol.BlockwiseModel` with the target's
vocabulary and special ids; only its p_1 is used) proposes tokens autoregressively with its own KV
cache, and the target verifies a whole block in one call, exactly as in
:func:`~lightning_bpd.decoding.blockwise.blockwise_decode`. One iteration of block size k::

    y_1      = target's own token (p_1 at the last accepted position, or the carried residual token)
    y_2..y_k = k-1 cached draft steps: feed (last committed token, y_1), then y_2, ..., y_{k-1}
    hidden   = target.decode_step(y_1..y_k)                      # one target call, (b, k, D)
    accepted, first = verify(target, criterion, block, hidden)   # as in blockwise decoding
    commit(y_1..y_n);  crop both caches;  next y_1 = first (greedy's next token), or sampled

The draft's cache always holds BOS and every committed token but the newest one, which is fed
again with the next y_1, so every draft step has the same width for every row. The deterministic
rules (:class:`~lightning_bpd.decoding.criteria.Exact`, ``TopK``, ...) take the argmax of the draft;
``Exact`` reproduces the target's greedy output. :class:`~lightning_bpd.decoding.criteria.SpeculativeSampling`
samples the draft tokens with q_i = the draft's distribution at step i and is lossless.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion, Exact
from lightning_bpd.decoding.blockwise import verify
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.protocol import BlockwiseModel, Cache, Context, DecodeResult, check_decode_args
from lightning_bpd.decoding.row_book import RowBook


def check_draft_args(target: BlockwiseModel, draft: BlockwiseModel, k: int) -> None:
    """Raise ValueError on a block size below 1 or a draft whose special token ids differ from the target's."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (tokens per target call), got {k!r}")
    ids = {"pad_id": (target.pad_id, draft.pad_id), "bos_id": (target.bos_id, draft.bos_id),
           "eos_id": (target.eos_id, draft.eos_id)}
    for name, (want, got) in ids.items():
        if got != want:
            raise ValueError(f"draft {name}={got!r} differs from the target's {want!r}")


def draft_block(
    draft: BlockwiseModel,
    criterion: Criterion,
    first_logits: Tensor | None,
    first: Tensor | None,
    last_token: Tensor,
    context: Context,
    cache: Cache,
    k: int,
    rules: RuleBook | None = None,
    book: RowBook | None = None,
) -> Block:
    """One block (b, k): y_1 from the target's p_1 logits (b, V) or ``first`` (b,), then k-1 draft steps.

    ``first`` is the verdict's opening token: complete for deterministic rules (then ``first_logits``
    may be None), -1 where p_1 must be sampled for sampling rules. ``last_token`` (b,) is the newest
    committed token (BOS at the start), the one the draft's cache lacks. ``rules`` (with the loop's ``book``):
    the target's generation rules, applied to the draft's steps too, so that its proposals obey them.
    """
    if first is not None and not criterion.stochastic:
        parts = [Block(first[:, None])]  # (b, 1)
    else:
        parts = [criterion.draft(first_logits[:, None], first)]  # type: ignore[index]  # tokens (b, 1)
    inputs = torch.stack([last_token, parts[0].tokens[:, 0]], dim=1)  # (b, 2)
    for _ in range(k - 1):
        logits = draft.logits_first(draft.decode_step(inputs, context, cache)[:, -1])  # (b, V)
        reader = None if rules is None or book is None else rules.verifying(book, Block.cat(parts).tokens)
        if reader is not None:  # the rules at the draft token's index
            logits = reader.rule(logits[:, None, :].expand(-1, len(parts), -1))[:, -1]
        parts.append(criterion.draft(logits[:, None]))  # tokens (b, 1)
        inputs = parts[-1].tokens  # (b, 1)
    return Block.cat(parts)


@torch.no_grad()
def draft_decode(
    target: BlockwiseModel,
    draft: BlockwiseModel,
    src: Tensor,
    criterion: Criterion | None = None,
    max_len: int = 256,
    k: int = 4,
) -> DecodeResult:
    """Decode ``src`` (B, S) with ``target``, ``draft`` proposing k-1 tokens of every block of k.

    ``criterion`` defaults to :class:`Exact` (the target's greedy output). ``model_calls`` counts the
    target's decoder calls (one per iteration plus the first on BOS); rows finish as in blockwise decoding.
    """
    criterion = criterion if criterion is not None else Exact()
    check_decode_args(target, src, max_len)
    check_draft_args(target, draft, k)
    criterion.validate(k)
    criterion.reset(src.device)
    batch, device = src.shape[0], src.device
    t_context, d_context = target.encode(src), draft.encode(src)
    t_cache = target.new_cache(batch, capacity=1 + max_len + k)
    d_cache = draft.new_cache(batch, capacity=1 + max_len + k)
    book = RowBook(batch, max_len, k, target.pad_id, device)
    rules = RuleBook(target, max_len, device, src)
    last_token = torch.full((batch,), target.bos_id, dtype=torch.long, device=device)  # (B,)
    h = target.decode_step(last_token[:, None], t_context, t_cache)[:, -1]  # (B, D)
    opening = rules.opening(batch) or target  # p_1 of the first token, under the rules
    logits = opening.logits_first(h)  # (B, V)
    check_draft_vocabulary(target, draft, logits)
    first: Tensor | None = None
    if not criterion.stochastic:  # greedy's first token (under the rules)
        first = criterion.first_token(opening, h)
    calls = 1
    while True:
        block = draft_block(draft, criterion, logits, first, last_token, d_context, d_cache, k, rules, book)
        hidden = target.decode_step(block.tokens, t_context, t_cache)  # (b, k, D)
        calls += 1
        accepted, first = verify(target, criterion, block, hidden, p1=rules.verifying(book, block.tokens))
        n, done = book.commit(block.tokens, accepted, rules.stops)
        last_token = block.tokens.gather(1, (accepted - 1)[:, None])[:, 0]  # (b,)
        logits = None
        if criterion.stochastic:  # p_1 at the last accepted position: token 1 where no residual was drawn
            last = hidden.gather(1, (accepted - 1)[:, None, None].expand(-1, 1, hidden.shape[-1]))[:, 0]  # (b, D)
            logits = target.logits_first(last)  # (b, V); the rules once the row's new length is known
        keep = book.settle(n, done)  # the one host read of the iteration
        if keep is not None:
            if not keep:
                break
            rows = torch.tensor(keep, dtype=torch.long, device=device)
            t_context, d_context = t_context.select(rows), d_context.select(rows)
            t_cache.select(rows)
            d_cache.select(rows)
            last_token, accepted = last_token[rows], accepted[rows]
            first = first[rows] if first is not None else None
            logits = logits[rows] if logits is not None else None
        reader = rules.next(book) if logits is not None else None
        if reader is not None:
            logits = reader.rule(logits)
        t_cache.crop(t_cache.lengths - k + accepted, bounds=book.length_bounds(offset=1), check=False)  # BOS + committed
        if k > 1:  # BOS and every committed token but the newest
            d_cache.crop(d_cache.lengths - k + accepted, bounds=book.length_bounds(offset=0), check=False)
    return book.result(calls)


def check_draft_vocabulary(target: BlockwiseModel, draft: BlockwiseModel, target_logits: Tensor) -> None:
    """Raise ValueError when the draft's vocabulary size (``draft.vocab_size``, when known) differs from the
    target's, the width of its p_1 logits (..., V)."""
    size = draft.vocab_size
    if size is not None and size != target_logits.shape[-1]:
        raise ValueError(f"draft vocabulary ({size}) differs from the target's ({target_logits.shape[-1]})")
