"""Lightning callbacks shared by the tasks."""

from lightning_bpd.callbacks.decode_eval import DecodeEval

__all__ = ["DecodeEval"]
