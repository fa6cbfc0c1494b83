"""``python -m lightning_bpd datastore``: a retrieval datastore, a target's training text as its own tokenizer reads
it (:mod:`lightning_bpd.tasks.lm.datastore`), for the retrieval proposer (``--proposer retrieval:FILE``): no training,
4 bytes a token on disk. ``--greedy N`` adds the target's own greedy continuations of N prompts of the split (line-aligned
windows, as the held-out prompts are cut, spread evenly over the split), decoded in batches by our runtime (``--precision``, default float32-packed):
the text its greedy decoding will write, the self-distilled datastore.

    python -m lightning_bpd datastore --pretrained model.gguf --data-root ../shared/data/code/python-stdlib/Lib \\
        --suffixes .py --out runs/datastore.pt
    python -m lightning_bpd datastore --pretrained model.gguf --data-root ../shared/data/code/python-stdlib/Lib \
        --suffixes .py --greedy 2048 --max-new-tokens 64 --out runs/datastore-greedy.pt
    python -m lightning_bpd decode --ckpt RUN.ckpt --proposer retrieval:runs/datastore.pt < prompts.jsonl
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd datastore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pretrained", required=True,
                   help="the target whose tokenizer reads the data: a Hugging Face folder, a .gguf file, or an "
                        "own-base LM run's .ckpt")
    p.add_argument("--data-root", required=True, help="the data folder (a fit's data.init_args.root)")
    p.add_argument("--out", required=True, help="the datastore file to write")
    p.add_argument("--split", choices=("train", "val", "test"), default="train", help="the split read (default train)")
    p.add_argument("--suffixes", nargs="*", default=None, help="data.init_args.suffixes (e.g. .py)")
    p.add_argument("--val-fraction", type=float, default=0.05, help="data.init_args.val_fraction (default 0.05)")
    p.add_argument("--test-fraction", type=float, default=0.05, help="data.init_args.test_fraction (default 0.05)")
    p.add_argument("--greedy", type=int, default=0,
                   help="add the target's own greedy continuations of this many prompts of the split (default 0)")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="of each greedy prompt window (data.init_args.prompt_tokens; default 64)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="of each greedy continuation (default 64)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per greedy batch (default 16)")
    p.add_argument("--precision", default="float32-packed",
                   help="of the runtime that decodes the greedy continuations (default float32-packed)")
    p.add_argument("--device", default="cpu", help="of the greedy decoding (default cpu)")
    return p


def target_tokenizer(pretrained: str) -> tuple[str, object]:
    """The target's absolute path and its tokenizer (an own-base run's comes with its checkpoint)."""
    from lightning_bpd.hf.gguf_target import is_gguf

    path = os.path.abspath(pretrained)
    if os.path.isdir(path) or is_gguf(path):
        from lightning_bpd.hf.prompts import load_tokenizer

        return path, load_tokenizer(path)
    from lightning_bpd.drafters.common.target import frozen_target

    path, _, tokenizer = frozen_target(pretrained)
    return path, tokenizer


def run(args: argparse.Namespace) -> None:
    from lightning_bpd.tasks.lm.datamodule import HF_PREFIX, LMDataModule
    from lightning_bpd.tasks.lm.datastore import save_datastore

    if not os.path.isdir(args.data_root):
        raise ValueError(f"--data-root {args.data_root}: not a folder (give the data folder the fits read)")
    for name, least in (("greedy", 0), ("prompt_tokens", 1), ("max_new_tokens", 1), ("batch_size", 1)):
        if getattr(args, name) < least:
            raise ValueError(f"--{name.replace('_', '-')} must be >= {least}, got {getattr(args, name)}")
    if os.path.isdir(args.out):
        raise ValueError(f"--out {args.out}: a folder, not a file (give the datastore file's path)")
    if os.path.exists(args.out):
        from lightning_bpd.tasks.lm.datastore import checked_record

        try:
            checked_record(args.out)
        except ValueError:
            raise ValueError(f"--out {args.out}: an existing file that is not a datastore, which this would replace: "
                             "give a new path") from None
    start = time.perf_counter()
    pretrained, tokenizer = target_tokenizer(args.pretrained)
    data = LMDataModule(args.data_root, HF_PREFIX + pretrained, val_fraction=args.val_fraction,
                        test_fraction=args.test_fraction, suffixes=args.suffixes, prompt_tokens=args.prompt_tokens)
    data.__dict__["tokenizer"] = tokenizer
    tokens = data.stream(args.split)
    if not tokens:
        raise ValueError(f"--data-root {args.data_root}: the {args.split} split holds no text")
    meta = {"root": os.path.abspath(args.data_root), "split": args.split, "suffixes": args.suffixes,
            "val_fraction": args.val_fraction, "test_fraction": args.test_fraction, "pretrained": pretrained,
            "text_tokens": len(tokens)}
    if args.greedy:
        greedy = greedy_part(pretrained, data, args)
        meta.update(greedy=args.greedy, prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens, precision=args.precision,
                    greedy_tokens=len(greedy))
        tokens += greedy
    out = save_datastore(args.out, tokens, tokenizer, meta)
    print(f"datastore: {out}: {len(tokens):,} tokens of the {args.split} split"
          + (f" ({meta['greedy_tokens']:,} of them the target's greedy continuations)" if args.greedy else "")
          + f", {os.path.getsize(out) / 2**20:.1f} MiB, in {time.perf_counter() - start:.0f} s; decode with "
          f"--proposer retrieval:{out}", flush=True)


def greedy_part(pretrained: str, data: object, args: argparse.Namespace) -> list[int]:
    """The target's greedy continuations of ``--greedy`` prompts of the split, with a progress line per batch."""
    from lightning_bpd.inference import InferenceOptions, build_runtime
    from lightning_bpd.tasks.lm import LMModule
    from lightning_bpd.tasks.lm.datastore import greedy_tokens

    windows, _ = data.eval_prompts(args.split, None)  # type: ignore[attr-defined]
    if not windows:
        raise ValueError(f"--greedy {args.greedy}: the {args.split} split has no prompt windows")
    count = min(args.greedy, len(windows))
    prompts = [windows[i * len(windows) // count] for i in range(count)]  # spread evenly over the split's files
    # k=2: the smallest frozen-base module (its heads are not used; greedy reads p_1 only)
    module = LMModule(pretrained, k=2, max_new_tokens=args.max_new_tokens).eval().to(args.device)
    runtime = build_runtime(module.model, InferenceOptions(precision=args.precision))
    began = time.perf_counter()

    def progress(done: int, total: int) -> None:
        spent = time.perf_counter() - began
        print(f"datastore: greedy {done}/{total} prompts, {spent:.0f} s, about {spent / done * (total - done):.0f} s "
              "left", file=sys.stderr, flush=True)

    return greedy_tokens(module, runtime, prompts, args.max_new_tokens, args.batch_size, progress)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        run(args)
    except ValueError as err:
        sys.exit(f"datastore: {str(err).strip().splitlines()[0]}")
    except OSError as err:
        sys.exit(f"datastore: {err.filename or args.out}: {err.strerror or type(err).__name__}")


if __name__ == "__main__":
    main()
