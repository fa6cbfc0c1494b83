"""Language modelling: blockwise heads on a Hugging Face causal LM, trained on a folder of text or source files."""

from lightning_bpd.tasks.lm.datamodule import LMDataModule
from lightning_bpd.tasks.lm.dflash_module import DFlashModule
from lightning_bpd.tasks.lm.eagle3_module import Eagle3Module
from lightning_bpd.tasks.lm.module import LMModule

__all__ = ["DFlashModule", "Eagle3Module", "LMDataModule", "LMModule"]
