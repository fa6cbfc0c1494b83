"""Decode batches of inputs with a method, timed: the one evaluation loop. Lightning-free.

The validation callback (:class:`~lightning_bpd.callbacks.decode_eval.DecodeEval`), ``bench``,
``decode`` / :func:`~lightning_bpd.tasks.translation.module.translate`, ``distill`` and
``human-eval`` all decode through :func:`run_batch` / :func:`decode_all`: a method (anything called
as ``method(model, src, max_len) -> DecodeResult``, e.g. a
:class:`~lightning_bpd.decoding.methods.DecodeMethod`) over :class:`EvalBatch` inputs, each call timed
(CUDA synchronized), the outputs and counts collected in a :class:`MethodRun`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding import DecodeResult
from lightning_bpd.decoding.trees import budget as tree_budget


@dataclass
class EvalBatch:
    """One batch of evaluation inputs: ``src`` (B, S), the decode length limit, and what the task
    needs to score and show the outputs (references, raw sources, dataset indices)."""

    src: Tensor
    max_len: int
    references: list[Any] = field(default_factory=list)
    sources: list[Any] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)


@dataclass
class BatchRun:
    """One method on one batch: plain Python values, so ranks can gather them. ``agree`` / ``scored``:
    per head, matches with greedy's output and positions scored; ``ranks``: per head 2..k, how many times
    greedy's token was its rank-r choice (greedy's run only)."""

    outputs: list[list[int]]
    blocks: list[list[int]]
    tokens: int
    iterations: int
    model_calls: int
    seconds: float
    agree: list[float] = field(default_factory=list)
    scored: list[float] = field(default_factory=list)
    ranks: list[list[float]] = field(default_factory=list)

    @classmethod
    def of(cls, result: DecodeResult, seconds: float) -> BatchRun:
        return cls(result.sequences(), [list(b) for b in result.block_sizes], int(result.lengths.sum()),
                   int(result.iterations.sum()), int(result.model_calls), float(seconds))


@dataclass
class MethodRun:
    """All outputs of one decoding method over the evaluation batches."""

    outputs: list[list[int]] = field(default_factory=list)
    blocks: list[list[int]] = field(default_factory=list)
    tokens: int = 0
    iterations: int = 0
    model_calls: int = 0
    seconds: float = 0.0
    agree: list[float] = field(default_factory=list)
    scored: list[float] = field(default_factory=list)
    ranks: list[list[float]] = field(default_factory=list)

    def merge(self, part: BatchRun) -> None:
        self.outputs += part.outputs
        self.blocks += part.blocks
        self.tokens += part.tokens
        self.iterations += part.iterations
        self.model_calls += part.model_calls
        self.seconds += part.seconds
        if part.agree:
            self.agree = [a + b for a, b in zip(self.agree or [0.0] * len(part.agree), part.agree)]
            self.scored = [a + b for a, b in zip(self.scored or [0.0] * len(part.scored), part.scored)]
        if part.ranks:
            self.ranks = [[a + b for a, b in zip(mine, theirs)]
                          for mine, theirs in zip(self.ranks or [[0.0] * len(r) for r in part.ranks], part.ranks)]

    def rank_agreement(self) -> Tensor | None:
        """The heads' top-r agreement table (k - 1, ranks) of ``ranks`` over ``scored`` (greedy's run; None
        without one)."""
        if not self.ranks:
            return None
        counts = torch.tensor(self.ranks, dtype=torch.float64)  # (k - 1, ranks)
        return counts / torch.tensor(self.scored[1:], dtype=torch.float64).clamp(min=1)[:, None]

    @property
    def mean_accepted_block_size(self) -> float:
        return self.tokens / max(1, self.iterations)


Method = Callable[[Any, Tensor, int], DecodeResult]


def timed(device: torch.device | str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """Run ``fn(*args, **kwargs)``; return its result and wall-clock seconds (CUDA synchronized)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - start


def run_batch(method: Method, model: Any, batch: EvalBatch) -> tuple[DecodeResult, BatchRun]:
    """Decode one batch with ``method``, timed, without gradients: the result and its :class:`BatchRun`."""
    with torch.no_grad():
        result, seconds = timed(batch.src.device, method, model, batch.src, batch.max_len)
    return result, BatchRun.of(result, seconds)


def decode_all(method: Method, model: Any, batches: Sequence[EvalBatch]) -> MethodRun:
    """Decode every batch with ``method``: outputs in batch order, counts and seconds summed."""
    run = MethodRun()
    for batch in batches:
        run.merge(run_batch(method, model, batch)[1])
    return run


def pad_rows(rows: Sequence[Tensor], pad_id: int) -> Tensor:
    """Single-row (1, S_i) tensors -> one (B, max S_i) tensor padded with ``pad_id``."""
    width = max(r.shape[1] for r in rows)
    return torch.cat([torch.nn.functional.pad(r, (0, width - r.shape[1]), value=pad_id) for r in rows])


def batched(module: Any, rows: list[Tensor], size: int) -> list[EvalBatch]:
    """Single-row inputs in batches of ``size``, padded, each with the module's decode length limit."""
    out = []
    for start in range(0, len(rows), size):
        src = pad_rows(rows[start : start + size], module.model.pad_id)
        out.append(EvalBatch(src, module.max_decode_len(src)))
    return out


def budget_trees(module: Any, model: Any, inputs: list[Tensor], budgets: list[tree_budget.TreeNodes] | None,
                 k: int | None, who: str, batch_size: int = 1,
                 choices: dict[str, Any] | None = None) -> dict[str, tree_budget.Tree | None]:
    """``nodes<N>``: the tree of each budget N for ``module``'s heads decoding with ``k`` of them (None: all), from
    the table stored with them, or measured with ``model`` (the module's model or a runtime of it) on the single-row
    ``inputs`` (batches of 32) first where none is (said on stderr, after ``who``). ``nodes-auto`` (``nodes-auto:M``)
    for ``auto`` (``auto:M``): :func:`~lightning_bpd.decoding.trees.budget.auto_tree` timed on the first
    ``batch_size`` inputs; its choice goes to stderr and, as a record, into ``choices``."""
    if not budgets:
        return {}
    k = module.model.k if k is None else k
    table = module.rank_agreement
    if table is None and k > 1 and any(budgets):
        table = tree_budget.measure_rank_agreement(model, batched(module, inputs, 32))
        print(f"{who}: the heads store no rank agreement table: measured on the {len(inputs)} inputs", file=sys.stderr)
    out: dict[str, tree_budget.Tree | None] = {}
    for n in budgets:
        if isinstance(n, str):
            src = pad_rows(inputs[:batch_size], module.model.pad_id)
            out[f"nodes-{n}"], choice = tree_budget.auto_tree(model, table, k, src, n)
            print(f"{who}: {choice.summary()} (timed at batch {src.shape[0]})", file=sys.stderr)
            if choices is not None:
                choices[f"nodes-{n}"] = {**choice.as_record(), "batch": src.shape[0]}
        else:
            out[f"nodes{n}"] = tree_budget.budget_tree(n, table, k)
    return out
