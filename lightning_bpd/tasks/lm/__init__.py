"""Language modelling: blockwise heads on a Hugging Face causal LM, trained on a folder of text or source files.

The drafter kinds' training modules live in their folders (``lightning_bpd.drafters.<kind>.module``); the names
``lightning_bpd.tasks.lm.DFlashModule`` and ``Eagle3Module`` of older configs still resolve, through the registry."""

from typing import Any

from lightning_bpd.tasks.lm.datamodule import LMDataModule
from lightning_bpd.tasks.lm.module import LMModule

__all__ = ["LMDataModule", "LMModule"]


def __getattr__(name: str) -> Any:
    """``DFlashModule`` / ``Eagle3Module`` (older configs' class paths): the registered kind's module class."""
    from lightning_bpd.drafters.registry import legacy_class

    found = legacy_class(f"{__name__}.{name}")
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found
