"""The shape and options of a :class:`~lightning_bpd.nn.model.BlockwiseTransformer`."""

from __future__ import annotations

from dataclasses import dataclass

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
class ModelConfig:
    """Shape of a :class:`BlockwiseTransformer`. ``head_hidden`` defaults to ``d_ff``.

    Image options (their defaults are the original design, which translation keeps):
    ``tie_output``: the vocabulary projection is the target embedding (else its own layer with a bias);
    ``tie_output_to_source``: the vocabulary projection is the source embedding (a table of its own,
    ``share_embeddings`` off), so that with direct conditioning the input intensity under the predicted
    position votes for itself: nearest-neighbour upsampling is the model's prior, not the last token;
    ``src_positions = tgt_positions = "grid"``: both rasters on one shared row / column grid;
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
    src_image_shape: tuple[int, int, int] | None = None
    tgt_image_shape: tuple[int, int, int] | None = None
    window: int | None = None
    tie_output: bool = True
    tie_output_to_source: bool = False
    scale_positions: bool = False
    direct_conditioning: bool = False
    conditioning: str = "nearest"
    intensity_prior: float = 0.0
    intensity_output: str = "categorical"
    intensity_offset: int = 3
    head_centres: str = "first"
    head_neighbours: bool = False
    head_prior: str = "shared"
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int | None = 2

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
        for name in ("src_image_shape", "tgt_image_shape"):
            if getattr(self, name) is not None:
                setattr(self, name, tuple(getattr(self, name)))
        self.check_image_options()

    def check_image_options(self) -> None:
        images = self.src_image_shape is not None and self.tgt_image_shape is not None
        if "grid" in (self.src_positions, self.tgt_positions) and not (
            self.src_positions == self.tgt_positions == "grid" and images
        ):
            raise ValueError("grid positions need src_positions = tgt_positions = 'grid' and both image shapes")
        if self.scale_positions and "sinusoidal" in (self.src_positions, self.tgt_positions):
            raise ValueError("scale_positions applies to image positions ('image' or 'grid'), not 'sinusoidal'")
        if self.tie_output_to_source and (self.tie_output or self.share_embeddings):
            raise ValueError("tie_output_to_source needs tie_output off and share_embeddings off "
                             "(a source embedding of its own to tie the output to)")
        if self.conditioning not in CONDITIONING:
            raise ValueError(f"conditioning must be one of {CONDITIONING}, got {self.conditioning!r}")
        if self.direct_conditioning:
            if not images:
                raise ValueError("direct_conditioning needs src_image_shape and tgt_image_shape")
            (sh, sw, sc), (th, tw, tc) = self.src_image_shape, self.tgt_image_shape
            if th % sh or tw % sw or sc != tc:
                raise ValueError(f"direct_conditioning needs a target {th}x{tw}x{tc} that is an integer multiple "
                                 f"of the source {sh}x{sw}x{sc} (same channels)")
            if not self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
                raise ValueError("direct_conditioning needs one vocabulary for source and target intensities")
        if self.intensity_prior < 0:
            raise ValueError(f"intensity_prior must be >= 0 intensity levels (0 = off), got {self.intensity_prior}")
        if self.intensity_prior > 0 and (not self.direct_conditioning or self.d_model <= RESERVED):
            raise ValueError("intensity_prior is centred on the input intensity that direct conditioning adds: it "
                             f"needs direct_conditioning and d_model > {RESERVED}")
        if self.intensity_output not in INTENSITY_OUTPUTS:
            raise ValueError(f"intensity_output must be one of {INTENSITY_OUTPUTS}, got {self.intensity_output!r}")
        if self.intensity_output == "gaussian" and self.intensity_prior <= 0:
            raise ValueError("intensity_output 'gaussian' needs intensity_prior > 0 (its initial width in levels)")
        if self.head_centres not in HEAD_CENTRES:
            raise ValueError(f"head_centres must be one of {HEAD_CENTRES}, got {self.head_centres!r}")
        if self.head_neighbours and self.k > 1 and not (self.intensity_prior > 0 and self.head_centres == "own"
                                                        and self.head_type in ("chained", "chained_attn")):
            raise ValueError("head_neighbours needs chained heads (head_type chained or chained_attn) centred on their "
                             "own pixel (intensity_prior > 0, head_centres: own)")
        if self.head_prior not in HEAD_PRIORS:
            raise ValueError(f"head_prior must be one of {HEAD_PRIORS}, got {self.head_prior!r}")
        if self.head_prior != "shared" and self.k > 1 and not (self.intensity_output == "gaussian"
                                                             and self.head_centres == "own"):
            raise ValueError(f"head_prior {self.head_prior!r} gives the heads a shift-and-width layer of the Gaussian "
                             "output's: it needs intensity_output 'gaussian' and head_centres 'own'")
        if self.intensity_prior > 0 and not 0 <= self.intensity_offset <= self.tgt_vocab_size - 2:
            raise ValueError(f"intensity_offset {self.intensity_offset} leaves fewer than two intensity ids in a "
                             f"vocabulary of {self.tgt_vocab_size}: set it to the first intensity id")
