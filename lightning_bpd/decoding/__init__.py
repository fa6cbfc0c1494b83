"""Task-agnostic decoding core (torch only): greedy, blockwise parallel decoding (eager, and with fixed shapes for
CUDA graphs), beam search and their references."""

from lightning_bpd.decoding.agreement import head_agreement
from lightning_bpd.decoding.beam import BeamResult, beam_search, beam_search_reference
from lightning_bpd.decoding.blockwise import blockwise_decode
from lightning_bpd.decoding.criteria import (
    Criterion,
    Distance,
    Exact,
    MinBlock,
    SpeculativeSampling,
    TopK,
    parse_criterion,
)
from lightning_bpd.decoding.greedy import greedy_decode, greedy_decode_reference
from lightning_bpd.decoding.protocol import DecodeResult
from lightning_bpd.decoding.reference import blockwise_decode_reference
from lightning_bpd.decoding.static import StaticDecoder, static_decode

__all__ = [
    "BeamResult",
    "Criterion",
    "DecodeResult",
    "Distance",
    "Exact",
    "MinBlock",
    "SpeculativeSampling",
    "StaticDecoder",
    "TopK",
    "beam_search",
    "beam_search_reference",
    "blockwise_decode",
    "blockwise_decode_reference",
    "greedy_decode",
    "greedy_decode_reference",
    "head_agreement",
    "parse_criterion",
    "static_decode",
]
