"""English->German translation task."""

from lightning_bpd.tasks.translation.datamodule import TranslationDataModule
from lightning_bpd.tasks.translation.module import TranslationConfig, TranslationModule

__all__ = ["TranslationConfig", "TranslationDataModule", "TranslationModule"]
