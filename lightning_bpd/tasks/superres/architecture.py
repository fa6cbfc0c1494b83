"""The super-resolution model's shape: a :class:`~lightning_bpd.nn.config.ModelConfig` with this task's defaults.

:class:`SuperResolutionConfig` is the ``architecture`` of :class:`~lightning_bpd.tasks.superres.SuperResolutionModule`
(``model.init_args.architecture`` in a config, its image options under ``image``). Its defaults are the image design
of issue 14 with heads centred on their own pixel; what the task fixes (vocabulary, token ids, the 8x8 and 32x32
rasters) stays as it is, and :func:`check_architecture` says so in one line when a config changes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lightning_bpd.nn.config import ImageOptions, ModelConfig
from lightning_bpd.tasks.superres.pixels import BOS_ID, OFFSET, PAD_ID, VOCAB_SIZE

LOW, HIGH = (8, 8, 3), (32, 32, 3)
POSITIONS = ("image", "grid")
FIXED = {"src_vocab_size": VOCAB_SIZE, "tgt_vocab_size": VOCAB_SIZE, "pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": None}
FIXED_IMAGE = {"src_image_shape": LOW, "tgt_image_shape": HIGH, "intensity_offset": OFFSET}
# The image design: options a checkpoint's weights must have been trained with (ModelConfig fields; image.* those of
# ImageOptions). A base of another design can neither warm-start a model nor load into it.
DESIGN = ("tie_output", "tie_output_to_source", "share_embeddings", "src_positions", "tgt_positions",
          "image.scale_positions", "image.direct_conditioning", "image.conditioning", "image.intensity_prior",
          "image.intensity_output")


def default_image() -> ImageOptions:
    """The image options of the defaults: both rasters on one grid at the token vectors' scale, the decoder input
    adding the input intensity under each target pixel, heads centred on the pixel each one predicts."""
    return ImageOptions(src_image_shape=LOW, tgt_image_shape=HIGH, scale_positions=True, direct_conditioning=True,
                        intensity_offset=OFFSET, head_centres="own")


@dataclass
class SuperResolutionConfig(ModelConfig):
    """A :class:`ModelConfig` whose defaults are the super-resolution model's: 128-wide, 2 encoder and 3 decoder
    layers, a 256-intensity local window, positions on one 32x32 grid and an untied output layer that is the source
    embedding (``tie_output_to_source``: the input intensity under the predicted pixel votes for itself, so the
    model starts from the upsampling that ``image.conditioning`` names), image options always present
    (:func:`default_image`; a config names only those it changes)."""

    src_vocab_size: int = VOCAB_SIZE
    tgt_vocab_size: int = VOCAB_SIZE
    d_model: int = 128
    n_encoder_layers: int = 2
    d_ff: int = 512
    src_positions: str = "grid"
    tgt_positions: str = "grid"
    window: int | None = 256
    tie_output: bool = False
    tie_output_to_source: bool = True
    image: ImageOptions = field(default_factory=default_image)  # type: ignore[assignment]
    eos_id: int | None = None


def check_architecture(config: ModelConfig) -> None:
    """What super-resolution needs of a config beyond what :class:`ModelConfig` checks: the values the task fixes
    (:data:`FIXED`, :data:`FIXED_IMAGE`), one kind of image positions for both rasters, and direct conditioning
    under an output layer tied to the source embedding."""
    for key, value in FIXED.items():
        if getattr(config, key) != value:
            raise ValueError(f"model.architecture.{key} is {value!r} in super-resolution, got {getattr(config, key)!r}")
    if config.image is None:
        raise ValueError("model.architecture.image: super-resolution needs the image options")
    for key, value in FIXED_IMAGE.items():
        if getattr(config.image, key) != value:
            raise ValueError(f"model.architecture.image.{key} is {value!r} in super-resolution (8x8 -> 32x32), "
                             f"got {getattr(config.image, key)!r}")
    if config.src_positions != config.tgt_positions or config.src_positions not in POSITIONS:
        raise ValueError(f"model.architecture.src_positions and tgt_positions must be the same, one of {POSITIONS}; "
                         f"got {config.src_positions!r} and {config.tgt_positions!r}")
    if config.tie_output_to_source and not config.image.direct_conditioning:
        raise ValueError("model.architecture.tie_output_to_source needs image.direct_conditioning: true (the input "
                         "intensity it votes for is the one direct conditioning adds)")


def design_of(config: ModelConfig) -> dict[str, Any]:
    """The :data:`DESIGN` options of ``config``, by name."""
    return {name: getattr(config.image if name.startswith("image.") else config, name.removeprefix("image."))
            for name in DESIGN}
