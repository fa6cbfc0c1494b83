"""Distributions for lossless (speculative) sampling, and the slow ancestral sampler they must match. Torch only.

Every distribution the samplers use goes through :func:`probabilities`: logits / temperature, softmax,
then top-p (nucleus) filtering. Temperature 0 means greedy: a one-hot distribution on the argmax.

Speculative sampling (Leviathan et al., 2023; Chen et al., 2023) turns a draft token x ~ q into a
sample of the target p: accept x with probability min(1, p(x) / q(x)) (:func:`accept_draws`), and
on rejection draw from ``normalize(max(0, p - q))`` (:func:`residual`). The output is distributed
exactly as p, whatever q is, as long as x really was drawn from q.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.generation_rules import reference_rules, ruled_at
from lightning_bpd.decoding.greedy import strip_padding, token_by_token
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult, check_decode_args, pack_rows


def check_sampling_args(temperature: float, top_p: float) -> None:
    """Raise ValueError on a temperature outside [0, inf) or a top_p outside (0, 1]."""
    if not isinstance(temperature, (int, float)) or not 0 <= temperature < float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
        raise ValueError(f"top_p must lie in (0, 1], got {top_p!r}")


def top_p_filter(probs: Tensor, top_p: float) -> Tensor:
    """Keep the smallest set of most likely tokens whose mass is >= ``top_p`` (at least one), renormalized.

    probs (..., V) -> (..., V). Ties are ranked by token id (a stable sort), so the set is deterministic.
    """
    if top_p >= 1:
        return probs
    ranked, order = probs.sort(dim=-1, descending=True, stable=True)  # (..., V) each
    before = ranked.cumsum(dim=-1).roll(1, dims=-1)  # mass of the strictly better-ranked tokens, (..., V)
    before[..., 0] = 0  # the most likely token is always kept
    keep = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)  # (..., V)
    kept = probs * keep
    return kept / kept.sum(dim=-1, keepdim=True)


def probabilities(logits: Tensor, temperature: float = 1.0, top_p: float = 1.0) -> Tensor:
    """Sampling distribution (..., V) from logits (..., V): temperature, softmax, then top-p.

    Computed in at least float32. Temperature 0 gives the one-hot distribution of the argmax.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if temperature == 0:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return top_p_filter(torch.softmax(logits / temperature, dim=-1), top_p)


def sample(probs: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token per distribution: probs (..., V) -> long (...). Zero-probability tokens are never drawn."""
    flat = probs.reshape(-1, probs.shape[-1])  # (N, V)
    if flat.shape[0] == 0:
        return torch.zeros(probs.shape[:-1], dtype=torch.long, device=probs.device)
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def residual(p: Tensor, q: Tensor) -> Tensor:
    """The distribution to draw from after rejecting a draft of q: normalize(max(0, p - q)), (..., V).

    Where p <= q everywhere (numerically; a rejection then has probability ~0) it falls back to p.
    """
    diff = (p - q).clamp(min=0)  # (..., V)
    total = diff.sum(dim=-1, keepdim=True)  # (..., 1)
    return torch.where(total > 0, diff / total.clamp(min=torch.finfo(diff.dtype).tiny), p)


def accept_draws(tokens: Tensor, p: Tensor, q: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Accept each draft token x ~ q with probability min(1, p(x) / q(x)).

    tokens (..., m), p and q (..., m, V) -> bool (..., m). One uniform u per token; x is accepted
    when u * q(x) < p(x), which is the same test without a division (q(x) > 0 for a drawn x).
    """
    px = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (..., m)
    qx = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (..., m)
    u = torch.rand(px.shape, generator=generator, dtype=px.dtype, device=px.device)  # (..., m)
    return u * qx < px


def new_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``seed`` (a fresh random seed when None)."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator


@torch.no_grad()
def ancestral_sample(
    model: BlockwiseModel,
    src: Tensor,
    max_len: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """Slow, obviously correct sampling from p_1: one row at a time, no padding, no cache.

    Each step re-runs the whole prefix and draws the next token from :func:`probabilities` of p_1.
    Rows stop after EOS or at ``max_len``. Temperature 0 is greedy decoding.
    """
    check_decode_args(model, src, max_len)
    check_sampling_args(temperature, top_p)
    bound, stops, befores = reference_rules(model, src, max_len)  # befores: what the rules see before token 0
    rows: list[list[int]] = []
    for before, row_src in zip(befores, strip_padding(src, model.pad_id)):
        context = model.encode(row_src)
        out: list[int] = []
        while len(out) < max_len and (not out or out[-1] not in stops):
            prefix = [model.bos_id, *out]
            logits = model.logits_first(model.decode_full(torch.tensor([prefix], device=src.device), context)[0, -1:])
            if bound is not None:  # (1, V): the generation rules, then the distribution
                logits = ruled_at(bound, [*before, *out], len(out))(logits)
            logits = logits[0]  # (V,)
            out.append(int(sample(probabilities(logits, temperature, top_p), generator)))
        rows.append(out)
    lengths = torch.tensor([len(r) for r in rows], device=src.device)
    blocks = [[1] * len(r) for r in rows]
    return DecodeResult(pack_rows(rows, model.pad_id, src.device), lengths, lengths.clone(), int(lengths.sum()), blocks)


@torch.no_grad()
def sample_decode(
    model: BlockwiseModel,
    src: Tensor,
    max_len: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
) -> DecodeResult:
    """Ancestral sampling from p_1 with the KV cache: the fast baseline of speculative sampling.

    The sampling twin of :func:`~lightning_bpd.decoding.greedy.greedy_decode` (one decoder call of one
    token per step, finished rows leave the batch). With one row it draws the same random numbers as
    :func:`ancestral_sample`, so the two agree token for token at a fixed seed.
    """
    check_decode_args(model, src, max_len)
    check_sampling_args(temperature, top_p)
    return token_by_token(model, src, max_len,
                          lambda h, p1: sample(probabilities(p1.logits_first(h), temperature, top_p), generator))
