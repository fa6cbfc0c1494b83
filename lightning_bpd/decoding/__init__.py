"""Task-agnostic decoding core (torch only): greedy, blockwise parallel decoding and their references."""

from lightning_bpd.decoding.blockwise import blockwise_decode
from lightning_bpd.decoding.criteria import Criterion, Distance, Exact, MinBlock, TopK, parse_criterion
from lightning_bpd.decoding.greedy import greedy_decode, greedy_decode_reference
from lightning_bpd.decoding.protocol import DecodeResult
from lightning_bpd.decoding.reference import blockwise_decode_reference

__all__ = [
    "Criterion",
    "DecodeResult",
    "Distance",
    "Exact",
    "MinBlock",
    "TopK",
    "blockwise_decode",
    "blockwise_decode_reference",
    "greedy_decode",
    "greedy_decode_reference",
    "parse_criterion",
]
