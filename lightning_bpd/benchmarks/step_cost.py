"""Cost of one blockwise iteration against one cached greedy step (issue: core decoding).

    python -m lightning_bpd.benchmarks.step_cost [--k 8] [--batch 1] [--json out.json]

Builds a small untrained model (d_model 256, 3+3 layers, ff 1024, vocab 8k), decodes a fixed
number of tokens with EOS disabled, and reports seconds per greedy step and per blockwise
iteration (median over repeats, methods alternated). An untrained model accepts few proposals,
(the heads are randomized so nearly every iteration accepts one token), which does not change
what one iteration costs: one decoder call on k tokens, p_1 at k-1
positions, all k heads at one position per row, and the bookkeeping.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.records import write_json


def build(k: int, vocab: int, identity_first: bool, head_hidden: int | None = None) -> BlockwiseTransformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab, vocab, d_model=256, n_heads=4, n_encoder_layers=3, n_decoder_layers=3, d_ff=1024,
                      dropout=0.0, k=k, identity_first=identity_first, head_hidden=head_hidden)
    model = BlockwiseTransformer(cfg).eval()
    model.eos_id = None  # decode exactly max_len tokens
    model.use_lean_steps(True)  # the lean steps, as a runtime's snapshot runs them
    if k > 1:  # untrained heads that disagree with p_1: one accepted token per iteration, as in the worst case
        torch.nn.init.normal_(model.head.out.weight, std=1.0)
    return model


def per_unit_seconds(fn, units: int, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) / units)
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--tokens", type=int, default=64, help="tokens decoded per run")
    p.add_argument("--head-hidden", type=int, default=None, help="d_hidden of the head (default: d_ff = 1024)")
    p.add_argument("--src-len", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--json", default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    src = torch.randint(4, args.vocab, (args.batch, args.src_len))
    base = build(1, args.vocab, identity_first=False)
    block = {flag: build(args.k, args.vocab, flag, args.head_hidden) for flag in (True, False)}
    runs = {
        "greedy_base_step": (lambda: greedy_decode(base, src, args.tokens), args.tokens),
        "greedy_blockwise_model_step": (lambda: greedy_decode(block[False], src, args.tokens), args.tokens),
    }
    for flag, model in block.items():
        n = int(blockwise_decode(model, src, Exact(), args.tokens).iterations.max())
        runs[f"bpd_iteration_identity_first={flag}"] = (lambda m=model: blockwise_decode(m, src, Exact(), args.tokens), n)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for fn, _ in runs.values():
        fn()  # warm up
    for _ in range(args.repeats):  # alternate the methods
        for name, (fn, units) in runs.items():
            times[name] += per_unit_seconds(fn, units, 1)
    med = {name: statistics.median(ts) for name, ts in times.items()}
    result = {"k": args.k, "batch": args.batch, "vocab": args.vocab, "threads": torch.get_num_threads(),
              "head_hidden": args.head_hidden or 1024, "seconds": med,
              "units_per_run": {name: units for name, (_, units) in runs.items()}}
    base_step = med["greedy_base_step"]
    for name, sec in med.items():
        print(f"{name:40s} {sec * 1e3:8.3f} ms   {sec / base_step:5.2f}x greedy base step")
    result["ratio_vs_greedy_base_step"] = {name: sec / base_step for name, sec in med.items()}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
