"""Validation/test decoding: greedy against blockwise decoding under several acceptance rules.

Shared by both tasks. On a fixed subset of the validation set (every example for ``validate`` and
``test``) it decodes greedily and blockwise with each criterion, in the same run and on the same
inputs, and logs per method: the task's quality metrics (BLEU, PSNR, ...), the mean accepted block
size, model calls, seconds, tokens per second, wall-clock speedup over greedy, and for exact acceptance the share of
outputs identical to greedy. A task may add metrics of its own on the same examples (the optional
``decode_eval_extras`` hook: e.g. a trivial baseline's quality as a ``<name>/<quality>`` row, or
diagnostics of the model). A sample table (with the accepted blocks of every iteration, as in
section 7.4 of the paper) goes to W&B when the logger is a WandbLogger.

The task's LightningModule provides the hooks of :class:`DecodeEvalTask`.
"""

from __future__ import annotations

import json
import logging
from argparse import ArgumentTypeError
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import pytorch_lightning as pl
import torch
from pytorch_lightning.loggers import WandbLogger
from torch import Tensor

from lightning_bpd.decoding import Criterion, head_agreement, head_rank_agreement
from lightning_bpd.decoding.methods import DecodeMethod, acceptance_rate, make_method, with_baselines
from lightning_bpd.decoding.trees.budget import (
    RANKS,
    TreeNodes,
    auto_tree,
    budget_tree,
    measure_rank_agreement,
    tree_nodes_arg,
)
from lightning_bpd.decoding.trees.tree import budget_limit
from lightning_bpd.evaluation import BatchRun, EvalBatch, MethodRun, run_batch
from lightning_bpd.inference import InferenceOptions, build_runtime

__all__ = ["BatchRun", "DecodeEval", "EvalBatch", "MethodRun", "run_decode_eval"]

logger = logging.getLogger("lightning_bpd")


class DecodeEvalTask(Protocol):
    model: Any

    def decode_eval_batches(self, stage: str, limit: int | None, batch_size: int) -> list[EvalBatch]: ...

    def make_criterion(self, spec: str) -> Criterion: ...

    def decode_eval_metrics(
        self, outputs: list[list[int]], batches: list[EvalBatch], greedy: list[list[int]] | None
    ) -> dict[str, float]:
        """Quality of ``outputs`` against the references (and against greedy's outputs, when given)."""
        ...

    def decode_eval_samples(
        self, outputs: dict[str, list[list[int]]], blocks: dict[str, list[list[int]]], batches: list[EvalBatch], n: int
    ) -> tuple[list[str], list[list[Any]]]:
        """Sample table columns and rows; image cells as (H, W, C) uint8 numpy arrays (W&B images in the table)."""
        ...

    # optional: def decode_eval_extras(self, batches: list[EvalBatch]) -> dict[str, float]
    # optional: def decode_eval_proposer(self, model: Any) -> Proposer  (what proposes instead of the model's heads)


def build_methods(task: DecodeEvalTask, criteria: list[str], k: int | None = None,
                  model: Any = None) -> tuple[list[str], dict[str, DecodeMethod]]:
    """The methods of ``criteria`` with their baselines (greedy always), baselines first: ``(order, methods)``;
    ``model``: what they decode with (default the task's model; or a runtime of it). A task with the optional hook
    ``decode_eval_proposer(model)`` (a DFlash drafter's module) has its blockwise rules proposed by what it returns
    instead of the model's heads."""
    model = task.model if model is None else model
    hook = getattr(task, "decode_eval_proposer", None)
    proposer = hook(model) if hook is not None and criteria else None

    def make(spec: str) -> DecodeMethod:
        return make_method(spec, task.make_criterion, model, k, proposer=proposer)

    methods = {"greedy": make("greedy"), **{spec: make(spec) for spec in criteria}}
    return with_baselines(["greedy", *criteria], methods, make), methods


def proposed_block(task: DecodeEvalTask, methods: dict[str, DecodeMethod]) -> int:
    """The block of a decode evaluation (its JSON's ``k``): the most tokens per target call its blockwise ``methods``
    propose, as each method's proposer says (a DFlash drafter's ``block_size``, an EAGLE-3 chain, the heads used);
    the model's k where only baselines decode."""
    return max((m.block_size(task.model) for m in methods.values() if not m.is_baseline), default=task.model.k)


Shard = dict[int, dict[str, BatchRun]]  # batch index -> method -> its run on that batch


