"""Greedy decoding of p_1, the cached fast path (its uncached reference, the oracle:
:mod:`lightning_bpd.decoding.reference.greedy`). Torch only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.generation_rules import RuleBook, RuledFirst
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args, first_argmax
from lightning_bpd.decoding.row_book import ends_row


@torch.no_grad()
def greedy_decode(model: BlockwiseModel, src: Tensor, max_len: int) -> DecodeResult:
    """Batched greedy decoding of p_1 with the KV cache: one decoder call of one token per step.

    Finished rows leave the batch; the per-step bookkeeping is one write and one EOS check, so
    this stays a fair (no wasted work) baseline for blockwise decoding.
    """
    check_decode_args(model, src, max_len)
    return token_by_token(model, src, max_len, lambda h, p1: first_argmax(p1, h))


def token_by_token(model: BlockwiseModel, src: Tensor, max_len: int,
                   pick: Callable[[Tensor, Any], Tensor]) -> DecodeResult:
    """The cached one-token-per-step loop: ``pick(h, p1)`` turns the decoder's hidden states (b, D) into the
    next tokens (b,) through p_1 as ``p1`` reads it (the model, or the model under its generation rules at this
    step: :mod:`lightning_bpd.decoding.generation_rules`): its argmax (:func:`first_argmax`) or a draw.

    Shared by greedy decoding (argmax) and ancestral sampling (a draw). Rows stop after an EOS id or at
    ``max_len`` and leave the batch.
    """
    rules = RuleBook(model, max_len, src.device, src)
    bound, stops = rules.bound, rules.stops
    batch, device = src.shape[0], src.device
    context = model.encode(src)
    cache = model.new_cache(batch, capacity=1 + max_len)
    tokens = torch.full((batch, max_len), model.pad_id, dtype=torch.long, device=device)
    lengths = torch.full((batch,), max_len, dtype=torch.long, device=device)
    live = torch.arange(batch, device=device)  # original index of each live row
    inputs = torch.full((batch, 1), model.bos_id, dtype=torch.long, device=device)
    window = rules.window
    history = torch.full((batch, window + max_len), -1, dtype=torch.long, device=device)  # (B, window + max_len)
    if window:
        history[:, :window] = rules.start
    steps = 0
    for step in range(max_len):
        h = model.decode_step(inputs, context, cache)[:, -1]  # (b, D)
        steps += 1
        if bound is None or not bound.touches(step, step):  # no rule can change this step's token
            p1 = model
        else:
            tail = history[live, step : step + window] if window else None  # (b, window)
            p1 = RuledFirst(model, bound, torch.full((h.shape[0],), step, dtype=torch.long, device=device), tail)
        nxt = pick(h, p1)  # (b,)
        tokens[live, step] = nxt
        if window:
            history[live, window + step] = nxt
        if stops is not None:
            done = ends_row(nxt, stops)
            if bool(done.any()):
                lengths[live[done]] = step + 1
                keep = (~done).nonzero().squeeze(1)
                if keep.numel() == 0:
                    break
                live, nxt, context = live[keep], nxt[keep], context.select(keep)
                cache.select(keep)
        inputs = nxt[:, None]
    width = max(1, int(lengths.max()))
    tokens = tokens[:, :width].masked_fill(torch.arange(width, device=device) >= lengths[:, None], model.pad_id)
    blocks = [[1] * n for n in lengths.tolist()]
    return DecodeResult(tokens, lengths, lengths.clone(), steps, blocks)


def strip_padding(src: Tensor, pad_id: int) -> list[Tensor]:
    """Each source row without its pad tokens, as a (1, S_b) tensor."""
    return [row[row != pad_id][None] for row in src]
