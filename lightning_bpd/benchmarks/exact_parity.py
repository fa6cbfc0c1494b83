"""Does exact blockwise decoding reproduce greedy token for token at a given precision?

    python -m lightning_bpd.benchmarks.exact_parity --ckpt runs/x/last.ckpt --images ../shared/data/celeba \
        --inputs 8 [--dtypes float32 bfloat16 float64] [--json out.json]

In exact arithmetic it always does. In floating point, the k-token verify pass and the 1-token greedy
step multiply matrices of different shapes and round differently; where p_1's top two logits are
closer than that rounding, the two decoders can pick different tokens and go on from there. With a
categorical output such near-ties are rare; with the Gaussian intensity output
(:mod:`lightning_bpd.nn.intensity_prior`) every position whose predicted mean sits near a half level is
one. For each dtype this decodes the inputs greedily and blockwise (exact) with the model cast to it,
and reports how many rows are identical and how many tokens differ.
"""

from __future__ import annotations

import argparse
import time

import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.decoding.protocol import DecodeResult
from lightning_bpd.evaluation import batched
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.precision import PRECISIONS
from lightning_bpd.records import write_json
from lightning_bpd.tasks.inputs import load_inputs


def differing_tokens(a: DecodeResult, b: DecodeResult) -> list[int]:
    """Per row: positions where the two outputs differ, a length difference counting as that many."""
    out = []
    for row in range(a.tokens.shape[0]):
        la, lb = int(a.lengths[row]), int(b.lengths[row])
        n = min(la, lb)
        out.append(int((a.tokens[row, :n] != b.tokens[row, :n]).sum()) + abs(la - lb))
    return out


def parity(module, inputs: list[torch.Tensor], dtypes: list[str], batch_size: int) -> dict:
    """Greedy vs exact blockwise decoding of ``inputs`` (single rows (1, S)) with the model in each dtype."""
    result = {}
    for name in dtypes:
        diffs: list[int] = []
        seconds = {"greedy": 0.0, "exact": 0.0}
        model = build_runtime(module.model, InferenceOptions(precision=name))
        with torch.no_grad():
            for batch in batched(module, inputs, batch_size):
                start = time.perf_counter()
                greedy = greedy_decode(model, batch.src, batch.max_len)
                middle = time.perf_counter()
                exact = blockwise_decode(model, batch.src, Exact(), batch.max_len)
                seconds["greedy"] += middle - start
                seconds["exact"] += time.perf_counter() - middle
                diffs += differing_tokens(greedy, exact)
        result[name] = {"rows": len(diffs), "identical_rows": sum(d == 0 for d in diffs),
                        "differing_tokens": sum(diffs), "greedy_seconds": round(seconds["greedy"], 3),
                        "exact_seconds": round(seconds["exact"], 3)}
    return result


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.exact_parity", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint of a translation or super-resolution run")
    p.add_argument("--input", default=None, help="translation: source sentences, one per line (.gz allowed)")
    p.add_argument("--images", default=None, help="super-resolution: CelebA folder (default: synthetic faces); val split")
    p.add_argument("--inputs", type=int, default=8, help="number of inputs")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--dtypes", nargs="+", default=["float32", "float32-invariant", "float64"], choices=list(PRECISIONS))
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    from lightning_bpd.checkpoints import load_model

    if args.inputs < 1 or args.batch_size < 1:
        raise SystemExit("exact_parity: --inputs and --batch-size must be >= 1")
    try:
        module = load_model(args.ckpt).eval()
        inputs = load_inputs(module, args)
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"exact_parity: {err}") from None
    result = {"ckpt": args.ckpt, "inputs": len(inputs), "threads": torch.get_num_threads(),
              "dtypes": parity(module, inputs, args.dtypes, args.batch_size)}
    for name, r in result["dtypes"].items():
        print(f"{name}: {r['identical_rows']} of {r['rows']} outputs identical to greedy, "
              f"{r['differing_tokens']} differing tokens")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
