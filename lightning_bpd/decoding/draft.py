"""Speculative decoding with a separate draft model: the second proposer. Torch only.

A small draft model (any :class:`~lightning_bpd.decoding.protocol.BlockwiseModel` with the target's
vocabulary and special ids; only its p_1 is used) proposes tokens autoregressively with its own KV
cache, and the target verifies a whole block in one call, exactly as in
:func:`~lightning_bpd.decoding.blockwise.blockwise_decode`. One iteration of block size k::

    y_1      = target's own token (p_1 at the last accepted position, or the carried residual token)
    y_2..y_k = k-1 cached draft steps: feed (last committed token, y_1), then y_2, ..., y_{k-1}
    hidden   = target.decode_step(y_1..y_k)                      # one target call, (b, k, D)
    verdict  = criterion.judge(block, target p_1 at hidden[:, :-1])
    commit(y_1..y_n);  crop both caches;  next y_1 from target p_1 at hidden[n - 1]

The draft's cache always holds BOS and every committed token but the newest one, which is fed
again with the next y_1, so every draft step has the same width for every row. The deterministic
rules (:class:`~lightning_bpd.decoding.criteria.Exact`, ``TopK``, ...) take the argmax of the draft;
``Exact`` reproduces the target's greedy output. :class:`~lightning_bpd.decoding.criteria.SpeculativeSampling`
samples the draft tokens with q_i = the draft's distribution at step i and is lossless.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.criteria import Block, Criterion, Exact
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args
from lightning_bpd.decoding.row_book import RowBook


def check_draft_args(target: BlockwiseModel, draft: BlockwiseModel, k: int) -> None:
    """Raise ValueError on a block size below 1 or a draft whose special token ids differ from the target's."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (tokens per target call), got {k!r}")
    for name in ("pad_id", "bos_id", "eos_id"):
        if getattr(target, name) != getattr(draft, name):
            raise ValueError(f"draft {name}={getattr(draft, name)!r} differs from the target's {getattr(target, name)!r}")


def draft_block(
    draft: BlockwiseModel,
    criterion: Criterion,
    first_logits: Tensor,
    first: Tensor | None,
    last_token: Tensor,
    context: Any,
    cache: Any,
    k: int,
) -> Block:
    """One block (b, k): y_1 from the target's p_1 logits (b, V) or ``first`` (b,), then k-1 draft steps.

    ``last_token`` (b,) is the newest committed token (BOS at the start), the one the draft's cache lacks.
    """
    parts = [criterion.draft(first_logits[:, None], first)]  # tokens (b, 1)
    inputs = torch.stack([last_token, parts[0].tokens[:, 0]], dim=1)  # (b, 2)
    for _ in range(k - 1):
        logits = draft.logits_first(draft.decode_step(inputs, context, cache)[:, -1])  # (b, V)
        if logits.shape[-1] != first_logits.shape[-1]:
            raise ValueError(f"draft vocabulary ({logits.shape[-1]}) differs from the target's ({first_logits.shape[-1]})")
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
    last_token = torch.full((batch,), target.bos_id, dtype=torch.long, device=device)  # (B,)
    logits = target.logits_first(target.decode_step(last_token[:, None], t_context, t_cache)[:, -1])  # (B, V)
    first: Tensor | None = None
    calls = 1
    while book.live.numel() > 0:
        block = draft_block(draft, criterion, logits, first, last_token, d_context, d_cache, k)  # tokens (b, k)
        hidden = target.decode_step(block.tokens, t_context, t_cache)  # (b, k, D)
        calls += 1
        verdict = criterion.judge(block, target.logits_first(hidden[:, :-1]))
        accepted, first = verdict.accepted, verdict.next_first  # (b,), (b,) or None
        _, done = book.commit(block.tokens, accepted, target.eos_id)
        t_cache.crop(t_cache.lengths - k + accepted)  # BOS and every committed token
        if k > 1:
            d_cache.crop(d_cache.lengths - k + accepted)  # BOS and every committed token but the newest
        rows = torch.arange(hidden.shape[0], device=device)
        last, last_token = hidden[rows, accepted - 1], block.tokens[rows, accepted - 1]  # (b, D), (b,)
        keep = book.drop_finished(done)
        if keep is not None:
            if keep.numel() == 0:
                break
            t_context, d_context = t_context.select(keep), d_context.select(keep)
            t_cache.select(keep)
            d_cache.select(keep)
            last, last_token = last[keep], last_token[keep]
            first = first[keep] if first is not None else None
        logits = target.logits_first(last)  # (b, V)
    return book.result(calls)
