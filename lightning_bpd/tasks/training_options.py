"""How a task module trains: the options of the blockwise training step that every task shares.

:class:`TrainingOptions` is the ``training`` argument of every task module (``model.init_args.training`` in a
config); the model's shape is its ``architecture`` (:class:`~lightning_bpd.nn.config.ModelConfig`). Each value is
checked here, once, with one line that names it; what also depends on the model (``freeze_base`` with k = 1, a
readout to train) is checked by :class:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lightning_bpd.nn.loss import LOSS_MODES

NOISE_KINDS = ("shuffle", "uniform", "span", "self")  # how corrupt_inputs replaces decoder inputs
HEAD_TARGETS = ("data", "own")  # what heads 2..k train towards (BlockwiseModule.head_target_tokens)
DETACH_HEADS = ("none", "states", "base")  # what heads 2..k's losses may not train (BlockwiseModule.head_logits)
PREFIX = "model.training."  # where the options sit in a config (model.init_args.training), as errors name them


@dataclass(frozen=True)
class TrainingOptions:
    """The two-stage recipe and its optimization (defaults: the paper's recipe, the base trained alone).

    ``loss_mode``: ``random`` (one head per minibatch, the paper's) or ``mean`` (every head);
    ``freeze_base``: train only the heads (needs ``init_from``, k >= 2); ``init_from``: a checkpoint whose
    non-head weights initialize the model (stage 2 starts from the stage-1 base);
    ``lr``, ``warmup_steps``, ``label_smoothing``, ``weight_decay``: AdamW with linear warm-up, then inverse-sqrt decay;
    ``seed``: of the per-minibatch head choice (and the training loss's random positions);
    ``loss_fraction``: share of target positions at which the training loss is evaluated (1 = all, the paper);
    ``head1_weight``: when fine-tuning, p_1's loss is kept in every minibatch with this weight
    (``w * L_1 + (1 - w) * mean of the other heads``; 0 = the paper's loss);
    ``head_loss_decay``: head i (1-based) weighs ``head_loss_decay ** (i - 1)`` (Medusa-2's decaying head weights;
    in random mode the trained head is drawn with these odds; 1 = equal);
    ``base_lr_scale``: when fine-tuning, the base learns at ``lr * base_lr_scale`` and the heads at ``lr`` (Medusa-2);
    ``frozen_cache_gb``: with a frozen base, up to this many GiB of its decoder states are kept per training example
    (computed once, no dropout) so that a head step skips the base (0 = recompute);
    ``input_noise``, ``input_noise_kind``: share of the teacher-forced decoder inputs replaced while the base trains,
    and by what (:meth:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule.corrupt_inputs`; 0 = plain teacher
    forcing);
    ``head_targets``: ``data`` (heads 2..k train towards the data) or ``own`` (towards the model's own greedy choice
    given the teacher-forced prefix: self-distilled targets on the fly);
    ``detach_heads``: what heads 2..k's losses may not train when base and heads train together: ``none`` (the
    paper's joint training), ``states`` (the decoder learns from p_1's loss alone) or ``base`` (no base weight);
    ``train_readout``: with ``freeze_base``, the base's readout (a Gaussian output's shift-and-width layer, after the
    decoder states) trains beside the heads.
    """

    loss_mode: str = "random"
    freeze_base: bool = False
    init_from: str | None = None
    lr: float = 1e-3
    warmup_steps: int = 1000
    label_smoothing: float = 0.1
    weight_decay: float = 0.0
    seed: int = 0
    loss_fraction: float = 1.0
    head1_weight: float = 0.0
    head_loss_decay: float = 1.0
    base_lr_scale: float = 1.0
    frozen_cache_gb: float = 4.0
    input_noise: float = 0.0
    input_noise_kind: str = "shuffle"
    head_targets: str = "data"
    detach_heads: str = "none"
    train_readout: bool = False

    @classmethod
    def from_dict(cls, options: Mapping[str, Any]) -> TrainingOptions:
        """The options of a dict (a checkpoint's ``training``); an unknown key is one error that names it."""
        unknown = sorted(set(options) - set(TRAINING_KEYS))
        if unknown:
            raise ValueError(f"unknown training options {unknown} (known: {', '.join(TRAINING_KEYS)})")
        return cls(**options)

    def __post_init__(self) -> None:
        for name, allowed in (("loss_mode", LOSS_MODES), ("input_noise_kind", NOISE_KINDS),
                              ("head_targets", HEAD_TARGETS), ("detach_heads", DETACH_HEADS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{PREFIX}{name} must be one of {allowed}, got {getattr(self, name)!r}")
        self.check_ranges()
        self.check_frozen_base()

    def check_ranges(self) -> None:
        """Each number within its range."""
        if self.lr <= 0:
            raise ValueError(f"{PREFIX}lr must be > 0, got {self.lr}")
        if self.warmup_steps < 0:
            raise ValueError(f"{PREFIX}warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("weight_decay", "frozen_cache_gb"):
            if getattr(self, name) < 0:
                raise ValueError(f"{PREFIX}{name} must be >= 0, got {getattr(self, name)}")
        for name, what in (("label_smoothing", "0 = one-hot targets"), ("head1_weight", "0 = the paper's loss"),
                           ("input_noise", "0 = plain teacher forcing")):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{PREFIX}{name} must lie in [0, 1) ({what}), got {getattr(self, name)}")
        for name, what in (("loss_fraction", "1 = every position"), ("head_loss_decay", "1 = equal weights"),
                           ("base_lr_scale", "1 = one learning rate")):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise ValueError(f"{PREFIX}{name} must lie in (0, 1] ({what}), got {getattr(self, name)}")

    def check_frozen_base(self) -> None:
        """The options that train the base need it unfrozen (or its readout trained)."""
        if self.train_readout and not self.freeze_base:
            raise ValueError(f"{PREFIX}train_readout trains the base's readout beside an otherwise frozen base: set "
                             f"{PREFIX}freeze_base: true (fine-tuning trains the readout anyway) or train_readout: false")
        frozen = self.freeze_base and not self.train_readout
        if frozen and self.head1_weight > 0:
            raise ValueError(f"{PREFIX}head1_weight weights p_1's loss, which a frozen base does not train: set "
                             f"{PREFIX}freeze_base: false (or {PREFIX}train_readout: true) or {PREFIX}head1_weight: 0")
        if frozen and self.base_lr_scale < 1.0:
            raise ValueError(f"{PREFIX}base_lr_scale scales the base's learning rate, which a frozen base does not have: "
                             f"set {PREFIX}freeze_base: false (or {PREFIX}train_readout: true) or "
                             f"{PREFIX}base_lr_scale: 1")


TRAINING_KEYS = tuple(f.name for f in fields(TrainingOptions))  # the flat keys of old checkpoints among the others
