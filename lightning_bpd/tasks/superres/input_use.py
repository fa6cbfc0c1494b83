"""How much a super-resolution model uses its input, and the baseline it must beat. Torch only.

:func:`conditioning_diagnostic` scores the same targets teacher-forced three ways: with the true
sources, with the sources rolled across the images (each target gets another face's input) and
with one constant grey source. A model that reads its input loses clearly more without it (the
gaps); one that ignores it scores all three alike. It also gives the share of positions whose top
prediction repeats the decoder's input token (the previous intensity): a model stuck copying its
input scores near 1, while real faces repeat the previous intensity only a few percent of the time
(``repeat_share_truth``).

:func:`nearest_upsample` is the trivial baseline: every input pixel copied into its f x f block;
:func:`smooth_upsample` gives the stronger classical ones (bilinear, bicubic).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from lightning_bpd.nn.loss import decoder_inputs


def nearest_upsample(low: Tensor, factor: int) -> Tensor:
    """(..., H, W, C) images -> (..., f H, f W, C), each pixel repeated over an f x f block."""
    return low.repeat_interleave(factor, -3).repeat_interleave(factor, -2)


def smooth_upsample(low: Tensor, factor: int, mode: str) -> Tensor:
    """(N, H, W, C) images -> (N, f H, f W, C) float intensities, ``bilinear`` or ``bicubic``
    interpolation (align_corners=False), rounded half up and clipped to [0, 255] like decoded intensities."""
    up = F.interpolate(low.permute(0, 3, 1, 2).float(), scale_factor=factor, mode=mode, align_corners=False)
    return (up + 0.5).floor().clamp(0, 255).permute(0, 2, 3, 1)  # (N, fH, fW, C)


def teacher_forced(model, src: Tensor, tgt: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """p_1 scored on ``tgt`` (B, T) given ``src`` (B, S): (summed NLL (), top predictions (B, T),
    decoder inputs (B, T): BOS then the targets shifted right)."""
    tgt_in = decoder_inputs(tgt, model.bos_id)  # (B, T)
    logits = model.logits_first(model.decode_full(tgt_in, model.encode(src)))  # (B, T, V)
    nll = F.cross_entropy(logits.flatten(0, 1).float(), tgt.flatten(), reduction="sum")
    return nll, logits.argmax(-1), tgt_in


@torch.no_grad()
def conditioning_diagnostic(model, src: Tensor, tgt: Tensor, constant_id: int, batch_size: int = 16) -> dict[str, float]:
    """Teacher-forced loss (nats per target token) of ``model`` on ``tgt`` (N, T) with the true ``src``
    (N, S), with the sources rolled by one image (needs N >= 2) and with every source token set to
    ``constant_id``; the gaps to the true loss; and the repeat shares of the model and of the truth.

    Keys: ``cond/loss_true``, ``cond/loss_rolled``, ``cond/loss_constant``, ``cond/gap_rolled``,
    ``cond/gap_constant``, ``cond/repeat_share``, ``cond/repeat_share_truth``.
    """
    if src.shape[0] < 2:
        raise ValueError("conditioning_diagnostic needs at least 2 images (it rolls sources across them)")
    sources = {"true": src, "rolled": src.roll(1, dims=0), "constant": torch.full_like(src, constant_id)}
    totals = dict.fromkeys(sources, 0.0)
    repeats = 0
    for start in range(0, src.shape[0], batch_size):
        rows = slice(start, start + batch_size)
        for name, s in sources.items():
            nll, top, tgt_in = teacher_forced(model, s[rows], tgt[rows])
            totals[name] += float(nll)
            if name == "true":
                repeats += int((top == tgt_in).sum())
    n = tgt.numel()
    out = {f"cond/loss_{name}": total / n for name, total in totals.items()}
    out["cond/gap_rolled"] = out["cond/loss_rolled"] - out["cond/loss_true"]
    out["cond/gap_constant"] = out["cond/loss_constant"] - out["cond/loss_true"]
    out["cond/repeat_share"] = repeats / n
    out["cond/repeat_share_truth"] = float((tgt[:, 1:] == tgt[:, :-1]).sum()) / n
    return out
