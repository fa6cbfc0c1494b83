"""The shape and options of a :class:`~lightning_bpd.nn.model.BlockwiseTransformer`.

:class:`ModelConfig` holds what both tasks share; the image options nest in :class:`ImageOptions`
(``ModelConfig.image``, None for translation). :meth:`ModelConfig.from_dict` also reads the flat dicts of
before the nesting (every image option at the top level).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from lightning_bpd.nn.conditioning import CONDITIONING
from lightning_bpd.nn.intensity_prior import RESERVED

# "paper": the paper's parallel head (section 6); "chained": heads that see the tokens proposed
# before them; "chained_attn": chained heads that also attend over the source
# (:mod:`lightning_bpd.nn.chained_head`).
HEAD_TYPES = ("paper", "chained", "chained_attn")
# The output distribution over intensities (:mod:`lightning_bpd.nn.intensity_prior`).
INTENSITY_OUTPUTS = ("categorical", "gaussian")
# Where head i's intensity prior is centred: "first": on the input intensity under the position p_1
# predicts (t; the original design), "own": under the position head i predicts (t + i).
HEAD_CENTRES = ("first", "own")
HEAD_PRIORS = ("shared", "own", "residual")


@dataclass
class ImageOptions:
    """The image options of a :class:`ModelConfig` (their defaults are the original design).

    ``src_image_shape``, ``tgt_image_shape``: (H, W, C) of the source and target rasters;
    ``scale_positions``: image position vectors are scaled to the token vectors' size (RMS 1, like
    ``embedding * sqrt(d)``); ``direct_conditioning``: the decoder input at target intensity
    (r, c, channel) adds the source embedding of the input intensity at (r / f, c / f, channel);
    ``conditioning``: which input intensity it adds, ``nearest`` (the one under the target pixel),
    ``bilinear`` (the bilinear interpolation of the four around the target pixel's centre, rounded) or
    ``bicubic`` (the bicubic one of the sixteen around it, rounded and clipped: bicubic upsampling);
    ``intensity_prior``: a Gaussian prior of this initial width (intensity levels; 0 = off) over every
    output distribution, centred on that input intensity (:mod:`~lightning_bpd.nn.intensity_prior`);
    ``intensity_output``: ``categorical`` (a softmax over the vocabulary, plus the prior) or ``gaussian``
    (a discretized Gaussian per intensity around the input intensity, shift and width predicted);
    ``intensity_offset``: the first intensity id (the target vocabulary's ids from there on are intensities);
    ``head_centres``: with the prior and k > 1, ``own`` centres head i's distribution on the input
    intensity under the position *it* predicts (t + i), ``first`` on the one under p_1's (t; the original
    design, in which heads 2..k cannot see the input under their own pixel);
    ``head_neighbours``: chained heads with own centres also read the decoded intensities around the pixel
    each one predicts (left, above-left, above, above-right; :mod:`~lightning_bpd.nn.pixel_neighbours`); a
    base (k = 1) ignores it, as it does ``head_centres``;
    ``head_prior``: with a Gaussian output and own centres, ``own`` gives heads 2..k a shift-and-width layer of
    their own (``head.prior_adapt``, a copy of the prior's ``adapt``), so that their losses cannot move p_1's
    mean; ``residual`` reads them out through the prior's layer detached plus a correction of their own
    (``head.prior_adapt``, starting at zero): they follow p_1's layer as it learns and still cannot move it;
    ``shared`` (default): every head reads out through the prior's. A base ignores it.
    """

    src_image_shape: tuple[int, int, int]
    tgt_image_shape: tuple[int, int, int]
    scale_positions: bool = False
    direct_conditioning: bool = False
    conditioning: str = "nearest"
    intensity_prior: float = 0.0
    intensity_output: str = "categorical"
    intensity_offset: int = 3
    head_centres: str = "first"
    head_neighbours: bool = False
    head_prior: str = "shared"

    def __post_init__(self) -> None:
        if self.src_image_shape is None or self.tgt_image_shape is None:
            raise ValueError("image options need src_image_shape and tgt_image_shape")
        self.src_image_shape, self.tgt_image_shape = tuple(self.src_image_shape), tuple(self.tgt_image_shape)
        if self.conditioning not in CONDITIONING:
            raise ValueError(f"conditioning must be one of {CONDITIONING}, got {self.conditioning!r}")
        if self.direct_conditioning:
            (sh, sw, sc), (th, tw, tc) = self.src_image_shape, self.tgt_image_shape
            if th % sh or tw % sw or sc != tc:
                raise ValueError(f"direct_conditioning needs a target {th}x{tw}x{tc} that is an integer multiple "
                                 f"of the source {sh}x{sw}x{sc} (same channels)")
        if self.intensity_prior < 0:
            raise ValueError(f"intensity_prior must be >= 0 intensity levels (0 = off), got {self.intensity_prior}")
        if self.intensity_output not in INTENSITY_OUTPUTS:
            raise ValueError(f"intensity_output must be one of {INTENSITY_OUTPUTS}, got {self.intensity_output!r}")
        if self.intensity_output == "gaussian" and self.intensity_prior <= 0:
            raise ValueError("intensity_output 'gaussian' needs intensity_prior > 0 (its initial width in levels)")
        if self.head_centres not in HEAD_CENTRES:
            raise ValueError(f"head_centres must be one of {HEAD_CENTRES}, got {self.head_centres!r}")
        if self.head_prior not in HEAD_PRIORS:
            raise ValueError(f"head_prior must be one of {HEAD_PRIORS}, got {self.head_prior!r}")


IMAGE_KEYS = tuple(f.name for f in fields(ImageOptions))  # the flat keys of before the nesting


@dataclass
class ModelConfig:
    """Shape of a :class:`BlockwiseTransformer`. ``head_hidden`` defaults to ``d_ff``.

    ``tie_output``: the vocabulary projection is the target embedding (else its own layer with a bias);
    ``tie_output_to_source``: the vocabulary projection is the source embedding (a table of its own,
    ``share_embeddings`` off), so that with direct conditioning the input intensity under the predicted
    position votes for itself: nearest-neighbour upsampling is the model's prior, not the last token;
    ``src_positions``, ``tgt_positions``: ``sinusoidal``, or for images (``image`` options needed) ``image``
    (row / column / channel tables) or ``grid`` (both rasters on one shared row / column grid);
    ``window``: the decoder's local self-attention window (None: the whole prefix);
    ``image``: the image options (:class:`ImageOptions`), None for text;
    ``decoder_only``: no encoder and no cross-attention, the decoder's layers alone over a prompt and its continuation
    (:class:`~lightning_bpd.nn.causal_model.CausalTransformer`; one vocabulary, ``n_encoder_layers`` 0, text only).
    """

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 256
    n_heads: int = 4
    n_encoder_layers: int = 3
    n_decoder_layers: int = 3
    d_ff: int = 1024
    dropout: float = 0.1
    k: int = 1
    head_hidden: int | None = None
    identity_first: bool = False
    head_type: str = "paper"
    draft_vocab: int | None = None
    share_embeddings: bool = False
    src_positions: str = "sinusoidal"
    tgt_positions: str = "sinusoidal"
    window: int | None = None
    tie_output: bool = True
    tie_output_to_source: bool = False
    image: ImageOptions | None = None
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int | None = 2
    decoder_only: bool = False

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> ModelConfig:
        """A config from a dict: the nested one of :func:`dataclasses.asdict` (``image`` a dict, an
        :class:`ImageOptions` or None) or the flat one of before the nesting, every image option at the top level
        (``src_image_shape: None`` or absent: no image options). Flat image keys beside ``image`` override it."""
        options = dict(options)
        image = options.pop("image", None)
        flat = {key: options.pop(key) for key in IMAGE_KEYS if key in options}
        image = asdict(image) if isinstance(image, ImageOptions) else dict(image or {})
        image.update(flat)
        if image.get("src_image_shape") is None and image.get("tgt_image_shape") is None:
            defaults = {f.name: f.default for f in fields(ImageOptions)}
            changed = sorted(key for key, value in image.items() if value is not None and value != defaults[key])
            if changed:
                raise ValueError(f"image options {changed} need src_image_shape and tgt_image_shape")
            return cls(**options)
        return cls(**options, image=ImageOptions(**image))

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("n_encoder_layers", "n_decoder_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {self.dropout}")
        if self.head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES}, got {self.head_type!r}")
        if self.head_type == "chained_attn" and self.n_decoder_layers < 1:
            raise ValueError("head_type chained_attn reads the last decoder layer's cross-attention: n_decoder_layers >= 1")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("share_embeddings needs src_vocab_size == tgt_vocab_size")
        if self.tie_output_to_source and (self.tie_output or self.share_embeddings):
            raise ValueError("tie_output_to_source needs tie_output off and share_embeddings off "
                             "(a source embedding of its own to tie the output to)")
        if isinstance(self.image, Mapping):
            self.image = ImageOptions(**self.image)
        if "grid" in (self.src_positions, self.tgt_positions) and not (
            self.src_positions == self.tgt_positions == "grid" and self.image is not None
        ):
            raise ValueError("grid positions need src_positions = tgt_positions = 'grid' and both image shapes")
        if self.image is not None:
            self.check_image_options(self.image)
        if self.decoder_only:
            self.check_decoder_only()

    def check_decoder_only(self) -> None:
        """What a decoder-only model cannot have: an encoder, a source vocabulary of its own, image options, a local
        window (its prompt is not in the ring cache), heads that attend over a source."""
        wrong = [f"{name}={value!r}" for name, value, ok in (
            ("n_encoder_layers", self.n_encoder_layers, self.n_encoder_layers == 0),
            ("src_vocab_size", self.src_vocab_size, self.src_vocab_size == self.tgt_vocab_size),
            ("image", self.image, self.image is None), ("window", self.window, self.window is None),
            ("head_type", self.head_type, self.head_type != "chained_attn"),
            ("tie_output_to_source", self.tie_output_to_source, not self.tie_output_to_source),
            ("tgt_positions", self.tgt_positions, self.tgt_positions == "sinusoidal")) if not ok]
        if wrong:
            raise ValueError(f"decoder_only takes n_encoder_layers 0, src_vocab_size = tgt_vocab_size, no image "
                             f"options, no window, no chained_attn head, no tie_output_to_source and sinusoidal "
                             f"positions: got {', '.join(wrong)}")

    def check_image_options(self, image: ImageOptions) -> None:
        """What the image options need of the rest of the config."""
        if image.scale_positions and "sinusoidal" in (self.src_positions, self.tgt_positions):
            raise ValueError("scale_positions applies to image positions ('image' or 'grid'), not 'sinusoidal'")
        if image.direct_conditioning and not self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError("direct_conditioning needs one vocabulary for source and target intensities")
        if image.intensity_prior > 0 and (not image.direct_conditioning or self.d_model <= RESERVED):
            raise ValueError("intensity_prior is centred on the input intensity that direct conditioning adds: it "
                             f"needs direct_conditioning and d_model > {RESERVED}")
        if image.head_neighbours and self.k > 1 and not (image.intensity_prior > 0 and image.head_centres == "own"
                                                         and self.head_type in ("chained", "chained_attn")):
            raise ValueError("head_neighbours needs chained heads (head_type chained or chained_attn) centred on their "
                             "own pixel (intensity_prior > 0, head_centres: own)")
        if image.head_prior != "shared" and self.k > 1 and not (image.intensity_output == "gaussian"
                                                              and image.head_centres == "own"):
            raise ValueError(f"head_prior {image.head_prior!r} gives the heads a shift-and-width layer of the Gaussian "
                             "output's: it needs intensity_output 'gaussian' and head_centres 'own'")
        if image.intensity_prior > 0 and not 0 <= image.intensity_offset <= self.tgt_vocab_size - 2:
            raise ValueError(f"intensity_offset {image.intensity_offset} leaves fewer than two intensity ids in a "
                             f"vocabulary of {self.tgt_vocab_size}: set it to the first intensity id")


MODEL_KEYS = tuple(f.name for f in fields(ModelConfig))
