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
(``prompt-lookup``); or a DFlash drafter (``dflash``, ``dflash:CKPT``). A DFlash drafter's checkpoint (a fit with
``conf/lm/dflash.yaml``) continues prompts with its target, the drafter proposing (its default; ``--k`` the block
size, ``--criterion`` the deterministic rules; ``--base DIR`` where the target's directory moved);
``--proposer dflash:CKPT`` puts that drafter on a causal LM checkpoint of the same target shapes (the heads' base
verifies). Sampling is seeded (``--seed``) and
reproducible. ``--max-new-tokens N`` caps every translation at N tokens, as ``generate(max_new_tokens=N)`` does (a
checkpoint that forces EOS at the cap ends its capped rows with it); the default is the task's own cap
(``max_len_a * source length + max_len_b``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from lightning_bpd.checkpoints import load_error, load_model
from lightning_bpd.commands.proposer_option import add_proposer_arg
from lightning_bpd.decoding import parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.decoding.trees.budget import auto_tree
from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.inference import build_runtime
from lightning_bpd.inference.arguments import add_draft_vocab_args, add_precision_arg, options_from_args


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd decode", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="checkpoint (.ckpt) of a translation run, or a folder of heads saved on their own "
                        "(save_heads: heads.json names their Hugging Face base)")
    # --base DIR: the Hugging Face base (a DFlash drafter's target) if it moved since the run (load_model's base=);
    # named in the description and in the error line of a missing base, not listed (decode lists at most 12 options)
    p.add_argument("--base", default=None, help=argparse.SUPPRESS)
    p.add_argument("--input", default="-", help="text file, one sentence per line (.gz allowed); a language model: "
                        'JSON Lines, each {"prompt": "..."}; - for stdin')
    p.add_argument("--out", default="-", dest="output", metavar="FILE",
                   help="where to write the translations (or completions); - for stdout")
    deprecated_alias(p, "--output", "--out")
    p.add_argument("--criterion", default="exact",
                   help="greedy, exact, topN (top2), minL[_<rule>], sample_tX[_pY], ancestral_tX[_pY], "
                        "or draft:<rule> (default: exact)")
    p.add_argument("--k", type=int, default=None,
                   help="heads to use (default: all of the model's); with a draft, the block size (default: the model's k, >= 2)")
    add_proposer_arg(p)
    p.add_argument("--seed", type=int, default=0, help="random seed of sampling methods")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="at most this many tokens per translation, as generate's max_new_tokens "
                        "(default: the task's own cap, max_len_a * source length + max_len_b)")
    add_draft_vocab_args(p)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_precision_arg(p)
    return p


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


def eagle3_choice(module: Any, runtime: Any, args: argparse.Namespace) -> Any:
    """The proposer of an EAGLE-3 checkpoint: its chain of ``--k`` (default the run's block size) under the default
    ``heads``, an EAGLE-2 dynamic tree under ``dynamic:N[:D[:W]]`` (D default the chain's drafts) or a static tree
    under ``tree:PATHS`` (paths of the drafter's ranks); one-line ValueError for another choice."""
    from lightning_bpd.decoding.trees.tree import DynamicTree
    from lightning_bpd.drafters.eagle3.module import eagle3_proposer
    from lightning_bpd.drafters.eagle3.tree import Eagle3StaticTree, Eagle3Tree

    choice, what = args.proposer, f"the drafter of {args.ckpt}"
    chain = eagle3_proposer(module.drafter, runtime, args.k or module.block_size, what)
    if choice.kind == "heads":
        return chain
    if choice.kind == "tree" and choice.dynamic:
        nodes, depth, *width = choice.dynamic
        spec = DynamicTree(nodes, depth or chain.block_size - 1, *width)
        return Eagle3Tree(chain.drafter, spec=spec)
    if choice.kind == "tree" and choice.paths is not None:
        return Eagle3StaticTree(chain.drafter, tree=choice.tree(None, chain.block_size))
    raise ValueError(f"--proposer {choice.text}: an EAGLE-3 checkpoint's drafter proposes chains (heads, the "
                     "default), dynamic trees (dynamic:N[:D[:W]]) or static trees (tree:PATHS)")


def dflash_choice(module: Any, runtime: Any, args: argparse.Namespace) -> Any:
    """The DFlash proposer of ``--proposer dflash[:CKPT]``, or of a DFlash checkpoint under the default ``heads``
    (None for every other choice); one-line ValueError where there is no drafter or it does not fit the target.
    An EAGLE-3 checkpoint's drafter: :func:`eagle3_choice`."""
    choice, own = args.proposer, hasattr(module, "decode_eval_proposer") and hasattr(module, "drafter")
    if own:  # a drafter's run (a language model: transformers is loaded already)
        from lightning_bpd.drafters.eagle3.module import Eagle3Module

        if isinstance(module, Eagle3Module):
            if choice.kind == "dflash":
                raise ValueError(f"--proposer {choice.text}: {args.ckpt} is an EAGLE-3 drafter's run; give a heads "
                                 "checkpoint as --ckpt to add a DFlash drafter")
            return eagle3_choice(module, runtime, args)
    if choice.kind != "dflash" and not own:  # no DFlash here (and no transformers import for a translation run)
        return None
    from lightning_bpd.drafters.dflash.module import dflash_proposer, load_drafter

    if choice.kind == "dflash" and choice.ckpt:
        drafter, what = load_drafter(choice.ckpt), f"the drafter of {choice.ckpt}"
    elif choice.kind == "dflash" or (own and choice.kind == "heads"):
        if not own:
            raise ValueError(f"--proposer {choice.text}: {args.ckpt} holds no DFlash drafter "
                             f"({type(module).__name__}): give a DFlash checkpoint as --ckpt, or --proposer dflash:CKPT")
        drafter, what = module.drafter, f"the drafter of {args.ckpt}"
    else:
        return None
    if args.criterion.strip().startswith("draft:"):
        raise ValueError(f"--criterion {args.criterion}: the DFlash drafter proposes, not a draft model")
    return dflash_proposer(drafter, runtime, args.k, what)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        sys.exit("decode: --batch-size must be >= 1")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        sys.exit(f"decode: --max-new-tokens must be >= 1, got {args.max_new_tokens}")
    try:
        try:
            module = load_model(args.ckpt, args.device, base=args.base)
        except (ValueError, FileNotFoundError, OSError) as err:
            raise ValueError(load_error(err, args.base)) from None
        lm = hasattr(module, "encode_prompts")  # a language-modelling checkpoint: JSON Lines in and out
        if not hasattr(module, "tokenizer"):
            raise ValueError(f"{args.ckpt} is not a translation checkpoint")
        options = options_from_args(args, module)
        runtime = build_runtime(module.model, options)
        proposer = args.proposer
        dflash = dflash_choice(module, runtime, args)
        draft = (build_runtime(load_model(proposer.ckpt, args.device).model, options) if proposer.kind == "draft"
                 else None)
        sentences = read_lm_input(module, args) if lm else read_input(args.input)
        if dflash is not None:  # a drafter proposes (its block size is --k's); no heads
            method = make_method(args.criterion, parse_criterion, runtime, None, seed=args.seed, proposer=dflash)
        else:
            if proposer.auto is not None:
                tree = decode_auto_tree(module, runtime, sentences, lm, args)
            else:
                tree = proposer.tree(module.rank_agreement, args.k or module.model.k)
            method = make_method(proposer.criterion(args.criterion), parse_criterion, runtime, args.k, draft,
                                 seed=args.seed, tree=tree, **proposer.method_kwargs())
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
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
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
