"""Writing a target-feature store (:mod:`~lightning_bpd.tasks.lm.feature_store`): the frozen target over the chosen
training windows, once, shard by shard.

The target runs as training runs it (:meth:`full_features`, its own forward in its own precision), so a stored value
is the training-time value rounded to 16 bits, and a label is the target's own greedy choice from its float logits.
Under a Lightning run of several devices (``devices``, DDP) each rank writes the shards the distributed sampler hands
it; every shard is written to a temporary file and renamed, so a stopped run resumes at the shards still missing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_only
from torch import Tensor
from torch.utils.data import DataLoader

from lightning_bpd.nn.argmax import argmax
from lightning_bpd.tasks.lm.feature_store import (
    DTYPES,
    FORMAT,
    META,
    shard_name,
    target_fingerprint,
    tokenizer_fingerprint,
)


def hidden_size(model: Any) -> int:
    """The width of the target's hidden states: a Hugging Face causal LM's ``hidden_size``, our own base's
    ``d_model``."""
    base = getattr(model, "base", None)
    return int(base.config.hidden_size if base is not None else model.config.d_model)


@dataclass(frozen=True)
class StorePlan:
    """What a store holds: the target's ``layers`` (and its last hidden state when ``last``) in ``dtype`` for the
    training windows ``indices`` (of ``total``), ``shard_size`` windows a shard, computed ``batch_size`` at a time."""

    layers: tuple[int, ...]
    last: bool
    dtype: str
    indices: tuple[int, ...]
    total: int
    shard_size: int
    batch_size: int

    @property
    def n_shards(self) -> int:
        return max(1, math.ceil(len(self.indices) / self.shard_size))

    def shard_indices(self, s: int) -> tuple[int, ...]:
        return self.indices[s * self.shard_size : (s + 1) * self.shard_size]

    def bytes_per_token(self, hidden: int) -> int:
        """Stored bytes per token: 2 per value of each layer and the last state, 4 each for the token and label."""
        return 2 * hidden * (len(self.layers) + int(self.last)) + 8


def choose_windows(total: int, limit: int | None, seed: int) -> tuple[int, ...]:
    """``limit`` of ``total`` training windows (all when None), drawn without replacement by ``seed`` and sorted (a
    store of a part of the data is a sample of all of it, read in file order)."""
    if limit is None or limit >= total:
        return tuple(range(total))
    if limit < 1:
        raise ValueError(f"--sequences must be >= 1, got {limit}")
    order = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:limit]
    return tuple(sorted(order.tolist()))


@torch.no_grad()
def target_rows(model: Any, src: Tensor, layers: Sequence[int], last: bool, dtype: torch.dtype
                ) -> dict[str, Tensor]:
    """The target over windows ``src`` (b, T): labels (b, T) int32 (argmax of its float logits), features
    (b, T, A, H) and the last hidden states (b, T, H) in ``dtype``."""
    read = tuple(layers) or (int(model.n_layers) - 1,)  # the forward needs one layer to return
    hidden, features = model.full_features(src, read)  # (b, T, H), (b, T, A*H)
    labels = torch.stack([argmax(model.logits_first(h)) for h in hidden]).to(torch.int32)  # row by row: (b, T)
    out = {"labels": labels}
    if layers:
        out["features"] = features.view(*src.shape, len(layers), -1).to(dtype)
    if last:
        out["last"] = hidden.to(dtype)
    return out


def compute_shard(model: Any, windows: Tensor, plan: StorePlan) -> dict[str, Tensor]:
    """One shard: ``windows`` (n, T) through the target ``plan.batch_size`` at a time."""
    device = next(iter(model.parameters())).device
    parts: list[dict[str, Tensor]] = []
    for start in range(0, windows.shape[0], plan.batch_size):
        src = windows[start : start + plan.batch_size].to(device)
        parts.append({k: v.cpu() for k, v in target_rows(model, src, plan.layers, plan.last, DTYPES[plan.dtype]).items()})
    out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out["tokens"] = windows.to(torch.int32)
    return out


def write_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def store_meta(plan: StorePlan, model: Any, tokenizer: Any, pretrained: str, data: dict[str, Any]) -> dict[str, Any]:
    hidden = hidden_size(model)
    return {"format": FORMAT,
            "target": {"path": pretrained, "fingerprint": target_fingerprint(model), "n_layers": int(model.n_layers),
                       "vocab_size": int(model.vocab_size), "hidden_size": hidden},
            "tokenizer": {"fingerprint": tokenizer_fingerprint(tokenizer), "size": len(tokenizer)},
            "data": data, "layers": list(plan.layers), "last_hidden": plan.last, "dtype": plan.dtype,
            "shard_size": plan.shard_size, "n_shards": plan.n_shards, "indices": list(plan.indices),
            "total_windows": plan.total}


def token_digest(tokens: Tensor) -> str:
    """16 hex digits of SHA-256 over a token stream (a PackedDataset's ``tokens``): the data a store was made of."""
    return hashlib.sha256(tokens.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()[:16]


def prepare_folder(out: Path, meta: dict[str, Any], write: bool = True) -> list[int]:
    """Write ``meta`` into ``out`` (or find the same there) -> the shards still missing; ValueError where ``out`` holds
    another store (another target, data, layers or plan), something that is no store, or other files. ``write=False``
    checks only: no folder made, nothing written."""
    if not write and not out.is_dir():
        return list(range(meta["n_shards"]))  # a new store (a file or a path under one fails when it is written)
    out.mkdir(parents=True, exist_ok=True)
    path = out / META
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a readable feature store ({type(err).__name__}): give a new --out") from None
        if not isinstance(old, dict) or old.get("format") != FORMAT:
            found = old.get("format") if isinstance(old, dict) else type(old).__name__
            raise ValueError(f"{out} holds a {META} that is no feature store of this version ({found!r}, want "
                             f"{FORMAT!r}): give a new --out")
        same = {"target": {**old.get("target", {}), "path": meta["target"]["path"]}}  # the same target by another path
        data = old.get("data")
        if isinstance(data, dict) and "tokens" not in data:  # a store of before the data digest: resumed unchecked
            same["data"] = {**data, "tokens": meta["data"].get("tokens")}
        differ = sorted(k for k in set(old) | set(meta) if {**old, **same}.get(k) != meta.get(k))
        if differ:
            raise ValueError(f"{out} holds another store (differing: {', '.join(differ)}): give a new --out, or delete "
                             "it to start again")
    else:
        others = sorted(p.name for p in out.iterdir() if not p.name.startswith(f".{META}."))
        if others:  # a store folder starts with its store.json: this is something else (a run, the data, ...)
            raise ValueError(f"{out} holds other files ({', '.join(others[:3])}{', ...' if len(others) > 3 else ''}) "
                             "and no store: give a new or empty --out")
        if write:
            tmp = out / f".{META}.{os.getpid()}.tmp"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, path)
    return [s for s in range(meta["n_shards"]) if not (out / shard_name(s)).is_file()]


class StoreWriter(pl.LightningModule):
    """The frozen target (not a registered child: nothing of it trains or is saved) writing the shards that a
    prediction loop hands it: one shard id per batch (-1: none)."""

    def __init__(self, model: Any, windows: Any, plan: StorePlan, out: Path) -> None:
        super().__init__()
        object.__setattr__(self, "target", model)
        self.windows, self.plan, self.out = windows, plan, out
        self.done = 0
        self.started = time.perf_counter()
        self.shard_ids: list[int] = []  # the loader's, in its order
        self.todo = 0  # shards of this rank (set when the loop starts)

    def on_predict_start(self) -> None:
        """Start the clock (not before: rank 0 waits here for the other ranks to start) and count this rank's
        shards (one a batch)."""
        self.started, self.done = time.perf_counter(), 0
        mine = self.shard_ids[self.global_rank :: self.trainer.world_size]  # Lightning's prediction sampler's split
        self.todo = sum(s >= 0 for s in mine)

    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> StoreWriter:
        super()._apply(fn, *args, **kwargs)
        self.target._apply(fn, *args, **kwargs)
        return self

    def predict_step(self, batch: Tensor, batch_idx: int) -> int:
        for s in batch.tolist():
            if s < 0:  # padding: every rank gets as many batches
                continue
            path = self.out / shard_name(s)
            if path.is_file():  # already there (a rank of another run of the same store)
                continue
            rows = torch.stack([self.windows[i]["src"] for i in self.plan.shard_indices(s)])  # (n, T)
            shard = compute_shard(self.target, rows, self.plan)
            shard["index"] = torch.tensor(self.plan.shard_indices(s), dtype=torch.long)
            write_atomic(shard, path)
            self.done += 1
            if not sys.stdout.isatty():
                spent = time.perf_counter() - self.started
                left = spent / self.done * max(0, self.todo - self.done)
                print(f"store: rank {self.global_rank}: shard {s} written ({self.done}/{self.todo} of this rank, "
                      f"{spent / 60:.1f} min, about {left / 60:.1f} min left)", flush=True)
        return len(batch)


def estimate(model: Any, windows: Any, plan: StorePlan, missing: list[int]) -> float:
    """Seconds of the ``missing`` shards on one process, from one timed batch."""
    n = min(plan.batch_size, len(plan.indices))
    src = torch.stack([windows[i]["src"] for i in plan.indices[:n]])
    device = next(iter(model.parameters())).device
    start = time.perf_counter()
    target_rows(model, src.to(device), plan.layers, plan.last, DTYPES[plan.dtype])
    per_window = (time.perf_counter() - start) / n
    todo = sum(len(plan.shard_indices(s)) for s in missing)
    return per_window * todo


def make_trainer(trainer_args: dict[str, Any]) -> pl.Trainer:
    """The Lightning run of ``trainer_args``; ValueError (one line, naming the option to fix) for an accelerator or
    devices this machine lacks."""
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    try:
        return pl.Trainer(**trainer_args)
    except (MisconfigurationException, ValueError, ImportError) as err:
        accelerator, devices = trainer_args.get("accelerator"), trainer_args.get("devices")
        fix = "give --accelerator cpu (or auto)" if accelerator not in ("cpu", "auto") else \
            "give --devices this machine has"
        line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"--accelerator {accelerator} --devices {devices}: {line}: {fix}") from None


