"""Frozen-head training steps per minute, with and without the cached base states.

    python -m lightning_bpd.benchmarks.frozen_steps --ckpt runs/m30k-base/last.ckpt \\
        --data-root ../shared/data/translation/multi30k --k 8 --head-type chained --batches 20 --json out.json
    python -m lightning_bpd.benchmarks.frozen_steps --pretrained <HF checkpoint dir> \\
        --data-root ../shared/data/translation/multi30k --k 8 --head-type chained_attn --json out.json

Stage 2 with a frozen base trains only the head, so the base's decoder states of an example never
change (:class:`~lightning_bpd.tasks.frozen_states.FrozenStates`). This times full training steps
(forward, loss, backward, optimizer) on the same training batches of the frozen-base module, once
recomputing the base every step (``frozen_cache_gb: 0``, what a run does without the cache and what
the first epoch of a cached run does) and once reading the states from the cache (every later
epoch), and, for scale, of the fine-tuning module (every weight trained) and of the base's own training
step (k = 1: the base alone, its loss at every position), alternating the variants over ``--repeats``
rounds; it reports the median seconds per step and steps per minute of each. ``--loss-mode random``
trains one random head per step (the paper's sub-loss) instead of every head (``mean``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

import torch

from lightning_bpd.nn.config import HEAD_TYPES
from lightning_bpd.records import write_json
from lightning_bpd.tasks.training_options import TrainingOptions
from lightning_bpd.tasks.translation import TranslationConfig, TranslationDataModule, TranslationModule


def build_module(ckpt: str, vocab: int, args: argparse.Namespace, cache_gb: float,
                 frozen: bool = True, base_only: bool = False) -> TranslationModule:
    """The stage-2 module of the ``multi30k_k8_frozen`` recipe (or, not ``frozen``, of the fine-tuned
    one: every weight trained; ``base_only``: the base alone, k = 1, its loss at every position, as its own
    training step), warm-started from ``ckpt``."""
    base = TranslationModule.init_args_of_checkpoint(torch.load(ckpt, map_location="cpu", weights_only=False)
                                                     ["hyper_parameters"])["architecture"]
    shape = {key: getattr(base, key) for key in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff")}
    architecture = TranslationConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, **shape, k=1 if base_only else args.k,
                                     head_type=args.head_type, head_hidden=args.head_hidden, identity_first=True)
    training = TrainingOptions(loss_mode=args.loss_mode, freeze_base=frozen, init_from=ckpt,
                               loss_fraction=1.0 if base_only else args.loss_fraction,
                               frozen_cache_gb=cache_gb if frozen else 0.0)
    module = TranslationModule(architecture, training)
    module.warm_start(ckpt)
    return module.train()


def build_hf_module(pretrained: str, args: argparse.Namespace, cache_gb: float, frozen: bool = True,
                    base_only: bool = False):
    """The same variants on a Hugging Face base (:class:`~lightning_bpd.tasks.translation.hf_module.
    HFTranslationModule`): heads on the frozen base, the base fine-tuned with them, or the base alone."""
    from lightning_bpd.tasks.translation.hf_module import TRAINING, HFTranslationModule

    torch.manual_seed(0)  # the same heads in every variant
    training = replace(TRAINING, freeze_base=frozen, loss_mode=args.loss_mode,
                       loss_fraction=1.0 if base_only else args.loss_fraction, frozen_cache_gb=cache_gb if frozen else 0.0)
    module = HFTranslationModule(pretrained=pretrained, k=1 if base_only else args.k, head_type=args.head_type,
                                 head_hidden=args.head_hidden, training=training)
    return module.train()


def seconds_per_step(module: TranslationModule, batches: list[dict], optimizer: torch.optim.Optimizer) -> float:
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        optimizer.zero_grad()
        loss = module.training_step(batch, i)
        loss.backward()
        optimizer.step()
    return (time.perf_counter() - start) / len(batches)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.frozen_steps", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    base = p.add_mutually_exclusive_group(required=True)
    base.add_argument("--ckpt", help="a stage-1 (base) translation checkpoint of ours")
    base.add_argument("--pretrained", help="or a Hugging Face seq2seq checkpoint directory (with its tokenizer)")
    p.add_argument("--data-root", required=True, help="the training corpus")
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--head-type", default="paper", choices=list(HEAD_TYPES))
    p.add_argument("--head-hidden", type=int, default=256)
    p.add_argument("--loss-fraction", type=float, default=0.25)
    p.add_argument("--loss-mode", default="mean", choices=["mean", "random"],
                   help="the heads' loss: every head's each step (mean), or one random head's (the paper's)")
    p.add_argument("--max-tokens", type=int, default=2000)
    p.add_argument("--batches", type=int, default=20, help="training batches timed per round")
    p.add_argument("--repeats", type=int, default=3, help="rounds, alternating the two variants")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    try:
        torch.manual_seed(0)
        tokenizer = f"hf:{args.pretrained}" if args.pretrained else args.ckpt
        data = TranslationDataModule(root=args.data_root, tokenizer_path=tokenizer, max_tokens=args.max_tokens)
        data.setup("fit")
        loader = iter(data.train_dataloader())
        batches = [next(loader) for _ in range(args.batches)]
        if args.pretrained:
            variants = {"base": build_hf_module(args.pretrained, args, 0.0, frozen=False, base_only=True),
                        "fine-tuned": build_hf_module(args.pretrained, args, 0.0, frozen=False),
                        "recomputed": build_hf_module(args.pretrained, args, 0.0),
                        "cached": build_hf_module(args.pretrained, args, 4.0)}
        else:
            variants = {"base": build_module(args.ckpt, data.vocab_size, args, 0.0, frozen=False, base_only=True),
                        "fine-tuned": build_module(args.ckpt, data.vocab_size, args, 0.0, frozen=False),
                        "recomputed": build_module(args.ckpt, data.vocab_size, args, 0.0),
                        "cached": build_module(args.ckpt, data.vocab_size, args, 4.0)}
    except (ValueError, FileNotFoundError) as err:  # a missing folder or checkpoint, a foreign one: one line
        raise SystemExit(f"frozen_steps: {err}") from None
    optimizers = {name: torch.optim.AdamW([q for q in m.parameters() if q.requires_grad], lr=1e-4)
                  for name, m in variants.items()}
    with torch.no_grad():  # fill the cache: what the first epoch does
        for batch in batches:
            variants["cached"].blockwise_step(batch["src"], batch["tgt"], [0], index=batch["index"])
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, module in variants.items():
            times[name].append(seconds_per_step(module, batches, optimizers[name]))
    result = {"ckpt": args.ckpt, "pretrained": args.pretrained, "data_root": args.data_root, "k": args.k, "head_type": args.head_type,
              "loss_fraction": args.loss_fraction, "loss_mode": args.loss_mode, "max_tokens": args.max_tokens,
              "threads": torch.get_num_threads(),
              "batches": args.batches, "repeats": args.repeats}
    for name, values in times.items():
        sec = statistics.median(values)
        result[name] = {"seconds_per_step": sec, "steps_per_minute": 60.0 / sec}
        print(f"{name:10s} {sec:7.3f} s/step  {60.0 / sec:7.1f} head steps per minute", flush=True)
    result["speedup"] = result["recomputed"]["seconds_per_step"] / result["cached"]["seconds_per_step"]
    result["cached_vs_fine_tuned"] = result["cached"]["seconds_per_step"] / result["fine-tuned"]["seconds_per_step"]
    result["cached_vs_base"] = result["cached"]["seconds_per_step"] / result["base"]["seconds_per_step"]
    print(f"cached / recomputed: {result['speedup']:.2f}x the steps per minute; a cached frozen step costs "
          f"{result['cached_vs_fine_tuned']:.2f} of a fine-tuning step and {result['cached_vs_base']:.2f} of the base's own step")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
