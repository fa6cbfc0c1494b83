"""``python -m lightning_bpd bench``: wall-clock greedy vs blockwise decoding of a checkpoint.

For every batch size, the inputs are cut into batches and every batch is decoded by each method in
turn (the baselines first, then each method), so slow drifts of the machine hit all methods alike.
Prints a table and writes JSON: seconds per input (median and interquartile range over batches),
tokens per second, iterations, model calls, mean accepted block size, speedup over the method's
baseline, the efficiency (speedup / mean accepted block size: 1.0 would be a verify pass as cheap as
a greedy step) and, for deterministic rules, whether every output equals greedy's.

Methods (``--criteria``): a criterion (exact, top2, eps2, ...) decodes blockwise with the model's
heads, against greedy; ``sample_t0.7[_p0.9]`` is lossless speculative sampling with the heads,
against cached ancestral sampling at the same temperature and top-p (``ancestral_t0.7``, added
automatically); ``draft:<criterion>`` lets the ``--draft`` checkpoint propose instead of the heads.

    python -m lightning_bpd bench --ckpt runs/m30k-k8-finetune/last.ckpt --input src.en \\
        --criteria exact top2 --batch-sizes 1 32 --limit 100 --json results/bench.json
    python -m lightning_bpd bench --ckpt runs/m30k-k8-frozen/last.ckpt --draft runs/m30k-draft/last.ckpt \\
        --input src.en --criteria exact draft:exact sample_t1 draft:sample_t1 --batch-sizes 1

Against a Hugging Face base's own ``generate`` (what ``bench-generate`` did, which still runs with one deprecation
line): ``--ckpt`` a Hugging Face heads run, a ``save_heads`` folder or a drafter kind's run (``--base DIR`` where its
target moved) with ``--peers`` (a language model's checkpoint always; a seq2seq one when ``--peers`` is given) decodes
the same inputs with ``generate`` (greedy, the reference of every row), transformers' prompt lookup and ours (exact,
with the heads or the drafter; ``--tree-nodes`` rows; our prompt lookup), and the peers asked for: ``assisted:DRAFT``
(transformers' assisted generation with that draft model, batch 1), ``llamacpp[:BIN]`` (llama.cpp on the base written
as a float32 GGUF: llama-cpp-python, or BIN's ``llama-speculative-simple`` from ``build-llamacpp``, alone and with a
drafter checkpoint's drafter; ``--llamacpp-threads``, ``--gguf``), ``ctranslate2[:QUANT]`` (a seq2seq base converted
by CTranslate2, float32 and int8 unless QUANT names one; repeat it for several) (:mod:`lightning_bpd.commands.
bench_generate`; its record: ``hf_generate``, ``hf_prompt_lookup``, ``exact`` or the kind's row, ...)::

    python -m lightning_bpd bench --ckpt runs/code-lm/frozen/last.ckpt --data-root ../shared/data/code/python-stdlib/Lib \\
        --split test --limit 64 --max-new-tokens 64 --batch-sizes 1 32 \\
        --peers generate,prompt-lookup,assisted:runs/code-lm/draft-export,llamacpp --json results/lm_generate.json

Runs of one Hugging Face causal base (heads, or any registered drafter kind's run) go in one table with ``--run
NAME=CKPT[@PROPOSER]`` (repeated; what ``bench-drafters`` did, which still runs with one deprecation line): every
row exact and counted against the base's own ``generate``, transformers' prompt lookup (``--peers
generate,prompt-lookup[:NGRAM:TOKENS]``, default 2:10; ``assisted:DRAFT`` adds assisted generation) and ours, each
run with its training cost (:mod:`lightning_bpd.commands.bench_drafters`); ``--k NAME=K`` a run's block,
``--tree-nodes`` its tree rows; ``llamacpp[:BIN]`` llama.cpp on the base alone once and, with BIN, with each run's
drafter that llama.cpp runs (``llamacpp_f32+NAME``; ``--llamacpp-threads``, ``--gguf``); ``ctranslate2`` is for
seq2seq bases. ``--ckpt`` on a causal base records the same table (``runs``, ``tables``), its checkpoint the one run::

    python -m lightning_bpd bench --run heads=runs/code-lm/frozen/last.ckpt --run dflash=runs/code-lm/dflash/last.ckpt \\
        --run e3=runs/code-lm/eagle3/last.ckpt@dynamic:16 --data-root ../shared/data/code/python-stdlib/Lib \\
        --split test --limit 64 --max-new-tokens 64 --batch-sizes 1 --device cpu
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

from lightning_bpd.benchmarks.ctranslate2_peer import Peers
from lightning_bpd.benchmarks.lm_prompts import add_prompt_args
from lightning_bpd.checkpoints import load_error, load_model
from lightning_bpd.commands.bench_peers import GENERATE_PEERS, PeerChoice, k_value, peer_choice, peer_list
from lightning_bpd.commands.out_paths import file_above, is_json_record, same_file_as
from lightning_bpd.decoding.methods import DecodeMethod, acceptance_rate, make_method, with_baselines
from lightning_bpd.decoding.trees.budget import tree_nodes_arg
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree, parse_tree
from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.evaluation import batched, budget_trees, run_batch
from lightning_bpd.inference import InferenceOptions, Runtime, build_runtime
from lightning_bpd.inference.arguments import (
    add_draft_vocab_args,
    add_precision_arg,
    add_timing_args,
    draft_vocab_of,
    options_from_args,
)
from lightning_bpd.inference.memory import measured_build
from lightning_bpd.records import device_name, write_json
from lightning_bpd.tasks.inputs import load_inputs


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="old spellings, each still working with one deprecation line: --inputs (--limit), "
                                       "--draft-vocab-from TEXT (--draft-vocab N:TEXT); the commands bench-generate "
                                       "(--ckpt CKPT --peers generate,...) and bench-drafters (--run NAME=CKPT ...)")
    p.add_argument("--ckpt", default=None,
                   help="the checkpoint to bench (or --run): a translation or super-resolution run (--criteria against "
                        "greedy), or a Hugging Face heads run, save_heads folder or drafter's run (against its base's "
                        "generate: a language model's always, a seq2seq one with --peers)")
    p.add_argument("--base", default=None, help="--ckpt's base (a drafter's target) directory, if it moved since the run")
    p.add_argument("--run", action="append", default=None, metavar="NAME=CKPT[@PROPOSER]",
                   help="a run of a Hugging Face causal base to bench under NAME (repeat; all on one base): heads or a "
                        "drafter kind's checkpoint, proposing as its own (heads, its drafter) or as PROPOSER (tree:N, "
                        "dynamic:N, prompt-lookup[:N:T], ...; greedy: our runtime's greedy, which every row of ours is "
                        "then also compared with); one table against the base's generate (--peers)")
    p.add_argument("--minutes", action="append", default=[], metavar="NAME=M",
                   help="--run NAME's training minutes, where its checkpoint keeps no training clock")
    p.add_argument("--input", default=None, help="translation: source sentences, one per line (.gz allowed)")
    p.add_argument("--images", default=None,
                   help="super-resolution: CelebA folder (default: synthetic faces); the val split is used")
    p.add_argument("--criteria", nargs="+", default=None,
                   help="--ckpt of our own base: the methods (default exact top2): exact, topN, epsX, minL[_rule], "
                        "sample_tX[_pY], draft:<any of these>; against generate ours is exact")
    p.add_argument("--k", type=k_value, nargs="+", action="extend", default=None, metavar="K|NAME=K",
                   help="heads to use (default: all); with a draft, the block size (default: the model's k, >= 2). "
                        "Several values run every method at each k, named <method>@k<k>, against one baseline; with "
                        "--run: NAME=K for run NAME's block (heads, a drafter's block or chain), K for every run's")
    p.add_argument("--draft", default=None, help="checkpoint of a draft model (same vocabulary) for draft:<rule>")
    p.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 32])
    p.add_argument("--limit", type=int, default=100, dest="inputs", help="number of inputs decoded per batch size")
    deprecated_alias(p, "--inputs", "--limit")
    p.add_argument("--warmup", type=int, default=2, help="untimed batches first")
    add_draft_vocab_args(p)
    p.add_argument("--trees", nargs="+", default=None,
                   help="also time each criterion of the model's heads verifying these trees of candidates "
                        "(Medusa-format paths such as '0;1;0,0;0,1', or 'path:D'): methods <criterion>+tree<nodes>; "
                        "'dynamic:N:D[:W]': EAGLE-2's dynamic tree of N nodes, D deep, W wide (exact only): "
                        "exact+dynamic<N>x<D>x<W>")
    p.add_argument("--tree-nodes", type=tree_nodes_arg, nargs="+", default=None,
                   help="also time each criterion of the model's heads verifying the tree of N nodes built from their "
                        "rank agreement table (stored with them, else measured on the inputs first): methods "
                        "<criterion>+nodes<N>; 0 = the single path; auto (auto:M): the budget up to 64 (M) that pays "
                        "on this machine, timed at the smallest batch size (<criterion>+nodes-auto)")
    p.add_argument("--lazy-verify", action="store_true",
                   help="verify prefix rules position by position (fewer projections, a host read per position)")
    p.add_argument("--fixed-shape", action="store_true",
                   help="greedy and deterministic rules with fixed shapes (finished rows stay, the whole KV cache "
                        "read under a mask, no host read inside an iteration), replayed as CUDA graphs on CUDA")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_precision_arg(p)
    add_timing_args(p)
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--peers", type=peer_list, nargs="*", action="extend", default=None, metavar="PEER,...",
                   help="what else decodes the same inputs (comma-separated): generate (the base's own, greedy: the "
                        "reference), prompt-lookup[:NGRAM:TOKENS] (transformers'; default 2:10), assisted:DRAFT "
                        "(transformers' assisted generation with DRAFT, a causal LM folder or LM run), llamacpp[:BIN] "
                        "(llama.cpp on the base as a float32 GGUF: llama-cpp-python, or the build-llamacpp folder BIN's "
                        "binaries, alone and with a drafter's drafter), ctranslate2[:QUANT] (CTranslate2: of a seq2seq "
                        "Hugging Face base, float32 and int8 or QUANT, repeatable; of our own base, a random-weight "
                        "Transformer of its shape forced to greedy's lengths; pip install -e '.[peers]'). On a Hugging "
                        "Face base generate and prompt-lookup always run")
    g = add_prompt_args(p)
    g.add_argument("--llamacpp-threads", type=int, default=None, help="--peers llamacpp: its threads (default: torch's)")
    g.add_argument("--gguf", default=None, help="--peers llamacpp: keep its GGUF here (default: a temporary file); with "
                   "llamacpp:BIN a folder for target.gguf (and drafter.gguf; with --run NAME/drafter.gguf)")
    g.add_argument("--llamacpp-float32", action="store_true",
                   help="--run on a .gguf target with --peers llamacpp:BIN: llama.cpp's rows on the float32 "
                        "target.gguf written from it too (alone and drafted), beside those on the .gguf itself")
    return p


def runs_args(args: argparse.Namespace, peers: PeerChoice) -> argparse.Namespace:
    """``bench --run``'s options as the table's engine reads them (:func:`~lightning_bpd.commands.bench_drafters.run`);
    ValueError (one line) for what that table does not take."""
    if args.ckpt is not None:
        raise ValueError("--ckpt and --run: give the runs as --run NAME=CKPT (one base, any number of runs)")
    if "ctranslate2" in peers.names:
        raise ValueError("--peers ctranslate2 with --run: CTranslate2 peers are for seq2seq bases (bench --ckpt CKPT "
                         "--peers ctranslate2); a causal base's peer is llamacpp[:BIN]")
    for option in ("images", "draft", "trees", "criteria", "base"):
        if getattr(args, option):
            raise ValueError(f"--{option.replace('_', '-')} benches a --ckpt, not --run's table")
    if (args.llamacpp_threads is not None or args.gguf) and "llamacpp" not in peers.names:
        raise ValueError("--llamacpp-threads and --gguf set llama.cpp's peer: add --peers llamacpp[:BIN]")
    if args.llamacpp_float32 and not peers.llamacpp_bin:
        raise ValueError("--llamacpp-float32 sets llama.cpp's binaries' rows: add --peers llamacpp:BIN")
    ks = args.k or []
    named = [k for k in ks if isinstance(k, str)]
    plain = [k for k in ks if not isinstance(k, str)]
    if len(plain) > 1:
        raise ValueError("--k with --run: one K for every run, or NAME=K per run")
    done = {k.partition("=")[0] for k in named}
    named += [f"{value.partition('=')[0]}={plain[0]}" for value in args.run
              if plain and value.partition("=")[0] not in done]
    out = copy.copy(args)
    out.run_k, out.tree_nodes = named, args.tree_nodes or []
    out.prompt_lookup_tokens, out.max_matching_ngram, out.assistant = peers.tokens, peers.ngram, peers.assistant
    out.llamacpp = (peers.llamacpp_bin or "") if "llamacpp" in peers.names else None  # "": llama-cpp-python
    return out


ONLY_OURS = ("images", "draft", "trees", "criteria", "minutes", "lazy_verify", "fixed_shape")  # --criteria's bench


def generate_args(args: argparse.Namespace, peers: PeerChoice) -> argparse.Namespace:
    """``bench --ckpt``'s options against a Hugging Face base's ``generate`` as that bench reads them
    (:func:`~lightning_bpd.commands.bench_generate.run`); ValueError (one line) for what it does not take."""
    for option in ONLY_OURS:
        if getattr(args, option):
            raise ValueError(f"--{option.replace('_', '-')} times our own decoding against greedy, not against "
                             "generate (there ours is exact)")
    if args.k is not None and len(args.k) > 1:
        raise ValueError("--k against generate: one K (heads used, or a drafter's block)")
    if (args.llamacpp_threads is not None or args.gguf) and "llamacpp" not in peers.names:
        raise ValueError("--llamacpp-threads and --gguf set llama.cpp's peer: add --peers llamacpp[:BIN]")
    if args.llamacpp_float32:
        raise ValueError("--llamacpp-float32 is --run's (a --ckpt on a .gguf target already gets both)")
    out = copy.copy(args)
    out.k = args.k[0] if args.k else None
    out.tree_nodes = args.tree_nodes or []
    out.prompt_lookup_tokens, out.max_matching_ngram = peers.tokens, peers.ngram
    out.assistant, out.llamacpp_bin = peers.assistant, peers.llamacpp_bin
    out.peers = [name for name in ("ctranslate2", "llamacpp") if name in peers.names]
    out.ct2_quantizations = list(peers.quantizations) or ["float32", "int8"]
    return out


def build_methods(module, runtime: Runtime, specs: list[str], ks: list[int] | None, draft, lazy: bool = False,
                  trees: dict[str, Tree | DynamicTree | None] | None = None) -> tuple[list[str], dict[str, DecodeMethod]]:
    """The methods to time, baselines first: ``(order, methods)``. With several ``ks`` every method
    runs at each k and is named ``<spec>@k<k>``; with ``trees`` (a name -> a tree, None: the single path) every
    method of the model's own heads (deterministic or sampling) also verifies each tree, named ``<spec>+<name>``."""
    options = runtime.options

    def make(spec: str, k: int | None = None, tree: Tree | None = None) -> DecodeMethod:
        return make_method(spec, module.make_criterion, runtime, k, draft, lazy=lazy, fixed_shape=options.fixed_shape,
                           stop_below=options.stop_below, tree=tree)

    if ks is None or len(ks) == 1:
        k = ks[0] if ks else None
        methods = {spec: make(spec, k) for spec in specs}
    else:
        methods = {f"{spec}@k{k}": make(spec, k) for k in ks for spec in specs}
    for name, tree in (trees or {}).items():
        for spec in specs:
            if isinstance(tree, DynamicTree) and spec.strip() != "exact":
                continue  # a dynamic tree verifies exactly only
            method = make(spec, ks[0] if ks and len(ks) == 1 else None, tree)
            if method.tree is not None or (tree is None and method.criterion is not None and method.draft is None
                                           and not method.is_sampling):
                methods[f"{spec}+{name}"] = method
    return with_baselines(list(methods), methods, make), methods


