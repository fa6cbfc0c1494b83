"""``python -m lightning_bpd decode``: translate a file (or stdin) with a checkpoint.

One output line per input line; a stats line (sentences, iterations, mean accepted block size,
seconds) goes to stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from lightning_bpd.checkpoints import load_model
from lightning_bpd.decoding import parse_criterion


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) of a translation run")
    p.add_argument("--input", default="-", help="text file, one sentence per line (.gz allowed); - for stdin")
    p.add_argument("--output", default="-", help="where to write the translations; - for stdout")
    p.add_argument("--criterion", default="exact",
                   help="greedy, exact, topN (top2), epsX, minL or minL_<rule> (default: exact)")
    p.add_argument("--k", type=int, default=None, help="heads to use (default: all of the model's)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return p


def read_input(path: str) -> list[str]:
    if path == "-":
        return [line.rstrip("\n") for line in sys.stdin]
    from lightning_bpd.tasks.translation.text_files import read_lines

    return read_lines(path)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        sys.exit("decode: --batch-size must be >= 1")
    try:
        criterion = None if args.criterion == "greedy" else parse_criterion(args.criterion)
        module = load_model(args.ckpt, args.device)
        if not hasattr(module, "tokenizer"):
            raise ValueError(f"{args.ckpt} is not a translation checkpoint")
        if criterion is not None:
            from lightning_bpd.decoding.blockwise import resolve_k

            criterion.validate(resolve_k(module.model, args.k))
        sentences = read_input(args.input)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"decode: {err}")
    from lightning_bpd.tasks.translation.module import translate

    start = time.perf_counter()
    texts, stats = translate(module, sentences, criterion, k=args.k, batch_size=args.batch_size)
    seconds = time.perf_counter() - start
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    try:
        for line in texts:
            out.write(line + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    print(
        f"sentences={stats['sentences']} iterations={stats['iterations']} tokens={stats['tokens']} "
        f"mean_accepted_block_size={stats['mean_accepted_block_size']:.3f} seconds={seconds:.2f}",
        file=sys.stderr,
    )
