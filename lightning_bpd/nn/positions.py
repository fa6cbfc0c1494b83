"""Position embeddings: (B, T) absolute positions -> (B, T, D).

Sinusoidal positions for text of any length, and 2D row/column plus colour-channel embeddings
for images flattened in raster order with the channels interleaved (R, G, B per pixel).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class SinusoidalPositions(nn.Module):
    """Fixed sin/cos embeddings of Vaswani et al. (2017), for any position (a table grown on demand)."""

    def __init__(self, d_model: int) -> None:
        super().__init__()
        if d_model % 2 != 0:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        self.d_model = d_model
        self.register_buffer("table", self.make_table(512), persistent=False)  # (P, D) float64

    def make_table(self, n: int) -> Tensor:
        freqs = torch.exp(torch.arange(0, self.d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / self.d_model))
        angles = torch.arange(n, dtype=torch.float64)[:, None] * freqs  # (P, D/2)
        return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(-2)  # (P, D)

    def forward(self, positions: Tensor) -> Tensor:
        needed = int(positions.max()) + 1 if positions.numel() else 1
        if needed > self.table.shape[0]:
            self.table = self.make_table(max(needed, 2 * self.table.shape[0])).to(self.table.device)
        return self.table[positions]  # (B, T, D) float64; the model casts it to its own dtype


class ImagePositions(nn.Module):
    """Learned row + column + channel embeddings for a (height, width, channels) raster.

    Position p is the p-th intensity in raster order: row p // (W*C), column (p // C) % W,
    channel p % C. Positions past the image (speculative proposals beyond the last intensity,
    which decoding truncates) are clamped to the last one.
    """

    def __init__(self, d_model: int, height: int, width: int, channels: int) -> None:
        super().__init__()
        self.height, self.width, self.channels = height, width, channels
        self.rows = nn.Embedding(height, d_model)
        self.cols = nn.Embedding(width, d_model)
        self.chans = nn.Embedding(channels, d_model)
        for emb in (self.rows, self.cols, self.chans):
            nn.init.normal_(emb.weight, std=d_model**-0.5)

    def forward(self, positions: Tensor) -> Tensor:
        p = positions.clamp(max=self.height * self.width * self.channels - 1)
        row = p // (self.width * self.channels)
        col = (p // self.channels) % self.width
        return self.rows(row) + self.cols(col) + self.chans(p % self.channels)


def build_positions(kind: str, d_model: int, image_shape: tuple[int, int, int] | None = None) -> nn.Module:
    """``kind`` is ``"sinusoidal"`` or ``"image"`` (which needs ``image_shape`` = (H, W, C))."""
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model)
    if kind == "image":
        if image_shape is None:
            raise ValueError("image positions need image_shape = (height, width, channels)")
        return ImagePositions(d_model, *image_shape)
    raise ValueError(f"positions must be 'sinusoidal' or 'image', got {kind!r}")
