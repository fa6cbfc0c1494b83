"""``bench --ckpt`` on a language-modelling checkpoint (an ``LMModule`` run, a heads folder or a drafter's run): the
base's own ``generate`` and its peers against our exact blockwise decoding, on the same prompts, in one run (once
``bench-generate``).

    python -m lightning_bpd bench --ckpt runs/code-lm/heads/last.ckpt \\
        --data-root ../shared/data/code/python-stdlib/Lib --split test --limit 64 --max-new-tokens 64 \\
        --batch-sizes 1 32 --peers generate,prompt-lookup,assisted:runs/code-lm/draft-export,llamacpp \\
        --json results/lm_generate.json

Methods (:mod:`lightning_bpd.benchmarks.lm_generate`): ``hf_generate`` (greedy, the checkpoint's own generation
config; batch 1 and larger, left-padded ragged batches), ``hf_prompt_lookup`` (``prompt_lookup_num_tokens``, batch
1), ``hf_assisted`` (``--peers assisted:DRAFT``: a local Hugging Face causal LM directory with the checkpoint's tokenizer, or an
LM run's checkpoint whose base is the draft; ``assistant_model=``, batch 1), ``exact`` (ours, through the inference
runtime with ``--precision``, ``--proposal-precision``, ``--draft-vocab``; ``exact+nodes<N>`` per ``--tree-nodes``),
``prompt_lookup`` (ours: :class:`~lightning_bpd.decoding.proposers.PromptLookup` with generate's n-gram size and token
count, exact, at every batch size); on a DFlash drafter's checkpoint (a fit with ``conf/lm/dflash.yaml``; ``--base
DIR`` where its target moved) ``dflash`` replaces ``exact``: exact acceptance of the target through the inference
runtime at ``--precision``, the drafter proposing (:class:`~lightning_bpd.decoding.proposers.DFlash`; ``--k`` its
block size, default the drafter's), and the ``generate`` rows run the target
and, with ``--peers llamacpp``, ``llamacpp_f32`` (:mod:`lightning_bpd.benchmarks.llamacpp_peer`: the base written as
a float32 GGUF, greedy in llama.cpp with ``--llamacpp-threads`` threads, batch 1; the GGUF must tokenize every prompt
as the checkpoint's tokenizer does, else the command stops with one line). With ``--peers llamacpp:DIR`` (a
``build-llamacpp`` folder) the llama.cpp rows are its own binary instead (:mod:`lightning_bpd.benchmarks.llamacpp_bin_peer`):
``llamacpp_f32``, the target alone, and on a drafter's checkpoint the target + our drafter: ``llamacpp_dflash``
(DFlash, ``--spec-type draft-dflash``) or ``llamacpp_eagle3`` (EAGLE-3, ``--spec-type draft-eagle3``), drafting
``--k`` - 1 tokens per step (default: the drafter's block or chain, as our row), both timed by llama.cpp's own clock
(loading excluded), their ``block`` the tokens per target call, their text compared with generate's and with each
other (``llamacpp.dflash_vs_alone`` / ``llamacpp.eagle3_vs_alone`` in the record). Where the run's target is a
``.gguf`` file (say a Q4_1 one), llama.cpp runs on that file too: ``llamacpp_q4_1`` alone and ``llamacpp_q4_1_dflash``
(or ``_eagle3``) with our drafter, compared with each other (``llamacpp.q4_1_dflash_vs_alone``; their text differs
from generate's float32 as the weights do; ``llamacpp.rows`` names each row's GGUF)::

    python -m lightning_bpd bench --ckpt runs/code-lm/dflash/last.ckpt \\
        --data-root ../shared/data/code/python-stdlib/Lib --split test --limit 16 --max-new-tokens 64 \\
        --batch-sizes 1 --peers generate,prompt-lookup,llamacpp:../llamacpp-build --llamacpp-threads 1

Prompts: ``--input FILE.jsonl`` (``{"prompt": ...}`` per line) or ``--data-root DIR``: the LM data module's held-out
prompts (line-aligned windows of the ``--split`` files, :meth:`~lightning_bpd.tasks.lm.LMDataModule.eval_prompts`),
split as the run split them (suffixes, fractions and ``prompt_tokens`` read from a ``.ckpt``'s data settings; the
flags override). The first ``--limit`` prompts; each continued by at most ``--max-new-tokens`` (default: the
module's ``max_new_tokens``).

Per batch size and method: seconds per prompt (median, interquartile range), tokens per second, ms per new token,
``speedup_over_hf_generate`` (generate's seconds over the method's), for ours ``speedup_over`` every other method
and the mean accepted block size, and ``differs_from_hf_generate``: rows whose new tokens differ from generate's
(expected 0 for ours in float32, for prompt lookup and assisted generation; llama.cpp may differ by float rounding).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from lightning_bpd.benchmarks.llamacpp_bin_peer import agreement, agreement_line, pair_key
from lightning_bpd.benchmarks.lm_generate import (
    ASSISTED,
    GENERATE,
    LOOKUP,
    OURS,
    LMGenerate,
    bench_methods,
    load_assistant,
)
from lightning_bpd.benchmarks.lm_prompts import lm_prompts, new_tokens
from lightning_bpd.benchmarks.ours import ours, runtime_options
from lightning_bpd.commands.bench_table import OURS_LOOKUP, llamacpp_titles, run_record, table
from lightning_bpd.drafters.registry import kind, kind_of
from lightning_bpd.records import device_name, write_json


def main_row(module: Any) -> str:
    """The name of our main row: ``exact`` with the heads, the kind's name (``dflash``, ``eagle3``, ...) with a
    drafter (:func:`~lightning_bpd.drafters.registry.kind_of`)."""
    found = kind_of(module)
    return OURS if found is None else found.name


def drafter_rows(module: Any, runtime: Any, args: argparse.Namespace) -> dict[str, Any]:
    """A drafter checkpoint's rows of ours, by name, each a proposer (its kind's
    :meth:`~lightning_bpd.drafters.common.kind.DrafterKind.bench_rows`: ``NAME`` with blocks of ``--k``, default the
    run's, and where the kind grows trees ``NAME+tree<N>`` per ``--tree-nodes`` N > 0); one-line ValueError where
    ``--k`` or ``--tree-nodes`` does not fit."""
    return kind_of(module).bench_rows(module, runtime, args.k, args.tree_nodes, f"the drafter of {args.ckpt}")


def assistant_record(draft: Any, path: str) -> dict[str, Any]:
    """The draft model and the settings of transformers' assisted loop it brings (its generation config's, else
    transformers' defaults)."""
    config = draft.generation_config
    defaults = getattr(type(config), "_get_default_generation_params", dict)()
    settings = {key: getattr(config, key, None) if getattr(config, key, None) is not None else defaults.get(key)
                for key in ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")}
    return {"path": path, "model_type": draft.config.model_type, "layers": draft.config.num_hidden_layers,
            "parameters": sum(p.numel() for p in draft.parameters()), **settings}


def print_header(result: dict[str, Any], precision: str) -> None:
    drafter = kind(result["head_type"]).title if result.get("drafter") else None
    what = f"exact with the {drafter} drafter" if drafter else "exact blockwise decoding"
    print(f"device: {result['device_name']}; ours = {what} at precision {precision}; "
          f"{result['inputs']} prompts, at most {result['max_new_tokens']} new tokens; x gen = generate's seconds over "
          "the method's; x ours = the method's seconds over ours; differ = rows whose tokens differ from hf_generate's")
    print(f"{'batch':>5s} {'method':22s} {'s/input':>9s} {'tok/s':>8s} {'ms/tok':>7s} {'x gen':>6s} {'x ours':>6s} "
          f"{'block':>6s} {'differ':>6s}")


def print_rows(batch_size: int, report: dict[str, Any], mine: str = OURS) -> None:
    for name, r in report.items():
        if "skipped" in r:
            print(f"{batch_size:5d} {name:22s} skipped: {r['skipped']}", flush=True)
            continue
        ours = report.get(mine, {}).get("speedup_over", {}).get(name)
        block = f"{r['mean_accepted_block_size']:6.2f}" if "mean_accepted_block_size" in r else f"{'':>6s}"
        print(f"{batch_size:5d} {name:22s} {r['seconds_per_input_median']:9.4f} {r['tokens_per_second']:8.1f} "
              f"{r['ms_per_output_token']:7.3f} {r['speedup_over_hf_generate']:6.2f} "
              f"{'' if ours is None else f'{ours:6.2f}':>6s} {block} {r.get('differs_from_hf_generate', ''):>6}",
              flush=True)


def generate_methods(model: Any, args: argparse.Namespace, draft: Any = None) -> dict[str, Any]:
    """The base's own ``generate`` rows: greedy, prompt lookup and assisted generation (with ``draft``), by name."""
    eos = list(model.generation_rules.eos_ids or [model.eos_id])
    return {
        GENERATE: LMGenerate(model.base, model.pad_id, eos),
        LOOKUP: LMGenerate(model.base, model.pad_id, eos, lookup=(args.prompt_lookup_tokens, args.max_matching_ngram)),
        **({ASSISTED: LMGenerate(model.base, model.pad_id, eos, assistant=draft)} if draft is not None else {}),
    }


def our_lookup(runtime: Any, args: argparse.Namespace) -> Any:
    """Our prompt lookup's row (any batch size; the same n-gram size and token count as generate's)."""
    from lightning_bpd.decoding.proposers import PromptLookup

    return ours(runtime, None, proposer=PromptLookup(args.max_matching_ngram, args.prompt_lookup_tokens))


def lm_methods(model: Any, runtime: Any, args: argparse.Namespace, trees: dict[str, Any],
               draft: Any, dflash: dict[str, Any] | None = None) -> dict[str, Any]:
    """generate greedy, prompt lookup, assisted generation (with ``draft``), ours (``dflash``: a drafter's rows by
    name, :func:`drafter_rows`), ours per tree and our prompt lookup (:func:`our_lookup`), by name."""
    return {
        **generate_methods(model, args, draft),
        **({name: ours(runtime, None, proposer=p) for name, p in dflash.items()} if dflash
           else {OURS: ours(runtime, args.k)}),
        **{name: ours(runtime, args.k, tree) for name, tree in trees.items()},
        OURS_LOOKUP: our_lookup(runtime, args),
    }


def prepare(module: Any, args: argparse.Namespace) -> tuple[int, list[str], Any, Any, dict[str, Any], Any, Any]:
    """The cap, the prompts, the inference options, the runtime, the trees, the draft model (or None) and a drafter
    checkpoint's rows (:func:`drafter_rows`, else None); ValueError (one line) on bad input."""
    from lightning_bpd.evaluation import budget_trees
    from lightning_bpd.inference import build_runtime
    from lightning_bpd.inference.arguments import options_from_args

    model = module.model
    if "ctranslate2" in args.peers:
        raise ValueError("--peers ctranslate2 benches seq2seq checkpoints; on a language model use --peers llamacpp[:BIN]")
    max_new = new_tokens(module, args)
    prompts = lm_prompts(module, args, max_new)
    drafting = kind_of(module)
    if drafting is not None:  # --tree-nodes it cannot take: one line before the runtime is built
        drafting.check_tree_nodes(args.tree_nodes)
    if drafting is None and args.k is not None and not 1 <= args.k <= model.k:
        raise ValueError(f"--k must lie in [1, {model.k}] (the checkpoint's heads), got {args.k}")
    options = options_from_args(args, module)
    runtime = build_runtime(model, options)
    dflash = drafter_rows(module, runtime, args) if drafting is not None else None
    singles = [module.encode_prompts([p]) for p in prompts]
    budgets = {} if dflash else budget_trees(module, runtime, singles, args.tree_nodes, args.k, "bench")
    trees = {f"{OURS}+{name}": tree for name, tree in budgets.items()}
    draft = load_assistant(args.assistant, module, prompts, args.device) if args.assistant else None
    return max_new, prompts, options, runtime, trees, draft, dflash


def llamacpp_pairs(info: dict[str, Any] | None, binaries: dict[str, Any], report: dict[str, Any]) -> dict[str, int]:
    """llama.cpp's drafted rows against its alone rows (``info["pairs"]``, e.g. ``llamacpp_f32`` and
    ``llamacpp_dflash``) where both ran in ``report`` (batch 1): each :func:`~lightning_bpd.benchmarks.
    llamacpp_bin_peer.agreement` recorded in ``info`` (``dflash_vs_alone``) and printed; the drafted rows' counts of
    rows whose text differs from alone's."""
    differs: dict[str, int] = {}
    for alone, drafted in (info or {}).get("pairs", []):
        if any("skipped" in report.get(row, {"skipped": ""}) for row in (alone, drafted)):
            continue
        agreed = info[pair_key(drafted)] = agreement(binaries[alone], binaries[drafted], alone)
        differs[drafted] = agreed[f"differs_from_{alone}"]
        print(agreement_line(agreed, alone), flush=True)
    return differs


def main_lm(module: Any, args: argparse.Namespace, prog: str = "bench") -> dict[str, Any]:
    """``bench --ckpt CKPT --peers generate,...`` on a language-modelling ``module`` (loaded by the command from
    ``args.ckpt``); errors are one line, ``<prog>: ...``."""
    from lightning_bpd.hf.causal import HFCausalBlockwise

    model = module.model
    if not isinstance(model, HFCausalBlockwise):
        sys.exit(f"{prog}: {args.ckpt}: a run of our own decoder-only base, which has no transformers generate "
                 "to compare with (this bench needs a Hugging Face base)")
    try:
        max_new, prompts, options, runtime, trees, draft, dflash = prepare(module, args)
    except (ValueError, TypeError, OSError) as err:
        sys.exit(f"{prog}: {str(err).strip().splitlines()[0]}")
    methods = lm_methods(model, runtime, args, trees, draft, dflash)
    mine = main_row(module)
    result: dict[str, Any] = {
        "ckpt": args.ckpt, "base": module.hparams.get("pretrained"), "model_type": model.base.config.model_type,
        "k": dflash[mine].width if dflash else args.k or model.k,
        "head_type": mine if dflash else model.head_type,
        "drafter": module.drafter.config.to_dict() if dflash is not None else None, "device": str(module.device),
        "device_name": device_name(module.device), "threads": torch.get_num_threads(), "inputs": len(prompts),
        "prompts_from": args.input or f"{args.data_root} ({args.split} split)", "max_new_tokens": max_new,
        "precision": runtime.precision, "options": runtime_options(options, args),
        "generate_dtype": str(next(model.base.parameters()).dtype), "tree_nodes": args.tree_nodes,
        "prompt_lookup_num_tokens": args.prompt_lookup_tokens, "max_matching_ngram_size": args.max_matching_ngram,
        "assistant": assistant_record(draft, args.assistant) if draft is not None else None,
        "transformers_version": __import__("transformers").__version__, "batch_sizes": {}}
    with TemporaryDirectory(prefix="lightning_bpd_gguf_") as tmp:
        binaries: dict[str, Any] = {}
        if "llamacpp" in args.peers:
            threads = args.llamacpp_threads or torch.get_num_threads()
            if args.llamacpp_bin:
                from lightning_bpd.benchmarks.llamacpp_bin_peer import start_llamacpp_bin

                try:
                    binaries, result["llamacpp"] = start_llamacpp_bin(module, prompts, args.llamacpp_bin, threads,
                                                                      args.gguf or tmp, block_size=args.k)
                except (ValueError, RuntimeError, OSError) as err:
                    sys.exit(f"{prog}: llama.cpp peer refused: {str(err).strip().splitlines()[0]}")
                methods.update(binaries)
            else:
                from lightning_bpd.benchmarks.llamacpp_peer import LLAMACPP, start_llamacpp

                peer, result["llamacpp"] = start_llamacpp(module, prompts, threads,
                                                          args.gguf or Path(tmp) / "model.gguf")
                if peer is None:
                    sys.exit(f"{prog}: llama.cpp peer refused: {result['llamacpp']['skipped']}")
                methods[LLAMACPP] = peer
            own = result["llamacpp"].get("own_gguf") or {}
            ggufs = ", ".join(dict.fromkeys(Path(p).name for p in result["llamacpp"].get("rows", {}).values()
                                            if not own.get("tokenization_differs") or p != own.get("gguf")))
            print(f"{prog}: llama.cpp tokenizes all {len(prompts)} prompts{f' with {ggufs}' if ggufs else ''} "
                  "as the checkpoint's tokenizer does", file=sys.stderr)
            if own.get("tokenization_differs"):
                print(f"{prog}: with {Path(own['gguf']).name} (its own pre-tokenizer) llama.cpp tokenizes "
                      f"{own['tokenization_differs']} of {len(prompts)} prompts otherwise than the checkpoint's "
                      "tokenizer (transformers' reading of that file): its rows are compared with each other only",
                      file=sys.stderr)
        result["methods"] = list(methods)
        # the one table's record, as bench --run writes it: this checkpoint is its one run, named by its main row
        ours_rows = [*(dflash or [mine]), *trees]
        row_run = {row: mine for row in [*ours_rows, *(pair[1] for pair in result.get("llamacpp", {}).get("pairs", []))]}
        result["runs"] = {mine: run_record(args.ckpt, module, args.k)}
        result["tables"] = {}
        titles = llamacpp_titles(result.get("llamacpp"), result["runs"], row_run)
        print_header(result, runtime.precision)
        for bs in args.batch_sizes:
            batches = [module.encode_prompts(prompts[i : i + bs]) for i in range(0, len(prompts), bs)]
            report = bench_methods(methods, batches, max_new, args.warmup, [*ours_rows, OURS_LOOKUP],
                                   peers=[name for name in methods if name.startswith("llamacpp")])
            result["batch_sizes"][str(bs)] = report
            print_rows(bs, report, mine)
            alone = llamacpp_pairs(result.get("llamacpp"), binaries, report)
            result["tables"][str(bs)] = table(report, result["runs"], row_run, titles, alone)
    if args.json:
        write_json(args.json, result)
    return result
