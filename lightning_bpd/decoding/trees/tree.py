"""A tree of candidate continuations, verified in one pass (Medusa, SpecInfer, EAGLE). Torch only; model-agnostic.

Node 0, the root, is the token greedy decoding emits next (p_1's argmax at the last accepted position): it is
always accepted. A node at depth d >= 1 holds a proposal of the head at depth d (0-based head d: heads 2..k in the
paper's numbering), and its ``rank`` says which one: rank r is that head's (r+1)-th most likely token. A tree is
given as the list of its non-root nodes' paths of ranks, Medusa's "choices" format: ``(1,)`` is head 1's second
choice, ``(1, 0)`` head 2's first choice after it. Parallel heads read every node of depth d from the same head
(so node ``(1, 0)`` and ``(0, 0)`` hold the same token); chained heads expand each node's own link, fed the
node's token. Sampling on a tree (:mod:`~lightning_bpd.decoding.tree_sampling`) draws each node's children
instead: there the ranks only order a node's children (child j holds draw j).

Nodes are numbered in Medusa's order, by depth and then by path, so a node's ancestors come before it and the
path of rank 0s (today's single block) is nodes 0..depth when it is in the tree. From the paths a tree gives,
once: each node's parent, depth and rank; the attention mask of the verify pass (a node sees its ancestors and
itself, :meth:`Tree.ancestors`); the per-node position offsets (its depth); and the root-to-node index table
(:meth:`Tree.path_table`) that maps an accepted node to the nodes to keep.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import Tensor

Path = tuple[int, ...]


@dataclass(frozen=True)
class Tree:
    """A tree of candidates: ``paths[i]`` is node i's path of ranks (node 0, the root, has the empty path)."""

    paths: tuple[Path, ...]
    parents: tuple[int, ...] = field(init=False)  # node i's parent (the root: -1)
    depths: tuple[int, ...] = field(init=False)  # node i's depth (the root: 0)
    ranks: tuple[int, ...] = field(init=False)  # node i's rank among its head's tokens (the root: 0)

    def __post_init__(self) -> None:
        index = {p: i for i, p in enumerate(self.paths)}
        object.__setattr__(self, "parents", tuple(index[p[:-1]] if p else -1 for p in self.paths))
        object.__setattr__(self, "depths", tuple(len(p) for p in self.paths))
        object.__setattr__(self, "ranks", tuple(p[-1] if p else 0 for p in self.paths))

    # ---- construction ---------------------------------------------------------------------------------------------
    @staticmethod
    def from_paths(paths: Sequence[Sequence[int]]) -> Tree:
        """The tree of these non-root node paths (Medusa's choices), in any order. Raises ValueError, in one line,
        on a path that is empty, holds a rank that is not an integer >= 0, is listed twice, or whose parent path is
        not listed."""
        seen: set[Path] = set()
        for raw in paths:
            path = tuple(raw)
            if not path:
                raise ValueError("tree paths: the empty path is the root, which every tree has; list only the others")
            if any(isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in path):
                raise ValueError(f"tree paths: ranks must be integers >= 0, got {path}")
            if path in seen:
                raise ValueError(f"tree paths: {path} is listed twice")
            seen.add(path)
        for path in seen:
            if len(path) > 1 and path[:-1] not in seen:
                raise ValueError(f"tree paths: {path} needs its parent {path[:-1]}, which is not listed")
        return Tree(((), *sorted(seen, key=lambda p: (len(p), p))))

    @staticmethod
    def path(depth: int) -> Tree:
        """The single path of each head's first choice, ``depth`` heads deep: today's block of ``depth + 1``."""
        if not isinstance(depth, int) or depth < 0:
            raise ValueError(f"a path tree's depth must be an integer >= 0, got {depth!r}")
        return Tree.from_paths([(0,) * d for d in range(1, depth + 1)])

    @staticmethod
    def from_budget(n_nodes: int, agreement: Sequence[Sequence[float]] | Tensor) -> Tree:
        """Medusa's greedy tree: ``n_nodes`` non-root nodes, added one at a time, each the candidate (a child of a
        node already in the tree) with the highest expected contribution, the product of the agreements along its
        path (ties to the shorter, then the lower path). ``agreement[d - 1][r]`` is the measured probability that
        the rank-r token of the head at depth d is greedy's (:func:`head_rank_agreement`): rows are depths 1..,
        columns ranks 0..; the tree is at most that deep and wide."""
        table = agreement_table(agreement)
        depth, width = table.shape
        if not isinstance(n_nodes, int) or not 0 <= n_nodes <= budget_limit(depth, width):
            raise ValueError(f"n_nodes must be an integer in [0, {budget_limit(depth, width)}] for a {depth} x {width} "
                             f"agreement table, got {n_nodes!r}")
        return Tree.from_paths([path for path, _ in itertools.islice(greedy_nodes(table), n_nodes)])

    def cut(self, depth: int) -> Tree:
        """This tree without its nodes deeper than ``depth`` (>= 0): nodes 0..n-1 of this one, in the same order
        (nodes are numbered by depth first): a verify pass whose rows have fewer positions left than this tree
        is deep."""
        if depth >= self.depth:
            return self
        return Tree(tuple(p for p in self.paths if len(p) <= depth))

    # ---- what the decoders read -----------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Nodes, the root included: the width of the verify pass."""
        return len(self.paths)

    @property
    def depth(self) -> int:
        """The deepest node's depth: the heads the tree reads beyond p_1 (blocks of at most depth + 1 tokens)."""
        return max(self.depths)

    @cached_property
    def is_path(self) -> bool:
        """Whether the tree is the single path of first choices (today's block)."""
        return self.paths == Tree.path(self.depth).paths

    def widths(self) -> list[int]:
        """How many ranks each depth 1..depth reads: 1 + the highest rank at that depth."""
        return [1 + max(r for r, d in zip(self.ranks, self.depths) if d == depth) for depth in range(1, self.depth + 1)]

    def at_depth(self, depth: int) -> list[int]:
        """The nodes at ``depth``, in node order."""
        return [i for i, d in enumerate(self.depths) if d == depth]

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def leaves(self) -> list[int]:
        """The nodes without children, in node order."""
        parents = set(self.parents)
        return [i for i in range(self.size) if i not in parents]

    def root_path(self, node: int) -> list[int]:
        """The nodes from the root to ``node`` (both included)."""
        out = [node]
        while out[-1] > 0:
            out.append(self.parents[out[-1]])
        return out[::-1]

    def leaf_paths(self) -> list[list[int]]:
        """Every root-to-leaf path as its node indices: the candidates a one-by-one check walks."""
        return [self.root_path(leaf) for leaf in self.leaves()]

    @cached_property
    def _tables(self) -> dict[str, Tensor]:
        n = self.size
        ancestors = torch.zeros(n, n, dtype=torch.bool)
        table = torch.zeros(n, self.depth + 1, dtype=torch.long)
        for i in range(n):
            path = self.root_path(i)
            ancestors[i, path] = True
            table[i] = torch.tensor(path + [i] * (self.depth + 1 - len(path)))
        depths = torch.tensor(self.depths, dtype=torch.long)
        # the accepted node is the deepest accepted one, ties to the lowest index: the largest key
        order = depths * n + (n - 1 - torch.arange(n))
        kids = [self.children(i) for i in range(n)]
        children = torch.tensor([c + [-1] * (max(map(len, kids)) - len(c)) for c in kids], dtype=torch.long)
        return {"ancestors": ancestors, "paths": table, "depths": depths, "ranks": torch.tensor(self.ranks),
                "parents": torch.tensor(self.parents[1:], dtype=torch.long), "order": order,
                "children": children}

    def table(self, name: str, device: torch.device | str = "cpu") -> Tensor:
        """One of the tree's tensors on ``device``: ``ancestors`` (N, N) bool, row i True at node i's ancestors and
        i itself (the verify pass's attention mask among the nodes); ``paths`` (N, depth + 1) long, row i the
        nodes from the root to i, padded with i (:meth:`root_path`); ``depths`` (N,) long (the position offsets);
        ``ranks`` (N,) long; ``parents`` (N - 1,) long, the parents of nodes 1..N-1; ``order`` (N,) long, the key whose largest accepted
        entry picks the accepted node (deepest, then lowest index); ``children`` (N, C) long, row i node i's children
        in node order, -1 past them (C: the most children of a node; 0 for the root alone)."""
        return self._tables[name].to(device)

    def ancestors(self, device: torch.device | str = "cpu") -> Tensor:
        """The tree attention mask (N, N) bool: node i attends to its ancestors and itself."""
        return self.table("ancestors", device)

    def path_table(self, device: torch.device | str = "cpu") -> Tensor:
        """(N, depth + 1) long: row i lists the nodes from the root to node i, padded with i."""
        return self.table("paths", device)

    def __repr__(self) -> str:
        return f"Tree({self.size - 1} nodes, depth {self.depth}, widths {self.widths()})"


