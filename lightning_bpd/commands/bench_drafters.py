"""``bench --run``: trained proposers of one base side by side, one table: several language-modelling runs on the
same frozen Hugging Face base (chained or Medusa heads, a DFlash or an EAGLE-3 drafter) decode the same prompts with
exact acceptance, batch by batch in turn with the base's own ``generate``, transformers' prompt lookup (``--peers
assisted:DRAFT``: and assisted generation) and ours (``bench-drafters`` is the old spelling:
:func:`lightning_bpd.commands.old_benches.bench_drafters`)::

    python -m lightning_bpd bench \\
        --run chained=runs/code-lm/frozen_distilled/last.ckpt --run medusa=runs/code-lm/medusa_distilled/last.ckpt \\
        --run dflash=runs/code-lm/dflash/last.ckpt --run eagle3=runs/code-lm/eagle3/last.ckpt \\
        --data-root ../shared/data/code/python-stdlib/Lib --split test --limit 64 --max-new-tokens 64 \\
        --batch-sizes 1 --tree-nodes 0 16 --precision float32-packed --json results/lm/code_lm_drafters.json

Rows: ``hf_generate``, ``hf_prompt_lookup`` (``hf_assisted`` with ``--peers assisted:DRAFT``, batch 1) and
``prompt_lookup`` (ours: n-grams of the prompt, exact, any batch); ``--run NAME=BASE@greedy``: our runtime's own greedy
(one token a call), against which every other row of ours is also counted (``differs_from_own_greedy``: the
reference at a precision whose greedy is not ``generate``'s, such as ``--precision int8``);
per run ``NAME`` (the heads' single path, the DFlash block, the EAGLE-3 chain; ``--k NAME=K`` its block, default the
run's) and, per ``--tree-nodes`` N > 0,
``NAME+nodes<N>`` (heads: the tree of N nodes from the run's rank agreement table) or ``NAME+tree<N>`` (EAGLE-3: a
dynamic tree of N nodes); a DFlash run has no tree rows. Per row: tokens per target call, seconds against
``generate``'s on the same batches, rows that differ from ``generate``'s (0 expected: every row is exact), and what
the run cost to train: its training minutes (the checkpoint's :class:`~lightning_bpd.callbacks.training_clock.
TrainingClock`: the training loop's wall clock less its validations, so at most about a run's ``max_time``; else
Lightning's ``Timer``, validations included; ``--minutes NAME=M`` for a run saved without either), steps, and the
proposer's own parameters (the heads or the drafter; the base's are not counted).

``--peers llamacpp:BIN`` adds llama.cpp's own binaries (:func:`~lightning_bpd.benchmarks.llamacpp_bin_peer.
start_llamacpp_runs`): the base alone once (``llamacpp_f32`` on a float32 ``target.gguf``, or ``llamacpp_<type>``,
e.g. ``llamacpp_q4_1``, on the runs' own ``.gguf`` target) and, for each run whose drafter kind llama.cpp runs, that
target with the run's drafter, ``llamacpp_f32+NAME`` (heads runs have none; a retrieval run: ``llama-lookup`` drafting
from its datastore as llama.cpp's lookup cache), timed by llama.cpp's clock at batch 1, its text compared with
generate's and with llama.cpp alone's (the table's last column, ``llamacpp.f32+NAME_vs_alone``); the record's
``llamacpp.pass_cost``: what a pass of n tokens costs llama.cpp there (``llama-bench``); ``--peers llamacpp`` without
BIN: llama-cpp-python, the base alone.

Every run must hold the same base (configuration and every weight), the same tokenizer and the same prompts (its
data split settings), else the command stops with one line that says which run differs: a table of proposers is a
comparison on one model.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

import torch

from lightning_bpd.benchmarks.lm_generate import ASSISTED, GENERATE, LOOKUP, bench_methods, load_assistant
from lightning_bpd.benchmarks.ours import our_greedy, ours, runtime_options
from lightning_bpd.commands.bench_generate_lm import (
    assistant_record,
    generate_methods,
    llamacpp_pairs,
    main_row,
    our_lookup,
    prepare,
)
from lightning_bpd.commands.bench_table import (
    GREEDY,
    OURS_LOOKUP,
    llamacpp_titles,
    markdown,
    run_record,
    table,
)
from lightning_bpd.drafters.registry import kind_of
from lightning_bpd.records import device_name, write_json

RESERVED = (GENERATE, LOOKUP, ASSISTED, OURS_LOOKUP)  # the reference rows' names


def named(pairs: list[str], what: str) -> dict[str, str]:
    """``NAME=VALUE`` pairs by name; ValueError (one line) on a malformed pair, a repeated name, or a name that is a
    reference row's or holds ``+`` (a tree row's separator)."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name or not value:
            raise ValueError(f"{what} takes NAME=VALUE, got {pair!r}")
        if name in RESERVED or "+" in name:
            raise ValueError(f"{what}: the name {name!r} is taken by a row of the table ({', '.join(RESERVED)}, "
                             "NAME+tree<N>): choose another")
        if name in out:
            raise ValueError(f"{what}: the name {name!r} is given twice")
        out[name] = value
    return out


