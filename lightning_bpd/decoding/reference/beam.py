"""Beam search over p_1, the uncached reference, with :func:`~lightning_bpd.decoding.beam.beam_search`'s contract
(stated there). Torch only."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.beam import BeamResult, check_beam_args, length_penalty, log_probs
from lightning_bpd.decoding.greedy import strip_padding
from lightning_bpd.decoding.protocol import BlockwiseModel, pack_rows


@torch.no_grad()
def beam_search_reference(
    model: BlockwiseModel, src: Tensor, max_len: int, beam_size: int = 4, alpha: float = 0.6
) -> BeamResult:
    """Slow, obviously correct beam search with the same contract: one unpadded source at a time,
    no KV cache (the whole prefix of every hypothesis re-run with ``decode_full``), Python lists."""
    check_beam_args(model, src, max_len, beam_size, alpha)
    eos, rows, scores, calls = model.eos_id, [], [], 0
    for row_src in strip_padding(src, model.pad_id):
        context = model.encode(row_src)
        alive: list[tuple[list[int], float]] = [([], 0.0)]  # (tokens, raw score), best first
        finished: list[tuple[list[int], float]] = []  # (tokens, normalized score), best first
        for n in range(1, max_len + 1):
            cands: list[tuple[float, list[int]]] = []
            for toks, score in alive:
                prefix = torch.tensor([[model.bos_id, *toks]], device=src.device)
                logp = log_probs(model, model.decode_full(prefix, context)[0, -1]).tolist()
                calls += 1
                cands += [(score + lp, [*toks, tok]) for tok, lp in enumerate(logp)]
            ranked = sorted(cands, key=lambda c: -c[0])[: 2 * beam_size]
            new = [(t, s / length_penalty(n, alpha)) for i, (s, t) in enumerate(ranked) if i < beam_size and t[-1] == eos]
            finished = sorted(finished + new, key=lambda f: -f[1])[:beam_size]
            alive = [(t, s) for s, t in ranked if t[-1] != eos][:beam_size]
            if n == max_len:
                at_max = [(t, s / length_penalty(max_len, alpha)) for t, s in alive]
                finished = sorted(finished + at_max, key=lambda f: -f[1])[:beam_size]
            elif len(finished) == beam_size and alive[0][1] / length_penalty(max_len, alpha) <= finished[-1][1]:
                break
        rows.append(finished[0][0])
        scores.append(finished[0][1])
    lengths = torch.tensor([len(r) for r in rows], device=src.device)
    out = torch.tensor(scores, dtype=torch.float64, device=src.device)
    return BeamResult(pack_rows(rows, model.pad_id, src.device), lengths, lengths.clone(), calls,
                      [[1] * len(r) for r in rows], scores=out)
