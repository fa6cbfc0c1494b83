"""The paper's premise on a Hugging Face shape: a k-token verify pass against a 1-token greedy step, per runtime.

    python -m lightning_bpd.benchmarks.verify_cost --shape opus-mt --k 8 --json results/runtime/verify_cost_opus.json

Builds a random-weight Marian of the named shape (``opus-mt``: d 512, 6+6 layers, 8 heads, ff 2048, vocabulary
58,101, the shape of Helsinki-NLP/opus-mt-en-de; ``multi30k``: our Multi30k base's shape, d 256, 3+3, vocab 8,000)
behind the decoding protocol (:class:`~lightning_bpd.hf.HFSeq2SeqBlockwise`), and for each precision's runtime
(:func:`~lightning_bpd.inference.build_runtime`) times, at batch 1 with a warm cache of ``--prefix`` tokens:
a cached 1-token decoder step plus its vocabulary projection (greedy's step), and a cached k-token step plus the
projection at all k positions (blockwise decoding's verify pass). Both are cropped back after each call, so every
call sees the same cache. Calls alternate between the two and between runtimes; medians over ``--repeats``.
Also the base's own HF step (``base(decoder_input_ids, cache)``, its own ``nn.Linear`` products) for
reference. Random weights: only the cost is measured (nothing here depends on what the model says).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from lightning_bpd.records import cpu_name, write_json

SHAPES = {
    "opus-mt": {"d_model": 512, "encoder_layers": 6, "decoder_layers": 6, "encoder_attention_heads": 8,
                "decoder_attention_heads": 8, "encoder_ffn_dim": 2048, "decoder_ffn_dim": 2048, "vocab_size": 58101},
    "multi30k": {"d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "encoder_attention_heads": 4,
                 "decoder_attention_heads": 4, "encoder_ffn_dim": 1024, "decoder_ffn_dim": 1024, "vocab_size": 8000},
    "tiny": {"d_model": 32, "encoder_layers": 1, "decoder_layers": 2, "encoder_attention_heads": 4,  # for tests
             "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "vocab_size": 1200},
}


def build(shape: str, k: int) -> Any:
    """A random Marian of ``shape`` with k paper heads, wrapped for the decoding protocol."""
    from transformers import MarianConfig, MarianMTModel

    from lightning_bpd.hf import HFSeq2SeqBlockwise

    torch.manual_seed(0)
    config = MarianConfig(**SHAPES[shape], pad_token_id=0, eos_token_id=1, decoder_start_token_id=0,
                          max_position_embeddings=512, dropout=0.0, attn_implementation="sdpa")
    base = MarianMTModel(config).eval()
    return HFSeq2SeqBlockwise(base, k=k)


def timed(fn) -> float:
    """Seconds of one call of ``fn()``; a ``fn`` that times itself (returns seconds) is taken at its word."""
    start = time.perf_counter()
    own = fn()
    return own if own is not None else time.perf_counter() - start


def step_and_verify(model: Any, k: int, prefix: int, src_len: int) -> tuple[Any, Any]:
    """Two closures on ``model`` (a runtime or a wrapper): greedy's step (1 token + projection) and the verify pass
    (k tokens + projection at all k), each cropping the cache back to ``prefix`` tokens afterwards."""
    src = torch.randint(2, 1000, (1, src_len))
    context = model.encode(src)
    cache = model.new_cache(1, prefix + k + 1)
    model.decode_step(torch.randint(2, 1000, (1, prefix)), context, cache)
    keep = cache.lengths.clone()
    one, block = torch.randint(2, 1000, (1, 1)), torch.randint(2, 1000, (1, k))

    def call(tokens: torch.Tensor) -> None:
        h = model.decode_step(tokens, context, cache)
        model.logits_first(h).argmax(-1)
        cache.crop(keep.clone())  # crop keeps the tensor it is given, and the next call advances it in place

    return (lambda: call(one)), (lambda: call(block))


def hf_own_step(model: Any, k: int, prefix: int, src_len: int) -> tuple[Any, Any]:
    """The base's own cached forward (its ``nn.Linear`` products, its cache): 1 token and k tokens."""
    from transformers import DynamicCache, EncoderDecoderCache

    base = model.base
    src = torch.randint(2, 1000, (1, src_len))
    encoder_out = base.get_encoder()(input_ids=src)

    def call(n: int) -> float:  # the prefix pass untimed, then the n-token step
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        base(encoder_outputs=encoder_out, decoder_input_ids=torch.randint(2, 1000, (1, prefix)), cache=cache)
        start = time.perf_counter()
        base(encoder_outputs=encoder_out, decoder_input_ids=torch.randint(2, 1000, (1, n)), cache=cache)
        return time.perf_counter() - start

    return (lambda: call(1)), (lambda: call(k))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.verify_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="opus-mt", choices=list(SHAPES))
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--precisions", nargs="+", default=["float32", "float32-packed", "int8"])
    p.add_argument("--prefix", type=int, default=16, help="tokens already in the cache")
    p.add_argument("--src-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    return checked_run("verify_cost", run, p.parse_args(argv))


def checked_run(prog: str, run: Callable[[argparse.Namespace], dict[str, Any]],
                args: argparse.Namespace) -> dict[str, Any]:
    """``run(args)`` on ``args.threads`` threads (torch's count restored after), once every name of
    ``args.precisions`` is known (else one line, before any model is built)."""
    from lightning_bpd.inference import InferenceOptions

    try:
        for name in args.precisions:
            InferenceOptions(precision=name)
    except ValueError as err:
        raise SystemExit(f"{prog}: {err}") from None
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`main`'s work, on ``args.threads`` threads."""
    from lightning_bpd.inference import InferenceOptions, build_runtime

    model = build(args.shape, args.k)
    runtimes = {name: build_runtime(model, InferenceOptions(precision=name)) for name in args.precisions}
    with torch.no_grad():
        calls = {name: step_and_verify(rt, args.k, args.prefix, args.src_len) for name, rt in runtimes.items()}
        calls["hf_own"] = hf_own_step(model, args.k, args.prefix, args.src_len)
        for one, block in calls.values():  # warm up
            for _ in range(3):
                one(), block()
        samples: dict[str, dict[str, list[float]]] = {n: {"step": [], "verify": []} for n in calls}
        for _ in range(args.repeats):  # alternate the runtimes and the two calls
            for name, (one, block) in calls.items():
                samples[name]["step"].append(timed(one))
                samples[name]["verify"].append(timed(block))
    report: dict[str, Any] = {"shape": args.shape, **SHAPES[args.shape], "k": args.k, "prefix": args.prefix,
                              "src_len": args.src_len, "repeats": args.repeats, "threads": torch.get_num_threads(),
                              "cpu": cpu_name(), "torch": torch.__version__, "runtimes": {}}
    print(f"{'runtime':16s} {'1-token step ms':>16s} {f'{args.k}-token pass ms':>16s} {'ratio':>6s}")
    for name, s in samples.items():
        step, verify = statistics.median(s["step"]), statistics.median(s["verify"])
        report["runtimes"][name] = {"step_ms": 1e3 * step, "verify_ms": 1e3 * verify, "ratio": verify / step}
        print(f"{name:16s} {1e3 * step:16.2f} {1e3 * verify:16.2f} {verify / step:6.2f}")
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
