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

Calls alternate between the two kinds and between runtimes, and every ``--generate-every`` rounds a ``generate``
sample; medians over ``--repeats``. With ``--decode-inputs N``, each precision's lean runtime also decodes N random
prompts greedily and blockwise (exact, k paper heads, ``--decode-tokens`` new tokens) through
:func:`~lightning_bpd.benchmarks.where_time_goes.profile`: milliseconds per greedy step and per blockwise iteration
by part (the decoder pass, p_1, the proposals, the loop) and the ceilings it bounds; the scrambled heads get about
one token accepted per iteration, so the measured speedup is not the point, the parts of an iteration against a
greedy step's are. Random weights: only the cost is measured. The load average before and after is recorded (the machine may
be shared).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time
from typing import Any

import torch

from lightning_bpd.benchmarks.verify_cost import checked_run, timed
from lightning_bpd.hf.causal_base import CAUSAL_SHAPES
from lightning_bpd.records import cpu_name, write_json

SHAPES: dict[str, dict[str, int]] = {
    "smollm": {"d": 576, "layers": 30, "heads": 9, "kv_heads": 3, "ffn": 1536, "positions": 2048, "vocab": 49152},
    "code": {**CAUSAL_SHAPES["code"], "vocab": 8192},
    "tiny": {"d": 32, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 64, "positions": 256, "vocab": 300},  # tests
}


def build(shape: str, k: int) -> Any:
    """A random Llama of ``shape`` (sdpa attention) with k paper heads (scrambled), wrapped for the decoding
    protocol."""
    from transformers import LlamaForCausalLM

    from lightning_bpd.hf.causal import HFCausalBlockwise
    from lightning_bpd.hf.causal_base import llama_config

    dims = SHAPES[shape]
    torch.manual_seed(0)
    config = llama_config(dims["vocab"], dims)
    config._attn_implementation = "sdpa"
    model = HFCausalBlockwise(LlamaForCausalLM(config).eval(), k=k)
    if k > 1:  # heads that disagree with p_1: one token accepted per iteration, every iteration a whole one
        torch.nn.init.normal_(model.head.out.weight, std=1.0)
    return model


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


class RandomPrompts:
    """What :func:`~lightning_bpd.benchmarks.where_time_goes.profile` asks of a module: a decode length and a
    criterion."""

    def __init__(self, new_tokens: int) -> None:
        self.new_tokens = new_tokens

    def max_decode_len(self, src: torch.Tensor) -> int:
        return self.new_tokens

    def make_criterion(self, spec: str) -> Any:
        from lightning_bpd.decoding import parse_criterion

        return parse_criterion(spec)


def decode_parts(runtime: Any, prompts: list[torch.Tensor], k: int, new_tokens: int) -> dict[str, Any]:
    """Greedy and exact blockwise decodes of ``prompts`` (each (1, P)) by ``runtime``, timed by part
    (:func:`~lightning_bpd.benchmarks.where_time_goes.profile`), with the ceilings of the blockwise one."""
    from lightning_bpd.benchmarks.where_time_goes import ceilings, profile

    module = RandomPrompts(new_tokens)
    profile(module, runtime, prompts[:1], k, "exact")  # warm-up
    greedy = profile(module, runtime, prompts, None, None)
    block = profile(module, runtime, prompts, k, "exact")
    block["ceilings"] = ceilings(greedy, block)
    return {"greedy": greedy, f"exact@k{k}": block}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.causal_cost", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="smollm", choices=list(SHAPES))
    p.add_argument("--k", type=int, default=8)
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens in the cache")
    p.add_argument("--precisions", nargs="+", default=["float32", "float32-packed"])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--generate-tokens", type=int, default=16, help="new tokens of each timed generate run")
    p.add_argument("--generate-every", type=int, default=2, help="a generate sample every this many rounds")
    p.add_argument("--decode-inputs", type=int, default=0, help="prompts decoded through where_time_goes (0: none)")
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--label", default=None, help="what the record measures (default: the shape and k)")
    p.add_argument("--note", default=None, help="recorded as is (e.g. the machine was shared)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.command = shlex.join(["python", "-m", "lightning_bpd.benchmarks.causal_cost",
                               *(sys.argv[1:] if argv is None else argv)])
    return checked_run("causal_cost", run, args)


