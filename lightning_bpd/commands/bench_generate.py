"""Our blockwise decoding of a Hugging Face heads checkpoint against the base's own ``generate``: ``bench --ckpt CKPT
--peers generate,...`` (:func:`run`). ``bench-generate`` is its old spelling
(:func:`lightning_bpd.commands.old_benches.bench_generate`: one deprecation line that names the new command line, then
the same bench).

    python -m lightning_bpd bench --ckpt runs/opus-heads/last.ckpt --input newstest.en \\
        --batch-sizes 1 32 --limit 100 --precision float32-packed --json results/hf_generate.json \\
        --peers generate,prompt-lookup[,ctranslate2]

Three ways to decode the same sentences with the same checkpoint (a run of
:class:`~lightning_bpd.tasks.translation.hf_module.HFTranslationModule`, or a heads folder of ``save_heads``):

- ``hf_generate``: the base's own ``generate``, greedy (``num_beams=1, do_sample=False``);
- ``hf_prompt_lookup``: ``generate`` assisted by prompt lookup (``prompt_lookup_num_tokens``): candidate tokens
  copied from an earlier occurrence of the last n-gram, verified by the base in one pass. For an encoder-decoder
  transformers looks the n-grams up in the decoder's own output so far (the ``input_ids`` of its assisted loop),
  not in the source sentence. Assisted generation takes one row only (transformers 5.x: "assisted generate is only
  supported for batch_size = 1"): at a larger batch size the method is tried once, untimed, and recorded as
  ``skipped`` with transformers' message;
- ``exact``: our blockwise decoding with the heads and exact acceptance, through the inference runtime at
  ``--precision`` (default: as trained, float32);
- ``exact+nodes<N>`` for each ``--tree-nodes N``: the same, verifying the tree of N nodes built from the heads'
  rank agreement table (stored with them, else measured on the inputs first; 0 = the single path); ``exact+nodes-auto``
  for ``--tree-nodes auto``: the budget that pays here (its choice and cost curve in the record's ``tree_nodes_auto``);
- ``prompt_lookup``: our prompt lookup (:class:`~lightning_bpd.decoding.proposers.PromptLookup`, generate's n-gram
  size and token count, looking up the source sentence and the output so far), exact, at every batch size.

``generate`` always runs the base as loaded (its own modules, float32 for a float32 checkpoint) with the checkpoint's
own generation config (forced BOS/EOS, EOS ids, suppressed and banned tokens, minimum lengths: the rules our
decoders apply too, :mod:`lightning_bpd.decoding.generation_rules`), greedy (``num_beams=1, do_sample=False``) and
``max_new_tokens`` = the module's ``max_decode_len`` of the batch (our limit too). Every output is compared without
the decoder start token and cut after its first EOS id, as our outputs are.

Batches alternate between the methods (each batch is decoded by every method in turn), after ``--warmup`` untimed
batches. Per batch size and method: seconds per input (median and interquartile range over batches), seconds,
tokens, tokens per second, ms per output token, the number of sentences and of those whose output differs from
``hf_generate``'s (``differs_from_hf_generate``, expected 0 for ``exact`` in float32 and for prompt lookup, which
is lossless for greedy up to rounding), and for every other method ``exact_speedup``: its seconds over ours
(``exact``'s ``speedup_over`` lists them all).

``--peers ctranslate2[:QUANT]`` also converts the base (its directory, or the fine-tuned weights saved to a temporary one;
a Marian whose ``<pad>`` is not the last id is converted from a copy with ``<pad>`` moved last, see
:mod:`lightning_bpd.hf.pad_last`) with CTranslate2's ``TransformersConverter`` and times its greedy decoding (float32
and int8 by default, else each QUANT named) of the same sentences, each batch in one ``translate_batch`` call
(ragged, no forced lengths). A peer that cannot run (the ``ctranslate2`` package missing: ``pip install
ctranslate2``; its conversion refused; an error while decoding) is one ``skipped`` line in the table and its reason
in the record (``peers.failed`` and its rows), never the end of the bench.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.benchmarks.ctranslate2_hf import CT2Translator, cut, start_ct2
from lightning_bpd.benchmarks.ctranslate2_peer import failure, quiet_transformers
from lightning_bpd.benchmarks.ours import ours, runtime_options
from lightning_bpd.benchmarks.tally import Tally, differing
from lightning_bpd.commands.bench_generate_lm import main_lm
from lightning_bpd.decoding import Tree
from lightning_bpd.decoding.proposers import PromptLookup
from lightning_bpd.evaluation import batched, budget_trees, timed
from lightning_bpd.inference import build_runtime
from lightning_bpd.inference.arguments import options_from_args
from lightning_bpd.records import device_name, write_json
from lightning_bpd.tasks.inputs import load_inputs

GENERATE, LOOKUP, OURS = "hf_generate", "hf_prompt_lookup", "exact"
OURS_LOOKUP = "prompt_lookup"  # ours: PromptLookup through the one loop, exact, any batch size
METHODS = (GENERATE, LOOKUP, OURS)


# ---- Hugging Face generate ------------------------------------------------------------------------------------
def greedy_config(model, max_len: int, lookup_tokens: int | None = None, max_ngram: int = 2):
    """The base's own ``GenerationConfig``, greedy, at most ``max_len`` new tokens (see the module docstring); with
    ``lookup_tokens``, assisted by prompt lookup."""
    config = copy.deepcopy(model.base.generation_config)
    config.update(decoder_start_token_id=model.bos_id, pad_token_id=model.pad_id, num_beams=1, do_sample=False,
                  max_new_tokens=max_len)
    if lookup_tokens is not None:
        config.prompt_lookup_num_tokens = lookup_tokens
        config.max_matching_ngram_size = max_ngram
    return config


def hf_generate(model, src: Tensor, max_len: int, lookup_tokens: int | None = None,
                max_ngram: int = 2) -> list[list[int]]:
    """``model.base.generate`` of (B, S) pad-padded sources, greedy (or assisted by prompt lookup): each row without
    its decoder start token and cut after its first EOS."""
    config = greedy_config(model, max_len, lookup_tokens, max_ngram)
    with torch.no_grad(), quiet_transformers():
        out = model.base.generate(input_ids=src, attention_mask=(src != model.pad_id).long(), generation_config=config)
    if not bool((out[:, 0] == model.bos_id).all()):
        raise RuntimeError("generate's output does not start with the decoder start token")
    return cut(out[:, 1:].tolist(), model.generation_rules.eos_ids or model.eos_id)


# ---- the benchmark ----------------------------------------------------------------------------------------------
def lookup_refusal(model, src: Tensor, max_len: int, args: argparse.Namespace) -> str | None:
    """None if ``generate`` takes prompt lookup at this batch (one untimed try), else transformers' message."""
    try:
        hf_generate(model, src, max_len, args.prompt_lookup_tokens, args.max_matching_ngram)
    except ValueError as err:
        return str(err).strip().splitlines()[0]
    return None


