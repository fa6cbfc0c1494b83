"""Pretrained Hugging Face models behind the decoding protocol (imports transformers): seq2seq translation models
(:mod:`lightning_bpd.hf.base`) and decoder-only language models (:mod:`lightning_bpd.hf.causal`).

Importing it checks the transformers version against the tested range (:mod:`lightning_bpd.hf.compat`)."""

from lightning_bpd.hf.compat import check_version

check_version()

from lightning_bpd.hf.base import HFContext, HFSeq2SeqBlockwise, load_base
from lightning_bpd.hf.causal import CausalContext, HFCausalBlockwise, load_causal

__all__ = ["CausalContext", "HFCausalBlockwise", "HFContext", "HFSeq2SeqBlockwise", "load_base", "load_causal"]