def sample(calls: dict[str, tuple[Any, Any]], per_token: Any, args: argparse.Namespace) -> tuple[dict, list[float]]:
    """Every call pair ``args.repeats`` times, alternated, and a ``generate`` sample every ``args.generate_every``
    rounds -> seconds by name and kind, and generate's seconds per token."""
    for one, block in calls.values():  # warm up
        for _ in range(2):
            one(), block()
    samples: dict[str, dict[str, list[float]]] = {n: {"step": [], "verify": []} for n in calls}
    generated: list[float] = []
    for i in range(args.repeats):
        for name, (one, block) in calls.items():
            samples[name]["step"].append(timed(one))
            samples[name]["verify"].append(timed(block))
        if i % args.generate_every == 0:
            generated.append(per_token())
    return samples, generated


def run(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`main`'s work, on ``args.threads`` threads."""
    from lightning_bpd.inference import InferenceOptions, build_runtime

    load_before = os.getloadavg()
    model = build(args.shape, args.k)
    vocab = SHAPES[args.shape]["vocab"]
    prompt = torch.randint(3, vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    calls: dict[str, tuple[Any, Any]] = {}
    lean: dict[str, Any] = {}
    with torch.no_grad():
        for name in args.precisions:
            for on in (True, False):
                runtime = build_runtime(model, InferenceOptions(precision=name, lean_steps=on))
                kind = "lean" if runtime.model.lean else "modules"
                lean.setdefault(name, runtime)
                calls[f"{name} {kind}"] = step_and_verify(runtime, prompt, args.k)
        calls["hf_own"] = hf_own_step(model.base, prompt, args.k)
        samples, generated = sample(calls, generate_per_token(model.base, prompt, args.generate_tokens), args)
        g = torch.Generator().manual_seed(2)
        prompts = [torch.randint(3, vocab, (1, args.prompt), generator=g) for _ in range(args.decode_inputs)]
        decodes = {name: decode_parts(rt, prompts, args.k, args.decode_tokens) for name, rt in lean.items()} \
            if prompts else {}
    label = args.label or (f"random-weight Llama of the {args.shape} shape behind the decoding protocol, batch 1, "
                           f"{args.prompt}-token prompt: generate's greedy token, a runtime's 1-token step and its "
                           f"{args.k}-token verify pass")
    generate = statistics.median(generated)
    report: dict[str, Any] = {
        "label": label, "command": args.command, "shape": args.shape, **SHAPES[args.shape], "k": args.k,
        "prompt": args.prompt, "repeats": args.repeats, "threads": torch.get_num_threads(), "cpu": cpu_name(),
        "torch": torch.__version__, "note": args.note,
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "generate_ms_per_token": 1e3 * generate, "generate_tokens": args.generate_tokens,
        "generate_samples": len(generated), "runtimes": {}, "decodes": decodes}
    print(f"generate greedy: {1e3 * generate:.2f} ms/token")
    print(f"{'runtime':24s} {'1-token step ms':>16s} {f'{args.k}-token pass ms':>16s} {'ratio':>6s} {'/ generate':>10s}")
    for name, s in samples.items():
        step, verify = statistics.median(s["step"]), statistics.median(s["verify"])
        report["runtimes"][name] = {"step_ms": 1e3 * step, "verify_ms": 1e3 * verify, "ratio": verify / step,
                                    "step_over_generate": step / generate}
        print(f"{name:24s} {1e3 * step:16.2f} {1e3 * verify:16.2f} {verify / step:6.2f} {step / generate:10.2f}")
    for name, parts in decodes.items():
        g, b = parts["greedy"]["ms_per_step_by_part"], parts[f"exact@k{args.k}"]["ms_per_step_by_part"]
        print(f"{name} decodes: decoder pass per greedy step {g['decode_step']:.2f} ms, per k={args.k} iteration "
              f"{b['decode_step']:.2f} ms ({b['decode_step'] / g['decode_step']:.2f}x); ceilings "
              + ", ".join(f"{c} {v:.2f}" for c, v in parts[f"exact@k{args.k}"]["ceilings"].items()))
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
