"""The command-line face of :class:`~lightning_bpd.inference.options.InferenceOptions`, below every command.

``decode`` offers what a user needs (:func:`add_precision_arg`, :func:`add_draft_vocab_args`); ``bench`` and
``where_time_goes`` add the timing experiments (:func:`add_timing_args`). :func:`options_from_args` reads
whichever of them a parser has into one :class:`InferenceOptions`.
"""

from __future__ import annotations

import argparse
from typing import Any

from lightning_bpd.inference.options import InferenceOptions

PRECISION_HELP = (
    "decode with the model in float32, bfloat16 (fast several-row products on AVX-512-BF16 / AMX CPUs), float64, "
    "float32-invariant (float32 with float64 products: the verify pass and the greedy step round alike, so exact "
    "decoding equals greedy even with the Gaussian image output), float32-packed (float32 with oneDNN's packed weights: "
    "batch-invariant products on these CPUs, cheap for several rows; float64 attention), bfloat16-invariant (bfloat16 with float64 "
    "attention) or int8 (float32 weights multiplied in int8 with a scale per weight row and per activation row, "
    "float64 attention: batch-invariant, so exact decoding equals int8 greedy; CPU) (default: as trained)")


def add_precision_arg(p: argparse.ArgumentParser) -> None:
    """``--precision``."""
    p.add_argument("--precision", default=None, help=PRECISION_HELP)


def draft_vocab_arg(text: str) -> tuple[int, str | None]:
    """``--draft-vocab``'s argparse type: ``N:TEXT`` (or N alone, with the deprecated ``--draft-vocab-from TEXT``)."""
    size, _, path = text.partition(":")
    try:
        return int(size), path or None
    except ValueError:
        raise argparse.ArgumentTypeError(f"--draft-vocab N:TEXT takes an integer N, got {text!r}") from None


def add_draft_vocab_args(p: argparse.ArgumentParser) -> None:
    """``--draft-vocab N:TEXT``: the heads propose only the N most frequent target tokens of TEXT (the old
    ``--draft-vocab N --draft-vocab-from TEXT`` still works, with a deprecation line)."""
    from lightning_bpd.deprecated_options import deprecated_option

    p.add_argument("--draft-vocab", type=draft_vocab_arg, default=None, metavar="N:TEXT",
                   help="the heads propose only the N most frequent target tokens of the text file TEXT "
                        "(target-language text, .gz allowed)")
    deprecated_option(p, "--draft-vocab-from", "--draft-vocab N:TEXT", default=None)


def draft_vocab_of(args: argparse.Namespace) -> tuple[int | None, str | None]:
    """The size and text of ``--draft-vocab N:TEXT`` (or of ``--draft-vocab N --draft-vocab-from TEXT``)."""
    value = getattr(args, "draft_vocab", None)
    size, text = value if isinstance(value, tuple) else (value, None)
    return size, text or getattr(args, "draft_vocab_from", None)


def add_timing_args(p: argparse.ArgumentParser) -> None:
    """The timing experiments of ``bench`` and ``where_time_goes``."""
    p.add_argument("--stop-below", type=float, default=None,
                   help="confidence stop: a block ends before the first head whose probability of its own token "
                        "is below this (deterministic rules; exact decoding stays exact)")
    p.add_argument("--proposal-precision", default=None,
                   help="the heads propose from a copy in this precision (e.g. bfloat16; int8: a float32 copy whose "
                        "chain links and projection multiply in int8) while verification keeps --precision: exact "
                        "decoding stays exact")
    p.add_argument("--screened-argmax", action="store_true",
                   help="greedy decoding and exact verification take p_1's argmax through an int8 screen of the "
                        "vocabulary and float64 logits of the candidates it leaves: the float64 logits' argmax, the "
                        "same in a k-token verify pass as in a 1-token step; CPU, float32 translation models")
    p.add_argument("--reference-steps", action="store_true",
                   help="run the encoder and the cached decoder steps through the reference modules instead of the "
                        "TorchScript lean steps (same outputs); for timing the difference")
    p.add_argument("--unfused-chain", action="store_true",
                   help="chained heads propose through the reference links instead of the fused ones; for timing")


def options_from_args(args: argparse.Namespace, module: Any = None) -> InferenceOptions:
    """The :class:`InferenceOptions` that a command's parsed arguments ask for, the one road from a command to a
    runtime: ``--precision``, the timing options and the draft vocabulary of ``--draft-vocab N --draft-vocab-from
    TEXT`` counted with ``module``'s tokenizer (raises ValueError on a bad name or a draft vocabulary without
    them)."""
    from lightning_bpd.tasks.inputs import draft_vocab_ids

    return InferenceOptions(
        precision=getattr(args, "precision", None),
        draft_vocab=draft_vocab_ids(module, *draft_vocab_of(args)),
        proposal_precision=getattr(args, "proposal_precision", None),
        screened_argmax=getattr(args, "screened_argmax", False),
        lean_steps=not getattr(args, "reference_steps", False),
        fused_chain=not getattr(args, "unfused_chain", False),
        stop_below=getattr(args, "stop_below", None),
        fixed_shape=getattr(args, "fixed_shape", False),
    )