def decode_shard(task: DecodeEvalTask, batches: list[EvalBatch], criteria: list[str], k: int | None = None,
                 rank: int = 0, world_size: int = 1, model: Any = None) -> Shard:
    """Decode batches ``rank, rank + world_size, ...`` with every method (alternating per batch) on ``model``
    (default: the task's model; or a runtime of it, :func:`~lightning_bpd.inference.build_runtime`)."""
    model = task.model if model is None else model
    order, methods = build_methods(task, criteria, k, model)
    shard: Shard = {}
    for index in range(rank, len(batches), world_size):
        batch = batches[index]
        shard[index] = {}
        for name in order:
            result, run = run_batch(methods[name], model, batch)
            shard[index][name] = run
            if name == "greedy" and model.k > 1:  # what the block size measures, head by head
                agree, scored = head_agreement(model, batch.src, result.tokens, result.lengths)
                run.agree, run.scored = agree.tolist(), scored.tolist()
                table = head_rank_agreement(model, batch.src, result.tokens, result.lengths, RANKS).cpu()
                run.ranks = (table * scored[1:, None].double()).tolist()  # counts: batches add up
    return shard


def valid_budget(n: Any) -> bool:
    """A tree budget ``DecodeEval`` takes: an integer >= 0, or ``auto`` / ``auto:M`` as ``--tree-nodes`` reads them
    (:func:`~lightning_bpd.decoding.trees.budget.tree_nodes_arg`)."""
    if isinstance(n, str):
        try:
            return tree_nodes_arg(n) == n  # "auto" or "auto:M" exactly (not a number given as text)
        except ArgumentTypeError:
            return False
    return not isinstance(n, bool) and isinstance(n, int) and n >= 0


def decode_trees(batches: list[EvalBatch], methods: dict[str, DecodeMethod], shard: Shard, rank: int = 0,
                 world_size: int = 1, model: Any = None) -> Shard:
    """Add each tree method's run to ``shard`` (the batches ``rank, rank + world_size, ...``)."""
    for index in range(rank, len(batches), world_size):
        for name, method in methods.items():
            shard[index][name] = run_batch(method, model, batches[index])[1]
    return shard


def rank_agreement(shards: list[Shard]) -> Tensor | None:
    """The heads' top-r agreement table (k - 1, ranks) of greedy's runs over every batch of ``shards`` (None for
    a model without heads)."""
    greedy = MethodRun()
    for shard in shards:
        for parts in shard.values():
            greedy.merge(parts["greedy"])
    return greedy.rank_agreement()


def summarize(task: DecodeEvalTask, batches: list[EvalBatch], criteria: list[str], shards: list[Shard],
              k: int | None = None, extra: dict[str, DecodeMethod] | None = None
              ) -> tuple[dict[str, float], dict[str, MethodRun]]:
    """Metrics over every batch of ``batches``, each taken exactly once from the shards that decoded it;
    ``extra``: methods decoded beside those of ``criteria`` (the tree budgets), after them."""
    order, methods = build_methods(task, criteria, k)
    order, methods = [*order, *(extra or {})], {**methods, **(extra or {})}
    merged: Shard = {}
    for shard in shards:
        for index, parts in shard.items():
            if index in merged:
                raise RuntimeError(f"decode eval: batch {index} was decoded by two ranks")
            merged[index] = parts
    missing = sorted(set(range(len(batches))) - set(merged))
    if missing:
        raise RuntimeError(f"decode eval: no rank decoded batches {missing[:5]}")
    runs = {name: MethodRun() for name in order}
    for index in range(len(batches)):
        for name in order:
            runs[name].merge(merged[index][name])
    metrics: dict[str, float] = {}
    greedy = runs["greedy"]
    for name in order:
        run, method = runs[name], methods[name]
        reference = None if name == "greedy" else greedy.outputs
        for key, value in task.decode_eval_metrics(run.outputs, batches, reference).items():
            metrics[f"{name}/{key}"] = value
        metrics[f"{name}/mean_accepted_block_size"] = run.mean_accepted_block_size
        metrics[f"{name}/model_calls"] = float(run.model_calls)
        metrics[f"{name}/seconds"] = run.seconds
        metrics[f"{name}/tokens_per_second"] = run.tokens / max(run.seconds, 1e-9)
        metrics[f"{name}/speedup"] = runs[method.baseline].seconds / max(run.seconds, 1e-9)
        if method.is_baseline:
            continue
        if method.is_sampling:
            metrics[f"{name}/acceptance_rate"] = acceptance_rate(run.blocks, method.block_size(task.model))
        else:
            same = sum(a == b for a, b in zip(run.outputs, greedy.outputs))
            metrics[f"{name}/matches_greedy"] = same / max(1, len(greedy.outputs))
    for i, (agree, scored) in enumerate(zip(greedy.agree, greedy.scored), start=1):
        metrics[f"greedy/head{i}_agreement"] = agree / max(scored, 1.0)
    metrics["examples"] = float(len(greedy.outputs))
    return metrics, runs