def tree_name(tree: Tree | DynamicTree) -> str:
    """``tree<nodes>``, or ``dynamic<nodes>x<depth>x<width>`` for a dynamic tree."""
    if isinstance(tree, DynamicTree):
        return f"dynamic{tree.nodes}x{tree.depth}x{tree.width}"
    return f"tree{tree.size - 1}"


def bench_batch_size(module, runtime: Runtime, inputs: list[torch.Tensor], batch_size: int, order: list[str],
                     methods: dict[str, DecodeMethod], warmup: int, peers=None) -> dict:
    """Each method's report, decoding with ``runtime`` (the module's model prepared); ``peers``
    (:class:`~lightning_bpd.benchmarks.ctranslate2_peer.Peers`) decode every batch after the methods, forced to
    greedy's output lengths (its totals: ``peers.report()``)."""
    model = runtime
    batches = batched(module, inputs, batch_size)
    for batch in batches[:warmup]:
        for name in order:
            result, _ = run_batch(methods[name], model, batch)
            if peers is not None and name == order[0]:
                peers.run(batch.src, model.pad_id, result.lengths.tolist(), record=False)
    per_input = {n: [] for n in order}
    totals = {n: {"seconds": 0.0, "tokens": 0, "iterations": 0, "model_calls": 0} for n in order}
    same = {n: True for n in order}
    blocks: dict[str, list[list[int]]] = {n: [] for n in order}
    for batch in batches:
        runs = {name: run_batch(methods[name], model, batch) for name in order}
        if peers is not None:  # greedy's output lengths (the first baseline's without greedy)
            peers.run(batch.src, model.pad_id, runs.get("greedy", runs[order[0]])[0].lengths.tolist())
        for name, (result, run) in runs.items():
            sec = run.seconds
            per_input[name].append(sec / batch.src.shape[0])
            t = totals[name]
            t["seconds"] += sec
            t["tokens"] += int(result.lengths.sum())
            t["iterations"] += int(result.iterations.sum())
            t["model_calls"] += result.model_calls
            blocks[name] += result.block_sizes
            if "greedy" in runs and name != "greedy":
                same[name] &= result.sequences() == runs["greedy"][0].sequences()
    report = {}
    for name in order:
        method, t, secs = methods[name], totals[name], sorted(per_input[name])
        q = statistics.quantiles(secs, n=4) if len(secs) > 1 else [secs[0]] * 3
        block = t["tokens"] / max(1, t["iterations"])
        speedup = totals[method.baseline]["seconds"] / max(t["seconds"], 1e-9)
        ms_per_call = 1000 * t["seconds"] / max(1, t["model_calls"])
        base = totals[method.baseline]
        report[name] = {
            "baseline": method.baseline, "block_size": method.block_size(model),
            "ms_per_call": ms_per_call,
            "call_cost_vs_baseline": ms_per_call / max(1e-12, 1000 * base["seconds"] / max(1, base["model_calls"])),
            "seconds_per_input_median": statistics.median(secs), "seconds_per_input_iqr": [q[0], q[2]],
            "tokens_per_second": t["tokens"] / max(t["seconds"], 1e-9),
            "ms_per_output_token": 1000 * t["seconds"] / max(1, t["tokens"]), "iterations": t["iterations"],
            "model_calls": t["model_calls"], "mean_accepted_block_size": block, "speedup": speedup,
            "efficiency": speedup / block,
        }
        if not method.is_baseline and method.is_sampling:
            report[name]["acceptance_rate"] = acceptance_rate(blocks[name], method.block_size(model))
        elif not method.is_baseline and "greedy" in totals:
            report[name]["equals_greedy"] = same[name]
    return report


