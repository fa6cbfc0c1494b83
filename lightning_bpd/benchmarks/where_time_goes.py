"""Where the decoding time goes: greedy vs blockwise, split by model call (issue: speed).

    python -m lightning_bpd.benchmarks.where_time_goes --ckpt runs/m30k-k8-frozen/last.ckpt \\
        --input src.en --inputs 30 --k 4 8 --criterion exact [--json out.json]
    python -m lightning_bpd.benchmarks.where_time_goes --ckpt runs/code-lm/frozen/last.ckpt \\
        --data-root ../shared/data/code/python-stdlib/Lib --split test --inputs 16 --max-new-tokens 64

A language-modelling checkpoint (an LM run's ``.ckpt`` or a heads folder) takes its prompts as ``bench-generate``
does: ``--input FILE.jsonl`` (``{"prompt": ...}`` per line) or ``--data-root DIR`` (the held-out ``--split``'s
line-aligned prompts, split as the run split them), each continued by ``--max-new-tokens`` (default the module's)
and checked against the model's context; the encoder part is its prefill.

Decodes the same inputs one at a time (batch 1) with cached greedy decoding and with blockwise
decoding at each k, through a proxy of the model that times every call: ``encode``, the decoder
(``decode_step``: one token for greedy, the k-token verify pass for blockwise), the p_1 projections
(``logits_first``: greedy's next token, blockwise's verification) and the proposals: the paper
head's projections (``logits_heads``, or ``draft_tokens`` with a draft vocabulary) or, for chained
heads, the whole chain of fused links with their projections (``chain_drafts``), or each reference link
(``chain_draft`` with ``--unfused-chain``; ``chain_step`` without a draft path). With ``--screened-argmax``
greedy's token and exact verification are ``argmax_first``. The rest of the wall-clock time is the decode loop itself
(argmax, acceptance, output bookkeeping, KV-cache crop). Reports milliseconds per step (greedy) or
per iteration (blockwise), and each part's share.

For each blockwise method it also bounds what faster code could reach (``ceilings``, speedups over greedy's
time in the same run): ``measured``; ``free_proposals`` (the heads' part cost nothing); ``and_lean_loop``
(also, the loop cost per iteration what greedy's costs per step); ``and_one_token_pass`` (also, the k-token
verify pass and its verification cost what greedy's decoder step and next-token projection cost: the paper's
premise, which leaves the encoder and one greedy step per iteration).

On a DFlash drafter's checkpoint (``conf/lm/dflash.yaml``) the blockwise method is exact acceptance with the drafter
proposing (``dflash@k<w>``, ``--k`` its block sizes, default the drafter's), and the parts are the target's
``encode_features`` (the prefill with the drafter's layers) and ``decode_step_features`` (the w-token verify pass with
them), ``logits_first``, and the proposals: the drafter's ``draft`` (its one bidirectional pass) and ``extend`` (the
accepted positions' features into its context), the block's ``embed_tokens`` and the drafts' LM head
(``draft_head``: the target's ``logits_first`` over the w - 1 drafted slots). On an EAGLE-3 drafter's checkpoint it is
``eagle3@k<w>`` (chains of w) and, per ``--tree-nodes N``, ``eagle3+tree<N>@k<w>`` (dynamic trees of N nodes, w - 1
deep, 4 wide; the verify pass ``decode_tree_features``); the drafter's part is ``extend`` (each call of its layer and
LM head), and the trees' top-k, confidences and selection count in ``loop``.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from typing import Any

import torch

from lightning_bpd.decoding import blockwise_decode, decode, greedy_decode
from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.drafters.common.kind import article
from lightning_bpd.drafters.registry import kind_of, kinds
from lightning_bpd.inference import Runtime, build_runtime
from lightning_bpd.inference.arguments import (
    add_draft_vocab_args,
    add_precision_arg,
    add_timing_args,
    draft_vocab_of,
    options_from_args,
)
from lightning_bpd.records import write_json
from lightning_bpd.tasks.inputs import load_inputs

TIMED = ("encode", "decode_step", "logits_first", "argmax_first", "logits_heads", "draft_tokens", "chain_drafts",
         "chain_draft", "chain_step", "encode_features", "decode_step_features", "decode_tree_features", "embed_tokens")
DRAFTER = ("draft", "extend", "draft_head")  # a DFlash drafter's parts (TimedDrafter), the drafts' LM head included
PARTS = (*TIMED, *DRAFTER)


class TimedModel:
    """Forwards everything to ``model``; accumulates the wall-clock seconds of the timed methods. An optional
    member the model does not offer (None) stays None, so the decoders take the same path through the proxy."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.drafted = False  # a DFlash drafter just drafted: the next logits_first reads its drafts (draft_head)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.model, name)
        if name not in TIMED or attr is None:  # None: a capability the model does not offer
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            part = name
            if name == "logits_first" and self.drafted:
                part, self.drafted = "draft_head", False
            start = time.perf_counter()
            out = attr(*args, **kwargs)
            self.seconds[part] += time.perf_counter() - start
            self.calls[part] += 1
            return out

        return timed


