"""Task-agnostic decoding core (torch only): greedy decoding, the one speculative loop (:func:`decode`, with the
proposers of :mod:`~lightning_bpd.decoding.proposers`: the heads, trees of them, a draft model, prompt lookup, a
DFlash drafter; :func:`blockwise_decode` is it with the heads), fixed shapes for CUDA graphs, beam search and their
references."""

from lightning_bpd.decoding.acceptance import (
    Criterion,
    Distance,
    Exact,
    MinBlock,
    SpeculativeSampling,
    TopK,
    parse_criterion,
)
from lightning_bpd.decoding.agreement import head_agreement, head_rank_agreement
from lightning_bpd.decoding.beam import BeamResult, beam_search
from lightning_bpd.decoding.blockwise import blockwise_decode
from lightning_bpd.decoding.greedy import greedy_decode
from lightning_bpd.decoding.loop import decode
from lightning_bpd.decoding.protocol import DecodeResult
from lightning_bpd.decoding.reference.beam import beam_search_reference
from lightning_bpd.decoding.reference.blockwise import blockwise_decode_reference
from lightning_bpd.decoding.reference.greedy import greedy_decode_reference
from lightning_bpd.decoding.reference.tree import tree_decode_reference
from lightning_bpd.decoding.static import StaticDecoder, static_decode
from lightning_bpd.decoding.trees.tree import DynamicTree, Tree, parse_tree

__all__ = [
    "BeamResult",
    "Criterion",
    "DecodeResult",
    "Distance",
    "DynamicTree",
    "Exact",
    "MinBlock",
    "SpeculativeSampling",
    "StaticDecoder",
    "TopK",
    "Tree",
    "beam_search",
    "beam_search_reference",
    "blockwise_decode",
    "blockwise_decode_reference",
    "decode",
    "greedy_decode",
    "greedy_decode_reference",
    "head_agreement",
    "head_rank_agreement",
    "parse_criterion",
    "parse_tree",
    "static_decode",
    "tree_decode_reference",
]
