"""Helpers of the sampling tests: a tiny model whose output distribution can be enumerated exactly,
and the chi-square test of sampled sequences against it."""

from __future__ import annotations

from collections import Counter

import torch

from lightning_bpd.decoding.sampling import probabilities
from tests.models import EOS, Wrapped, random_model

VOCAB, MAX_LEN, K = 6, 4, 3
SRC = torch.tensor([[3, 4, 5, 3]])
P_MIN = 1e-3
N_SAMPLES = 5000


def tiny_model(seed: int = 2, scale: float = 10.0, head_scale: float = 50.0, k: int = K) -> Wrapped:
    """A random 6-token float64 model whose heads 2..k disagree with p_1 often (EOS = token 2)."""
    model = random_model(k=k, vocab=VOCAB, seed=seed)
    model.eos_id = EOS
    if k > 1:
        with torch.no_grad():
            model.head.out.weight.mul_(head_scale)  # random heads: q_i far from p_1
    return Wrapped(model, scale)


@torch.no_grad()
def sequence_probabilities(model, src: torch.Tensor, max_len: int, temperature: float, top_p: float) -> dict:
    """Exact probability of every output of ancestral sampling from p_1 (tuple of tokens -> probability)."""
    context = model.encode(src)  # src (1, S)
    out: dict[tuple[int, ...], float] = {}
    frontier: dict[tuple[int, ...], float] = {(): 1.0}
    for depth in range(max_len):
        prefixes = list(frontier)
        tgt = torch.tensor([[model.bos_id, *p] for p in prefixes])  # (n, depth + 1)
        rows = torch.zeros(len(prefixes), dtype=torch.long)
        h = model.decode_full(tgt, context.select(rows))[:, -1]  # (n, D)
        dist = probabilities(model.logits_first(h), temperature, top_p)  # (n, V)
        nxt: dict[tuple[int, ...], float] = {}
        for prefix, probs in zip(prefixes, dist.tolist()):
            for tok, p in enumerate(probs):
                if p > 0:
                    seq = (*prefix, tok)
                    target = out if tok == model.eos_id or depth + 1 == max_len else nxt
                    target[seq] = frontier[prefix] * p
        frontier = nxt
    return out


def chi_square_p_value(samples: list[list[int]], exact: dict, min_expected: float = 5.0) -> tuple[float, int]:
    """p-value of the chi-square goodness-of-fit test of ``samples`` against ``exact``; also the bin count."""
    n = len(samples)
    counts = Counter(tuple(s) for s in samples)
    assert set(counts) <= set(exact), f"impossible sequences sampled: {set(counts) - set(exact)}"
    observed, expected, pooled_o, pooled_e = [], [], 0.0, 0.0
    for seq, p in exact.items():
        if n * p >= min_expected:
            observed.append(counts[seq])
            expected.append(n * p)
        else:
            pooled_o, pooled_e = pooled_o + counts[seq], pooled_e + n * p
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    o, e = torch.tensor(observed, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64)
    stat = float(((o - e) ** 2 / e).sum())
    df = len(observed) - 1
    half = torch.tensor([df / 2, stat / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(half[0], half[1])), len(observed)


def copies(n: int) -> torch.Tensor:
    return SRC.expand(n, -1).contiguous()