def bench_batch_size(module, runtime, inputs: list[Tensor], batch_size: int, args: argparse.Namespace,
                     peers: Sequence[CT2Translator] = (), failed: dict[str, str] | None = None,
                     trees: dict[str, Tree | None] | None = None) -> dict[str, Any]:
    """Every method (and peer) on every batch of ``batch_size``, alternating: the report of each; ``trees``: a row
    of ours per tree (name -> tree). A peer that raises is dropped, its reason added to ``failed`` (peer name ->
    reason), which also names the peers to skip."""
    failed = {} if failed is None else failed
    trees = trees or {}
    names = [*dict.fromkeys([*(peer.name for peer in peers), *failed])]
    model = module.model
    batches = batched(module, inputs, batch_size)
    refused = lookup_refusal(model, batches[0].src, batches[0].max_len, args)
    methods: dict[str, Any] = {
        GENERATE: lambda src, n: hf_generate(model, src, n),
        LOOKUP: lambda src, n: hf_generate(model, src, n, args.prompt_lookup_tokens, args.max_matching_ngram),
        OURS: ours(runtime, args.k),
        **{name: ours(runtime, args.k, tree) for name, tree in trees.items()},
        OURS_LOOKUP: ours(runtime, None, proposer=PromptLookup(args.max_matching_ngram, args.prompt_lookup_tokens)),
    }
    our_rows = [*trees, OURS_LOOKUP]  # our rows beside exact, each timed and tallied as ours
    if refused is not None:
        del methods[LOOKUP]
    for peer in peers:
        if peer.name not in failed:
            methods[peer.name] = peer
    device = batches[0].src.device
    for batch in batches[: args.warmup]:
        for name in list(methods):
            run_or_drop(methods, failed, name, device, batch, batch_size, [*METHODS, *our_rows])
    tallies = {name: Tally() for name in methods}
    for batch in batches:
        for name in list(methods):
            ran = run_or_drop(methods, failed, name, device, batch, batch_size, [*METHODS, *our_rows])
            if ran is None:
                del tallies[name]
                continue
            out, seconds = ran
            if name == OURS or name in our_rows:
                out, iterations, calls = out
                tallies[name].add(out, seconds, iterations, calls)
            else:
                tallies[name].add(out, seconds)
    greedy = tallies[GENERATE].outputs
    report: dict[str, Any] = {}
    for name, tally in tallies.items():
        r = report[name] = tally.report()
        if name != GENERATE:
            rows = differing(tally.outputs, greedy)
            r["differs_from_hf_generate"] = len(rows)
            r["differing_sentences"] = rows[:10]
    for name in (OURS, *our_rows):
        report[name]["mean_accepted_block_size"] = tallies[name].tokens / max(1, tallies[name].iterations)
        report[name]["iterations"], report[name]["model_calls"] = tallies[name].iterations, tallies[name].model_calls
    mine = report[OURS]
    mine["speedup_over"] = {}
    for name, r in report.items():
        if name != OURS:
            r["exact_speedup"] = r["seconds"] / max(mine["seconds"], 1e-9)
            mine["speedup_over"][name] = r["exact_speedup"]
    if refused is not None:
        report[LOOKUP] = {"skipped": f"transformers refuses prompt lookup at batch size {batch_size}: {refused}"}
    report.update({name: {"skipped": failed[name]} for name in names if name in failed})
    return {name: report[name] for name in [*METHODS, *our_rows, *names]}


