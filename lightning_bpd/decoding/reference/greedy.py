"""Greedy decoding of p_1, the uncached reference (the oracle every decoder is checked against). Torch only."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.generation_rules import reference_rules, ruled_at
from lightning_bpd.decoding.greedy import strip_padding
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args, first_argmax, pack_rows
from lightning_bpd.nn.argmax import argmax


@torch.no_grad()
def greedy_decode_reference(model: BlockwiseModel, src: Tensor, max_len: int) -> DecodeResult:
    """Slow, obviously correct greedy: one row at a time, no padding, the whole prefix re-run each step, the
    generation rules applied to p_1's logits in ``generate``'s order."""
    check_decode_args(model, src, max_len)
    bound, stops, befores = reference_rules(model, src, max_len)  # befores: what the rules see before token 0
    rows: list[list[int]] = []
    for before, row_src in zip(befores, strip_padding(src, model.pad_id)):
        context = model.encode(row_src)
        out: list[int] = []
        while len(out) < max_len:
            prefix = [model.bos_id, *out]
            h = model.decode_full(torch.tensor([prefix], device=src.device), context)[0, -1:]  # (1, D)
            if bound is None:
                nxt = int(first_argmax(model, h)[0])
            else:  # the rules on p_1's logits, then their argmax
                nxt = int(argmax(ruled_at(bound, [*before, *out], len(out))(model.logits_first(h)))[0])
            out.append(nxt)
            if nxt in stops:
                break
        rows.append(out)
    lengths = torch.tensor([len(r) for r in rows], device=src.device)
    calls = int(lengths.sum())
    return DecodeResult(pack_rows(rows, model.pad_id, src.device), lengths, lengths.clone(), calls, [[1] * len(r) for r in rows])
