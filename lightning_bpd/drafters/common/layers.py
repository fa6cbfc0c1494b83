"""The pieces every drafter network shares: Qwen3's RMSNorm, rotate-half RoPE and the SwiGLU MLP. Torch only."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class RMSNorm(nn.Module):
    """Qwen3 RMSNorm over the last dim; half precisions are normalised in float32, others in their own dtype."""

    def __init__(self, size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope(x: Tensor, positions: Tensor, theta: float) -> Tensor:
    """Rotate-half RoPE. x: (..., P, heads, hd), positions: (..., P) integer token positions."""
    hd = x.shape[-1]
    dtype = torch.promote_types(x.dtype, torch.float32)
    inv_freq = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=dtype) / hd)  # (hd/2,)
    freqs = positions.to(dtype)[..., None] * inv_freq  # (..., P, hd/2)
    emb = torch.cat([freqs, freqs], dim=-1)[..., None, :]  # (..., P, 1, hd)
    x1, x2 = x.to(dtype).chunk(2, dim=-1)
    rotated = torch.cat([-x2, x1], dim=-1)
    return (x.to(dtype) * emb.cos() + rotated * emb.sin()).to(x.dtype)


class SwiGLU(nn.Module):
    """SwiGLU: down_proj(silu(gate_proj(x)) * up_proj(x)), no biases."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
