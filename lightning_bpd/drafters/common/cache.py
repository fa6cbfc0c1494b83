"""The drafter cache: each row's target context projected into every draft layer's keys and values. Torch only."""

from __future__ import annotations

import torch
from torch import Tensor


class DrafterCache:
    """Per-layer projected context keys/values of each row, ragged: row b holds ``lengths[b]`` context tokens in
    slots ``[0, lengths[b])``, their token positions in ``positions``. Slots past a row's length are stale and never
    attended to. ``k``/``v``: (L, B, nKV, capacity, hd); ``lengths``: (B,); ``positions``: (B, capacity)."""

    def __init__(self, num_layers: int, batch_size: int, capacity: int, num_kv_heads: int, head_dim: int, *,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"DrafterCache capacity must be >= 1, got {capacity}")
        shape = (num_layers, batch_size, num_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nKV, S, hd)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, nKV, S, hd)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self.positions = torch.zeros(batch_size, capacity, dtype=torch.long, device=device)  # (B, S)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def append(self, keys: list[Tensor], values: list[Tensor], positions: Tensor, counts: Tensor) -> None:
        """Write, for every layer l, row b's first ``counts[b]`` of ``keys[l]``/``values[l]`` (B, nKV, n, hd) at
        slots ``lengths[b] ..``, record their positions (B, n), and advance ``lengths`` by ``counts`` (B,)."""
        counts = counts.to(self.lengths.device, torch.long)
        n = positions.shape[1]
        if bool((counts < 0).any()) or bool((counts > n).any()):
            raise ValueError(f"counts must lie in [0, {n}], got {counts.tolist()}")
        if bool((self.lengths + counts > self.capacity).any()):
            raise RuntimeError(f"{type(self).__name__} overflow: lengths {self.lengths.tolist()} + counts {counts.tolist()} "
                               f"> capacity {self.capacity}")
        rows, j = (torch.arange(n, device=counts.device)[None, :] < counts[:, None]).nonzero(as_tuple=True)
        slots = self.lengths[rows] + j  # (P,)
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.k[layer, rows, :, slots] = k[rows, :, j].to(self.k.dtype)  # (P, nKV, hd)
            self.v[layer, rows, :, slots] = v[rows, :, j].to(self.v.dtype)
        self.positions[rows, slots] = positions.to(self.positions.device)[rows, j]
        self.lengths = self.lengths + counts

    def select(self, rows: Tensor | list[int]) -> None:
        """Keep only ``rows`` (in that order), e.g. when finished rows leave the batch."""
        rows = torch.as_tensor(rows, dtype=torch.long, device=self.lengths.device)
        self.k, self.v = self.k[:, rows], self.v[:, rows]
        self.lengths, self.positions = self.lengths[rows], self.positions[rows]

    def crop(self, lengths: Tensor | list[int]) -> None:
        """Cut each row back to ``lengths[b]`` context tokens (never longer than now)."""
        lengths = torch.as_tensor(lengths, dtype=torch.long, device=self.lengths.device)
        if bool((lengths > self.lengths).any()) or bool((lengths < 0).any()):
            raise ValueError(f"crop lengths {lengths.tolist()} must lie in [0, current length "
                             f"{self.lengths.tolist()}]")
        self.lengths = lengths.clone()

    def view(self, layer: int) -> tuple[Tensor, Tensor, Tensor]:
        """Layer ``layer``'s keys, values (B, nKV, C, hd) and validity (B, C), C = the longest row's length."""
        c = int(self.lengths.max()) if self.lengths.numel() else 0
        valid = torch.arange(c, device=self.lengths.device)[None, :] < self.lengths[:, None]  # (B, C)
        return self.k[layer, :, :, :c], self.v[layer, :, :, :c], valid
