"""Argmax over the last dimension, the fast way on CPU. Torch only.

``x.max(dim=-1).indices`` returns the same index as ``x.argmax(dim=-1)`` (the first maximal value, so
ties go to the lowest id; NaN wins in both), but on these CPUs it costs a third as much over a
vocabulary: 8 rows of 8,000 logits 32 us against 81, 256 rows 0.96 ms against 2.67 (1 thread).
For small tensors ``argmax`` is a little faster and is kept. Greedy decoding, proposals and
verification take every argmax through :func:`argmax`, so they keep breaking ties alike.
"""

from __future__ import annotations

from torch import Tensor

SMALL = 4096  # elements below which argmax itself is used


def argmax(x: Tensor) -> Tensor:
    """Index of the largest value along the last dimension, (..., V) -> (...) long, ties to the lowest."""
    if x.device.type == "cpu" and x.numel() >= SMALL:  # (a 0-d tensor has 1 element: argmax)
        return x.max(dim=-1).indices
    return x.argmax(dim=-1)