def base_difference(ours_: Any, theirs: Any) -> str | None:
    """None if two Hugging Face bases are the same model (configuration and every weight), else what differs."""
    def settings(model: Any) -> dict[str, Any]:  # less where it was read from
        return {k: v for k, v in model.config.to_dict().items() if not k.startswith("_") and k != "transformers_version"}

    if settings(ours_) != settings(theirs):
        return "another configuration"
    mine, other = ours_.state_dict(), theirs.state_dict()
    if mine.keys() != other.keys():
        return "other weights"
    for key, value in mine.items():
        if not torch.equal(value, other[key]):
            return f"other weights ({key})"
    return None


def base_only(path: str, spelling: str | None) -> bool:
    """Whether ``--run NAME=PATH@PROPOSER`` names a bare base (a ``.gguf`` file, or a Hugging Face folder without
    ``heads.json``) for a proposer that reads only the base (``prompt-lookup``, ``retrieval:FILE``) or ``greedy``."""
    from lightning_bpd.commands.proposer_option import base_only_kind
    from lightning_bpd.hf.gguf_target import is_gguf

    if base_only_kind(spelling) is None and spelling != GREEDY:
        return False
    folder = Path(path)
    return is_gguf(path) or (folder.is_dir() and (folder / "config.json").is_file()
                             and not (folder / "heads.json").is_file())


def base_run(path: str, device: str) -> Any:
    """A bare base as a run for a proposer that reads only the base: the LM module of it with two untrained heads
    (the smallest frozen-base module; its heads never propose)."""
    from lightning_bpd.tasks.lm import LMModule

    return LMModule(path, k=2).eval().to(device)


def split_run(value: str) -> tuple[str, str | None]:
    """``CKPT[@PROPOSER]`` (a ``--run`` value less ``NAME=``) as the checkpoint and the proposer's spelling (None:
    the run's own: its heads, or its drafter)."""
    ckpt, at, spelling = value.rpartition("@")
    return (ckpt, spelling.strip()) if at and ckpt and spelling.strip() else (value, None)


def spelled_row(name: str, module: Any, spelling: str, runtime: Any, trees: dict[str, Any], k: int | None) -> Callable:
    """Run ``name``'s row under ``--run NAME=CKPT@PROPOSER``: a drafter's spelling (its kind's, e.g. ``dynamic:16``),
    the heads' ``tree:N`` / ``dynamic:N`` (built by ``prepare``, in ``trees``), ``prompt-lookup[:N:T]`` or
    ``retrieval:FILE`` on the run's base, or ``greedy`` (our runtime's greedy); ValueError (one line) for another."""
    from lightning_bpd.commands.proposer_option import proposer_arg

    if spelling == GREEDY:  # our runtime's greedy: one token a call, the rows' reference at its precision
        return our_greedy(runtime)
    try:
        choice = proposer_arg(spelling)
    except argparse.ArgumentTypeError as err:
        raise ValueError(str(err)) from None
    if choice.on_base:  # prompt lookup, retrieval: on the run's base, its heads or drafter unused
        return ours(runtime, None, **choice.method_kwargs(getattr(module, "tokenizer", None)))
    drafting = kind_of(module)
    if drafting is not None:
        return ours(runtime, None, proposer=drafting.proposer(module.drafter, runtime, spelling, k,
                                                              f"the drafter of run {name}"))
    if choice.kind == "tree" and choice.auto is None:
        tree = choice.tree(module.rank_agreement, k or module.model.k) if choice.nodes is None else next(
            iter(trees.values()), None)
        return ours(runtime, None, tree)
    if choice.kind == "heads":
        return ours(runtime, None)
    raise ValueError(f"--run {name}=...@{spelling}: a run's proposer is heads, tree:N, tree:PATHS, dynamic:N, "
                     "prompt-lookup[:N:T], retrieval:FILE[:NODES[:DEPTH[:INPUTS]]], greedy or its drafter kind's spellings")


