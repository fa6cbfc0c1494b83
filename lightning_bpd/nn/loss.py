"""The blockwise training loss (section 6): head i predicts the target i - 1 positions further on.

With decoder inputs ``[BOS, y_1, .., y_{T-1}]`` and targets ``[y_1, .., y_T]`` the decoder output
at position t feeds head i (1-based), which is trained on target ``y_{t+i}``, i.e. the target
shifted left by i - 1. Positions past the end and padding are ignored. ``mode="random"`` trains one
head drawn uniformly per minibatch (the paper's choice, and the cheapest: only that head's
vocabulary projection is computed); ``mode="mean"`` averages all k sub-losses.

``head1_weight`` w > 0 (not in the paper) keeps the scoring model's loss in every minibatch while
the base is fine-tuned: head 1 is always trained and the loss is ``w * L_1 + (1 - w) * mean of the
other chosen sub-losses`` (random mode then draws one of heads 2..k). It trades some acceptance for
less drift of p_1, whose quality is the BLEU of every exact decode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

LOSS_MODES = ("random", "mean")


@dataclass
class BlockwiseLoss:
    """``loss`` to optimize, and per-head (1-based) loss and token accuracy for logging."""

    loss: Tensor
    head_loss: dict[int, Tensor]
    head_acc: dict[int, Tensor]


def choose_heads(
    k: int, mode: str, generator: torch.Generator | None = None, skip: Sequence[int] = (), keep_first: bool = False,
    weights: Sequence[float] | None = None,
) -> list[int]:
    """0-based heads to train this minibatch; ``skip`` lists heads with nothing to train.

    ``keep_first`` (for ``head1_weight``): head 0 is always trained, beside all others (mean) or one
    drawn from heads 1..k-1 (random). ``weights`` (k,): in random mode a head is drawn with
    probability proportional to its weight (uniformly when None).
    """
    if mode not in LOSS_MODES:
        raise ValueError(f"loss mode must be one of {LOSS_MODES}, got {mode!r}")
    heads = [i for i in range(k) if i not in set(skip)]
    if not heads:
        raise ValueError("no trainable head: every head is skipped (a frozen base with k = 1?)")
    if keep_first:
        if 0 not in heads:
            raise ValueError("head1_weight needs a trainable head 1 (the base is frozen)")
        others = heads[1:]
        if mode == "mean" or not others:
            return heads
        return [0, draw(others, weights, generator)]
    if mode == "mean":
        return heads
    return [draw(heads, weights, generator)]


def draw(heads: list[int], weights: Sequence[float] | None, generator: torch.Generator | None) -> int:
    """One of ``heads``, uniformly or with probability proportional to ``weights[head]``."""
    if weights is None or len({weights[i] for i in heads}) == 1:
        return heads[int(torch.randint(len(heads), (1,), generator=generator))]
    p = torch.tensor([float(weights[i]) for i in heads])
    return heads[int(torch.multinomial(p, 1, generator=generator))]


def decoder_inputs(targets: Tensor, bos_id: int) -> Tensor:
    """Teacher forcing: ``targets`` (B, T) shifted right behind BOS, the decoder's inputs (B, T)."""
    return torch.cat([torch.full_like(targets[:, :1], bos_id), targets[:, :-1]], dim=1)


def shifted_targets(targets: Tensor, shift: int, pad_id: int) -> Tensor:
    """``targets`` (B, T) moved left by ``shift`` positions, padded with ``pad_id`` at the end."""
    if shift == 0:
        return targets
    out = torch.full_like(targets, pad_id)
    if shift < targets.shape[1]:
        out[:, : targets.shape[1] - shift] = targets[:, shift:]
    return out


