"""One tree per row: the shape a dynamic tree (EAGLE-2, an EAGLE-3 drafter's tree) hands the verify pass. Torch only."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class RowTrees:
    """One tree per row, nodes in depth order (the root first): tokens, depths and parents (b, N) long (the root's
    parent is itself), the ancestor mask (b, N, N) bool (a node and its ancestors) and the root-to-node table
    (b, N, depth + 1) (padded with the node)."""

    tokens: Tensor
    depths: Tensor
    parents: Tensor
    ancestors: Tensor
    paths: Tensor

    @staticmethod
    def of(tokens: Tensor, depths: Tensor, parents: Tensor, depth: int) -> RowTrees:
        """The trees of ``tokens``, ``depths`` and ``parents`` (b, N), at most ``depth`` deep."""
        b, n = tokens.shape
        eye = torch.eye(n, dtype=torch.bool, device=tokens.device).expand(b, n, n)
        ancestors = eye
        for _ in range(depth):  # a node sees what its parent sees
            ancestors = eye | ancestors.gather(1, parents[:, :, None].expand(b, n, n))
        paths = torch.arange(n, device=tokens.device).expand(b, n)[:, :, None].repeat(1, 1, depth + 1)
        for d in range(depth + 1):  # the ancestor at depth d, where the node is that deep
            at = ancestors & (depths == d)[:, None, :]  # (b, N, N)
            paths[:, :, d] = torch.where(at.any(-1), at.int().argmax(-1), paths[:, :, d])
        return RowTrees(tokens, depths, parents, ancestors, paths)
