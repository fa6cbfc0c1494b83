"""CelebA 8x8 -> 32x32 super-resolution with a blockwise Image Transformer."""

from lightning_bpd.tasks.superres.architecture import SuperResolutionConfig
from lightning_bpd.tasks.superres.datamodule import SuperResolutionDataModule
from lightning_bpd.tasks.superres.module import SuperResolutionModule

__all__ = ["SuperResolutionConfig", "SuperResolutionDataModule", "SuperResolutionModule"]
