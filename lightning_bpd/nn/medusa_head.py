"""Medusa-1's heads (Cai et al., 2024): head i > 1 is a stack of residual blocks ``x + SiLU(W x + b)`` on the
base's last hidden state, then the base's own LM head; head 1 is the base itself (p_1).

The parameters are laid out as vLLM's Medusa model names them (``blocks.{i}.layers.{j}.weight`` and ``.bias``
for heads 2..k as i = 0..k-2), so that heads trained here can be written in that layout. W and b start at zero
(Medusa zeroes W): every head then starts as p_1.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lightning_bpd.nn.products import FLOAT, Products


class ResidualBlocks(nn.Module):
    """``n_layers`` residual blocks ``x + SiLU(W x + b)``: (..., D) -> (..., D)."""

    products: Products = FLOAT

    def __init__(self, d_model: int, n_layers: int = 1) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(n_layers))
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.layers:
            x = x + nn.functional.silu(self.products.linear(x, layer.weight, layer.bias))
        return x


class MedusaHead(nn.Module):
    """(..., D) -> (..., k, D) hidden states for p_1..p_k: p_1 the input itself, p_i (i > 1) its own residual
    blocks; the model's LM head then projects each."""

    def __init__(self, d_model: int, k: int, n_layers: int = 1) -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"k must be >= 1 (1 = the base model), got {k}")
        if n_layers < 1:
            raise ValueError(f"a medusa head needs n_layers >= 1, got {n_layers}")
        self.k, self.d_model, self.n_layers = k, d_model, n_layers
        self.blocks = nn.ModuleList(ResidualBlocks(d_model, n_layers) for _ in range(k - 1))

    def forward(self, h: Tensor) -> Tensor:
        """All k heads: (..., D) -> (..., k, D)."""
        return self.select(h, range(self.k))

    def select(self, h: Tensor, heads: Sequence[int]) -> Tensor:
        """Only the listed heads (0-based): (..., D) -> (..., len(heads), D)."""
        heads = list(heads)
        if any(not 0 <= i < self.k for i in heads):
            raise ValueError(f"heads must lie in [0, {self.k - 1}], got {heads}")
        return torch.stack([h if i == 0 else self.blocks[i - 1](h) for i in heads], dim=-2)

    def head_is_identity(self, i: int) -> bool:
        """Head 1 (i = 0) is p_1 itself: nothing of it trains."""
        return i == 0

    def first(self, h: Tensor) -> Tensor:
        """Head 1 only, p_1: the input itself (..., D)."""
        return h