def blockwise_loss(
    logits: Tensor,
    targets: Tensor,
    heads: Sequence[int],
    pad_id: int,
    label_smoothing: float = 0.0,
    positions: Tensor | None = None,
    head1_weight: float = 0.0,
    weights: Sequence[float] | None = None,
    target_kernel: Tensor | None = None,
    later_targets: Tensor | None = None,
) -> BlockwiseLoss:
    """Cross-entropy of ``logits`` (B, T, h, V) for the 0-based ``heads`` against ``targets`` (B, T).

    With ``positions`` (B, T) bool, ``logits`` are (N, h, V) for just the N selected positions (a
    random subset of positions gives an unbiased estimate of the loss at a fraction of the cost of
    the vocabulary projections). The returned loss is the mean over the listed heads of each head's
    token-averaged loss (with ``label_smoothing``; the logged per-head loss is the same quantity),
    or, with ``head1_weight`` w > 0 and head 0 listed beside others, ``w * L_1 + (1 - w) * mean(rest)``.
    ``weights`` (one per listed head) turn each of those means into a weighted mean.
    ``target_kernel`` (V, V): soft targets, row y the distribution a target y is trained towards
    (e.g. a Gaussian over neighbouring pixel intensities, :func:`gaussian_kernel`); None = one-hot.
    ``later_targets`` (B, T): what heads 2..k train towards (e.g. the model's own greedy choices), head 1
    still ``targets``; None = ``targets`` for every head.
    """
    if not 0.0 <= head1_weight < 1.0:
        raise ValueError(f"head1_weight must lie in [0, 1), got {head1_weight}")
    if logits.shape[-2] != len(heads):
        raise ValueError(f"logits have {logits.shape[-2]} heads but {len(heads)} head indices were given")
    losses, head_loss, head_acc = [], {}, {}
    per_head = logits.unbind(-2)  # one view per head; its backward stacks the h gradients once
    for j, i in enumerate(heads):
        tgt = shifted_targets(targets if i == 0 or later_targets is None else later_targets, i, pad_id)  # (B, T)
        if positions is not None:
            tgt = tgt[positions]  # (N,)
        mask = tgt != pad_id
        lg = per_head[j].float()  # (B, T, V) or (N, V)
        if target_kernel is None:
            loss = F.cross_entropy(
                lg.reshape(-1, lg.shape[-1]), tgt.reshape(-1), ignore_index=pad_id, reduction="sum",
                label_smoothing=label_smoothing,
            )
        else:
            soft = target_kernel[tgt] * (1 - label_smoothing) + label_smoothing / lg.shape[-1]  # (..., V)
            loss = -((soft * F.log_softmax(lg, dim=-1)).sum(-1) * mask).sum()
        count = mask.sum().clamp(min=1)
        loss = loss / count
        losses.append(loss)
        head_loss[i + 1] = loss.detach()
        head_acc[i + 1] = ((lg.argmax(-1) == tgt) & mask).sum() / count
    w = [1.0] * len(heads) if weights is None else [float(x) for x in weights]
    if len(w) != len(heads) or min(w) <= 0:
        raise ValueError(f"weights must be {len(heads)} positive numbers (one per head), got {weights}")
    if head1_weight > 0 and heads[0] == 0 and len(heads) > 1:
        total = head1_weight * losses[0] + (1 - head1_weight) * weighted_mean(losses[1:], w[1:])
    else:
        total = weighted_mean(losses, w)
    return BlockwiseLoss(total, head_loss, head_acc)


def gaussian_kernel(vocab_size: int, first: int, sigma: float) -> Tensor:
    """(V, V) soft targets for ordinal tokens ``first .. V - 1`` (pixel intensities): row y is a Gaussian
    of width ``sigma`` (in token steps) around y over those tokens, normalized; rows of the special
    tokens below ``first`` stay one-hot."""
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    kernel = torch.eye(vocab_size)
    values = torch.arange(vocab_size - first, dtype=torch.float64)
    g = torch.exp(-((values[:, None] - values[None, :]) ** 2) / (2 * sigma**2))
    kernel[first:, first:] = (g / g.sum(dim=1, keepdim=True)).float()
    return kernel


def weighted_mean(losses: list[Tensor], weights: list[float]) -> Tensor:
    if len(set(weights)) == 1:
        return torch.stack(losses).mean()
    return sum(x * w for x, w in zip(losses, weights)) / sum(weights)  # type: ignore[return-value]
