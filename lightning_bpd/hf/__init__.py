"""Pretrained Hugging Face translation models behind the decoding protocol (imports transformers)."""

from lightning_bpd.hf.base import HFContext, HFSeq2SeqBlockwise, load_base

__all__ = ["HFContext", "HFSeq2SeqBlockwise", "load_base"]
