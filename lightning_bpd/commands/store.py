"""``python -m lightning_bpd store``: a frozen target's features over its training data, computed once
(:mod:`lightning_bpd.tasks.lm.feature_store`), so that drafters and heads train without running the target.

The training windows are LMDataModule's (the same folder, split, ``seq_len`` and tokenizer a fit reads); the store
holds, per window, its tokens, the target's greedy next tokens, the outputs of ``--layers`` and (unless ``--no-last``)
the last hidden state, in 16 bits. Before it starts it prints the store's size and an estimate of its time; it writes
shards of ``--shard-size`` windows and resumes at the first missing one when run again with the same options.
``--devices N`` runs it on N devices of a Lightning run (DDP: Lightning starts the same command line again for each
other rank; each rank writes its share of the missing shards and prints its own progress lines, ``rank r: shard s
written``; rank 0 prints the plan and, once every rank is done, the end). From Python (``main([...])``) keep
``--devices 1``: the launcher would start the calling script again instead.

    python -m lightning_bpd store --pretrained model.gguf --data-root ../shared/data/code/python-stdlib/Lib \\
        --suffixes .py --layers 1,14,26 --sequences 2000 --out runs/store
    python -m lightning_bpd fit --config conf/lm/dflash.yaml --model.init_args.pretrained=model.gguf \\
        --data.init_args.root=../shared/data/code/python-stdlib/Lib --model.init_args.feature_store=runs/store
"""

from __future__ import annotations

import argparse
import os
import sys

from lightning_bpd.tasks.lm.feature_store import DTYPES

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd store", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", required=True,
                   help="the frozen target: a Hugging Face causal LM folder, a .gguf file, or an own-base LM run's .ckpt")
    p.add_argument("--data-root", required=True, help="the data folder a fit reads (data.init_args.root)")
    p.add_argument("--out", required=True, help="the store folder (made if missing; resumed if it holds this store)")
    p.add_argument("--layers", default="eagle3",
                   help="the target layers stored, comma-separated (0-based decoder layers), or 'eagle3' (default: "
                        "EAGLE-3's low, middle and high layers; give DFlash the same with target_layer_ids), or "
                        "'none' (heads only)")
    p.add_argument("--no-last", action="store_true", help="leave out the last hidden state (heads and EAGLE-3 read it)")
    p.add_argument("--seq-len", type=int, default=256, help="data.init_args.seq_len of the fits (default 256)")
    p.add_argument("--suffixes", nargs="*", default=None, help="data.init_args.suffixes (e.g. .py)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="data.init_args.val_fraction (default 0.05)")
    p.add_argument("--test-fraction", type=float, default=0.05, help="data.init_args.test_fraction (default 0.05)")
    p.add_argument("--sequences", type=int, default=None,
                   help="store this many training windows, drawn at random (--seed) (default: all)")
    p.add_argument("--seed", type=int, default=0, help="of the windows drawn (default 0)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16", help="of the stored states")
    p.add_argument("--batch-size", type=int, default=4, help="windows per target forward (default 4)")
    p.add_argument("--shard-size", type=int, default=64, help="windows per shard file (default 64)")
    p.add_argument("--devices", type=int, default=1, help="devices of the Lightning run (DDP above 1)")
    p.add_argument("--accelerator", default="auto", help="cpu, gpu or auto (default)")
    return p


def parse_layers(text: str, n_layers: int) -> tuple[int, ...]:
    from lightning_bpd.drafters.registry import REGISTERED, kind

    if text == "none":
        return ()
    if text in REGISTERED:  # a drafter kind's default layers (eagle3: its low, middle and high ones)
        return tuple(kind(text).default_layers(n_layers))
    try:
        layers = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        layers = ()
    if not layers:
        raise ValueError(f"--layers {text!r}: give comma-separated layer numbers, a drafter kind's name (its default "
                         "layers: eagle3) or 'none'")
    bad = [i for i in layers if not 0 <= i < n_layers]
    if bad or len(set(layers)) != len(layers):
        raise ValueError(f"--layers {text}: give distinct decoder layers of the target in [0, {n_layers - 1}]")
    return layers


def run(args: argparse.Namespace) -> None:
    from pytorch_lightning.utilities import rank_zero_only

    from lightning_bpd.drafters.common.target import frozen_target
    from lightning_bpd.tasks.lm.datamodule import HF_PREFIX, LMDataModule
    from lightning_bpd.tasks.lm.store_writer import StorePlan, choose_windows, token_digest, write_store

    for name in ("seq_len", "batch_size", "shard_size", "devices"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not os.path.isdir(args.data_root):
        raise ValueError(f"--data-root {args.data_root}: not a folder (give the data folder the fits read)")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise ValueError(f"--out {args.out}: a file, not a folder (give a new folder, or the folder of this store)")
    pretrained, target, tokenizer = frozen_target(args.pretrained)
    layers = parse_layers(args.layers, int(target.n_layers))
    if not layers and args.no_last:
        raise ValueError("--layers none with --no-last stores nothing: keep the last hidden state or give layers")
    positions = target.n_positions
    if positions is not None and args.seq_len > positions:
        raise ValueError(f"--seq-len {args.seq_len} is longer than the target's context ({positions} positions)")
    data = LMDataModule(args.data_root, HF_PREFIX + pretrained, seq_len=args.seq_len, val_fraction=args.val_fraction,
                        test_fraction=args.test_fraction, suffixes=args.suffixes)
    data.__dict__["tokenizer"] = tokenizer  # the target's own (an own-base run's comes with its checkpoint)
    windows = data.dataset("train")
    indices = choose_windows(len(windows), args.sequences, args.seed)
    plan = StorePlan(layers=layers, last=not args.no_last, dtype=args.dtype, indices=indices, total=len(windows),
                     shard_size=args.shard_size, batch_size=args.batch_size)
    meta = {"root": os.path.abspath(args.data_root), "seq_len": args.seq_len, "suffixes": args.suffixes,
            "val_fraction": args.val_fraction, "test_fraction": args.test_fraction, "split": "train",
            "seed": args.seed, "tokens": token_digest(windows.tokens)}  # edited data: another store, not a resume
    trainer_args = {"devices": args.devices, "accelerator": args.accelerator}
    if args.devices > 1:
        trainer_args["strategy"] = "ddp"
    out = write_store(target, tokenizer, pretrained, windows, meta, plan, args.out, trainer_args)
    if rank_zero_only.rank == 0:  # under DDP every rank gets here, after all shards are written
        print(f"store: {out} complete; train with --model.init_args.feature_store={out}", flush=True)


def main(argv: list[str] | None = None) -> None:
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    args = build_parser().parse_args(argv)
    try:
        run(args)
    except (ValueError, MisconfigurationException) as err:  # Lightning's: e.g. --accelerator gpu without a GPU
        sys.exit(f"store: {str(err).strip().splitlines()[0]}")
    except OSError as err:  # an --out folder that cannot be written, a full disk
        sys.exit(f"store: {err.filename or args.out}: {err.strerror or type(err).__name__}")


if __name__ == "__main__":
    main()
