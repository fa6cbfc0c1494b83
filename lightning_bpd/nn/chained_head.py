"""Sequentially dependent heads (Hydra-style, beyond the paper). Torch only.

The paper's head predicts the k future tokens from the decoder output h alone, so head i has to
guess y_{t+i} without knowing what heads 1..i-1 proposed. Here head i also sees the token proposed
for the position before it, through a chain of small residual cells::

    z_1 = h                                        (head 1 is the base's p_1, unchanged)
    z_i = z_{i-1} + W_o relu(W_z z_{i-1} + W_e e(y_{i-1}) + b) + b_o     for i = 2..k

where e(y) is the model's (scaled) token embedding; every z_i goes through the shared vocabulary
projection. Decoding still makes one decoder call per iteration: the proposals are k - 1 steps of
these cells (each a few small matrix products and one projection). In training the tokens
y_1..y_{k-1} are teacher-forced from the targets; with exact acceptance only the case where heads
1..i-1 were right matters (a wrong earlier proposal rejects the rest of the block anyway), so on
targets that are the base's own greedy output the teacher-forced inputs are exactly what decoding
feeds. ``W_o`` starts at zero: a fresh chain proposes p_1's token at every step.

With ``source_attention`` (head type ``chained_attn``) every cell also reads the source: a query
from z_{i-1} + e(y_{i-1}) attends over the encoder memory through the keys and values of the base
decoder's last cross-attention layer (computed once per source, see :class:`ChainSource`), and the
result c enters the cell's hidden layer beside z and e: the chain can look up which source words come
next instead of guessing them from h alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_bpd.nn.products import FLOAT, Products


@dataclass
class ChainSource:
    """What source-attending chain cells read: keys and values (B, S, nh, dh) of the base decoder's
    last cross-attention layer and ``valid`` (B, S), True for real source tokens."""

    keys: Tensor
    values: Tensor
    valid: Tensor

    def take(self, rows: Tensor) -> ChainSource:
        """The source of each listed batch row (1-D index), e.g. one per selected target position."""
        return ChainSource(self.keys[rows], self.values[rows], self.valid[rows])


class ChainCell(nn.Module):
    """One link of the chain: (z (..., D), e (..., D)) -> z + FFN([z; e]) (..., D); with a
    ``source``, z + FFN([z; e; attend(z + e, source)])."""

    products: Products = FLOAT  # how it multiplies (:mod:`~lightning_bpd.nn.products`)

    def __init__(self, d_model: int, d_hidden: int, dropout: float = 0.0, source_attention: bool = False) -> None:
        super().__init__()
        self.z_in = nn.Linear(d_model, d_hidden)
        self.e_in = nn.Linear(d_model, d_hidden, bias=False)
        self.out = nn.Linear(d_hidden, d_model)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)
        self.drop = nn.Dropout(dropout)
        self.source_attention = source_attention
        if source_attention:
            self.query = nn.Linear(d_model, d_model)
            self.c_in = nn.Linear(d_model, d_hidden, bias=False)

    def forward(self, z: Tensor, e: Tensor, source: ChainSource | None = None) -> Tensor:
        linear = self.products.linear
        a = linear(z, self.z_in.weight, self.z_in.bias) + linear(e, self.e_in.weight)  # (..., H)
        if self.source_attention:
            if source is None:
                raise ValueError("a source-attending chain cell needs the source (model.chain_source(context))")
            a = a + linear(self.attend(z + e, source), self.c_in.weight)
        a = torch.relu(a)
        if self.training:
            a = self.drop(a)
        return z + linear(a, self.out.weight, self.out.bias)  # (..., D)

    def attend(self, x: Tensor, source: ChainSource) -> Tensor:
        """Attention of queries from x, (B, D) or (B, T, D), over the source rows (B, S, nh, dh) -> like x."""
        b, _, nh, dh = source.keys.shape
        q = self.products.linear(x, self.query.weight, self.query.bias)
        q = (q[:, None] if x.dim() == 2 else q).reshape(b, -1, nh, dh).transpose(1, 2)  # (B, nh, T, dh)
        out = self.products.attention(q, source.keys.transpose(1, 2), source.values.transpose(1, 2),
                        attn_mask=source.valid[:, None, None, :])  # (B, nh, T, dh)
        out = out.transpose(1, 2).reshape(b, -1, nh * dh)  # (B, T, D)
        return out[:, 0] if x.dim() == 2 else out


class ChainedHead(nn.Module):
    """k heads as a chain of k - 1 :class:`ChainCell`; head 1 (index 0) is the decoder output itself."""

    chained = True

    def __init__(self, d_model: int, d_hidden: int, k: int, *, dropout: float = 0.0,
                 source_attention: bool = False) -> None:
        super().__init__()
        if k < 1:
            raise ValueError(f"k must be >= 1 (1 = the base model), got {k}")
        if d_hidden < 1:
            raise ValueError(f"d_hidden must be >= 1, got {d_hidden}")
        self.k, self.d_model, self.source_attention = k, d_model, source_attention
        self.cells = nn.ModuleList(ChainCell(d_model, d_hidden, dropout, source_attention) for _ in range(k - 1))

    def head_is_identity(self, i: int) -> bool:
        """Head 1 (index 0) is p_1 of the base: no parameters of its own."""
        return i == 0

    def step(self, z: Tensor, e: Tensor, i: int, source: ChainSource | None = None) -> Tensor:
        """State of head ``i`` (0-based, >= 1) from head i-1's state z (..., D) and the embedding e
        (..., D) of the token proposed for head i-1: (..., D)."""
        return self.cells[i - 1](z, e, source)

    def select(self, h: Tensor, heads: Sequence[int], prev: Tensor | None, embed: Callable[[Tensor], Tensor],
               source: ChainSource | None = None, link_input: Callable[[Tensor, int], Tensor] | None = None) -> Tensor:
        """Teacher-forced states of the listed heads: h (..., D), prev (..., m) long with m >= max(heads)
        holding the token proposed for heads 1..m (0-based 0..m-1) -> (..., len(heads), D). ``source``:
        one row per leading index of h ((B, D) or (B, T, D) states). ``link_input(z, i)``: what link i reads
        of head i-1's state z (default z itself; images tag it with the input under head i's pixel)."""
        heads = list(heads)
        if any(not 0 <= i < self.k for i in heads):
            raise ValueError(f"heads must lie in [0, {self.k - 1}], got {heads}")
        last = max(heads)
        if last > 0 and (prev is None or prev.shape[-1] < last or prev.shape[:-1] != h.shape[:-1]):
            got = None if prev is None else tuple(prev.shape)
            raise ValueError(f"chained heads up to {last + 1} need prev tokens of shape {(*h.shape[:-1], last)}, got {got}")
        states = [h]
        for i in range(1, last + 1):
            z = states[-1] if link_input is None else link_input(states[-1], i)
            states.append(self.step(z, embed(prev[..., i - 1]), i, source))  # type: ignore[index]
        return torch.stack([states[i] for i in heads], dim=-2)
