"""Drafter and heads training steps per second on a frozen target, running the target every step against reading a
feature store (:mod:`~lightning_bpd.tasks.lm.feature_store`).

    OMP_NUM_THREADS=1 python -m lightning_bpd.benchmarks.store_steps --pretrained model.gguf --store runs/store \\
        --data-root ../shared/data/code/python-stdlib/Lib --suffixes .py --kind dflash --steps 4 --json out.json

Times whole training steps (the module's ``step``: the target's outputs, the drafter's forward, the loss; backward;
AdamW) on the same stored training batches, once with the target running (what a fit does without a store: its
first epoch, and on a real model every epoch, since one epoch is more than a CPU budget) and once reading the store,
alternating the two over ``--steps`` rounds after one warm-up round each; reports the median seconds per step and
steps per second of each and their ratio. ``--set KEY=VALUE`` passes a module option (``anchors=16``, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch

from lightning_bpd.drafters.registry import REGISTERED, kind_of
from lightning_bpd.records import cpu_name, write_json

HEADS = "heads"  # the heads' training module (LMModule, frozen base); every other --kind is a registered drafter kind


def build(kind: str, pretrained: str, store: str | None, options: dict[str, Any]) -> Any:
    """The training module of ``kind`` (a registered drafter kind's, or the heads') on the frozen target, reading
    ``store`` (or running the target: None)."""
    if kind != HEADS:
        from lightning_bpd.drafters.registry import kind as drafter_kind

        return drafter_kind(kind).module_class()(pretrained, feature_store=store, feature_cache_gb=0.0, **options)
    from lightning_bpd.tasks.lm import LMModule
    from lightning_bpd.tasks.training_options import TrainingOptions

    return LMModule(pretrained, feature_store=store, training=TrainingOptions(freeze_base=True, frozen_cache_gb=0.0),
                    **options)


def one_step(module: Any, batch: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer, seed: int) -> float:
    """Seconds of one training step (forward, loss, backward, AdamW) of ``module`` on ``batch``."""
    start = time.perf_counter()
    if kind_of(module) is not None:  # a drafter's step: the target's outputs (or the store's), the drafter's loss
        out = module.step(batch, torch.Generator().manual_seed(seed), 0.0)
        loss = out["loss"]
    else:
        loss = module.training_step(batch, 0)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return time.perf_counter() - start


def parse_sets(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"store_steps: --set {item!r}: give KEY=VALUE")
        out[key] = json.loads(value) if value[:1] in "[{0123456789-tfn" else value
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--data-root", required=True)
    p.add_argument("--suffixes", nargs="*", default=None)
    p.add_argument("--kind", choices=[*REGISTERED, HEADS], default="dflash")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="timed rounds (each: one step of each variant)")
    p.add_argument("--set", action="append", default=[], help="a module option KEY=VALUE (repeatable)")
    p.add_argument("--json", default=None)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    from lightning_bpd.tasks.lm.datamodule import HF_PREFIX, LMDataModule
    from lightning_bpd.tasks.lm.feature_store import FeatureStore, train_from_store

    options = parse_sets(args.set)
    stored = build(args.kind, args.pretrained, args.store, options).train()
    running = build(args.kind, args.pretrained, None, options).train()
    running.load_state_dict(stored.state_dict())  # the same trainable start
    store = FeatureStore(args.store)
    data = LMDataModule(args.data_root, HF_PREFIX + stored.hparams.pretrained, seq_len=store.seq_len,
                        batch_size=args.batch_size, suffixes=args.suffixes)
    data.__dict__["tokenizer"] = stored.tokenizer
    train_from_store(store, data)
    loader = iter(data.train_dataloader())
    variants = {"target": running, "store": stored}
    optimizers = {name: torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
                  for name, m in variants.items()}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    for round_ in range(args.steps + 1):  # round 0 warms up
        batch = next(loader)
        for name, module in variants.items():
            took = one_step(module, batch, optimizers[name], round_)
            if round_:
                seconds[name].append(took)
            print(f"store_steps: round {round_} {name}: {took:.2f} s", flush=True)
    median = {name: statistics.median(s) for name, s in seconds.items()}
    record = {"label": f"{args.kind} training steps on a frozen target: the target every step against the feature store",
              "kind": args.kind, "pretrained": args.pretrained, "store": args.store, "options": options,
              "batch_size": args.batch_size, "seq_len": store.seq_len, "threads": torch.get_num_threads(),
              "cpu": cpu_name(), "seconds_per_step": median,
              "steps_per_second": {name: 1 / s for name, s in median.items()},
              "speedup": median["target"] / median["store"], "all_seconds": seconds,
              "command": "python -m lightning_bpd.benchmarks.store_steps " + " ".join(argv)}
    print(f"store_steps: {args.kind}: target every step {median['target']:.2f} s/step "
          f"({1 / median['target']:.3f} it/s), store {median['store']:.2f} s/step ({1 / median['store']:.3f} it/s): "
          f"{record['speedup']:.1f}x", flush=True)
    if args.json:
        write_json(args.json, record)
    return record


if __name__ == "__main__":
    main()
