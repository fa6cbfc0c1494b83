"""Tree budgets (issue 47): ``--tree-nodes N`` verifies Medusa's greedy tree of N nodes (:meth:`Tree.from_budget`),
built from each head's top-r agreement table stored with the heads. Torch only (the trees of a run's inputs, measured
where the heads store no table: :func:`lightning_bpd.evaluation.budget_trees`).

The table (:func:`~lightning_bpd.decoding.agreement.head_rank_agreement`: row d - 1, column r, how often greedy's
token is the rank-r choice of the head at depth d) is measured against the model's own greedy output, so any
sources serve: :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval` measures it on the validation decode subset
while fitting and the module keeps it (``rank_agreement``), which its checkpoint stores (``head_rank_agreement``)
and ``save_heads`` writes to ``heads.json``; ``bench`` and ``bench-generate`` measure it on their inputs where a
checkpoint has none. ``decode --tree-nodes N`` then builds the tree without data. N = 0 is today's single path.

``--tree-nodes auto`` (or ``auto:M``, budgets up to M; ``auto`` is ``auto:64``) picks the budget that pays on this
machine (:mod:`~lightning_bpd.decoding.trees.cost`): a few iterations of trees 2, 4, 8, ... wide are timed against
greedy's step on the first batch of the run's inputs, once per runtime (kept in ``Runtime.measurements``), and the
budget of most expected accepted tokens per unit of cost wins; the choice and the cost curve are reported.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.agreement import head_rank_agreement
from lightning_bpd.decoding.greedy import greedy_decode
from lightning_bpd.decoding.trees.cost import CostCurve, TreeChoice, choose_nodes, measure_pass_costs, measured_widths
from lightning_bpd.decoding.trees.tree import Tree, budget_limit

RANKS = 8  # ranks measured per head: trees up to 8 children wide
KEY = "head_rank_agreement"  # where a checkpoint and heads.json keep the table
AUTO_MAX = 64  # the largest budget --tree-nodes auto weighs (Medusa's largest tree)
TreeNodes = int | str  # a budget, or "auto" / "auto:M"


def tree_nodes_arg(text: str) -> TreeNodes:
    """``--tree-nodes``'s argparse type: an integer (range-checked by :func:`budget_tree`), ``auto`` or ``auto:M``
    (M >= 1)."""
    text = text.strip()
    if text == "auto" or text.startswith("auto:"):
        if text != "auto" and not (text[5:].isdigit() and int(text[5:]) >= 1):
            raise argparse.ArgumentTypeError(f"auto:M takes an integer M >= 1 (the largest budget), got {text!r}")
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a node budget (an integer >= 0), auto or auto:M, got {text!r}") from None


def auto_limit(spec: str) -> int:
    """The largest budget ``auto`` (``AUTO_MAX``) or ``auto:M`` (M) weighs."""
    return AUTO_MAX if spec == "auto" else int(spec[5:])


@torch.no_grad()
def measure_rank_agreement(model: Any, batches: Sequence[Any], ranks: int = RANKS) -> Tensor:
    """The (k - 1, ranks) agreement table of ``model``'s heads over every batch: greedy decodes each batch, then each
    head is scored teacher-forced on greedy's output, the batches weighted by the positions they score. A batch is
    anything with a source ``src`` (B, S) and a length cap ``max_len`` (an
    :class:`~lightning_bpd.evaluation.EvalBatch`)."""
    k = model.k
    if k < 2:
        raise ValueError(f"a head rank agreement table needs a model with k >= 2 heads, got k={k}")
    total = torch.zeros(k - 1, ranks, dtype=torch.float64)
    scored = torch.zeros(k - 1, dtype=torch.float64)
    for batch in batches:
        greedy = greedy_decode(model, batch.src, batch.max_len)
        table = head_rank_agreement(model, batch.src, greedy.tokens, greedy.lengths, ranks).cpu()  # (k - 1, ranks)
        lengths = greedy.lengths.cpu()
        n = torch.stack([(lengths - d).clamp(min=0).sum() for d in range(1, k)]).double()  # (k - 1,) positions
        total += table * n[:, None]
        scored += n
    return total / scored.clamp(min=1)[:, None]


def as_record(table: Tensor | None) -> list[list[float]] | None:
    """The table as a checkpoint or ``heads.json`` keeps it: rows of floats (None: none measured)."""
    return None if table is None else [[float(p) for p in row] for row in table.tolist()]


def from_record(record: Any, where: str = "the checkpoint") -> Tensor | None:
    """The table of a stored record (None where none is stored); ValueError, in one line, on a malformed one."""
    if record is None:
        return None
    try:
        table = torch.tensor(record, dtype=torch.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: {KEY} must be a table of probabilities (rows of numbers)") from None
    if table.dim() != 2 or table.numel() == 0 or not bool(((table >= 0) & (table <= 1)).all()):
        raise ValueError(f"{where}: {KEY} must be a non-empty (heads, ranks) table of probabilities in [0, 1]")
    return table


def stored_rows(table: Tensor | None, k: int, what: str) -> Tensor:
    """The rows of the stored ``table`` that decoding with ``k`` heads reads (k - 1, ranks); ValueError, in one line
    starting with ``what``, for k < 2 or no table."""
    if k < 2:
        raise ValueError(f"{what}: a tree needs k >= 2 heads, decoding with k={k}")
    if table is None:
        raise ValueError(f"{what}: no head rank agreement table is stored with these heads (fit measures one on its "
                         "validation decode subset; bench and bench-generate measure one on their inputs)")
    return table[: k - 1]


def budget_tree(n_nodes: int, table: Tensor | None, k: int, option: str = "--tree-nodes") -> Tree | None:
    """The tree of ``n_nodes`` non-root nodes for decoding with ``k`` heads (None for 0: today's single path), from
    the stored ``table``. ValueError, in one line, where N is out of range or no table is stored."""
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int) or n_nodes < 0:
        raise ValueError(f"{option} must be an integer >= 0 (0 = the single path), got {n_nodes!r}")
    if n_nodes == 0:
        return None
    rows = stored_rows(table, k, f"{option} {n_nodes}")
    limit = budget_limit(rows.shape[0], rows.shape[1])
    if n_nodes > limit:
        raise ValueError(f"{option} must lie in [0, {limit}] for {rows.shape[0]} heads of {rows.shape[1]} measured "
                         f"ranks each, got {n_nodes}")
    return Tree.from_budget(n_nodes, rows)


def auto_tree(model: Any, table: Tensor | None, k: int, src: Tensor, spec: str = "auto",
              repeats: int = 5) -> tuple[Tree | None, TreeChoice]:
    """``--tree-nodes auto``: the tree (None: the single path) of the budget in 1..M (or the single path) of most
    expected accepted tokens per unit of iteration cost, the costs timed on ``model`` (a runtime, or the module's
    model) at the batch ``src`` (B, S); and the choice. The cost curve is measured once per runtime and batch shape
    (kept in its ``measurements``). ValueError, in one line, as :func:`budget_tree`."""
    rows = stored_rows(table, k, f"--tree-nodes {spec}")
    n_max = min(auto_limit(spec), budget_limit(*rows.shape))
    widths = measured_widths(n_max, path_width=k)
    key = ("tree_cost", k, tuple(src.shape), tuple(widths), tuple(map(tuple, rows.tolist())))
    memo = getattr(model, "measurements", None)  # a runtime's: measured once per run
    if memo is None:  # a model keeps nothing
        memo = {}
    if key not in memo:
        trees = [Tree.from_budget(w - 1, rows) for w in widths]
        costs = measure_pass_costs(model, src, [*trees, Tree.path(k - 1)], repeats)
        memo[key] = (CostCurve((1, *widths), (1.0, *costs[:-1])), costs[-1])
    curve, path_cost = memo[key]
    choice = choose_nodes(rows, curve, n_max, path_cost)
    return (None if choice.nodes == 0 else Tree.from_budget(choice.nodes, rows)), choice
