"""What a runtime adds to the process beside its model (issue 45: a runtime shares the model's weights).

    python -m lightning_bpd.benchmarks.runtime_memory [--d-model 1024 --layers 6 --vocab 32000 --k 8] \\
        [--precisions float32 float32-packed int8] [--json results/runtime/memory.json]

Builds a random :class:`~lightning_bpd.nn.model.BlockwiseTransformer` in float32 (by default d_model 1024, 6+6
layers, ffn 4096, vocab 32k, k = 8: 544M parameters, issue 45's d_model, layers and vocabulary), then one runtime
per precision, each measured alone and dropped before the next (:func:`~lightning_bpd.inference.memory.measured_build`: the
model's weights, the runtime's copies in another dtype and for its products, and the resident memory the process
grew by while building it).
"""

from __future__ import annotations

import argparse
import gc

import torch

from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.memory import MB, measured_build, resident_bytes
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.records import cpu_name, write_json


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.runtime_memory", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--precisions", nargs="+", default=["float32", "float32-packed", "int8"])
    p.add_argument("--json", default=None)
    return p


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    torch.manual_seed(0)
    d = args.d_model
    config = ModelConfig(args.vocab, args.vocab, d_model=d, n_heads=max(1, d // 64), n_encoder_layers=args.layers,
                         n_decoder_layers=args.layers, d_ff=4 * d, dropout=0.0, k=args.k)
    start = resident_bytes()
    model = BlockwiseTransformer(config).eval()
    params = sum(p.numel() for p in model.parameters())
    record = {"command": "python -m lightning_bpd.benchmarks.runtime_memory " + " ".join(argv or []),
              "cpu": cpu_name(), "parameters": params, "model_resident_mb": round((resident_bytes() - start) / MB, 1),
              "runtimes": {}}
    print(f"model: {params / 1e6:.0f}M parameters, the process grew by {record['model_resident_mb']} MB")
    for precision in args.precisions:
        options = InferenceOptions(precision=None if precision == "float32" else precision)
        runtime, memory = measured_build(lambda o=options: build_runtime(model, o), model)
        record["runtimes"][precision] = memory
        print(f"{precision:16s} {memory}")
        del runtime
        gc.collect()
    if args.json:
        write_json(args.json, record)
    return record


if __name__ == "__main__":
    main()
