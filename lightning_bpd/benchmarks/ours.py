"""What ``bench-generate``'s two paths (seq2seq and language-model checkpoints) share: our exact blockwise decoding as
a benchmark method, and the options it ran with, for the record."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding import DecodeResult, Exact, Tree, blockwise_decode, decode, greedy_decode
from lightning_bpd.decoding.proposers import Proposer
from lightning_bpd.inference.arguments import draft_vocab_of


def ours(runtime, k: int | None, tree: Tree | None = None, proposer: Proposer | None = None):
    """Our exact decoding as a method: ``(src, max_len) -> (sequences, iterations, model_calls)``; the heads propose
    (verifying ``tree``, when given), or ``proposer`` does (e.g. :class:`~lightning_bpd.decoding.proposers.PromptLookup`)."""
    if proposer is not None:
        return as_method(lambda src, max_len: decode(runtime, src, Exact(), proposer, max_len))
    return as_method(lambda src, max_len: blockwise_decode(runtime, src, Exact(), max_len, k=k, tree=tree))


def our_greedy(runtime):
    """Our runtime's own greedy decoding as a method of the same form as :func:`ours` (one token a call): the
    reference of our rows at a precision whose greedy is not ``generate``'s (int8, bfloat16)."""
    return as_method(lambda src, max_len: greedy_decode(runtime, src, max_len))


def as_method(decoding: Callable[[Tensor, int], DecodeResult]):
    """A decoding ``(src, max_len) -> DecodeResult`` as a bench method, without gradients:
    ``(src, max_len) -> (sequences, iterations, model_calls)``."""

    def run(src: Tensor, max_len: int) -> tuple[list[list[int]], int, int]:
        with torch.no_grad():
            result = decoding(src, max_len)
        return result.sequences(), int(result.iterations.sum()), int(result.model_calls)

    return run


def runtime_options(options, args: argparse.Namespace) -> dict[str, Any]:
    """What our decoding ran with, for the record (the draft vocabulary by its size and source)."""
    size, source = draft_vocab_of(args)
    return {**asdict(options), "draft_vocab": size, "draft_vocab_from": source}
