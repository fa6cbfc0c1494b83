"""Task modules of the tests, built from a few named options: the architecture's as keywords, the image options and
the training options as dicts over each task's defaults."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from lightning_bpd.tasks.superres import SuperResolutionConfig, SuperResolutionModule
from lightning_bpd.tasks.superres.architecture import default_image
from lightning_bpd.tasks.superres.module import TRAINING as SUPERRES_TRAINING
from lightning_bpd.tasks.training_options import TrainingOptions
from lightning_bpd.tasks.translation import TranslationConfig, TranslationModule


def translation_module(training: dict[str, Any] | None = None, max_len_a: float = 1.5, max_len_b: int = 10,
                       **architecture: Any) -> TranslationModule:
    """A :class:`TranslationModule` of ``TranslationConfig(**architecture)`` and ``TrainingOptions(**training)``."""
    return TranslationModule(TranslationConfig(**architecture), TrainingOptions(**(training or {})), max_len_a,
                             max_len_b)


def superres_config(image: dict[str, Any] | None = None, **architecture: Any) -> SuperResolutionConfig:
    """The super-resolution defaults with these architecture options and ``image`` options."""
    return SuperResolutionConfig(**architecture, image=replace(default_image(), **(image or {})))


def superres_module(training: dict[str, Any] | None = None, image: dict[str, Any] | None = None,
                    intensity_sigma: float = 0.0, smooth_intensities: bool = True,
                    **architecture: Any) -> SuperResolutionModule:
    """A :class:`SuperResolutionModule` of :func:`superres_config` trained with the task's defaults and ``training``."""
    return SuperResolutionModule(superres_config(image, **architecture), replace(SUPERRES_TRAINING, **(training or {})),
                                 intensity_sigma, smooth_intensities)
