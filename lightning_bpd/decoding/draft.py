"""Speculative decoding with a separate draft model: the one loop with
:class:`~lightning_bpd.decoding.proposers.DraftModel` proposing (its module says how). Torch only."""

from __future__ import annotations

from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion
from lightning_bpd.decoding.loop import decode
from lightning_bpd.decoding.proposers.draft import DraftModel, check_draft_args
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult

__all__ = ["check_draft_args", "draft_decode"]


def draft_decode(
    target: BlockwiseModel,
    draft: BlockwiseModel,
    src: Tensor,
    criterion: Criterion | None = None,
    max_len: int = 256,
    k: int = 4,
) -> DecodeResult:
    """Decode ``src`` (B, S) with ``target``, ``draft`` proposing k-1 tokens of every block of k.

    ``criterion`` defaults to :class:`Exact` (the target's greedy output). ``model_calls`` counts the
    target's decoder calls (one per iteration plus the first on BOS); rows finish as in blockwise decoding.
    """
    return decode(target, src, criterion, DraftModel(draft, k), max_len)