def run_rows(name: str, module: Any, args: argparse.Namespace, k: int | None = None, spelling: str | None = None
             ) -> tuple[dict[str, Callable], list[str], Any]:
    """A run's rows of ours by name (``NAME``, ``NAME+nodes<N>``, ``NAME+tree<N>``) with block ``k`` (None: the
    run's), or under ``spelling`` (``@PROPOSER``) its one row ``NAME``; the prompts it reads and (the new tokens, the
    runtime's options, the runtime); ValueError (one line) on bad input."""
    if spelling is not None:
        from lightning_bpd.commands.proposer_option import proposer_arg

        try:
            choice = proposer_arg(spelling) if kind_of(module) is None and spelling != GREEDY else None
        except argparse.ArgumentTypeError as err:
            raise ValueError(str(err)) from None
        mine = copy.copy(args)
        mine.tree_nodes = [choice.nodes] if choice is not None and choice.nodes else []
        mine.peers, mine.llamacpp_bin, mine.assistant, mine.k = [], None, None, k
        if kind_of(module) is not None:
            mine.tree_nodes = []
        max_new, prompts, options, runtime, trees, _, _ = prepare(module, mine)
        row = spelled_row(name, module, spelling, runtime, trees, k)
        return {name: row}, prompts, (max_new, options, runtime)
    mine = copy.copy(args)
    mine.peers, mine.llamacpp_bin, mine.assistant, mine.k = [], None, None, k
    # NAME is the single path already (0 nodes); a drafter that grows no trees proposes single blocks
    drafting = kind_of(module)
    mine.tree_nodes = [] if drafting is not None and not drafting.trees else [n for n in args.tree_nodes if n != 0]
    max_new, prompts, options, runtime, trees, _, drafter = prepare(module, mine)
    rows: dict[str, Callable] = {}
    if drafter:
        main = main_row(module)
        for row, proposer in drafter.items():
            rows[name + row.removeprefix(main)] = ours(runtime, None, proposer=proposer)
    else:
        rows[name] = ours(runtime, None)
        for row, tree in trees.items():
            rows[f"{name}+{row.split('+', 1)[1]}"] = ours(runtime, None, tree)
    return rows, prompts, (max_new, options, runtime)


