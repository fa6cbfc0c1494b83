"""The drafter cache: each row's target context projected into every draft layer's keys and values. Torch only.

A drafter's step reads nothing back from the device: :meth:`DrafterCache.append` writes a fixed width with masks
(what a row does not keep goes to a spare slot no row reaches) and :meth:`DrafterCache.view` shows ``span`` slots, a
host bound on every row's length that the cache keeps from the widths it was given (and that a proposer tightens
from the loop's host counts, :meth:`DrafterCache.bound`). ``check=True`` (tests, debugging) reads the host to refuse
bad counts, overflows and growing crops with one line each.
"""

from __future__ import annotations

import torch
from torch import Tensor


class DrafterCache:
    """Per-layer projected context keys/values of each row, ragged: row b holds ``lengths[b]`` context tokens in
    slots ``[0, lengths[b])``, their token positions in ``positions``. Slots past a row's length are stale and never
    attended to. ``k``/``v``: (L, B, nKV, capacity + 1, hd) (the last slot takes the writes nobody keeps);
    ``lengths``: (B,); ``positions``: (B, capacity + 1); ``span``: a host int, no row longer."""

    def __init__(self, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu", check: bool = False) -> None:
        if capacity < 1:
            raise ValueError(f"DrafterCache capacity must be >= 1, got {capacity}")
        shape = (num_layers, batch_size, num_kv_heads, capacity + 1, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nKV, S + 1, hd)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nKV, S + 1, hd)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.positions = torch.zeros(batch_size, capacity + 1, dtype=torch.long, device=device)  # (B, S + 1)
        self.span = 0  # host: no row is longer
        self.check = check

    @property
    def capacity(self) -> int:
        return self.k.shape[3] - 1

    def append(self, keys: list[Tensor], values: list[Tensor], positions: Tensor, counts: Tensor) -> None:
        """Write, for every layer l, row b's first ``counts[b]`` of ``keys[l]``/``values[l]`` (B, nKV, n, hd) at
        slots ``lengths[b] ..``, record their positions (B, n), and advance ``lengths`` by ``counts`` (B,). No host
        read (but with ``check``): a fixed width n is written, what a row does not keep into the spare slot."""
        counts = counts.to(self.lengths.device, torch.long)
        b, n = positions.shape
        if n > self.capacity:
            raise RuntimeError(f"{type(self).__name__} overflow: {n} new positions > capacity {self.capacity}")
        if self.check:
            self.validate(counts, n)
        j = torch.arange(n, device=counts.device)  # (n,)
        slots = self.lengths[:, None] + j  # (B, n)
        slots = torch.where((j < counts[:, None]) & (slots < self.capacity), slots, self.capacity)  # spare: unkept
        rows = torch.arange(b, device=counts.device)[:, None].expand(b, n)  # (B, n)
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.k[layer, rows, :, slots] = k.transpose(1, 2).to(self.k.dtype)  # (B, n, nKV, hd)
            self.v[layer, rows, :, slots] = v.transpose(1, 2).to(self.v.dtype)
        self.positions[rows, slots] = positions.to(self.positions.device)
        self.lengths = (self.lengths + counts).clamp(max=self.capacity)
        self.span = min(self.capacity, self.span + n)

    def validate(self, counts: Tensor, n: int) -> None:
        """``check``: counts in [0, n] and no row past the capacity (host reads)."""
        if bool((counts < 0).any()) or bool((counts > n).any()):
            raise ValueError(f"counts must lie in [0, {n}], got {counts.tolist()}")
        if bool((self.lengths + counts > self.capacity).any()):
            raise RuntimeError(f"{type(self).__name__} overflow: lengths {self.lengths.tolist()} + counts "
                               f"{counts.tolist()} > capacity {self.capacity}")

    def bound(self, span: int) -> None:
        """No row is longer than ``span`` (a host count the caller knows, e.g. from the loop's committed lengths):
        :meth:`view` shows no more slots."""
        self.span = max(0, min(self.span, span))

    def select(self, rows: Tensor | list[int]) -> None:
        """Keep only ``rows`` (in that order), e.g. when finished rows leave the batch."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.lengths.device)
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        self.lengths, self.positions = self.lengths[rows], self.positions[rows]

    def crop(self, lengths: Tensor | list[int], span: int | None = None) -> None:
        """Cut each row back to ``lengths[b]`` context tokens (never longer than now); ``span``: no row is longer
        (a host count, e.g. :attr:`span` before the entries now cut)."""
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=self.lengths.device)
        if self.check and (bool((lengths > self.lengths).any()) or bool((lengths < 0).any())):
            raise ValueError(f"crop lengths {lengths.tolist()} must lie in [0, current length "
                             f"{self.lengths.tolist()}]")
        self.lengths = lengths.clone()
        if span is not None:
            self.bound(span)

    def view(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """Layer ``layer``'s keys, values (B, nKV, C, hd) and validity (B, C), C = :attr:`span` (a host bound on the
        longest row: no host read)."""
        c = self.span
        valid = torch.arange(c, device=self.lengths.device)[None, :] < self.lengths[:, None]  # (B, C)
        return self.k[layer, :, :, :c], self.v[layer, :, :, :c], valid
