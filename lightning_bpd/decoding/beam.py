"""Beam search over p_1 (the scoring model): the cached batched fast path (the uncached reference:
:mod:`lightning_bpd.decoding.reference.beam`). Torch only.

Contract (both functions, exactly). Each source keeps ``beam_size`` alive hypotheses with raw
scores = sums of ``log_softmax(model.logits_first(h))``. A step extends every alive hypothesis by
every token and ranks the candidates best first (ties: earlier alive hypothesis, then lower token
id). Of the best ``2 * beam_size`` candidates:

* those ending in EOS *and ranked within the first beam_size* join the finished set (the fairseq
  rule; it is what makes ``beam_size=1, alpha=0`` exactly greedy). The finished set keeps the
  ``beam_size`` best by normalized score ``score / lp(len)``, ``lp(len) = ((5 + len) / 6) ** alpha``
  (Wu et al. 2016), ``len`` counting generated tokens including EOS; ties keep the earlier entry;
* the best ``beam_size`` candidates not ending in EOS stay alive.

Stopping rule, per source: stop when the finished set is full and
``best_alive_score / lp(max_len) <= worst_finished_score``. Raw scores are <= 0, only fall, and
``lp`` grows at most to ``lp(max_len)``, so this bound (T2T's) proves no alive continuation can beat
the worst finished hypothesis (for alpha = 0 it is the plain raw-score comparison). At ``max_len``
the alive hypotheses join the finished set as they are. If ``model.eos_id is None`` every
hypothesis runs to ``max_len``. The answer is each source's best finished hypothesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args


@dataclass
class BeamResult(DecodeResult):
    """A :class:`DecodeResult` plus ``scores`` (B,): the normalized score of each returned hypothesis."""

    scores: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))


def length_penalty(length: int, alpha: float) -> float:
    """``((5 + length) / 6) ** alpha`` (Wu et al. 2016); 1 for alpha = 0."""
    return ((5.0 + length) / 6.0) ** alpha


def check_beam_args(model: BlockwiseModel, src: Tensor, max_len: int, beam_size: int, alpha: float) -> None:
    """Raise ValueError, naming the argument and its allowed range, on unusable input."""
    check_decode_args(model, src, max_len)
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
        raise ValueError(f"beam_size must be an integer >= 1, got {beam_size!r}")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0 <= alpha < math.inf):
        raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")


def log_probs(model: BlockwiseModel, h: Tensor) -> Tensor:
    """(..., D) -> (..., V) log p_1, computed in at least float32."""
    logits = model.logits_first(h)
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), dim=-1)


def _merge(fin: tuple[Tensor, Tensor, Tensor], live: Tensor, new_tok: Tensor, new_score: Tensor, n: int) -> None:
    """Merge ``beam`` new hypotheses per live source into the finished set, in place.

    fin = (tokens (B, beam, L), normalized scores (B, beam) best first, -inf = empty; lengths (B, beam)).
    new_tok (b, beam, L), new_score (b, beam) (-inf = not a hypothesis), all of length ``n``.
    """
    fin_tok, fin_score, fin_len = fin
    beam, width = fin_score.shape[1], fin_tok.shape[2]
    best, order = torch.cat([fin_score[live], new_score], dim=1).sort(dim=1, descending=True, stable=True)
    order = order[:, :beam]  # (b, beam)
    toks = torch.cat([fin_tok[live], new_tok], dim=1).gather(1, order[..., None].expand(-1, -1, width))
    lens = torch.cat([fin_len[live], torch.full_like(fin_len[live], n)], dim=1).gather(1, order)
    fin_tok[live], fin_score[live], fin_len[live] = toks, best[:, :beam], lens


@torch.no_grad()
def beam_search(model: BlockwiseModel, src: Tensor, max_len: int, beam_size: int = 4, alpha: float = 0.6) -> BeamResult:
    """Batched beam search with the KV cache: one decoder call of one token per step for B * beam rows.

    The cache is reordered by parent hypothesis every step; sources that stop leave the batch.
    ``model_calls`` counts decoder steps; ``iterations`` = ``lengths`` (one token per iteration).
    """
    check_beam_args(model, src, max_len, beam_size, alpha)
    batch, device, beam, eos = src.shape[0], src.device, beam_size, model.eos_id
    context = model.encode(src).select(torch.arange(batch, device=device).repeat_interleave(beam))
    cache = model.new_cache(batch * beam, capacity=1 + max_len)
    live = torch.arange(batch, device=device)  # (b,) original source of each live source
    alive_tok = torch.full((batch, beam, max_len), model.pad_id, dtype=torch.long, device=device)  # (b, beam, L)
    alive_score = torch.full((batch, beam), -math.inf, dtype=torch.float64, device=device)  # (b, beam) raw
    alive_score[:, 0] = 0.0  # all beams start identical: keep one
    fin = (
        torch.full((batch, beam, max_len), model.pad_id, dtype=torch.long, device=device),  # (B, beam, L)
        torch.full((batch, beam), -math.inf, dtype=torch.float64, device=device),  # (B, beam) normalized
        torch.zeros((batch, beam), dtype=torch.long, device=device),  # (B, beam) lengths
    )
    inputs = torch.full((batch * beam, 1), model.bos_id, dtype=torch.long, device=device)  # (b * beam, 1)
    bound_lp, steps = length_penalty(max_len, alpha), 0
    for step in range(max_len):
        n, b = step + 1, live.numel()
        h = model.decode_step(inputs, context, cache)[:, -1]  # (b * beam, D)
        steps += 1
        logp = log_probs(model, h)  # (b * beam, V)
        vocab = logp.shape[-1]
        cand = (alive_score.reshape(-1, 1) + logp).reshape(b, beam * vocab)  # (b, beam * V) float64
        top, idx = cand.sort(dim=1, descending=True, stable=True)
        top, idx = top[:, : 2 * beam], idx[:, : 2 * beam]  # (b, 2 * beam) best first
        parent, tok = idx // vocab, idx % vocab  # (b, 2 * beam)
        seqs = alive_tok.gather(1, parent[..., None].expand(-1, -1, max_len))  # (b, 2 * beam, L)
        seqs[:, :, step] = tok
        is_eos = tok == eos if eos is not None else torch.zeros_like(tok, dtype=torch.bool)  # (b, 2 * beam)
        ends = is_eos[:, :beam] & top[:, :beam].isfinite()  # (b, beam): EOS ranked within the first beam
        if bool(ends.any()):
            _merge(fin, live, seqs[:, :beam], top[:, :beam].div(length_penalty(n, alpha)).masked_fill(~ends, -math.inf), n)
        rank = torch.arange(top.shape[1], device=device)
        order = (is_eos.long() * top.shape[1] + rank).argsort(dim=1)[:, :beam]  # (b, beam) best non-EOS
        alive_score, parent = top.gather(1, order), parent.gather(1, order)  # (b, beam)
        alive_tok = seqs.gather(1, order[..., None].expand(-1, -1, max_len))  # (b, beam, L)
        if n == max_len:  # alive hypotheses at max_len count as finished
            norm = alive_score.div(bound_lp).masked_fill(~alive_score.isfinite(), -math.inf)
            _merge(fin, live, alive_tok, norm, n)
            break
        worst = fin[1][live, -1]  # (b,)
        done = worst.isfinite() & (alive_score[:, 0] / bound_lp <= worst)  # (b,)
        keep = (~done).nonzero().squeeze(1)  # (b',)
        if keep.numel() == 0:
            break
        rows = (keep[:, None] * beam + parent[keep]).reshape(-1)  # (b' * beam,) parent row of each new row
        cache.select(rows)
        if bool(done.any()):
            context = context.select(rows)  # every beam of a source shares its context
            live, alive_score, alive_tok = live[keep], alive_score[keep], alive_tok[keep]
        inputs = alive_tok[:, :, step].reshape(-1, 1)  # (b' * beam, 1)
    lengths = fin[2][:, 0]  # (B,)
    tokens = fin[0][:, 0, : max(1, int(lengths.max()))]  # (B, L') already pad past each length
    blocks = [[1] * m for m in lengths.tolist()]
    return BeamResult(tokens, lengths, lengths.clone(), steps, blocks, scores=fin[1][:, 0].clone())
