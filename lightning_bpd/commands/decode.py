"""``python -m lightning_bpd decode``: translate a file (or stdin) with a checkpoint, or continue prompts with a
language-modelling one.

Translation: one output line per input line. Language modelling (an :class:`~lightning_bpd.tasks.lm.LMModule`
checkpoint or heads): JSON Lines in, each ``{"prompt": "..."}``, and one ``{"completion": "..."}`` line out per input,
in order (:mod:`lightning_bpd.tasks.lm.jsonl`). Either way a stats line (sentences, or prompts for a language model,
iterations, mean accepted block size, seconds) goes to stderr. ``--criterion`` picks the method: ``greedy``;
blockwise with the model's heads (``exact``, ``top2``, ``min2_top3``, ...); lossless speculative sampling with the heads
(``sample_t0.7_p0.9``) or plain ancestral sampling (``ancestral_t0.7_p0.9``); and ``--proposer`` what proposes
(:mod:`lightning_bpd.commands.proposer_option`): the heads (``heads``, the default); a tree of candidates verified in
one pass (``tree:N``: the tree of N nodes built from the heads' rank agreement table stored with them, Medusa's greedy
tree, 0 = the single path; ``tree:auto`` the budget that pays on this machine, a few iterations timed on the first
batch, the choice to stderr; ``tree:0;1;0,0`` paths of head ranks; ``dynamic:N`` EAGLE-2's dynamic tree); a separate
draft model (``draft:CKPT``: any rule, ``draft:exact``, ``draft:sample_t1``); n-grams of the prompt
(``prompt-lookup``); trees of continuations from a datastore of the target's text (``retrieval:FILE``, made by
``python -m lightning_bpd datastore``; on any checkpoint of the base, its heads or drafter unused); or a DFlash drafter (``dflash``, ``dflash:CKPT``). A DFlash drafter's checkpoint (a fit with
``conf/lm/dflash.yaml``) continues prompts with its target, the drafter proposing (its default; ``--k`` the block
size, ``--criterion`` the deterministic rules; ``--base DIR`` where the target's directory moved);
``--proposer dflash:CKPT`` puts that drafter on a causal LM checkpoint of the same target shapes (the heads' base
verifies). Sampling is seeded (``--criterion sample_t1@SEED``, default 0) and
reproducible. ``--max-new-tokens N`` caps every translation at N tokens, as ``generate(max_new_tokens=N)`` does (a
checkpoint that forces EOS at the cap ends its capped rows with it); the default is the task's own cap
(``max_len_a * source length + max_len_b``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lightning_bpd.checkpoints import load_error, load_model
from lightning_bpd.commands.out_paths import same_file_as
from lightning_bpd.commands.proposer_option import add_proposer_arg
from lightning_bpd.decoding import parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.decoding.trees.budget import auto_tree
from lightning_bpd.deprecated_options import deprecated_alias, deprecated_option
from lightning_bpd.drafters.common.kind import article
from lightning_bpd.drafters.registry import REGISTERED, kind, kind_of
from lightning_bpd.inference import build_runtime
from lightning_bpd.inference.arguments import add_draft_vocab_args, add_precision_arg, options_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) of a translation run, or a folder of heads saved on their own "
                        "(save_heads: heads.json names their Hugging Face base)")
    p.add_argument("--base", default=None, help="the Hugging Face base directory (a drafter's target, a heads folder's "
                   "base) if it moved since the run")
    p.add_argument("--input", default="-", help="text file, one sentence per line (.gz allowed); a language model: "
                        'JSON Lines, each {"prompt": "..."}; - for stdin')
    p.add_argument("--out", default="-", dest="output", metavar="FILE",
                   help="where to write the translations (or completions); - for stdout")
    deprecated_alias(p, "--output", "--out")
    p.add_argument("--criterion", default="exact",
                   help="greedy, exact, topN (top2), minL[_<rule>], sample_tX[_pY], ancestral_tX[_pY], "
                        "or draft:<rule> (default: exact); a sampling rule's seed after @ (sample_t0.7@3; default 0)")
    p.add_argument("--k", type=int, default=None,
                   help="heads to use (default: all of the model's); with a draft, the block size (default: the model's k, >= 2)")
    add_proposer_arg(p)
    deprecated_option(p, "--seed", "--criterion RULE@SEED", type=int, default=None)
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="at most this many tokens per translation, as generate's max_new_tokens "
                        "(default: the task's own cap, max_len_a * source length + max_len_b)")
    add_draft_vocab_args(p)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_precision_arg(p)
    return p


def criterion_and_seed(args: argparse.Namespace) -> tuple[str, int]:
    """``--criterion RULE[@SEED]`` as the rule and its seed (default 0; the old ``--seed N`` read too); one-line
    ValueError for a seed that is no integer or given twice."""
    rule, at, seed = args.criterion.partition("@")
    if at and (not seed.strip().lstrip("-").isdigit()):
        raise ValueError(f"--criterion {args.criterion}: the seed after @ is an integer (sample_t0.7@3)")
    if at and args.seed is not None:
        raise ValueError(f"--criterion {args.criterion} and --seed {args.seed} both give a seed: give one")
    return rule.strip(), int(seed) if at else (args.seed if args.seed is not None else 0)


def read_input(path: str) -> list[str]:
    """The sentences of a file or of stdin (``-``); input that is not UTF-8 is one error naming where."""
    from lightning_bpd.tasks.translation.text_files import read_lines

    return read_lines(path)


def read_lm_input(module: Any, args: argparse.Namespace) -> list[str]:
    """The prompts of a JSON Lines file or stdin, each checked against the model's context (one line naming the
    input line where one is bad)."""
    from lightning_bpd.tasks.lm.jsonl import check_prompts, read_prompts

    prompts = read_prompts(args.input)
    check_prompts(module, prompts, args.max_new_tokens or module.max_new_tokens)
    return [prompt for _, prompt in prompts]


def decode_auto_tree(module: Any, runtime: Any, sentences: list[str], lm: bool, args: argparse.Namespace) -> Any:
    """``--proposer tree:auto``: the tree that pays, timed on the first batch of the input; the choice to stderr."""
    first = [s for s in sentences if lm or s.strip()][: args.batch_size]
    if not first:
        raise ValueError(f"--proposer {args.proposer.text} times trees on the input, which is empty")
    src = module.encode_prompts(first) if lm else module.encode_sources(first)
    tree, choice = auto_tree(runtime, module.rank_agreement, args.k or module.model.k, src, args.proposer.auto)
    print(f"decode: {choice.summary()} (timed at batch {src.shape[0]})", file=sys.stderr)
    return tree


def drafter_choice(module: Any, runtime: Any, args: argparse.Namespace) -> Any:
    """The proposer of a drafter, or None where none proposes. A drafter's run (a registered kind,
    :func:`~lightning_bpd.drafters.registry.kind_of`) proposes with its own drafter under every spelling its kind
    takes (``heads``, the default, or the kind's name; ``dynamic:N``, ``tree:PATHS`` where it grows trees), ``--k``
    its block (default the run's); ``--proposer NAME:CKPT`` puts the drafter of CKPT (a run of kind NAME) on the
    checkpoint's target. One-line ValueError where there is no drafter or it does not fit the target."""
    choice, own = args.proposer, kind_of(module)
    if choice.on_base:  # prompt lookup, retrieval: the run's base proposes, its heads or drafter unused
        return None
    named = kind(choice.kind) if choice.kind in REGISTERED else None
    if own is None and named is None:
        return None
    if named is not None and own is not None and named.name != own.name:
        raise ValueError(f"--proposer {choice.text}: {args.ckpt} is {article(own.title)} {own.title} drafter's run; "
                         f"give a heads checkpoint as --ckpt to add {article(named.title)} {named.title} drafter")
    if args.criterion.strip().startswith("draft:"):
        raise ValueError(f"--criterion {args.criterion}: the {(named or own).title} drafter proposes, not a draft "
                         "model")
    if named is not None and choice.ckpt:
        drafter, what, k = named.load_drafter(choice.ckpt), f"the drafter of {choice.ckpt}", args.k
    elif own is None:
        raise ValueError(f"--proposer {choice.text}: {args.ckpt} holds no {named.title} drafter "
                         f"({type(module).__name__}): give {article(named.title)} {named.title} checkpoint as --ckpt, "
                         f"or --proposer {named.name}:CKPT")
    else:
        drafter, what, k = module.drafter, f"the drafter of {args.ckpt}", args.k or own.default_k(module)
    return (named or own).proposer(drafter, runtime, "" if named is not None else choice.text, k, what)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        sys.exit("decode: --batch-size must be >= 1")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        sys.exit(f"decode: --max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.output != "-":
        if os.path.isdir(args.output):
            sys.exit(f"decode: --out {args.output} is a folder: give the output file's path")
        if args.input != "-" and same_file_as(Path(args.output), [("--input", args.input)]):
            sys.exit(f"decode: --out {args.output} is the --input file, which writing would erase: give another path")
    try:
        try:
            module = load_model(args.ckpt, args.device, base=args.base)
        except (ValueError, FileNotFoundError, OSError) as err:
            raise ValueError(load_error(err, args.base)) from None
        lm = hasattr(module, "encode_prompts")  # a language-modelling checkpoint: JSON Lines in and out
        if not hasattr(module, "tokenizer"):
            raise ValueError(f"{args.ckpt} is not a translation checkpoint")
        args.criterion, seed = criterion_and_seed(args)
        options = options_from_args(args, module)
        runtime = build_runtime(module.model, options)
        proposer = args.proposer
        drafting = drafter_choice(module, runtime, args)
        draft = (build_runtime(load_model(proposer.ckpt, args.device).model, options) if proposer.kind == "draft"
                 else None)
        sentences = read_lm_input(module, args) if lm else read_input(args.input)
        if drafting is not None:  # a drafter proposes (its block size is --k's); no heads
            method = make_method(args.criterion, parse_criterion, runtime, None, seed=seed, proposer=drafting)
        else:
            if proposer.auto is not None:
                tree = decode_auto_tree(module, runtime, sentences, lm, args)
            else:
                tree = proposer.tree(module.rank_agreement, args.k or module.model.k)
            method = make_method(proposer.criterion(args.criterion), parse_criterion, runtime, args.k, draft,
                                 seed=seed, tree=tree,
                                 **proposer.method_kwargs(getattr(module, "tokenizer", None)))
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"decode: {err}")
    from lightning_bpd.tasks.lm.jsonl import as_lines, complete
    from lightning_bpd.tasks.translation.module import translate

    start = time.perf_counter()
    try:
        texts, stats = (complete if lm else translate)(module, sentences, method, batch_size=args.batch_size,
                                                       model=runtime, max_new_tokens=args.max_new_tokens)
        texts = as_lines(texts) if lm else texts
    except ValueError as err:  # a cap past the checkpoint's positions, a refused generation setting, ...
        sys.exit(f"decode: {err}")
    seconds = time.perf_counter() - start
    try:
        out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as err:
        sys.exit(f"decode: --out {args.output}: {err.strerror or type(err).__name__}")
    try:
        for line in texts:
            out.write(line + "\n")
    finally:
        if out is not sys.stdout:
            out.close()
    count = "prompts" if lm else "sentences"  # what the input's lines are
    print(
        f"{count}={stats[count]} iterations={stats['iterations']} tokens={stats['tokens']} "
        f"mean_accepted_block_size={stats['mean_accepted_block_size']:.3f} seconds={seconds:.2f}",
        file=sys.stderr,
    )