class TimedDrafter:
    """A DFlash drafter whose ``draft`` and ``extend`` are timed into ``proxy``'s parts; ``draft`` marks the proxy's
    next ``logits_first`` as the drafts' LM head (what the DFlash proposer reads right after drafting)."""

    def __init__(self, drafter: Any, proxy: TimedModel) -> None:
        self.drafter, self.proxy = drafter, proxy

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.drafter, name)
        if name not in ("draft", "extend"):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            out = attr(*args, **kwargs)
            self.proxy.seconds[name] += time.perf_counter() - start
            self.proxy.calls[name] += 1
            self.proxy.drafted = name == "draft"
            return out

        return timed


def drafter_proposer(module: Any, runtime: Runtime, proxy: TimedModel, k: int | None, tree_nodes: int = 0) -> Any:
    """A drafter checkpoint's proposer (its kind's, :func:`~lightning_bpd.drafters.registry.kind_of`), its drafter
    timed into ``proxy``: blocks (chains) of ``k`` or, with ``tree_nodes``, the kind's dynamic trees of that many
    nodes, ``k`` - 1 deep and 4 wide."""
    from lightning_bpd.drafters.common.kind import Spelling

    kind = kind_of(module)
    timed = TimedDrafter(kind.prepare(module.drafter, runtime), proxy)
    if tree_nodes:
        return kind.build(timed, Spelling(f"dynamic:{tree_nodes}", "dynamic", (tree_nodes, 0, 0)), k)
    return kind.build(timed, Spelling("", "chain"), k)


def profile(module: Any, runtime: Runtime, inputs: list[torch.Tensor], k: int | None, criterion: str | None,
            stop_below: float | None = None, new_tokens: int | None = None, tree_nodes: int = 0) -> dict[str, Any]:
    """Time one method of ``runtime`` (the module's model prepared) over ``inputs`` (greedy when ``criterion`` is
    None; ``stop_below``: the confidence stop), each decoded to at most ``new_tokens`` (None: the module's
    ``max_decode_len``); on a drafter's checkpoint the blockwise method is the drafter's (DFlash blocks of ``k``,
    EAGLE-3 chains of ``k`` or its trees of ``tree_nodes``)."""
    proxy = TimedModel(runtime)
    rule = module.make_criterion(criterion) if criterion else None
    proposer = None
    if kind_of(module) is not None and rule is not None:
        proposer = drafter_proposer(module, runtime, proxy, k, tree_nodes)
    start, steps = time.perf_counter(), 0
    for src in inputs:
        max_len = module.max_decode_len(src) if new_tokens is None else new_tokens
        if rule is None:
            result = greedy_decode(proxy, src, max_len)
        elif proposer is not None:
            result = decode(proxy, src, rule, proposer, max_len=max_len)
        else:
            result = blockwise_decode(proxy, src, rule, max_len, k=k, stop_below=stop_below)
        steps += int(result.iterations.sum())
    total = time.perf_counter() - start
    parts = {name: proxy.seconds[name] for name in PARTS}
    parts["loop"] = total - sum(parts.values())
    return {"seconds": total, "steps": steps, "ms_per_step": 1e3 * total / steps,
            "ms_per_step_by_part": {n: 1e3 * s / steps for n, s in parts.items()},
            "share": {n: s / total for n, s in parts.items()}, "calls": dict(proxy.calls)}


PROPOSALS = ("logits_heads", "draft_tokens", "chain_drafts", "chain_draft", "chain_step", "embed_tokens", *DRAFTER)
VERIFY = ("decode_step", "decode_step_features", "decode_tree_features", "logits_first", "argmax_first")


def ceilings(greedy: dict[str, Any], method: dict[str, Any]) -> dict[str, float]:
    """Speedups over ``greedy`` (a :func:`profile`) that ``method`` (another) would reach with parts of it free
    or as cheap as greedy's (see the module docstring); from the measured parts, nothing rerun."""
    g_part, m_part = greedy["ms_per_step_by_part"], method["ms_per_step_by_part"]
    n = method["steps"]  # iterations (the BOS call included)
    total = method["seconds"] * 1e3  # ms
    free = total - n * sum(m_part[p] for p in PROPOSALS)
    lean = free - n * (m_part["loop"] - g_part["loop"])
    one_pass = lean - n * sum(m_part[p] - g_part[p] for p in VERIFY)
    g_total = greedy["seconds"] * 1e3
    return {"measured": g_total / total, "free_proposals": g_total / free, "and_lean_loop": g_total / lean,
            "and_one_token_pass": g_total / one_pass}


