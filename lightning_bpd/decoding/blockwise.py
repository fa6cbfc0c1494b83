"""Blockwise parallel decoding (Stern et al., 2018) with the model's own heads: the one loop's classic entry point.
Torch only.

:func:`blockwise_decode` is :func:`~lightning_bpd.decoding.loop.decode` with the heads proposing
(:class:`~lightning_bpd.decoding.proposers.Heads`: one block per row; :class:`~lightning_bpd.decoding.proposers.HeadTree`:
a tree; :class:`~lightning_bpd.decoding.proposers.DynamicHeadTree`: a tree per row). After a first call on BOS, every
iteration is ONE decoder call on the proposed tokens of each row: it verifies them and, at the last accepted position,
yields the next proposals, so n tokens cost one call. Rejected positions are cropped from the KV cache.
"""

from __future__ import annotations

from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion
from lightning_bpd.decoding.loop import decode
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.proposers.dynamic_tree import DynamicHeadTree
from lightning_bpd.decoding.proposers.heads import Heads
from lightning_bpd.decoding.proposers.tree import HeadTree
from lightning_bpd.decoding.protocol import BlockwiseModel, DecodeResult
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree


def heads_proposer(k: int | None = None, lazy: bool = False, stop_below: float | None = None,
                   tree: Tree | DynamicTree | None = None) -> Proposer:
    """The proposer of the model's own heads for these options: a block, a static tree or a dynamic one."""
    if tree is None:
        return Heads(k, lazy, stop_below)
    if lazy or stop_below is not None:
        raise ValueError("tree decoding takes neither lazy verification nor a confidence stop (stop_below)")
    if isinstance(tree, DynamicTree):
        return DynamicHeadTree(tree, k)
    return HeadTree(tree, k)


def blockwise_decode(
    model: BlockwiseModel,
    src: Tensor,
    criterion: Criterion | None = None,
    max_len: int = 256,
    k: int | None = None,
    lazy: bool = False,
    stop_below: float | None = None,
    tree: Tree | DynamicTree | None = None,
) -> DecodeResult:
    """Decode ``src`` (B, S) with blockwise parallel decoding.

    ``criterion`` defaults to :class:`Exact`, which reproduces greedy decoding token for token.
    ``k`` defaults to the model's number of heads. Rows accept different numbers of tokens and
    finish at different times (EOS inside a block ends the row; nothing after it is emitted).
    ``lazy`` verifies prefix rules position by position (:func:`~lightning_bpd.decoding.verify.verify_lazily`).
    ``stop_below`` is the confidence stop of deterministic rules (:func:`~lightning_bpd.decoding.proposers.heads.propose`):
    blocks may be shorter than k. ``tree``: propose and verify a tree of candidates instead
    (:class:`~lightning_bpd.decoding.proposers.HeadTree`), or a dynamic tree per row and iteration
    (:class:`~lightning_bpd.decoding.trees.tree.DynamicTree`, exact acceptance). The one loop
    (:func:`~lightning_bpd.decoding.loop.decode`) with the matching proposer (:func:`heads_proposer`).
    """
    return decode(model, src, criterion, heads_proposer(k, lazy, stop_below, tree), max_len)