def last_column(r: dict) -> str:
    """``True``/``False`` (outputs equal greedy's) or the acceptance rate of a sampling method."""
    if "acceptance_rate" in r:
        return f"{r['acceptance_rate']:.3f}"
    return str(r.get("equals_greedy", ""))


def against_generate(module, peers: PeerChoice) -> bool:
    """Whether ``bench --ckpt`` times ``module`` against its base's ``generate``: a language model's checkpoint always,
    a seq2seq Hugging Face one when ``--peers`` names any peer (else: its ``--criteria`` against greedy)."""
    if hasattr(module, "encode_prompts"):
        return True
    from lightning_bpd.hf.base import HFSeq2SeqBlockwise

    return isinstance(getattr(module, "model", None), HFSeq2SeqBlockwise) and bool(peers.names)


def option_paths(value: object) -> list[str]:
    """The paths an option's value may name: itself, and the parts of ``NAME=CKPT@PROPOSER`` or ``N:TEXT``."""
    if isinstance(value, (list, tuple)):
        return [path for item in value for path in option_paths(item)]
    if not isinstance(value, str) or not value:
        return []
    named = value.partition("=")[2]
    return [value, named, named.partition("@")[0], value.rpartition(":")[2]]


def check_json(args: argparse.Namespace) -> None:
    """Exit in one line, before any work, where writing ``--json`` would fail after the bench (a folder, a path under a
    file) or destroy something: one of the command's inputs, or an existing file that is not a JSON record (an
    earlier bench's record is replaced)."""
    path = Path(args.json)
    if path.is_dir():
        sys.exit(f"bench: --json {args.json} is a folder: give the JSON file's path")
    if (parent := file_above(path.absolute())) is not None:
        sys.exit(f"bench: --json {args.json} lies under the file {parent}: give another path")
    if not path.exists():
        return
    inputs = ((f"--{name.replace('_', '-')}", other) for name, value in vars(args).items() if name != "json"
              for other in option_paths(value))
    if (erased := same_file_as(path, inputs)) is not None:
        sys.exit(f"bench: --json {args.json} is the {erased[0]} file {erased[1]}, which writing would erase: give "
                 "another path")
    if not is_json_record(path):
        sys.exit(f"bench: --json {args.json} exists and is not a bench's JSON record, which writing would erase: give "
                 "another path")


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.json:
        check_json(args)
    try:
        peers = peer_choice(args.peers)
    except ValueError as err:
        sys.exit(f"bench: {err}")
    if args.run:
        from lightning_bpd.commands import bench_drafters

        try:
            table = runs_args(args, peers)
        except ValueError as err:
            sys.exit(f"bench: {err}")
        return bench_drafters.run(table, "bench")
    if args.ckpt is None:
        sys.exit("bench: give --ckpt CKPT (a checkpoint) or --run NAME=CKPT (runs of one Hugging Face base)")
    if args.k is not None and any(isinstance(k, str) for k in args.k):
        sys.exit("bench: --k NAME=K names a --run; with --ckpt give integers")
    try:
        module = load_model(args.ckpt, args.device, base=args.base)
    except (ValueError, TypeError, FileNotFoundError) as err:
        sys.exit(f"bench: {load_error(err, args.base)}")
    if against_generate(module, peers):
        from lightning_bpd.commands import bench_generate

        try:
            return bench_generate.run(generate_args(args, peers), module, "bench")
        except ValueError as err:
            sys.exit(f"bench: {err}")
    if peers.generate:
        sys.exit(f"bench: --peers {', '.join(n for n in peers.names if n in GENERATE_PEERS)}: {args.ckpt} is a run of our "
                 "own base, which has no transformers generate (its peer: ctranslate2)")
    if peers.quantizations:
        sys.exit("bench: --peers ctranslate2:QUANT picks the conversions of a Hugging Face base; our own base's peer "
                 "times float32 and int8 (--peers ctranslate2)")
    for option in ("minutes", "llamacpp_threads", "gguf", "llamacpp_float32"):
        if getattr(args, option):
            sys.exit(f"bench: --{option.replace('_', '-')} does not apply to {args.ckpt} (a run of our own base)")
    args.peers = list(peers.names)
    args.criteria = args.criteria or ["exact", "top2"]
    if any(b < 1 for b in args.batch_sizes) or args.inputs < 1:
        sys.exit("bench: --batch-sizes and --limit must be >= 1")
    try:
        options = options_from_args(args, module)
        runtime, memory = measured_build(lambda: build_runtime(module.model, options), module.model)
        draft = None
        if args.draft:
            draft = build_runtime(load_model(args.draft, args.device).model, InferenceOptions(precision=args.precision))
        inputs = load_inputs(module, args)
        trees = {tree_name(tree): tree for tree in map(parse_tree, args.trees or [])}
        choices: dict = {}  # --tree-nodes auto's choices
        if args.tree_nodes and args.k is not None and len(args.k) > 1:
            raise ValueError("--tree-nodes decodes at one k: give at most one --k")
        trees.update(budget_trees(module, runtime, inputs, args.tree_nodes, args.k[0] if args.k else None, "bench",
                                  min(args.batch_sizes), choices))
        order, methods = build_methods(module, runtime, args.criteria, args.k, draft, args.lazy_verify, trees)
        peers = Peers.build(args.peers, module)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"bench: {err}")
    k = (args.k[0] if len(args.k) == 1 else args.k) if args.k else module.model.k
    result = {"ckpt": args.ckpt, "draft": args.draft, "k": k, "device": str(module.device),
              "device_name": device_name(module.device), "threads": torch.get_num_threads(), "inputs": len(inputs),
              "lazy_verify": args.lazy_verify, "fixed_shape": args.fixed_shape, "draft_vocab": draft_vocab_of(args)[0],
              "precision": runtime.precision, "proposal_precision": args.proposal_precision,
              "stop_below": args.stop_below, "fused_chain": not args.unfused_chain,
              "screened_argmax": args.screened_argmax, "lean_steps": not args.reference_steps, "trees": args.trees,
              "tree_nodes": args.tree_nodes, "tree_nodes_auto": choices, "memory": memory, "batch_sizes": {}}
    if peers is not None:
        result["peers"] = {**peers.info, "batch_sizes": {}}
    print(f"device: {result['device_name']}; ms/call = wall-clock per decoder call (a greedy step or a blockwise "
          "iteration), x base = that cost over the baseline's, ms/tok = wall-clock per output token, "
          "ct2_* = CTranslate2 peers")
    print(f"memory: the model's weights {memory['model_mb']} MB; the runtime's copies {memory['runtime_cast_mb']} MB in "
          f"another dtype + {memory['runtime_products_mb']} MB for its products; the process grew by "
          f"{memory['runtime_added_mb']} MB building it")
    print(f"{'batch':>5s} {'method':18s} {'s/input':>9s} {'tok/s':>8s} {'ms/tok':>7s} {'block':>6s} {'calls':>6s} "
          f"{'ms/call':>8s} {'x base':>6s} {'speedup':>7s} {'effic.':>6s} {'=greedy/accept':>14s}")
    for bs in args.batch_sizes:
        report = bench_batch_size(module, runtime, inputs, bs, order, methods, args.warmup, peers)
        result["batch_sizes"][str(bs)] = report
        for name, r in report.items():
            print(f"{bs:5d} {name:18s} {r['seconds_per_input_median']:9.4f} {r['tokens_per_second']:8.1f} "
                  f"{r['ms_per_output_token']:7.3f} "
                  f"{r['mean_accepted_block_size']:6.2f} {r['model_calls']:6d} {r['ms_per_call']:8.2f} "
                  f"{r['call_cost_vs_baseline']:6.2f} {r['speedup']:7.2f} "
                  f"{r['efficiency']:6.2f} {last_column(r):>14s}", flush=True)
        if peers is not None:
            result["peers"]["batch_sizes"][str(bs)] = peer_report = peers.report()
            for name, r in peer_report.items():
                if "skipped" in r:
                    print(f"{bs:5d} {name.replace('ctranslate2', 'ct2'):18s} skipped: {r['skipped']}", flush=True)
                    continue
                print(f"{bs:5d} {name.replace('ctranslate2', 'ct2'):18s} {r['seconds_per_input_median']:9.4f} "
                      f"{r['tokens_per_second']:8.1f} {r['ms_per_output_token']:7.3f}", flush=True)
    if args.json:
        write_json(args.json, result)
    return result
