"""The paper's premise on a decoder-only shape: ``generate``'s greedy token against a runtime's 1-token step and its
k-token verify pass, at batch 1 with a prompt in the cache.

    python -m lightning_bpd.benchmarks.causal_cost --shape smollm --k 8 --prompt 128 --json results/lm/cost.json

Builds a random-weight Llama of the named shape (``smollm``: SmolLM-135M's, d 576, 30 layers, 9 heads / 3 KV heads,
gated MLP 1536, vocabulary 49,152, tied embeddings; ``code``: the code LM recipe's base, ``CAUSAL_SHAPES["code"]``
at vocabulary 8,192) behind the decoding protocol (:class:`~lightning_bpd.hf.causal.HFCausalBlockwise`) and times:

* ``generate``: the base's own greedy ``generate`` after the prompt, per new token (a run of n + 1 new tokens
  less a run of 1, over n: the prefill left out);
* for each precision's runtime (:func:`~lightning_bpd.inference.build_runtime`), with its lean step (``lean``) and
  with the HF modules (``modules``, ``lean_steps=False``): a cached 1-token step plus its vocabulary projection and
  argmax (greedy's step) and a cached k-token pass plus the projection and argmax at all k (the verify pass), each
  cropped back after the call, so every call sees the same cache (the prompt and one decoded token);
* ``hf_own``: the base's own forward with its ``DynamicCache`` (1 and k tokens, the cache cropped back).

Calls alternate between the two kinds and between runtimes; medians over ``--repeats``. Random weights: only the
cost is measured. The load average before and after is recorded (the machine may be shared).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from lightning_bpd.records import cpu_name, write_json

SHAPES: dict[str, dict[str, int]] = {
    "smollm": {"d": 576, "layers": 30, "heads": 9, "kv_heads": 3, "ffn": 1536, "positions": 2048, "vocab": 49152},
    "code": {"d": 384, "layers": 10, "heads": 6, "kv_heads": 2, "ffn": 1024, "positions": 1024, "vocab": 8192},
    "tiny": {"d": 32, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 64, "positions": 256, "vocab": 300},  # tests
}


def build(shape: str, k: int) -> Any:
    """A random Llama of ``shape`` (sdpa attention) with k paper heads, wrapped for the decoding protocol."""
    from transformers import LlamaForCausalLM

    from lightning_bpd.hf.causal import HFCausalBlockwise
    from lightning_bpd.hf.causal_base import llama_config

    dims = SHAPES[shape]
    torch.manual_seed(0)
    config = llama_config(dims["vocab"], dims)
    config._attn_implementation = "sdpa"
    return HFCausalBlockwise(LlamaForCausalLM(config).eval(), k=k)


def timed(fn) -> float:
    """Seconds of one call of ``fn()``; a ``fn`` that times itself (returns seconds) is taken at its word."""
    start = time.perf_counter()
    own = fn()
    return own if own is not None else time.perf_counter() - start


def step_and_verify(model: Any, prompt: torch.Tensor, k: int) -> tuple[Any, Any]:
    """Two closures on ``model`` (a runtime): greedy's step (1 token, projection, argmax) and the verify pass (k
    tokens, projection and argmax at all k), each cropping the cache back to the prompt and one decoded token."""
    context = model.encode(prompt)
    cache = model.new_cache(1, 2 + k)
    model.decode_step(torch.full((1, 1), model.bos_id), context, cache)  # the last prompt token
    keep = cache.lengths.clone()
    one, block = prompt[:, -1:], prompt[:, -k:]

    def call(tokens: torch.Tensor) -> None:
        h = model.decode_step(tokens, context, cache)
        model.logits_first(h).argmax(-1)
        cache.crop(keep.clone(), bounds=(1, 1), check=False)  # crop keeps the tensor it is given

    return (lambda: call(one)), (lambda: call(block))


def hf_own_step(base: Any, prompt: torch.Tensor, k: int) -> tuple[Any, Any]:
    """The base's own cached forward (its modules, its ``DynamicCache`` cropped back) and LM head: 1 and k tokens."""
    from transformers import DynamicCache

    cache = DynamicCache(config=base.config)
    base(input_ids=prompt, cache=cache, use_cache=True)

    def call(tokens: torch.Tensor) -> None:
        base(input_ids=tokens, cache=cache, use_cache=True).logits.argmax(-1)
        cache.crop(-tokens.shape[1])  # the tokens it took off again

    return (lambda: call(prompt[:, -1:])), (lambda: call(prompt[:, -k:]))