def run(args: argparse.Namespace, prog: str = "bench") -> dict[str, Any]:
    """The one table of ``args.run`` (``NAME=CKPT[@PROPOSER]`` each) on one base (see the module); errors are one
    line, ``<prog>: ...``."""
    from lightning_bpd.checkpoints import load_error, load_model

    try:
        if min(args.batch_sizes) < 1 or args.inputs < 1:
            raise ValueError("--batch-sizes and --limit take integers >= 1")
        paths, minutes, ks = named(args.run, "--run"), named(args.minutes, "--minutes"), named(args.run_k, "--k")
        spellings = {}
        for name, value in paths.items():
            paths[name], spelling = split_run(value)
            if spelling is not None:
                spellings[name] = spelling
        taken = [name for name in paths if name.startswith("llamacpp_")]
        if taken and getattr(args, "llamacpp", None) is not None:
            raise ValueError(f"--run: the name {taken[0]!r} is taken by llama.cpp's rows (llamacpp_<weights>, "
                             "llamacpp_<weights>+NAME): choose another")
        for option, given in (("--minutes", minutes), ("--k", ks)):
            unknown = sorted(set(given) - set(paths))
            if unknown:
                raise ValueError(f"{option} names no --run: {', '.join(unknown)}")
        for option, given, kind in (("--minutes", minutes, float), ("--k", ks, int)):
            for name, value in given.items():
                try:
                    kind(value)
                except ValueError:
                    raise ValueError(f"{option} {name}={value}: not a{'n integer' if kind is int else ' number'}") \
                        from None
    except ValueError as err:
        sys.exit(f"{prog}: {err}")
    modules: dict[str, Any] = {}
    for name, path in paths.items():
        try:
            modules[name] = base_run(path, args.device) if base_only(path, spellings.get(name)) else \
                load_model(path, args.device)
        except (ValueError, OSError, KeyError, RuntimeError, TypeError) as err:
            bare = " (or, with @greedy, @prompt-lookup or @retrieval:FILE, a .gguf or Hugging Face folder)" if \
                isinstance(err, FileNotFoundError) and not Path(path).exists() else ""
            sys.exit(f"{prog}: --run {name}={path}: {load_error(err)}{bare}")
    first_name, first = next(iter(modules.items()))
    from lightning_bpd.hf.causal import HFCausalBlockwise

    methods: dict[str, Callable] = {}
    ours_rows: list[str] = []
    runs: dict[str, dict[str, Any]] = {}
    row_run: dict[str, str] = {}
    prompts = setting = None
    for name, module in modules.items():
        where = f"--run {name}={paths[name]}"
        if not isinstance(getattr(module, "model", None), HFCausalBlockwise):
            sys.exit(f"{prog}: {where}: not a run on a Hugging Face causal base (generate is the reference)")
        differs = base_difference(first.model.base, module.model.base)
        if differs is None and first.tokenizer.get_vocab() != module.tokenizer.get_vocab():
            differs = "another tokenizer"
        if differs is not None:
            sys.exit(f"{prog}: {where}: its base is not run {first_name}'s ({differs}); the table compares "
                     "proposers of one frozen base")
        try:
            args.ckpt = paths[name]
            rows, its_prompts, its_setting = run_rows(name, module, args, int(ks[name]) if name in ks else None,
                                                      spellings.get(name))
        except (ValueError, TypeError, OSError) as err:
            sys.exit(f"{prog}: {where}: {str(err).strip().splitlines()[0]}")
        if prompts is None:
            prompts, setting = its_prompts, its_setting
        elif its_prompts != prompts:
            sys.exit(f"{prog}: {where}: its prompts differ from run {first_name}'s (another data split or "
                     "prompt length): give --prompt-tokens and --suffixes")
        methods.update(rows)
        ours_rows += list(rows)
        row_run.update({row: name for row in rows})
        runs[name] = run_record(paths[name], module, int(ks[name]) if name in ks else None, minutes.get(name),
                                spellings.get(name))
    max_new, options, runtime = setting  # the first run's: our prompt lookup runs its base
    model = first.model
    draft = None
    if getattr(args, "assistant", None):
        try:
            draft = load_assistant(args.assistant, first, prompts, args.device)
        except (ValueError, OSError) as err:
            sys.exit(f"{prog}: {str(err).strip().splitlines()[0]}")
    methods = {**generate_methods(model, args, draft), **methods, OURS_LOOKUP: our_lookup(runtime, args)}
    result: dict[str, Any] = {
        "runs": runs, "base": first.hparams.get("pretrained"), "model_type": model.base.config.model_type,
        "generate_dtype": str(next(model.base.parameters()).dtype),
        "device": str(first.device), "device_name": device_name(first.device), "threads": torch.get_num_threads(),
        "inputs": len(prompts), "prompts_from": args.input or f"{args.data_root} ({args.split} split)",
        "max_new_tokens": max_new, "options": runtime_options(options, args), "tree_nodes": args.tree_nodes,
        "prompt_lookup_num_tokens": args.prompt_lookup_tokens, "max_matching_ngram_size": args.max_matching_ngram,
        **({"assistant": assistant_record(draft, args.assistant)} if draft is not None else {}),
        "transformers_version": __import__("transformers").__version__, "methods": list(methods),
        "batch_sizes": {}, "tables": {}}
    print(f"device: {result['device_name']}; {len(prompts)} prompts, at most {max_new} new tokens; every row of ours "
          "exact; x gen = generate's seconds over the row's", flush=True)
    with TemporaryDirectory(prefix="lightning_bpd_gguf_") as tmp:
        binaries: dict[str, Any] = {}
        if getattr(args, "llamacpp", None) is not None:
            binaries = llamacpp_rows(modules, prompts, args, tmp, {name: int(k) for name, k in ks.items()}, result,
                                     prog, spellings)
            methods.update(binaries)
            row_run.update({row: d["run"] for row, d in result["llamacpp"].get("drafters", {}).items()})
            result["methods"] = list(methods)
        titles = llamacpp_titles(result.get("llamacpp"), runs, row_run)
        for bs in args.batch_sizes:
            batches = [first.encode_prompts(prompts[i : i + bs]) for i in range(0, len(prompts), bs)]
            report = bench_methods(methods, batches, max_new, args.warmup, [*ours_rows, OURS_LOOKUP],
                                   peers=[name for name in methods if name.startswith("llamacpp")],
                                   own_greedy=next((n for n, s in spellings.items() if s == GREEDY), None))
            result["batch_sizes"][str(bs)] = report
            alone = llamacpp_pairs(result.get("llamacpp"), binaries, report)
            rows = table(report, runs, row_run, titles, alone)
            result["tables"][str(bs)] = rows
            print(f"\nbatch size {bs}\n" + markdown(rows), flush=True)
    if args.json:
        write_json(args.json, result)
    return result


