"""Decoder states of a frozen base, kept per training example: cheap frozen-head training.

With the base frozen (stage 2 of the recipe, ``freeze_base: true``) the decoder output of a
training example never changes, so it is computed once, in eval mode (no dropout: the states the
heads will see when decoding), and reused every epoch; a frozen-head step then costs only the head
and its vocabulary projections. Examples are keyed by their dataset index (the batches' ``index``);
past ``budget_bytes`` new states are computed each time instead of stored.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class FrozenStates:
    """Per-example decoder states (T_i, D) of a frozen base, up to ``budget_bytes`` in memory."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget = budget_bytes
        self.states: dict[int, Tensor] = {}
        self.bytes = 0
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self.states)

    @torch.no_grad()
    def hidden(self, index: Tensor, lengths: Tensor, width: int, compute: Callable[[Tensor], Tensor]) -> Tensor:
        """States (B, ``width``, D) of the batch rows ``index`` (B,) with ``lengths`` (B,) real target
        positions; ``compute(rows)`` runs the base on the listed batch rows -> (b, T, D).
        Positions past a row's length are zero (their targets are padding)."""
        keys = index.tolist()
        missing = [r for r, key in enumerate(keys) if key not in self.states]
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        fresh: dict[int, Tensor] = {}
        if missing:
            rows = torch.tensor(missing, device=lengths.device)
            out = compute(rows)  # (b, T, D)
            for j, r in enumerate(missing):
                state = out[j, : int(lengths[r])].clone()  # (T_r, D)
                fresh[r] = state
                size = state.numel() * state.element_size()
                if self.bytes + size <= self.budget:
                    self.states[keys[r]] = state
                    self.bytes += size
        parts = [fresh[r] if r in fresh else self.states[key] for r, key in enumerate(keys)]
        batch = parts[0].new_zeros(len(parts), width, parts[0].shape[-1])  # (B, T, D)
        for r, state in enumerate(parts):
            batch[r, : state.shape[0]] = state
        return batch
