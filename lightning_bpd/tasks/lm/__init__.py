"""Language modelling: blockwise heads on a Hugging Face causal LM, trained on a folder of text or source files.

The drafter kinds' training modules live in their folders (``lightning_bpd.drafters.<kind>.module``); the names
``lightning_bpd.tasks.lm.DFlashModule`` and ``Eagle3Module`` of older configs still resolve (:mod:`lightning_bpd.class_paths`)."""

from typing import Any

from lightning_bpd.tasks.lm.datamodule import LMDataModule
from lightning_bpd.tasks.lm.module import LMModule

__all__ = ["LMDataModule", "LMModule"]


def __getattr__(name: str) -> Any:
    """``DFlashModule`` / ``Eagle3Module`` (older configs' class paths): the class in its kind's folder now."""
    import importlib

    from lightning_bpd.class_paths import current

    old = f"{__name__}.{name}"
    if current(old) == old:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, cls = current(old).rpartition(".")
    return getattr(importlib.import_module(module_name), cls)