def agreement_table(agreement: Sequence[Sequence[float]] | Tensor) -> Tensor:
    """``agreement`` as a (depth, ranks) float64 table; ValueError, in one line, where it is not one of
    probabilities."""
    table = torch.as_tensor(agreement, dtype=torch.float64)
    if table.dim() != 2 or table.numel() == 0:
        raise ValueError(f"agreement must be a non-empty (depth, ranks) table, got shape {tuple(table.shape)}")
    if not bool(((table >= 0) & (table <= 1)).all()):
        raise ValueError("agreement must hold probabilities in [0, 1]")
    return table


def greedy_nodes(table: Tensor) -> Iterator[tuple[Path, float]]:
    """Medusa's greedy order over a (depth, ranks) agreement table: each step yields the candidate (a child of a
    node yielded before; the first, depth 1's) of highest expected contribution, the product of the agreements
    along its path, and that contribution (ties to the shorter, then the lower path). Its first n paths are
    :meth:`Tree.from_budget`'s n nodes, so their contributions add up to its expected accepted length minus 1."""
    p = table.tolist()
    depth, width = table.shape
    candidates: dict[Path, float] = {(r,): p[0][r] for r in range(width)}
    while candidates:
        best = min(candidates, key=lambda c: (-candidates[c], len(c), c))
        value = candidates.pop(best)
        yield best, value
        if len(best) < depth:
            candidates.update({(*best, r): value * p[len(best)][r] for r in range(width)})