def write_store(model: Any, tokenizer: Any, pretrained: str, windows: Any, data: dict[str, Any], plan: StorePlan,
                out: str | os.PathLike, trainer_args: dict[str, Any] | None = None) -> Path:
    """Compute the store of ``plan`` for the frozen ``model`` over the dataset ``windows`` into ``out`` (resuming
    what is there) through a Lightning prediction loop (``trainer_args``: devices, accelerator, strategy).

    Under DDP every rank runs this (Lightning's launcher starts the script again for each rank): each finds the same
    missing shards (none is written before all ranks have joined), writes its share, and waits for the others; only
    rank 0 prints the plan. ValueError (on every rank) where a shard is still missing at the end."""
    out = Path(out)
    trainer_args = {"accelerator": "auto", "devices": 1, "logger": False, "enable_checkpointing": False,
                    "enable_model_summary": False, "use_distributed_sampler": True, **(trainer_args or {})}
    model.eval().requires_grad_(False)
    hidden = hidden_size(model)
    meta = store_meta(plan, model, tokenizer, pretrained, data)
    # the Trainer before anything is written: an accelerator this machine lacks leaves no half-made store
    trainer = make_trainer(trainer_args) if prepare_folder(out, meta, write=False) else None
    missing = prepare_folder(out, meta)
    ranks = trainer.world_size if trainer is not None else 1
    if rank_zero_only.rank == 0:
        if trainer is not None:  # timed where the run computes (a GPU's time, not the CPU's the target loaded on)
            model.to(trainer.strategy.root_device)
        seconds = estimate(model, windows, plan, missing) / ranks if missing else 0.0
        size = len(plan.indices) * int(data["seq_len"]) * plan.bytes_per_token(hidden)
        print(f"store: {len(plan.indices)} of {plan.total} training windows x {data['seq_len']} tokens, layers "
              f"{list(plan.layers)}{' + last hidden' if plan.last else ''} in {plan.dtype}: "
              f"{plan.bytes_per_token(hidden):,} bytes a token, {size / 2**30:.2f} GiB in {plan.n_shards} shards; "
              f"{len(missing)} to compute, about {seconds / 60:.1f} min"
              f"{f' on each of {ranks} processes' if ranks > 1 else ''}", flush=True)
    if trainer is None:
        return out
    writer = StoreWriter(model, windows, plan, out)
    # padded with -1 (nothing to write) to a multiple of the ranks: Lightning's prediction sampler fails on a rank
    # with no shard (fewer missing shards than ranks) and gives the last ranks one shard fewer than the first
    padded = missing + [-1] * (-len(missing) % ranks)
    writer.shard_ids = padded
    loader = DataLoader(torch.tensor(padded, dtype=torch.long), batch_size=1)
    trainer.predict(writer, loader, return_predictions=False)
    trainer.strategy.barrier("store-written")  # every rank's shards are there before any rank checks or exits
    left = [s for s in missing if not (out / shard_name(s)).is_file()]
    if left:
        raise ValueError(f"{out}: {len(left)} of {plan.n_shards} shards still missing after the run (shard {left[0]}"
                         "): run the same store command again to complete it")
    return out


__all__ = ["StorePlan", "StoreWriter", "choose_windows", "compute_shard", "target_rows", "token_digest",
           "write_store"]
