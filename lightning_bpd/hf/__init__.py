"""Pretrained Hugging Face translation models behind the decoding protocol (imports transformers).

Importing it checks the transformers version against the tested range (:mod:`lightning_bpd.hf.compat`)."""

from lightning_bpd.hf.compat import check_version

check_version()

from lightning_bpd.hf.base import HFContext, HFSeq2SeqBlockwise, load_base

__all__ = ["HFContext", "HFSeq2SeqBlockwise", "load_base"]
