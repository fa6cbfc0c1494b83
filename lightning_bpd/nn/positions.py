"""Position embeddings: (B, T) absolute positions -> (B, T, D).

Sinusoidal positions for text of any length, and 2D row/column plus colour-channel embeddings
for images flattened in raster order with the channels interleaved (R, G, B per pixel). With
:class:`ImageGrid` a low-resolution source and its high-resolution target share one set of
row / column tables on the target's grid: a source pixel sits at the centre of the block of
target pixels it covers, so "which input pixel is mine" is a matter of nearby coordinates.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

POSITION_KINDS = ("sinusoidal", "image", "grid")


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

    def forward(self, positions: Tensor, limit: int | None = None) -> Tensor:
        """``limit``: a host-side bound (exclusive) on ``positions`` (a cache knows it), which spares the
        device-to-host read of ``positions.max()`` that growing the table on demand needs otherwise."""
        needed = limit if limit is not None else (int(positions.max()) + 1 if positions.numel() else 1)
        if needed > self.table.shape[0]:
            self.table = self.make_table(max(needed, 2 * self.table.shape[0])).to(self.table.device)
        return self.table[positions]  # (B, T, D) float64; the model casts it to its own dtype


def raster_coordinates(positions: Tensor, shape: tuple[int, int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """Positions (...) in an (H, W, C) raster -> (row, column, channel), each (...). Positions past
    the image (speculative proposals beyond the last intensity, which decoding truncates) are clamped
    to the last one."""
    height, width, channels = shape
    p = positions.clamp(max=height * width * channels - 1)
    return p // (width * channels), (p // channels) % width, p % channels


class ImagePositions(nn.Module):
    """Learned row + column + channel embeddings for a (height, width, channels) raster.

    Position p is the p-th intensity in raster order: row p // (W*C), column (p // C) % W,
    channel p % C. ``scale`` multiplies the sum (tables start at N(0, d^-1/2)).
    """

    def __init__(self, d_model: int, height: int, width: int, channels: int, scale: float = 1.0) -> None:
        super().__init__()
        self.height, self.width, self.channels, self.scale = height, width, channels, scale
        self.rows = nn.Embedding(height, d_model)
        self.cols = nn.Embedding(width, d_model)
        self.chans = nn.Embedding(channels, d_model)
        for emb in (self.rows, self.cols, self.chans):
            nn.init.normal_(emb.weight, std=d_model**-0.5)

    def forward(self, positions: Tensor, limit: int | None = None) -> Tensor:  # limit: unused (clamped)
        row, col, chan = raster_coordinates(positions, (self.height, self.width, self.channels))
        out = self.rows(row) + self.cols(col) + self.chans(chan)
        return out * self.scale if self.scale != 1.0 else out


def sincos_table(size: int, d_model: int, shortest: float, longest: float, n_freqs: int, start: int = 0) -> Tensor:
    """A (size, D) float32 table of sin/cos features of the values 0..size-1 at ``n_freqs`` wavelengths
    from ``shortest`` to ``longest`` (log-spaced) in columns ``start .. start + 2 n_freqs`` (the rest zero),
    rescaled to the per-entry RMS d^-1/2 of the default embedding init: nearby values get similar vectors."""
    wavelengths = torch.logspace(math.log10(shortest), math.log10(longest), n_freqs, dtype=torch.float64)
    angles = 2 * math.pi * torch.arange(size, dtype=torch.float64)[:, None] / wavelengths  # (size, n)
    table = torch.zeros(size, d_model, dtype=torch.float64)
    table[:, start : start + 2 * n_freqs] = torch.cat([angles.sin(), angles.cos()], dim=-1)
    return (table * (d_model**-0.5 / table.pow(2).mean().sqrt())).float()


def grid_table(size: int, d_model: int, first_half: bool) -> Tensor:
    """A (size, D) table of one image coordinate in one half of the dimensions (the other half zero),
    wavelengths from 2 to 4 * size."""
    return sincos_table(size, d_model, 2.0, 4.0 * size, d_model // 4, 0 if first_half else d_model // 2)


class ImageGrid(nn.Module):
    """Row, column and channel tables of a (height, width, channels) target raster, shared by the
    target and a lower-resolution source (see :class:`GridPositions`). Rows and columns start as 2D
    sin/cos features (rows in one half of the dimensions, columns in the other), so that nearby
    coordinates start with similar vectors; all three tables are learned."""

    def __init__(self, d_model: int, height: int, width: int, channels: int) -> None:
        super().__init__()
        if d_model % 4 != 0:
            raise ValueError(f"grid positions need d_model divisible by 4, got {d_model}")
        self.shape = (height, width, channels)
        self.rows = nn.Parameter(grid_table(height, d_model, first_half=True))  # (H, D)
        self.cols = nn.Parameter(grid_table(width, d_model, first_half=False))  # (W, D)
        self.chans = nn.Parameter(torch.randn(channels, d_model) * d_model**-0.5)  # (C, D)


def centre_weights(size: int, grid_size: int) -> Tensor:
    """(size, grid_size) linear-interpolation weights placing coordinate i of a ``size`` axis at the
    centre of its block of ``grid_size / size`` grid cells: grid coordinate f * i + (f - 1) / 2."""
    f = grid_size // size
    centre = f * torch.arange(size, dtype=torch.float64) + (f - 1) / 2  # (size,)
    lo = centre.floor().long()
    frac = centre - lo
    w = torch.zeros(size, grid_size, dtype=torch.float64)
    w[torch.arange(size), lo] = 1 - frac
    w[torch.arange(size), (lo + 1).clamp(max=grid_size - 1)] += frac
    return w.float()


class GridPositions(nn.Module):
    """Row + column + channel embeddings of an (H, W, C) raster placed on a shared :class:`ImageGrid`
    of an integer multiple of its size (the target itself: factor 1). Row i of a coarse raster is the
    grid row at the centre of its block, interpolated between the two nearest grid rows."""

    def __init__(self, grid: ImageGrid, height: int, width: int, channels: int, scale: float = 1.0) -> None:
        super().__init__()
        gh, gw, gc = grid.shape
        if gh % height or gw % width or gc != channels:
            raise ValueError(f"grid positions: a {height}x{width}x{channels} raster does not tile the "
                             f"{gh}x{gw}x{gc} grid (needs integer factors and the same channels)")
        self.grid, self.shape, self.scale = grid, (height, width, channels), scale
        self.register_buffer("row_weights", centre_weights(height, gh), persistent=False)  # (H, gh)
        self.register_buffer("col_weights", centre_weights(width, gw), persistent=False)  # (W, gw)

    def forward(self, positions: Tensor, limit: int | None = None) -> Tensor:  # limit: unused (clamped)
        row, col, chan = raster_coordinates(positions, self.shape)
        rows = self.row_weights.to(self.grid.rows) @ self.grid.rows  # (H, D)
        cols = self.col_weights.to(self.grid.cols) @ self.grid.cols  # (W, D)
        # F.embedding, not rows[row]: its CPU backward sums repeated indices in a fixed order, so training
        # (and a resumed run) is bitwise reproducible; advanced indexing's backward is not
        out = F.embedding(row, rows) + F.embedding(col, cols) + F.embedding(chan, self.grid.chans)
        return out * self.scale if self.scale != 1.0 else out


def build_positions(kind: str, d_model: int, image_shape: tuple[int, int, int] | None = None, scale: float = 1.0,
                    grid: ImageGrid | None = None) -> nn.Module:
    """``kind`` is ``"sinusoidal"``, ``"image"`` (which needs ``image_shape`` = (H, W, C)) or ``"grid"``
    (``image_shape`` on the shared ``grid``). ``scale`` multiplies image position vectors."""
    if kind == "sinusoidal":
        return SinusoidalPositions(d_model)
    if kind in ("image", "grid") and image_shape is None:
        raise ValueError(f"{kind} positions need image_shape = (height, width, channels)")
    if kind == "image":
        return ImagePositions(d_model, *image_shape, scale=scale)
    if kind == "grid":
        if grid is None:
            raise ValueError("grid positions need the shared ImageGrid")
        return GridPositions(grid, *image_shape, scale=scale)
    raise ValueError(f"positions must be one of {POSITION_KINDS}, got {kind!r}")