def run_decode_eval(
    task: DecodeEvalTask, batches: list[EvalBatch], criteria: list[str], k: int | None = None,
    model: Any = None) -> tuple[dict[str, float], dict[str, MethodRun]]:
    """Decode every batch with each method and its baseline (alternating per batch); return the metrics
    ``{"greedy/bleu": ..., "exact/mean_accepted_block_size": ...}`` and the raw runs.

    ``criteria`` are method specs (:mod:`lightning_bpd.decoding.methods`): deterministic rules run
    against ``greedy``, ``sample_t..`` rules against cached ancestral sampling at the same settings
    (``ancestral_t.._p..``), which is added and logged as well. Sampling methods also log their
    ``acceptance_rate``: the share of proposed tokens 2..k accepted (:func:`acceptance_rate`).
    ``model``: what decodes (default the task's model; or a runtime of it).
    """
    return summarize(task, batches, criteria, [decode_shard(task, batches, criteria, k, model=model)], k)


def format_summary(metrics: dict[str, float], methods: list[str], quality_key: str) -> str:
    """A small text table of the decode metrics, one line per method, with a line saying how to read
    it and, for a model with heads, each head's agreement with greedy's output."""
    lines = [(f"(greedy = the baseline; block = tokens accepted per model call; speedup = wall-clock time "
              f"of the method's baseline / its own; {quality_key} on the decoded examples)"),
             f"{'method':18s} {quality_key:>8s} {'block':>6s} {'calls':>7s} {'seconds':>8s} {'speedup':>7s}"]
    for m in methods:
        lines.append(
            f"{m:18s} {metrics.get(f'{m}/{quality_key}', float('nan')):8.2f} "
            f"{metrics[f'{m}/mean_accepted_block_size']:6.2f} {metrics[f'{m}/model_calls']:7.0f} "
            f"{metrics[f'{m}/seconds']:8.2f} {metrics[f'{m}/speedup']:7.2f}"
        )
    rows = [key.removesuffix(f"/{quality_key}") for key in metrics if key.endswith(f"/{quality_key}")]
    for name in [r for r in rows if r not in methods and f"{r}/mean_accepted_block_size" not in metrics]:
        lines.append(f"{name + ' (no model)':18s} {metrics[f'{name}/{quality_key}']:8.2f} {'-':>6s} {'-':>7s} "
                     f"{'-':>8s} {'-':>7s}")
    diagnostics = {key: value for key, value in metrics.items() if key.startswith("cond/")}
    if diagnostics:
        lines.append("conditioning (teacher-forced nats per token; gap = loss without the true input - with it): "
                     + " ".join(f"{key.removeprefix('cond/')}={value:.3f}" for key, value in diagnostics.items()))
    agreement = [metrics[key] for i in range(1, 65) if (key := f"greedy/head{i}_agreement") in metrics]
    if agreement:
        lines.append("head agreement with greedy's output (teacher-forced): "
                     + " ".join(f"h{i}={a:.2f}" for i, a in enumerate(agreement, start=1)))
    return "\n".join(lines)


def gather_shards(shard: Shard, world_size: int) -> list[Shard]:
    """Every rank's shard, on every rank (``torch.distributed.all_gather_object``; gloo or NCCL)."""
    if world_size == 1 or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return [shard]
    shards: list[Any] = [None] * world_size
    torch.distributed.all_gather_object(shards, shard)
    return shards


def wandb_dirs(trainer: pl.Trainer) -> list[str]:
    """Folders of the trainer's W&B runs (offline: ``wandb sync`` uploads them later)."""
    dirs = []
    for lg in trainer.loggers:
        if isinstance(lg, WandbLogger) and lg._experiment is not None and getattr(lg.experiment, "dir", None):
            dirs.append(str(Path(lg.experiment.dir).parent))
    return dirs