def llamacpp_rows(modules: dict[str, Any], prompts: list[str], args: argparse.Namespace, tmp: str,
                  ks: dict[str, int], result: dict[str, Any], prog: str,
                  spellings: dict[str, str] | None = None) -> dict[str, Any]:
    """``--peers llamacpp[:BIN]``'s rows of the runs ``modules`` (their record in ``result["llamacpp"]``): with BIN,
    llama.cpp's binaries alone, with each drafter llama.cpp runs and with each retrieval run's datastore (``spellings``:
    a run's ``@PROPOSER``) (:func:`~lightning_bpd.benchmarks.llamacpp_bin_peer.start_llamacpp_runs`), else
    llama-cpp-python alone; a refusal is one line."""
    threads = args.llamacpp_threads or torch.get_num_threads()
    first = next(iter(modules.values()))
    if args.llamacpp:
        from lightning_bpd.benchmarks.llamacpp_bin_peer import start_llamacpp_runs
        from lightning_bpd.commands.proposer_option import proposer_arg

        datastores = {}
        for name, spelling in (spellings or {}).items():
            if spelling.startswith("retrieval:"):
                choice = proposer_arg(spelling)
                datastores[name] = (str(choice.ckpt), choice.tree_size[1])  # the file, the tree's depth
        try:
            methods, result["llamacpp"] = start_llamacpp_runs(modules, prompts, args.llamacpp, threads,
                                                              args.gguf or tmp, ks, datastores,
                                                              getattr(args, "llamacpp_float32", False))
        except (ValueError, RuntimeError, OSError) as err:
            sys.exit(f"{prog}: llama.cpp peer refused: {str(err).strip().splitlines()[0]}")
        for name, why in result["llamacpp"]["no_drafter"].items():
            print(f"{prog}: run {name}: no llama.cpp row with its drafter ({why})", file=sys.stderr)
        return methods
    from lightning_bpd.benchmarks.llamacpp_peer import LLAMACPP, start_llamacpp

    peer, result["llamacpp"] = start_llamacpp(first, prompts, threads, Path(args.gguf or tmp) / "model.gguf")
    if peer is None:
        sys.exit(f"{prog}: llama.cpp peer refused: {result['llamacpp']['skipped']}")
    if any(kind_of(module) is not None for module in modules.values()):
        print(f"{prog}: llama-cpp-python runs the base alone; llama.cpp with a run's drafter needs its binaries: "
              "--peers llamacpp:BIN (a build-llamacpp folder)", file=sys.stderr)
    return {LLAMACPP: peer}
