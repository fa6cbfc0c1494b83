"""How often each head agrees with the model's own greedy output. Torch only.

The accepted block under exact acceptance is the run of heads 2..k whose proposals equal what
greedy decoding of p_1 emits, so the number that predicts it is each head's teacher-forced
agreement with greedy's output (not its accuracy against reference translations): run the decoder
over greedy's tokens, and count how often head i's argmax at position t is greedy's token t + i
(chained heads are fed greedy's tokens t .. t + i - 1, as they are when heads 1..i-1 were right).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.blockwise import chain_source
from lightning_bpd.decoding.protocol import BlockwiseModel
from lightning_bpd.nn.loss import decoder_inputs, shifted_targets


@torch.no_grad()
def head_agreement(model: BlockwiseModel, src: Tensor, tokens: Tensor, lengths: Tensor,
                   k: int | None = None) -> tuple[Tensor, Tensor]:
    """Agreement counts of heads 1..k with greedy's output ``tokens`` (B, L) of ``lengths`` (B,).

    Returns (matches (k,), positions (k,)) as float tensors: head i is scored at every position t
    with t + i < length (so head 1 scores every token; with a cached greedy output it agrees 100%).
    """
    k = model.k if k is None else k
    width = tokens.shape[1]
    arange = torch.arange(width, device=tokens.device)
    real = arange < lengths[:, None]  # (B, L)
    targets = torch.where(real, tokens, model.pad_id)  # (B, L)
    context = model.encode(src)
    hidden = model.decode_full(decoder_inputs(targets, model.bos_id), context)  # (B, L, D)
    chained = bool(model.chained_heads)
    source = chain_source(model, context)
    prev = torch.stack([shifted_targets(targets, j, model.pad_id) for j in range(k - 1)], dim=-1) if chained and k > 1 else None
    matches, positions = torch.zeros(k), torch.zeros(k)
    for i in range(k):
        target = shifted_targets(targets, i, model.pad_id)  # (B, L): greedy's token t + i
        scored = shifted_targets(real.long(), i, 0).bool()  # (B, L)
        if chained:
            rows = scored.nonzero()[:, 0]  # (N,): the batch row of each scored position
            guess = model.logits_heads(hidden[scored], [i], None if prev is None else prev[scored],
                                       source.take(rows) if source is not None else None)  # (N, 1, V)
        else:
            guess = model.logits_heads(hidden[scored], [i])  # (N, 1, V)
        matches[i] = float((guess[:, 0].argmax(dim=-1) == target[scored]).sum())
        positions[i] = float(scored.sum())
    return matches, positions
