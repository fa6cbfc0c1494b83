"""Language modelling: blockwise heads on a Hugging Face causal LM, trained on a folder of text or source files."""

from lightning_bpd.tasks.lm.datamodule import LMDataModule
from lightning_bpd.tasks.lm.dflash_module import DFlashModule
from lightning_bpd.tasks.lm.module import LMModule

__all__ = ["DFlashModule", "LMDataModule", "LMModule"]