class DecodeEval(pl.Callback):
    """Greedy vs blockwise decoding at the end of validation (a fixed subset while fitting, the
    whole split under ``validate``) and of testing.

    Under DDP every rank decodes every ``world_size``-th batch of the same list, and rank 0 gathers
    them: every example counts exactly once (no sampler padding), and only rank 0 logs, saves and
    shows samples.

    Args:
        criteria: acceptance rules, e.g. ``[exact, top2, top3]``, ``[exact, eps0, eps1, eps2]`` or
            ``[exact, sample_t1, sample_t0.7]`` (speculative sampling, timed against ancestral sampling
            and logged with its acceptance rate).
        subset: number of validation examples decoded while fitting (the first ones, fixed).
        batch_size: decoding batch size (1 is the paper's latency setting).
        every_n_epochs: run while fitting every this many validation epochs.
        num_samples: rows of the logged sample table.
        quality_key: the task metric shown in the console summary.
        precision: decode a runtime of the model (:func:`~lightning_bpd.inference.build_runtime`, a snapshot
            built at each evaluation) in ``float32``, ``bfloat16``, ``float64``, ``float32-invariant`` or ``int8``
            (None: as it trains); the model itself is not touched.
        screened_argmax: greedy decoding and exact verification take p_1's argmax through the int8 screen
            (:mod:`lightning_bpd.inference.screened_argmax`; CPU, float32, translation models).
        tree_nodes: tree budgets: each also decodes exact with Medusa's greedy tree of that many nodes
            (:meth:`~lightning_bpd.decoding.trees.tree.Tree.from_budget`; 0 = the single path), logged as the method
            ``exact+nodes<N>``; ``auto`` (``auto:M``) picks the budget up to 64 (M) of most expected tokens per
            unit of pass cost timed on the first batch (:func:`~lightning_bpd.decoding.trees.budget.auto_tree`), logged as
            ``exact+nodes-auto`` with its choice (``exact+nodes-auto/nodes``, ``/predicted_speedup``). Every
            evaluation of a model with heads measures their top-r agreement table on its greedy outputs
            (:mod:`lightning_bpd.decoding.trees.budget`). While fitting (and in ``validate``) the trees are built from it and
            the module keeps it as ``rank_agreement`` (its checkpoints store it, for ``decode --tree-nodes``);
            ``test`` builds them from the table the checkpoint stores (measured on validation), else from one
            measured on the first ``subset`` validation examples, so that the tree is never tuned on the test set
            (the JSON's ``tree_table`` says which).
    """

    def __init__(
        self,
        criteria: list[str] | None = None,
        subset: int = 64,
        batch_size: int = 1,
        every_n_epochs: int = 1,
        num_samples: int = 8,
        quality_key: str = "bleu",
        precision: str | None = None,
        screened_argmax: bool = False,
        tree_nodes: list[int | str] | None = None,
    ) -> None:
        super().__init__()
        self.tree_nodes: list[TreeNodes] = list(tree_nodes or [])
        if not all(valid_budget(n) for n in self.tree_nodes):
            raise ValueError(f"DecodeEval: tree_nodes must be integers >= 0 (0 = the single path), auto or auto:M "
                             f"(M >= 1), got {tree_nodes}")
        self.tree_table = ""  # where the last evaluation's trees came from (save_json)
        self.tree_choices: dict[str, Any] = {}  # auto budgets: what the last evaluation chose
        self.screened_argmax = screened_argmax
        self.precision = precision
        # an unknown precision fails here, not after a training epoch
        self.options = InferenceOptions(precision=precision, screened_argmax=screened_argmax)
        if subset < 1 or batch_size < 1 or every_n_epochs < 1 or num_samples < 0:
            raise ValueError("DecodeEval: subset, batch_size and every_n_epochs must be >= 1, num_samples >= 0")
        self.criteria = list(criteria) if criteria is not None else ["exact", "top2", "top3"]
        self.subset, self.batch_size, self.every_n_epochs = subset, batch_size, every_n_epochs
        self.num_samples, self.quality_key = num_samples, quality_key
        self.last_metrics: dict[str, float] = {}
        self.validations = 0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Refuse a screened argmax the model cannot take, int8 decoding off the CPU, or tree budgets the heads
        cannot hold, now, not at the first validation after training."""
        k = pl_module.model.k
        fixed = [n for n in self.tree_nodes if isinstance(n, int)]
        if self.tree_nodes and (k < 2 or max(fixed, default=0) > budget_limit(k - 1, RANKS)):
            limit = budget_limit(k - 1, RANKS) if k > 1 else 0
            raise ValueError(f"decode_eval.tree_nodes must lie in [0, {limit}] for a model with k={k} heads, got "
                             f"{self.tree_nodes}")
        if self.tree_nodes and pl_module.model.decode_tree is None:
            raise ValueError("decode_eval.tree_nodes: this model verifies single paths only (a local attention window "
                             "or heads that read their own pixel neighbours): leave tree_nodes out")
        if self.screened_argmax or self.options.int8:  # a runtime refuses what the model cannot take
            device = getattr(getattr(trainer, "strategy", None), "root_device", None)
            if self.options.int8 and device is not None and device.type != "cpu":
                raise ValueError(f"decode_eval.precision int8 runs on the CPU (fbgemm's int8 products); this run "
                                 f"trains on {device}: pick bfloat16 or float32 for its validation decodes")
            build_runtime(pl_module.model, self.options)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        fitting = trainer.state.fn == "fit"
        self.validations += 1
        if fitting and (self.validations - 1) % self.every_n_epochs:
            return
        self.evaluate(trainer, pl_module, "val", self.subset if fitting else None)

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.evaluate(trainer, pl_module, "test", None)

    def evaluate(self, trainer: pl.Trainer, pl_module: Any, stage: str, limit: int | None) -> None:
        """Decode (each rank its share of the batches), gather on rank 0, log and save there."""
        _, methods = build_methods(pl_module, self.criteria)  # fail on a bad method before spending time decoding
        block = proposed_block(pl_module, methods)
        batches = pl_module.decode_eval_batches(stage, limit, self.batch_size)
        world, rank = trainer.world_size, trainer.global_rank
        runtime = build_runtime(pl_module.model, self.options)
        shard = decode_shard(pl_module, batches, self.criteria, rank=rank, world_size=world, model=runtime)
        shards = gather_shards(shard, world)
        table = rank_agreement(shards)  # every rank: the same table
        if stage == "test" and self.tree_nodes and table is not None:
            table = self.validation_table(pl_module, runtime)
        else:
            self.tree_table = f"measured on this {stage} decode"
            if table is not None:
                pl_module.rank_agreement = table  # the checkpoints store it (decode --tree-nodes)
        trees = self.tree_methods(pl_module, runtime, table, batches, trainer.strategy.broadcast)
        if trees:
            shards = gather_shards(decode_trees(batches, trees, shard, rank, world, runtime), world)
        folder = Path(trainer.log_dir or trainer.default_root_dir)  # a collective under DDP: every rank asks
        if not trainer.is_global_zero:
            return
        metrics, runs = summarize(pl_module, batches, self.criteria, shards, extra=trees)
        for name, choice in self.tree_choices.items():
            metrics[f"{name}/nodes"] = float(choice.nodes)
            metrics[f"{name}/predicted_speedup"] = choice.speedup
        if hasattr(pl_module, "decode_eval_extras"):  # rank 0 only: plain forward passes, no collectives
            metrics.update(pl_module.decode_eval_extras(batches))
        self.last_metrics = metrics
        for key, value in metrics.items():
            pl_module.log(f"{stage}/{key}", value, rank_zero_only=True)
        signature = getattr(pl_module, "quality_signature", None)
        print(f"\n[{stage} decode, {int(metrics['examples'])} examples, k={block}, {world} process(es)]")
        print(format_summary(metrics, list(runs), self.quality_key), flush=True)
        print(f"run folder: {folder}" + "".join(f"; W&B run: {run_dir}" for run_dir in wandb_dirs(trainer)), flush=True)
        if signature:
            print(f"{self.quality_key} signature: {signature}", flush=True)
            for lg in trainer.loggers:
                lg.log_hyperparams({f"{self.quality_key}_signature": signature})
        self.save_json(folder, trainer, pl_module, stage, metrics, signature, block)
        self.log_samples(trainer, pl_module, stage, runs, batches)
        if self.num_samples and hasattr(pl_module, "save_samples"):  # e.g. an image grid beside the JSON
            suffix = f"_step{trainer.global_step}" if trainer.state.fn == "fit" else ""
            pl_module.save_samples(folder / f"samples_{stage}{suffix}.png",
                                   {name: run.outputs for name, run in runs.items()}, batches, self.num_samples)

    def validation_table(self, pl_module: Any, runtime: Any) -> Tensor:
        """The table ``test``'s trees are built from: the checkpoint's (measured on validation while fitting), else
        measured now on the first ``subset`` validation examples (every rank the same), never on the test set."""
        if pl_module.rank_agreement is not None:
            self.tree_table = "stored with the checkpoint (measured on validation)"
            return pl_module.rank_agreement
        batches = pl_module.decode_eval_batches("val", self.subset, self.batch_size)
        self.tree_table = (f"measured on the first {sum(b.src.shape[0] for b in batches)} validation examples "
                           "(the checkpoint stores none)")
        pl_module.rank_agreement = measure_rank_agreement(runtime, batches)
        return pl_module.rank_agreement

    def tree_methods(self, pl_module: Any, runtime: Any, table: Tensor | None, batches: list[EvalBatch],
                     broadcast: Callable[[Any], Any] = lambda x: x) -> dict[str, DecodeMethod]:
        """Exact decoding with each budget's tree (built from ``table``), named ``exact+nodes<N>``; an ``auto``
        budget (``exact+nodes-auto``) is chosen by timing trees on the first batch, rank 0's choice ``broadcast`` to
        every rank (the strategy's broadcast under DDP)."""
        self.tree_choices = {}
        if not self.tree_nodes or table is None:
            return {}
        k = pl_module.model.k
        methods: dict[str, DecodeMethod] = {}
        for n in self.tree_nodes:
            if isinstance(n, str):
                name = f"exact+nodes-{n}"
                _, choice = auto_tree(runtime, table, k, batches[0].src, n)
                nodes = broadcast(choice.nodes)  # rank 0 decides, every rank decodes the same tree
                if nodes != choice.nodes:  # (only rank 0 records its choice)
                    choice = replace(choice, nodes=nodes)
                self.tree_choices[name] = choice
                tree = budget_tree(choice.nodes, table, k, "decode_eval.tree_nodes")
                logger.info("decode_eval.tree_nodes %s: %s", n, choice.summary())
            else:
                name, tree = f"exact+nodes{n}", budget_tree(n, table, k, "decode_eval.tree_nodes")
            methods[name] = make_method("exact", pl_module.make_criterion, runtime, None, tree=tree)
        return methods

    def save_json(self, folder: Path, trainer: pl.Trainer, pl_module: Any, stage: str, metrics: dict[str, float],
                  signature: str | None, k: int | None = None) -> None:
        """Write the metrics to ``<run dir>/decode_<stage>[_step<N>].json`` (rank 0); ``k``: the block the methods
        proposed (:func:`proposed_block`; default the model's k)."""
        folder.mkdir(parents=True, exist_ok=True)
        suffix = f"_step{trainer.global_step}" if trainer.state.fn == "fit" else ""
        record = {"stage": stage, "fn": str(trainer.state.fn), "global_step": trainer.global_step,
                  "ckpt_path": str(trainer.ckpt_path) if trainer.ckpt_path else None,
                  "k": pl_module.model.k if k is None else k, "criteria": self.criteria, "batch_size": self.batch_size,
                  "signature": signature, "metrics": metrics,
                  "precision": self.options.precision_of(pl_module.model),
                  "screened_argmax": self.screened_argmax, "tree_nodes": self.tree_nodes}
        if self.tree_nodes:
            record["tree_table"] = self.tree_table
            record["tree_choices"] = {name: choice.as_record() for name, choice in self.tree_choices.items()}
        (folder / f"decode_{stage}{suffix}.json").write_text(json.dumps(record, indent=2))

    def log_samples(self, trainer: pl.Trainer, pl_module: Any, stage: str, runs: dict[str, MethodRun],
                    batches: list[EvalBatch]) -> None:
        """The sample table, to W&B loggers only (nothing is built, and W&B is not imported, without one)."""
        wandb_loggers = [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]
        if self.num_samples == 0 or not wandb_loggers:
            return
        import numpy as np
        import wandb

        outputs = {name: run.outputs for name, run in runs.items()}
        blocks = {name: run.blocks for name, run in runs.items()}
        columns, rows = pl_module.decode_eval_samples(outputs, blocks, batches, self.num_samples)
        rows = [[wandb.Image(cell) if isinstance(cell, np.ndarray) else cell for cell in row] for row in rows]
        for lg in wandb_loggers:
            lg.log_table(key=f"{stage}/samples", columns=columns, data=rows)
