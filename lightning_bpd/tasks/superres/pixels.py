"""Token conventions for images in the super-resolution task.

Each 8-bit channel intensity ``v`` in ``0..255`` is one token with id ``OFFSET + v``; ids ``0..2`` are the specials
(pad=0, bos=1, eos=2), so the vocabulary has ``OFFSET + 256 = 259`` entries.

Layout: an image ``(H, W, 3)`` becomes a sequence of ``H * W * 3`` tokens in raster order (row by row, left to
right) with the channels of each pixel interleaved R, G, B. Pixel ``(r, c)`` channel ``ch`` therefore sits at index
``(r * W + c) * 3 + ch``. This is exactly ``img.reshape(-1)`` of a contiguous HWC tensor.
"""

from __future__ import annotations

import torch

from lightning_bpd.nn.positions import sincos_table

__all__ = [
    "BOS_ID",
    "CHANNELS",
    "EOS_ID",
    "NUM_INTENSITIES",
    "OFFSET",
    "PAD_ID",
    "VOCAB_SIZE",
    "image_to_tokens",
    "intensity_features",
    "intensity_values",
    "tokens_to_image",
]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
OFFSET = 3
NUM_INTENSITIES = 256
VOCAB_SIZE = OFFSET + NUM_INTENSITIES  # 259
CHANNELS = 3


def image_to_tokens(img: torch.Tensor) -> torch.Tensor:
    """Map uint8 images ``(..., H, W, 3)`` to token ids ``(..., H*W*3)`` (int64), raster order, RGB interleaved."""
    if img.dtype != torch.uint8:
        raise TypeError(f"image_to_tokens expects a uint8 tensor, got {img.dtype}")
    if img.dim() < 3 or img.shape[-1] != CHANNELS:
        raise ValueError(f"image_to_tokens expects shape (..., H, W, 3), got {tuple(img.shape)}")
    flat = img.reshape(*img.shape[:-3], -1)  # (..., H*W*3)
    return flat.long() + OFFSET


def tokens_to_image(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Map token ids ``(..., H*W*3)`` back to uint8 images ``(..., H, W, 3)``.

    Ids outside the intensity range (specials, or anything >= VOCAB_SIZE) clamp to the nearest valid intensity
    (0 or 255), so a partially decoded sequence can still be rendered.
    """
    expected = height * width * CHANNELS
    if tokens.shape[-1] != expected:
        raise ValueError(f"expected {expected} tokens for a {height}x{width} RGB image, got {tokens.shape[-1]}")
    values = (tokens.long() - OFFSET).clamp(0, NUM_INTENSITIES - 1).to(torch.uint8)  # (..., H*W*3)
    return values.reshape(*tokens.shape[:-1], height, width, CHANNELS)


def intensity_values() -> torch.Tensor:
    """Return a float64 ``(VOCAB_SIZE,)`` table mapping token id -> intensity, NaN for the special ids.

    Meant for a ``|u - v| <= eps`` acceptance rule: comparisons with NaN are False, so specials never match.
    """
    table = torch.full((VOCAB_SIZE,), float("nan"), dtype=torch.float64)
    table[OFFSET:] = torch.arange(NUM_INTENSITIES, dtype=torch.float64)
    return table


def intensity_features(d_model: int) -> torch.Tensor:
    """A (256, d_model) float32 table of sin/cos features of the intensity (wavelengths 4 to 1024 levels),
    per-entry RMS d^-1/2 like the default embedding init: nearby intensities get similar vectors."""
    return sincos_table(NUM_INTENSITIES, d_model, 4.0, 1024.0, d_model // 2)
