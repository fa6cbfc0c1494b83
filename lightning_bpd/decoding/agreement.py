"""How often each head agrees with the model's own greedy output. Torch only.

The accepted block under exact acceptance is the run of heads 2..k whose proposals equal what
greedy decoding of p_1 emits, so the number that predicts it is each head's teacher-forced
agreement with greedy's output (not its accuracy against reference translations): run the decoder
over greedy's tokens, and count how often head i's argmax at position t is greedy's token t + i
(chained heads are fed greedy's tokens t .. t + i - 1, as they are when heads 1..i-1 were right).
:func:`head_rank_agreement` counts, for trees of candidates, how often greedy's token is a head's
rank-r choice (:meth:`~lightning_bpd.decoding.trees.tree.Tree.from_budget`).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import BlockwiseModel, chain_source
from lightning_bpd.nn.loss import decoder_inputs, shifted_targets


def teacher_forced_heads(model: BlockwiseModel, src: Tensor, tokens: Tensor, lengths: Tensor,
                         k: int) -> Iterator[tuple[int, Tensor, Tensor]]:
    """For each head i < k: (i, its logits (N, V) at every position t with t + i < length, greedy's token
    t + i there (N,)), over greedy's output ``tokens`` (B, L) of ``lengths`` (B,)."""
    width = tokens.shape[1]
    arange = torch.arange(width, device=tokens.device)
    real = arange < lengths[:, None]  # (B, L)
    targets = torch.where(real, tokens, model.pad_id)  # (B, L)
    context = model.encode(src)
    hidden = model.decode_full(decoder_inputs(targets, model.bos_id), context)  # (B, L, D)
    chained = bool(model.chained_heads)
    source = chain_source(model, context)
    prev = torch.stack([shifted_targets(targets, j, model.pad_id) for j in range(k - 1)], dim=-1) if chained and k > 1 else None
    for i in range(k):
        target = shifted_targets(targets, i, model.pad_id)  # (B, L): greedy's token t + i
        scored = shifted_targets(real.long(), i, 0).bool()  # (B, L)
        if chained:
            rows = scored.nonzero()[:, 0]  # (N,): the batch row of each scored position
            guess = model.logits_heads(hidden[scored], [i], None if prev is None else prev[scored],
                                       source.take(rows) if source is not None else None)  # (N, 1, V)
        else:
            guess = model.logits_heads(hidden[scored], [i])  # (N, 1, V)
        yield i, guess[:, 0], target[scored]


@torch.no_grad()
def head_agreement(model: BlockwiseModel, src: Tensor, tokens: Tensor, lengths: Tensor,
                   k: int | None = None) -> tuple[Tensor, Tensor]:
    """Agreement counts of heads 1..k with greedy's output ``tokens`` (B, L) of ``lengths`` (B,).

    Returns (matches (k,), positions (k,)) as float tensors: head i is scored at every position t
    with t + i < length (so head 1 scores every token; with a cached greedy output it agrees 100%).
    """
    k = model.k if k is None else k
    matches, positions = torch.zeros(k), torch.zeros(k)
    for i, guess, target in teacher_forced_heads(model, src, tokens, lengths, k):
        matches[i] = float((guess.argmax(dim=-1) == target).sum())
        positions[i] = float(target.numel())
    return matches, positions


def token_rank(logits: Tensor, tokens: Tensor) -> Tensor:
    """The rank (...) of ``tokens`` (...) in ``logits`` (..., V): how many tokens score higher, ties counted
    for the lower ids (the order of a stable descending sort, whose rank 0 is :func:`~lightning_bpd.nn.argmax.argmax`)."""
    own = logits.gather(-1, tokens[..., None])  # (..., 1)
    ids = torch.arange(logits.shape[-1], device=logits.device)
    above = (logits > own) | ((logits == own) & (ids < tokens[..., None]))
    return above.sum(dim=-1)


@torch.no_grad()
def head_rank_agreement(model: BlockwiseModel, src: Tensor, tokens: Tensor, lengths: Tensor, ranks: int,
                        k: int | None = None) -> Tensor:
    """How often greedy's token is each proposing head's rank-r choice: (k - 1, ranks) probabilities, row d - 1
    for the head at depth d (heads 2..k), teacher-forced on greedy's output ``tokens`` (B, L) of ``lengths`` (B,)
    as in :func:`head_agreement`. The table :meth:`~lightning_bpd.decoding.trees.tree.Tree.from_budget` builds a tree
    from. Head logits are read as the model proposes from them (its draft vocabulary, when it has one)."""
    k = model.k if k is None else k
    if not isinstance(ranks, int) or ranks < 1:
        raise ValueError(f"ranks must be an integer >= 1, got {ranks!r}")
    if k < 2:
        raise ValueError(f"rank agreement needs a model with k >= 2 heads, got k={k}")
    table = torch.zeros(k - 1, ranks, dtype=torch.float64)
    restrict = model.restrict_draft
    for i, guess, target in teacher_forced_heads(model, src, tokens, lengths, k):
        if i == 0 or target.numel() == 0:
            continue
        rank = token_rank(restrict(guess) if restrict is not None else guess, target)  # (N,)
        table[i - 1] = torch.bincount(rank.clamp(max=ranks), minlength=ranks + 1)[:ranks].double() / target.numel()
    return table
