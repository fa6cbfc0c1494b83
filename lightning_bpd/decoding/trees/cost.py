"""Which tree pays on this machine: expected accepted tokens per unit of pass cost (issue 47). Torch only.

Medusa's greedy tree of n nodes (:meth:`Tree.from_budget`) has the highest expected accepted length E(n) at n
nodes (under the agreement table's independence: a node is accepted with the product of its path's agreements, and
the nodes of one depth exclude each other, so E(n) = 1 + the sum of its nodes' contributions). One iteration with
it costs c(n + 1): propose, the verify pass over n + 1 tokens, the verification and the cache's path kept, in units
of greedy's cached step (1 token and p_1's argmax). The tree that pays is the n of most expected tokens per unit
of cost, E(n) / c(n + 1), the predicted speedup over greedy (ties to the smaller tree). The single path of the
decoder's k - 1 heads competes as the budget 0.

:func:`measure_pass_costs` times the iterations of a few trees on the model at hand (a few calls each, the widths
alternated, medians); a :class:`CostCurve` interpolates between the measured widths; :func:`choose_nodes` takes the
argmax and says what it chose (:class:`TreeChoice`). :func:`choose_nodes_reference` builds every tree and sums its
nodes' path products (:func:`tree_expected_length`) instead of reading the greedy order's running sum.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Exact
from lightning_bpd.decoding.proposers.tree import check_tree_args, propose_tree
from lightning_bpd.decoding.protocol import BlockwiseModel, chain_source, first_argmax
from lightning_bpd.decoding.trees.tree import Tree, agreement_table, budget_limit, greedy_nodes
from lightning_bpd.decoding.verify import verify_tree


# ---- the expected side ---------------------------------------------------------------------------------------------
def expected_lengths(agreement: Sequence[Sequence[float]] | Tensor, n_max: int) -> list[float]:
    """E(n) for n = 0..n_max: the expected accepted tokens per iteration of ``Tree.from_budget(n, agreement)``
    (E(0) = 1, the root alone), the running sum of the greedy order's contributions."""
    table = agreement_table(agreement)
    if not 0 <= n_max <= budget_limit(*table.shape):
        raise ValueError(f"n_max must lie in [0, {budget_limit(*table.shape)}], got {n_max}")
    gains = [value for _, value in itertools.islice(greedy_nodes(table), n_max)]
    return [1.0, *(1.0 + s for s in itertools.accumulate(gains))]


def tree_expected_length(tree: Tree, agreement: Sequence[Sequence[float]] | Tensor) -> float:
    """The expected accepted tokens per iteration of ``tree``: 1 + the sum over its non-root nodes of the product of
    the agreements along their paths (row d - 1, column r: the rank-r token of the head at depth d)."""
    p = agreement_table(agreement).tolist()
    return 1.0 + sum(math.prod(p[d][r] for d, r in enumerate(path)) for path in tree.paths[1:])


# ---- the cost side -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostCurve:
    """The cost of an iteration over ``widths[i]`` tokens is ``costs[i]`` greedy steps (widths ascending, the first
    1 with cost 1); between two measured widths, linear."""

    widths: tuple[int, ...]
    costs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.widths) != len(self.costs) or not self.widths or self.widths[0] != 1:
            raise ValueError(f"a cost curve needs as many costs as widths, starting at width 1, got {self.widths}")
        if any(b <= a for a, b in itertools.pairwise(self.widths)):
            raise ValueError(f"a cost curve's widths must ascend, got {self.widths}")
        if any(not c > 0 for c in self.costs):
            raise ValueError(f"a cost curve's costs must be > 0, got {self.costs}")

    def __call__(self, width: int) -> float:
        if not self.widths[0] <= width <= self.widths[-1]:
            raise ValueError(f"width {width} lies outside the measured widths {self.widths[0]}..{self.widths[-1]}")
        i = next(j for j, w in enumerate(self.widths) if w >= width)
        if self.widths[i] == width:
            return self.costs[i]
        (w0, c0), (w1, c1) = (self.widths[i - 1], self.costs[i - 1]), (self.widths[i], self.costs[i])
        return c0 + (c1 - c0) * (width - w0) / (w1 - w0)

    def as_record(self) -> dict[str, float]:
        return {str(w): round(c, 4) for w, c in zip(self.widths, self.costs)}