def generate_per_token(base: Any, prompt: torch.Tensor, new: int) -> Any:
    """A closure timing ``generate`` greedy per new token: (n + 1 new tokens - 1 new token) / n, in seconds."""
    ones = torch.ones_like(prompt)

    def run(n: int) -> float:
        start = time.perf_counter()
        base.generate(input_ids=prompt, attention_mask=ones, do_sample=False, num_beams=1, max_new_tokens=n,
                      min_new_tokens=n, pad_token_id=0)
        return time.perf_counter() - start

    return lambda: (run(new + 1) - run(1)) / new


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.causal_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm", choices=list(SHAPES))
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens in the cache")
    p.add_argument("--precisions", nargs="+", default=["float32", "float32-packed"])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--generate-tokens", type=int, default=16, help="new tokens of each timed generate run")
    p.add_argument("--generate-repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--note", default=None, help="recorded as is (e.g. the machine was shared)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from lightning_bpd.inference import InferenceOptions

    try:
        for name in args.precisions:
            InferenceOptions(precision=name)  # an unknown name: one line, before the model is built
    except ValueError as err:
        raise SystemExit(f"causal_cost: {err}") from None
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`main`'s work, on ``args.threads`` threads."""
    from lightning_bpd.inference import InferenceOptions, build_runtime

    load_before = os.getloadavg()
    model = build(args.shape, args.k)
    prompt = torch.randint(3, SHAPES[args.shape]["vocab"], (1, args.prompt), generator=torch.Generator().manual_seed(1))
    calls: dict[str, tuple[Any, Any]] = {}
    with torch.no_grad():
        for name in args.precisions:
            for lean in (True, False):
                runtime = build_runtime(model, InferenceOptions(precision=name, lean_steps=lean))
                kind = "lean" if getattr(runtime.model, "lean", False) else "modules"
                calls[f"{name} {kind}"] = step_and_verify(runtime, prompt, args.k)
        calls["hf_own"] = hf_own_step(model.base, prompt, args.k)
        for one, block in calls.values():  # warm up
            for _ in range(2):
                one(), block()
        samples: dict[str, dict[str, list[float]]] = {n: {"step": [], "verify": []} for n in calls}
        for _ in range(args.repeats):  # alternate the runtimes and the two calls
            for name, (one, block) in calls.items():
                samples[name]["step"].append(timed(one))
                samples[name]["verify"].append(timed(block))
        per_token = generate_per_token(model.base, prompt, args.generate_tokens)
        generate = statistics.median(per_token() for _ in range(args.generate_repeats))
    dims = SHAPES[args.shape]
    report: dict[str, Any] = {
        "shape": args.shape, **dims, "k": args.k, "prompt": args.prompt, "repeats": args.repeats,
        "threads": torch.get_num_threads(), "cpu": cpu_name(), "torch": torch.__version__,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)], "note": args.note,
        "generate_ms_per_token": 1e3 * generate, "generate_tokens": args.generate_tokens, "runtimes": {}}
    print(f"generate greedy: {1e3 * generate:.2f} ms/token")
    print(f"{'runtime':24s} {'1-token step ms':>16s} {f'{args.k}-token pass ms':>16s} {'ratio':>6s} {'/ generate':>10s}")
    for name, s in samples.items():
        step, verify = statistics.median(s["step"]), statistics.median(s["verify"])
        report["runtimes"][name] = {"step_ms": 1e3 * step, "verify_ms": 1e3 * verify, "ratio": verify / step,
                                    "step_over_generate": step / generate}
        print(f"{name:24s} {1e3 * step:16.2f} {1e3 * verify:16.2f} {verify / step:6.2f} {step / generate:10.2f}")
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