def budget_limit(depth: int, width: int) -> int:
    """Non-root nodes of the full tree ``depth`` deep with ``width`` children per node."""
    return sum(width**d for d in range(1, depth + 1))


@dataclass(frozen=True)
class DynamicTree:
    """EAGLE-2's dynamic tree (:mod:`~lightning_bpd.decoding.proposers.dynamic_tree` grows it): ``nodes`` non-root nodes per row and iteration, at most ``depth`` heads deep, each node's
    ``width`` most likely children competing."""

    nodes: int
    depth: int
    width: int = 4

    def __post_init__(self) -> None:
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in (self.nodes, self.depth, self.width)):
            raise ValueError(f"a dynamic tree's nodes, depth and width must be integers >= 1, got {self}")
        if self.nodes > budget_limit(self.depth, self.width):
            raise ValueError(f"a dynamic tree {self.depth} deep and {self.width} wide has at most "
                             f"{budget_limit(self.depth, self.width)} nodes, got {self.nodes}")

    @property
    def size(self) -> int:
        """Nodes, the root included: the width of the verify pass."""
        return self.nodes + 1


def parse_tree(text: str) -> Tree | DynamicTree:
    """A tree from the command line: ``"0;1;0,0;0,1"`` (paths separated by ``;``, ranks by ``,``), ``"path:D"`` for
    :meth:`Tree.path` of depth D, or ``"dynamic:N:D[:W]"`` for a
    :class:`DynamicTree` of N nodes, D deep, W wide (default 4). One clear error
    line on anything else."""
    text = text.strip()
    try:
        if text.startswith("path:"):
            return Tree.path(int(text[5:]))
        if text.startswith("dynamic:"):
            numbers = [int(v) for v in text[8:].split(":")]
            if len(numbers) not in (2, 3):
                raise ValueError("a dynamic tree is dynamic:N:D or dynamic:N:D:W")
            return DynamicTree(*numbers)
        return Tree.from_paths([tuple(int(r) for r in part.split(",")) for part in text.split(";") if part.strip()])
    except ValueError as err:
        raise ValueError(f"--tree {text!r}: {err} (write paths of ranks like '0;1;0,0;0,1', 'path:3', or "
                         "'dynamic:16:3' for 16 nodes 3 deep)") from None