def run_or_drop(methods: dict[str, Any], failed: dict[str, str], name: str, device: torch.device, batch,
                batch_size: int, ours: Sequence[str] = METHODS) -> tuple[Any, float] | None:
    """``timed`` one method on ``batch``; a peer (not one of ``ours``: :data:`METHODS` and the tree rows) that raises
    is removed from ``methods`` with its reason in ``failed`` (None returned); our methods' errors propagate."""
    try:
        return timed(device, methods[name], batch.src, batch.max_len)
    except Exception as err:
        if name in ours:
            raise
        failed[name] = f"failed at batch size {batch_size}: {failure(err)}"
        del methods[name]
        return None


def check_hf(module, ckpt: str) -> None:
    from lightning_bpd.hf.base import HFSeq2SeqBlockwise

    if not isinstance(getattr(module, "model", None), HFSeq2SeqBlockwise):
        raise TypeError(f"{ckpt}: not a Hugging Face heads checkpoint ({type(module).__name__}); --peers generate "
                         "compares with transformers' generate: bench --ckpt CKPT --criteria ... times other checkpoints")


def run(args: argparse.Namespace, module: Any, prog: str = "bench") -> dict:
    """``bench --ckpt`` against the base's ``generate`` on ``module`` (loaded from ``args.ckpt``): a language model's
    (:func:`~lightning_bpd.commands.bench_generate_lm.main_lm`) or a seq2seq one's (see the module); ``args`` as
    :func:`~lightning_bpd.commands.bench.generate_args` makes them; errors are one line, ``<prog>: ...``."""
    if any(b < 1 for b in args.batch_sizes) or args.inputs < 1:
        sys.exit(f"{prog}: --batch-sizes and --limit must be >= 1")
    if args.warmup < 0:
        sys.exit(f"{prog}: --warmup must be >= 0")
    if hasattr(module, "encode_prompts"):  # a language model (heads or a drafter's run): prompts, llama.cpp
        return main_lm(module, args, prog)
    try:
        if args.input is None:
            raise ValueError("--input: give the source sentences, one per line")
        if "llamacpp" in args.peers or args.assistant:
            raise ValueError(f"--peers {'llamacpp' if 'llamacpp' in args.peers else 'assisted'} benches "
                             "language-modelling checkpoints; on a seq2seq base use --peers ctranslate2")
        check_hf(module, args.ckpt)
        if next(module.model.base.parameters()).dtype != torch.float32:
            print(f"{prog}: the base is {next(module.model.base.parameters()).dtype}: generate runs it so",
                  file=sys.stderr)
        options = options_from_args(args, module)
        runtime = build_runtime(module.model, options)
        if args.k is not None and not 1 <= args.k <= module.model.k:
            raise ValueError(f"--k must lie in [1, {module.model.k}] (the checkpoint's heads), got {args.k}")
        inputs = load_inputs(module, args)
        if not inputs:
            raise ValueError(f"{args.input}: no sentences")
        choices: dict[str, Any] = {}  # --tree-nodes auto's choices
        trees = {f"{OURS}+{name}": tree
                 for name, tree in budget_trees(module, runtime, inputs, args.tree_nodes, args.k, prog,
                                                min(args.batch_sizes), choices).items()}
    except (ValueError, TypeError, FileNotFoundError) as err:
        sys.exit(f"{prog}: {str(err).strip().splitlines()[0]}")
    peers: list[CT2Translator] = []
    failed: dict[str, str] = {}
    result: dict[str, Any] = {
        "ckpt": args.ckpt, "base": module.hparams.get("pretrained"), "model_type": module.model.base.config.model_type,
        "k": args.k or module.model.k, "head_type": module.model.head_type, "device": str(module.device),
        "device_name": device_name(module.device), "threads": torch.get_num_threads(), "inputs": len(inputs),
        "precision": runtime.precision, "options": runtime_options(options, args),
        "generate_dtype": str(next(module.model.base.parameters()).dtype),
        "methods": [*METHODS, *trees, OURS_LOOKUP], "tree_nodes": args.tree_nodes, "tree_nodes_auto": choices,
        "prompt_lookup_num_tokens": args.prompt_lookup_tokens, "max_matching_ngram_size": args.max_matching_ngram, "max_new_tokens": "the module's max_decode_len of each batch",
        "transformers_version": __import__("transformers").__version__, "batch_sizes": {}}
    if "ctranslate2" in args.peers:
        peers, result["peers"] = start_ct2(module, args.ct2_quantizations, args.device)
        failed = result["peers"]["failed"]  # grows if a peer fails while decoding
        for name, reason in failed.items():
            print(f"{prog}: CTranslate2 peer {name} skipped: {reason}", file=sys.stderr)
    print(f"device: {result['device_name']}; ours = exact blockwise decoding at precision {runtime.precision}; "
          "x ours = the method's seconds over ours; differ = sentences whose output differs from hf_generate's")
    print(f"{'batch':>5s} {'method':22s} {'s/input':>9s} {'tok/s':>8s} {'ms/tok':>7s} {'x ours':>7s} {'differ':>7s}")
    for bs in args.batch_sizes:
        report = bench_batch_size(module, runtime, inputs, bs, args, peers, failed, trees)
        result["batch_sizes"][str(bs)] = report
        for name, r in report.items():
            if "skipped" in r:
                print(f"{bs:5d} {name:22s} skipped: {r['skipped']}", flush=True)
                continue
            speed = f"{r['exact_speedup']:7.2f}" if "exact_speedup" in r else f"{'':>7s}"
            print(f"{bs:5d} {name:22s} {r['seconds_per_input_median']:9.4f} {r['tokens_per_second']:8.1f} "
                  f"{r['ms_per_output_token']:7.3f} {speed} {r.get('differs_from_hf_generate', ''):>7}", flush=True)
    if args.json:
        write_json(args.json, result)
    return result
