"""Direct conditioning: which input intensities a target position reads, and with what weights.

Pure functions of the source and target image shapes (H, W, C), rasters in (row, column, channel) order.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.nn.positions import raster_coordinates

# Which input intensities direct conditioning adds under a target pixel (:func:`source_taps`).
CONDITIONING = ("nearest", "bilinear", "bicubic")


def source_index(src_shape: tuple[int, int, int], tgt_shape: tuple[int, int, int]) -> Tensor:
    """(T,) for every target raster position, the raster position of the source intensity under it:
    target (r, c, channel) -> source (r // f_r, c // f_c, channel)."""
    (_, sw, c), (th, tw, _) = src_shape, tgt_shape
    row, col, chan = raster_coordinates(torch.arange(th * tw * c), tgt_shape)
    fr, fc = th // src_shape[0], tw // sw
    return ((row // fr) * sw + col // fc) * c + chan


def bilinear_taps(src_shape: tuple[int, int, int], tgt_shape: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    """For every target raster position, the raster positions of the 4 source intensities around the
    target pixel's centre and their bilinear weights (align_corners=False, edges clamped, as
    ``F.interpolate(mode="bilinear")``): ((T, 4) long, (T, 4) float, rows summing to 1)."""
    (sh, sw, c), (th, tw, _) = src_shape, tgt_shape
    row, col, chan = raster_coordinates(torch.arange(th * tw * c), tgt_shape)

    def axis(index: Tensor, n_src: int, n_tgt: int) -> tuple[Tensor, Tensor, Tensor]:
        x = ((index.double() + 0.5) * n_src / n_tgt - 0.5).clamp(min=0)  # source coordinate
        lo = x.floor().long().clamp(max=n_src - 1)
        hi = (lo + 1).clamp(max=n_src - 1)
        return lo, hi, (x - lo).clamp(0, 1)

    r0, r1, fr = axis(row, sh, th)
    c0, c1, fc = axis(col, sw, tw)
    index = torch.stack([(r * sw + q) * c + chan for r in (r0, r1) for q in (c0, c1)], dim=-1)  # (T, 4)
    weight = torch.stack([(1 - fr) * (1 - fc), (1 - fr) * fc, fr * (1 - fc), fr * fc], dim=-1)  # (T, 4)
    return index, weight.float()


CUBIC_A = -0.75  # the cubic convolution kernel's parameter in F.interpolate(mode="bicubic")


def cubic_weights(t: Tensor) -> Tensor:
    """Cubic convolution weights (..., 4) of the taps at floor(x) - 1 .. floor(x) + 2 for fractional parts t
    (...) of a source coordinate x (Keys' kernel with a = -0.75, as ``F.interpolate(mode="bicubic")``)."""
    a = CUBIC_A

    def near(d: Tensor) -> Tensor:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: Tensor) -> Tensor:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return torch.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], dim=-1)


def bicubic_taps(src_shape: tuple[int, int, int], tgt_shape: tuple[int, int, int]) -> tuple[Tensor, Tensor]:
    """For every target raster position, the raster positions of the 16 source intensities around the target
    pixel's centre and their bicubic weights (align_corners=False, taps past an edge clamped to it, as
    ``F.interpolate(mode="bicubic")``): ((T, 16) long, (T, 16) float, rows summing to 1). For integer factors
    that are powers of two the weights are dyadic fractions of at most 24 significant bits: exact in float32."""
    (sh, sw, c), (th, tw, _) = src_shape, tgt_shape
    row, col, chan = raster_coordinates(torch.arange(th * tw * c), tgt_shape)

    def axis(index: Tensor, n_src: int, n_tgt: int) -> tuple[Tensor, Tensor]:
        x = (index.double() + 0.5) * n_src / n_tgt - 0.5  # source coordinate (not clamped, as for cubic)
        base = x.floor()
        taps = (base.long()[:, None] + torch.arange(-1, 3)).clamp(0, n_src - 1)  # (T, 4)
        return taps, cubic_weights(x - base)  # (T, 4) each

    r, wr = axis(row, sh, th)
    q, wc = axis(col, sw, tw)
    index = ((r[:, :, None] * sw + q[:, None, :]) * c + chan[:, None, None]).reshape(-1, 16)  # (T, 16)
    weight = (wr[:, :, None] * wc[:, None, :]).reshape(-1, 16)  # (T, 16)
    return index, weight.float()


def source_taps(src_shape: tuple[int, int, int], tgt_shape: tuple[int, int, int], mode: str) -> tuple[Tensor, Tensor]:
    """Direct conditioning's source positions (T, n) and weights (T, n) per target position: n = 1 for
    ``nearest`` (:func:`source_index`, weight 1), 4 for ``bilinear`` (:func:`bilinear_taps`), 16 for ``bicubic``
    (:func:`bicubic_taps`)."""
    if mode == "bilinear":
        return bilinear_taps(src_shape, tgt_shape)
    if mode == "bicubic":
        return bicubic_taps(src_shape, tgt_shape)
    index = source_index(src_shape, tgt_shape)[:, None]  # (T, 1)
    return index, torch.ones(index.shape)