def lm_inputs(module: Any, args: argparse.Namespace) -> tuple[list[torch.Tensor], int]:
    """A language-modelling checkpoint's prompts, one (1, P) tensor each, and the new tokens each is continued by
    (:func:`~lightning_bpd.benchmarks.lm_prompts.lm_prompts`: each checked against the model's context)."""
    from lightning_bpd.benchmarks.lm_prompts import lm_prompts, new_tokens

    max_new = new_tokens(module, args)
    return [module.encode_prompts([p]) for p in lm_prompts(module, args, max_new)], max_new


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from lightning_bpd.benchmarks.lm_prompts import add_prompt_args

    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.where_time_goes", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True)
    p.add_argument("--input", default=None, help="translation: source sentences (.gz allowed); a language model: "
                   'JSON Lines of {"prompt": ...}')
    p.add_argument("--images", default=None, help="super-resolution: CelebA folder (default: synthetic faces)")
    p.add_argument("--limit", type=int, default=30, dest="inputs", help="number of inputs (prompts) decoded")
    deprecated_alias(p, "--inputs", "--limit")
    p.add_argument("--k", type=int, nargs="+", default=None, help="block sizes (default: the model's k)")
    p.add_argument("--criterion", default="exact")
    p.add_argument("--tree-nodes", type=int, nargs="*", default=[], help="an EAGLE-3 checkpoint: also its dynamic "
                   "trees of N nodes (k - 1 deep, 4 wide), one method each")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    add_precision_arg(p)
    add_timing_args(p)
    add_draft_vocab_args(p)
    add_prompt_args(p)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from lightning_bpd.checkpoints import load_model

    try:
        module = load_model(args.ckpt, "cpu")
        runtime = build_runtime(module.model, options_from_args(args, module))
        inputs, new = lm_inputs(module, args) if hasattr(module, "encode_prompts") else (load_inputs(module, args), None)
    except (ValueError, FileNotFoundError, OSError) as err:
        raise SystemExit(f"where_time_goes: {str(err).strip().splitlines()[0]}") from None
    drafting = kind_of(module)
    name = drafting.name if drafting is not None else args.criterion
    ks = args.k or [drafting.default_k(module) if drafting is not None else module.model.k]
    if args.tree_nodes and (drafting is None or not drafting.trees):
        growers = " or ".join(f"{article(k.title)} {k.title}" for k in kinds() if k.trees)
        raise SystemExit(f"where_time_goes: --tree-nodes times {growers} drafter's dynamic trees; this checkpoint "
                         "has none")
    if args.tree_nodes and (min(args.tree_nodes) < 1 or args.criterion != "exact"):
        raise SystemExit("where_time_goes: --tree-nodes takes node counts >= 1, with --criterion exact")
    try:
        profile(module, runtime, inputs[:2], ks[0], args.criterion, args.stop_below, new)  # warm-up
        for k, n in ((k, n) for k in ks for n in args.tree_nodes):  # every tree fits (a one-line error now)
            drafter_proposer(module, runtime, TimedModel(runtime), k, n).check(runtime, module.make_criterion("exact"))
    except ValueError as err:
        raise SystemExit(f"where_time_goes: {str(err).strip().splitlines()[0]}") from None
    report: dict[str, Any] = {"ckpt": args.ckpt, "inputs": len(inputs), "threads": torch.get_num_threads(),
                              "criterion": args.criterion, "precision": runtime.precision,
                              "proposal_precision": args.proposal_precision, "stop_below": args.stop_below,
                              "draft_vocab": draft_vocab_of(args)[0], "fused_chain": not args.unfused_chain,
                              "screened_argmax": args.screened_argmax, "lean_steps": not args.reference_steps,
                              **({} if new is None else {"max_new_tokens": new, "prompts_from": args.input or
                                                         f"{args.data_root} ({args.split} split)"}),
                              "methods": {"greedy": profile(module, runtime, inputs, None, None, new_tokens=new)}}
    for k in ks:
        report["methods"][f"{name}@k{k}"] = profile(module, runtime, inputs, k, args.criterion, args.stop_below, new)
        for n in args.tree_nodes:
            report["methods"][f"{name}+tree{n}@k{k}"] = profile(module, runtime, inputs, k, args.criterion,
                                                                args.stop_below, new, tree_nodes=n)
    greedy = report["methods"]["greedy"]
    for name, r in report["methods"].items():
        if name != "greedy":
            r["ceilings"] = ceilings(greedy, r)
    greedy_ms = greedy["ms_per_step"]
    shown = [n for n in (*PARTS, "loop") if any(r["calls"].get(n) for r in report["methods"].values()) or n == "loop"]
    print(f"{'method':12s} {'ms/step':>8s} {'x greedy':>8s}  " + " ".join(f"{n:>13s}" for n in shown))
    for name, r in report["methods"].items():
        parts = " ".join(f"{r['ms_per_step_by_part'][n]:7.2f} ({r['share'][n]:3.0%})" for n in shown)
        print(f"{name:12s} {r['ms_per_step']:8.2f} {r['ms_per_step'] / greedy_ms:8.2f}  {parts}")
    for name, r in report["methods"].items():
        if "ceilings" in r:
            print(f"{name:12s} speedup over greedy: " + ", ".join(f"{c} {v:.2f}" for c, v in r["ceilings"].items()))
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
