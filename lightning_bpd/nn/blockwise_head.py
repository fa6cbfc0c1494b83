"""The blockwise head of Stern et al. (2018), section 6.

One feed-forward layer with hidden size ``k * d_hidden`` and output size ``k * d_model`` turns the
decoder output h (B, T, D) into k vectors h + FFN(h)_i (B, T, k, D), one per future position; the
model's own vocabulary projection then gives the logits of p_1..p_k. With ``identity_first``
(the paper's footnote 1) p_1 bypasses the layer, so p_1 is exactly the base model. With k = 1
there is no layer at all: the head is the plain base model.

Decoding rarely needs all k outputs: verification needs p_1 at every proposed position, the next
proposals need p_1..p_k at one position per row. :meth:`first` and :meth:`select` give just those.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from lightning_bpd.nn.products import FLOAT, Products


class BlockwiseHead(nn.Module):
    """(B, T, D) -> (B, T, k, D) hidden states for p_1..p_k (before the vocabulary projection)."""

    products: Products = FLOAT  # how it multiplies (:mod:`~lightning_bpd.nn.products`)

    def __init__(self, d_model: int, d_hidden: int, k: int, *, identity_first: bool = False, dropout: float = 0.0):
        super().__init__()
        if k < 1:
            raise ValueError(f"k must be >= 1 (1 = the base model), got {k}")
        if d_hidden < 1:
            raise ValueError(f"d_hidden must be >= 1, got {d_hidden}")
        self.k, self.d_model, self.identity_first = k, d_model, identity_first
        self.has_ffn = k > 1
        if self.has_ffn:
            self.hidden = nn.Linear(d_model, k * d_hidden)
            self.out = nn.Linear(k * d_hidden, k * d_model)
            # Zero output: a warm-started head starts with every p_i equal to the base's p_1.
            nn.init.zeros_(self.out.weight)
            nn.init.zeros_(self.out.bias)
            self.drop = nn.Dropout(dropout)

    def head_is_identity(self, i: int) -> bool:
        """Whether head ``i`` (0-based) is the decoder output itself (no trainable parameters)."""
        return not self.has_ffn or (i == 0 and self.identity_first)

    def forward(self, h: Tensor) -> Tensor:
        """All k heads: (B, T, D) -> (B, T, k, D)."""
        return self.select(h, range(self.k))

    def select(self, h: Tensor, heads: Sequence[int]) -> Tensor:
        """Only the listed heads (0-based): (..., D) -> (..., len(heads), D)."""
        heads = list(heads)
        if any(not 0 <= i < self.k for i in heads):
            raise ValueError(f"heads must lie in [0, {self.k - 1}], got {heads}")
        if all(self.head_is_identity(i) for i in heads):
            return h.unsqueeze(-2).expand(*h.shape[:-1], len(heads), h.shape[-1])
        z = self.drop(torch.relu(self.products.linear(h, self.hidden.weight, self.hidden.bias)))  # (..., k * d_hidden)
        d = self.d_model
        if heads == list(range(self.k)):
            delta = self.products.linear(z, self.out.weight, self.out.bias).reshape(*h.shape[:-1], self.k, d)  # (..., k, D)
        elif heads == list(range(heads[0], heads[-1] + 1)):  # a contiguous run: a view, no copy
            w, b = self.out.weight[heads[0] * d : (heads[-1] + 1) * d], self.out.bias[heads[0] * d : (heads[-1] + 1) * d]
            delta = self.products.linear(z, w, b).reshape(*h.shape[:-1], len(heads), d)
        else:
            idx = torch.tensor(heads, device=h.device)
            rows = (idx[:, None] * d + torch.arange(d, device=h.device)).flatten()  # (len(heads) * D,)
            w, b = self.out.weight.index_select(0, rows), self.out.bias.index_select(0, rows)
            delta = self.products.linear(z, w, b).reshape(*h.shape[:-1], len(heads), d)
        out = h.unsqueeze(-2) + delta
        if self.identity_first and 0 in heads:
            out = out.clone()
            out[..., heads.index(0), :] = h
        return out

    def first(self, h: Tensor) -> Tensor:
        """Head 1 only, the scoring model p_1: (..., D) -> (..., D)."""
        return self.select(h, [0]).squeeze(-2)
