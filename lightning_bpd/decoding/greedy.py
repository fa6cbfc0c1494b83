"""Greedy decoding of p_1: the cached fast path and the uncached reference (the oracle). Torch only."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args, pack_rows
from lightning_bpd.decoding.row_book import RowBook


@torch.no_grad()
def greedy_decode(model: BlockwiseModel, src: Tensor, max_len: int) -> DecodeResult:
    """Batched greedy decoding of p_1 with the KV cache: one decoder call of one token per step."""
    check_decode_args(model, src, max_len)
    context = model.encode(src)
    cache = model.new_cache(src.shape[0], capacity=1 + max_len)
    book = RowBook(src.shape[0], max_len, 1, model.pad_id, src.device)
    inputs = torch.full((src.shape[0], 1), model.bos_id, dtype=torch.long, device=src.device)
    calls = 0
    while book.live.numel() > 0:
        h = model.decode_step(inputs, context, cache)[:, -1]  # (b, D)
        calls += 1
        nxt = model.logits_first(h).argmax(dim=-1)  # (b,)
        _, done = book.commit(nxt[:, None], torch.ones_like(nxt), model.eos_id)
        keep = book.drop_finished(done)
        if keep is not None:
            context, nxt = context.select(keep), nxt[keep]
            cache.select(keep)
        inputs = nxt[:, None]
    return book.result(calls)


def strip_padding(src: Tensor, pad_id: int) -> list[Tensor]:
    """Each source row without its pad tokens, as a (1, S_b) tensor."""
    return [row[row != pad_id][None] for row in src]


@torch.no_grad()
def greedy_decode_reference(model: BlockwiseModel, src: Tensor, max_len: int) -> DecodeResult:
    """Slow, obviously correct greedy: one row at a time, no padding, the whole prefix re-run each step."""
    check_decode_args(model, src, max_len)
    rows: list[list[int]] = []
    for row_src in strip_padding(src, model.pad_id):
        context = model.encode(row_src)
        out: list[int] = []
        while len(out) < max_len:
            prefix = torch.tensor([[model.bos_id, *out]], device=src.device)
            nxt = int(model.logits_first(model.decode_full(prefix, context)[0, -1]).argmax())
            out.append(nxt)
            if nxt == model.eos_id:
                break
        rows.append(out)
    lengths = torch.tensor([len(r) for r in rows], device=src.device)
    calls = int(lengths.sum())
    return DecodeResult(pack_rows(rows, model.pad_id, src.device), lengths, lengths.clone(), calls, [[1] * len(r) for r in rows])