def measured_widths(n_max: int, path_width: int) -> list[int]:
    """The tree widths worth timing for budgets up to ``n_max``: powers of two, n_max + 1 and the single path's."""
    powers = [2**i for i in range(1, (n_max + 1).bit_length()) if 2**i <= n_max + 1]
    return sorted({*powers, n_max + 1, path_width} - {1})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def measure_pass_costs(model: BlockwiseModel, src: Tensor, trees: Sequence[Tree], repeats: int = 5,
                       prefix: int = 8) -> list[float]:
    """Each tree's iteration cost (exact: propose, the verify pass, verification, the accepted path kept) over
    greedy's cached step (one token, p_1's argmax), on ``model`` at batch ``src.shape[0]`` with ``prefix`` tokens
    decoded: medians of ``repeats`` timed calls each, all calls alternated after one untimed round; the cache is
    cropped back after every call, so every call sees the same one."""
    if not trees or any(t.size < 2 for t in trees) or repeats < 1:
        raise ValueError("measure_pass_costs needs trees of at least one non-root node and repeats >= 1")
    check_tree_args(model, Exact(), max(trees, key=lambda t: t.depth), None)
    b, device = src.shape[0], src.device
    context = model.encode(src)
    widest, deepest = max(t.size for t in trees), max(t.depth for t in trees)
    cache = model.new_cache(b, capacity=1 + prefix + deepest + 1, extra_slots=widest)
    bos = torch.full((b, 1), model.bos_id, dtype=torch.long, device=device)
    h = model.decode_step(bos, context, cache)[:, -1]  # (b, D)
    first = first_argmax(model, h)  # (b,)
    if prefix:
        h = model.decode_step(first[:, None].repeat(1, prefix), context, cache)[:, -1]
        first = first_argmax(model, h)
    keep, bounds = cache.lengths.clone(), (1 + prefix, 1 + prefix)
    source = chain_source(model, context)

    def greedy_step() -> None:
        first_argmax(model, model.decode_step(first[:, None], context, cache)[:, -1])
        cache.crop(keep.clone(), bounds, check=False)

    def iteration(tree: Tree) -> Callable[[], None]:
        depths, ancestors, paths = tree.table("depths", device), tree.ancestors(device), tree.path_table(device)

        def call() -> None:
            tokens = propose_tree(model, Exact(), tree, h, first, source)  # (b, N)
            hidden = model.decode_tree(tokens, depths, ancestors, context, cache)  # (b, N, D)
            node, _ = verify_tree(model, Exact(), tree, tokens, hidden)  # (b,)
            cache.keep_path(paths[node], depths[node] + 1, tree.size)
            cache.crop(keep.clone(), bounds, check=False)

        return call

    calls = [greedy_step, *(iteration(t) for t in trees)]
    seconds: list[list[float]] = [[] for _ in calls]
    for round_ in range(repeats + 1):
        for fn, out in zip(calls, seconds):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            if round_:  # the first round warms up
                out.append(time.perf_counter() - start)
    step = statistics.median(seconds[0])
    return [statistics.median(s) / step for s in seconds[1:]]


# ---- the choice ----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TreeChoice:
    """What :func:`choose_nodes` chose: ``nodes`` (0: the single path), its expected accepted length, its cost in
    greedy steps and their ratio (the predicted speedup), the cost curve, and every candidate's ratio."""

    nodes: int
    expected: float
    cost: float
    curve: CostCurve
    ratios: dict[int, float]  # budget -> E / cost (0: the single path)

    @property
    def speedup(self) -> float:
        return self.expected / self.cost

    def summary(self) -> str:
        what = "the single path" if self.nodes == 0 else f"{self.nodes} nodes"
        curve = " ".join(f"{w}:{c:.2f}" for w, c in zip(self.curve.widths, self.curve.costs))
        return (f"tree-nodes auto: {what} (expected block {self.expected:.2f} / iteration cost {self.cost:.2f} greedy "
                f"steps = predicted speedup {self.speedup:.2f}); cost per width {curve}")

    def as_record(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "expected_block": round(self.expected, 4), "cost": round(self.cost, 4),
                "predicted_speedup": round(self.speedup, 4), "cost_per_width": self.curve.as_record(),
                "predicted_speedup_per_budget": {str(n): round(r, 4) for n, r in self.ratios.items()}}


def choose_nodes(agreement: Sequence[Sequence[float]] | Tensor, curve: CostCurve, n_max: int,
                 path_cost: float | None = None) -> TreeChoice:
    """The budget n in 1..n_max of highest E(n) / curve(n + 1) (ties to the smaller n); with ``path_cost`` the single
    path of all the table's heads (the budget 0) competes at that cost."""
    table = agreement_table(agreement)
    if n_max < 1:
        raise ValueError(f"n_max must be >= 1, got {n_max}")
    lengths = expected_lengths(table, n_max)
    options = {n: (lengths[n], curve(n + 1)) for n in range(1, n_max + 1)}
    if path_cost is not None:
        options[0] = (tree_expected_length(Tree.path(table.shape[0]), table), path_cost)
    ratios = {n: e / c for n, (e, c) in sorted(options.items())}
    best = max(ratios, key=lambda n: (ratios[n], -n))
    return TreeChoice(best, options[best][0], options[best][1], curve, ratios)


def choose_nodes_reference(agreement: Sequence[Sequence[float]] | Tensor, cost: Callable[[int], float],
                           n_max: int) -> int:
    """The slow :func:`choose_nodes` (without the single path): every budget's tree built, its expected length summed
    node by node."""
    ratio = {n: tree_expected_length(Tree.from_budget(n, agreement), agreement) / cost(n + 1)
             for n in range(1, n_max + 1)}
    return max(ratio, key=lambda n: (ratio[n], -n))
