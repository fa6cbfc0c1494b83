"""What both tasks' LightningModules share: the model, the blockwise loss, the two-stage recipe.

Stage 1 trains the base (``k: 1``). Stage 2 sets ``init_from`` to a stage-1 checkpoint, ``k`` in
2..16, ``freeze_base`` (train only the head) or not (fine-tune everything), and ``loss_mode``
``random`` (one head per minibatch, the paper's choice) or ``mean``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import math
import re
import warnings
from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.warnings import PossibleUserWarning
from torch import Tensor, nn

from lightning_bpd.decoding.trees import budget as tree_budget
from lightning_bpd.nn.config import IMAGE_KEYS, MODEL_KEYS, ModelConfig
from lightning_bpd.nn.loss import blockwise_loss, choose_heads, decoder_inputs, shifted_targets
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.nn.transformer import EncoderContext
from lightning_bpd.nn.warm_start import CheckpointMismatchError, base_detached, load_base_weights
from lightning_bpd.nn.warm_start import freeze_base as freeze_base_params
from lightning_bpd.tasks.frozen_states import FrozenStates
from lightning_bpd.tasks.training_options import TRAINING_KEYS, TrainingOptions

logger = logging.getLogger("lightning_bpd")

MAX_K = 16
SPAN_MAX = 64  # longest run of inputs one ``span`` corruption replaces


def options_of(architecture: ModelConfig | Mapping[str, Any] | None,
               training: TrainingOptions | Mapping[str, Any]) -> tuple[ModelConfig | None, TrainingOptions]:
    """The dataclasses of a task module's ``architecture`` and ``training`` arguments, given as they are or as the
    dicts a checkpoint holds (``Module.load_from_checkpoint`` hands those back)."""
    if isinstance(architecture, Mapping):
        architecture = ModelConfig.from_dict(architecture)
    if isinstance(training, Mapping):
        training = TrainingOptions.from_dict(training)
    return architecture, training


def split_flat(flat: Mapping[str, Any], architecture: ModelConfig | None, training: TrainingOptions) -> dict[str, Any]:
    """An old checkpoint's flat hyperparameters as ``__init__`` takes them now: ``training`` (the
    :class:`TrainingOptions` keys over ``training``'s values: a key the checkpoint lacks is newer than it, and its
    default of then is ``training``'s), ``architecture`` (the :class:`ModelConfig` and image keys over
    ``architecture``'s, as one dict that :meth:`ModelConfig.from_dict` reads; none without ``architecture``), and
    the other keys as they are. A task renames its own keys first."""
    rest = dict(flat)
    given = {key: rest.pop(key) for key in TRAINING_KEYS if key in rest}
    if architecture is not None:
        shape = {key: rest.pop(key) for key in (*MODEL_KEYS, *IMAGE_KEYS) if key in rest}
        rest["architecture"] = {**asdict(architecture), **shape}
    return {**rest, "training": {**asdict(training), **given}}


class BlockwiseModule(pl.LightningModule):
    """A :class:`BlockwiseTransformer` trained with the blockwise loss (task-independent part).

    ``architecture``: the model's shape (a :class:`BlockwiseTransformer` is built of it), or None with ``model``: a
    model built by the subclass (a pretrained one, e.g. :class:`~lightning_bpd.hf.HFSeq2SeqBlockwise`, with the same
    training interface); ``training``: how it trains (:class:`TrainingOptions`, kept as ``self.options``).
    """

    def __init__(self, architecture: ModelConfig | None, training: TrainingOptions,
                 model: nn.Module | None = None) -> None:
        super().__init__()
        if (model is None) == (architecture is None):
            raise ValueError("BlockwiseModule takes an architecture or a built model, not both")
        k = model.k if model is not None else architecture.k  # type: ignore[union-attr]
        if not 1 <= k <= MAX_K:
            raise ValueError(f"model.architecture.k must lie in [1, {MAX_K}] (1 = the base model), got {k}")
        if training.freeze_base and training.init_from is None and model is None:
            raise ValueError("model.training.freeze_base needs model.training.init_from: a trained base checkpoint "
                             "to freeze")
        if training.freeze_base and k == 1:
            raise ValueError("model.training.freeze_base with k=1 leaves nothing to train: set model.architecture.k >= 2")
        self.options = training
        self.model = model if model is not None else BlockwiseTransformer(copy.deepcopy(architecture))
        self.freeze = training.freeze_base
        self.frozen_states = None
        self.rank_agreement: Tensor | None = None  # the heads' top-r agreement table (lightning_bpd.decoding.trees.budget)
        if self.freeze:
            freeze_base_params(self.model)
            if training.train_readout:
                readout = self.model.readout_parameters()
                if not readout:
                    raise ValueError("model.training.train_readout needs a readout that acts after the decoder states: "
                                     "a gaussian intensity output with head_centres: own (its shift-and-width layer); "
                                     "this model has none: set train_readout: false")
                for param in readout.values():
                    param.requires_grad_(True)
            if training.frozen_cache_gb > 0:
                self.frozen_states = FrozenStates(int(training.frozen_cache_gb * 2**30))

    def save_options(self, **init_args: Any) -> None:
        """Keep ``init_args`` (every argument of ``__init__``, as it took them) as the hyperparameters, the dataclasses
        as plain dicts: a checkpoint then holds values, not objects of our classes, and rebuilds the module the same
        way whether a config or Python made it (:meth:`init_args_of_checkpoint`)."""
        self.save_hyperparameters({key: asdict(value) if is_dataclass(value) else value
                                   for key, value in init_args.items()})

    # ---- checkpoints ------------------------------------------------------------------------------------
    @classmethod
    def init_args_of_checkpoint(cls, hparams: Mapping[str, Any]) -> dict[str, Any]:
        """The ``__init__`` arguments that rebuild the module of a checkpoint from its hyperparameters: its
        ``architecture`` and ``training`` (dicts, as :meth:`save_options` keeps them) or, in a checkpoint of before
        them, its flat keys (:meth:`flat_init_args`). jsonargparse's own keys (``_class_path``, ``_instantiator``)
        are left out; a key that is no argument of ``cls`` is one error."""
        given = {key: value for key, value in hparams.items() if not key.startswith("_")}
        if "training" not in given:
            given = cls.flat_init_args(given)
        architecture, given["training"] = options_of(given.get("architecture"), given["training"])
        if architecture is not None:
            given["architecture"] = architecture
        unknown = sorted(set(given) - set(inspect.signature(cls.__init__).parameters))
        if unknown:
            raise ValueError(f"the checkpoint's hyperparameters {unknown} are no options of {cls.__name__}")
        return given

    @classmethod
    def flat_init_args(cls, flat: dict[str, Any]) -> dict[str, Any]:
        """The ``__init__`` arguments of a checkpoint's flat hyperparameters (every option at the top level, the
        layout of before ``architecture`` and ``training``): each task maps its own keys (:func:`split_flat`)."""
        raise NotImplementedError(f"{cls.__name__} has no checkpoints of the flat layout")

    def train(self, mode: bool = True) -> BlockwiseModule:
        """A frozen base always runs in eval mode (no dropout): the heads train on the states they
        will see when decoding, and those states can be cached (:class:`FrozenStates`)."""
        super().train(mode)
        if self.freeze:
            for name, child in self.model.named_children():
                if name != "head":
                    child.eval()
        return self

    def hide_frozen_base_warning(self) -> None:
        """Lightning warns of the modules in eval mode when training starts ("Found N module(s) in eval mode");
        a frozen base is held in eval mode on purpose (:meth:`train`). Where the modules in eval mode are the
        frozen base's and no others, that warning (with their count N) is hidden until :meth:`on_train_start`, which
        follows the check; a module in eval mode outside the base still warns. Call it from ``on_fit_start``."""
        eval_modules = [m for m in self.modules() if not m.training]
        base = {id(m) for name, child in self.model.named_children() if name != "head" for m in child.modules()}
        if not self.freeze or not eval_modules or any(id(m) not in base for m in eval_modules):
            return
        message = re.escape(f"Found {len(eval_modules)} module(s) in eval mode at the start of training.")
        warnings.filterwarnings("ignore", message=message, category=PossibleUserWarning)
        self.frozen_base_filter = warnings.filters[0]

    def on_train_start(self) -> None:
        """Lightning's check of the modules in eval mode is over: :meth:`hide_frozen_base_warning`'s filter goes."""
        self.show_frozen_base_warning()

    def on_fit_end(self) -> None:
        """A fit that never trained (its step budget spent on resume, no training batches) removes the filter
        here."""
        self.show_frozen_base_warning()

    def show_frozen_base_warning(self) -> None:
        entry = getattr(self, "frozen_base_filter", None)
        if entry is not None and entry in warnings.filters:
            warnings.filters.remove(entry)
        self.frozen_base_filter = None

    # ---- two-stage recipe -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "fit" and self.options.init_from is not None:
            self.warm_start(self.options.init_from)

    def warm_start(self, path: str) -> None:
        """Load the base weights of a checkpoint (any k) into this model; the head keeps its init."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"model.init_from: no checkpoint at {path!r} (train a base with k: 1 first)")
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        state = ckpt.get("state_dict", ckpt)
        self.check_warm_start(path, ckpt)
        state = {key.removeprefix("model."): value for key, value in state.items()}
        try:
            fresh = load_base_weights(self.model, state)
        except CheckpointMismatchError as err:
            raise CheckpointMismatchError(f"model.init_from={path}: {err}") from None
        logger.info("warm start from %s; left as initialized: %d tensors of the head", path, len(fresh))

    def check_warm_start(self, path: str, checkpoint: dict[str, Any]) -> None:
        """Raise if ``checkpoint`` can't warm-start this run for a task-specific reason (none here)."""

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        cls = type(self)
        checkpoint["lightning_bpd_class"] = f"{cls.__module__}.{cls.__qualname__}"
        if self.rank_agreement is not None:  # what decode --tree-nodes builds its tree from
            checkpoint[tree_budget.KEY] = tree_budget.as_record(self.rank_agreement)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The heads' rank agreement table, where the checkpoint stores one."""
        self.rank_agreement = tree_budget.from_record(checkpoint.get(tree_budget.KEY))

    # ---- training ---------------------------------------------------------------------------------
    def trainable_heads_skip(self) -> list[int]:
        """Heads with nothing to train (p_1 bypassing the head while the base is frozen)."""
        frozen_p1 = self.freeze and not self.options.train_readout  # a trained readout learns from p_1 too
        return [i for i in range(self.model.k) if frozen_p1 and self.model.head.head_is_identity(i)]

    def head_weights(self, heads: list[int]) -> list[float]:
        """Loss weight of each listed head: ``head_loss_decay ** i`` for head i (0-based)."""
        return [self.options.head_loss_decay**i for i in heads]

    def decoder_states(self, src: Tensor, tgt_in: Tensor, tgt: Tensor, index: Tensor | None,
                       context: EncoderContext | None = None) -> Tensor:
        """Decoder output (B, T, D); from :class:`FrozenStates` for training batches of a frozen base.
        ``context``: the batch's encoded sources when the caller needed them anyway."""
        if self.frozen_states is None or index is None or not self.training:
            return self.model(src, tgt_in) if context is None else self.model.decode_full(tgt_in, context)
        lengths = (tgt != self.model.pad_id).sum(dim=1)  # (B,)
        return self.frozen_states.hidden(index, lengths, tgt.shape[1], lambda rows: self.model(src[rows], tgt_in[rows]))

    def chain_inputs(self, tgt: Tensor, heads: list[int]) -> Tensor | None:
        """Chained heads: the teacher-forced token fed to heads 2..max(heads) at each position,
        (B, T, m) with column j = the target at t + j (what head j+1 predicts); None otherwise."""
        last = max(heads)
        if not self.model.chained_heads or last == 0:
            return None
        return torch.stack([shifted_targets(tgt, j, self.model.pad_id) for j in range(last)], dim=-1)

    def blockwise_step(self, src: Tensor, tgt: Tensor, heads: list[int], fraction: float = 1.0,
                       generator: torch.Generator | None = None, head1_weight: float = 0.0,
                       index: Tensor | None = None, weights: list[float] | None = None):
        """Teacher-forced blockwise loss of ``heads`` for src (B, S), tgt (B, T) ending in EOS.

        ``fraction`` < 1 evaluates the heads at a random subset of the target positions. ``index``
        (B,): dataset indices of a training batch (the frozen base's states are cached by them).
        """
        tgt_in = decoder_inputs(tgt, self.model.bos_id)  # (B, T)
        if self.training and self.options.input_noise > 0 and not self.freeze:  # a frozen base has nothing to learn from it
            own = self.own_predictions(src, tgt_in) if self.options.input_noise_kind == "self" else None
            tgt_in = self.corrupt_inputs(tgt_in, generator, own)
        kernel = self.train_kernel() if self.training else None  # evaluation scores the plain cross-entropy
        reads_source = getattr(self.model.head, "source_attention", False) and max(heads) > 0
        context = self.model.encode(src) if reads_source else None
        hidden = self.decoder_states(src, tgt_in, tgt, index, context)  # (B, T, D)
        later = self.head_target_tokens(hidden, tgt) if max(heads) > 0 else tgt  # (B, T): what heads 2..k train towards
        prev = self.chain_inputs(later, heads)  # (B, T, m) or None
        source = self.model.chain_source(context) if context is not None else None
        if fraction >= 1.0:
            logits = self.head_logits(hidden, heads, prev, source)  # (B, T, h, V)
            return blockwise_loss(logits, tgt, heads, self.model.pad_id, self.options.label_smoothing,
                                  head1_weight=head1_weight, weights=weights, target_kernel=kernel, later_targets=later)
        draw = torch.rand(tgt.shape, generator=generator).to(tgt.device)
        positions = (draw < fraction) & (tgt != self.model.pad_id)  # (B, T)
        if source is not None:
            source = source.take(positions.nonzero()[:, 0])  # one source row per selected position
        logits = self.head_logits(hidden[positions], heads, None if prev is None else prev[positions], source)  # (N, h, V)
        return blockwise_loss(logits, tgt, heads, self.model.pad_id, self.options.label_smoothing, positions, head1_weight,
                              weights, kernel, later)

    def head_logits(self, hidden: Tensor, heads: list[int], prev: Tensor | None, source) -> Tensor:
        """Logits (..., len(heads), V) of the listed heads at decoder states ``hidden`` (..., D). While training,
        ``detach_heads`` keeps heads 2..k's losses out of the base: ``states``: they read the decoder states
        detached (the decoder learns from p_1's loss alone; the shared output layer from every head's);
        ``base``: every base weight they use (output layer, intensity prior, embeddings) is read detached too,
        so they train the head (``head.*``) alone; ``none``: the paper's joint training."""
        if self.options.detach_heads == "none" or not self.training or max(heads) == 0:
            return self.model.logits_heads(hidden, heads, prev, source)
        later = [i for i in heads if i > 0]
        with base_detached(self.model) if self.options.detach_heads == "base" else contextlib.nullcontext():
            logits = self.model.logits_heads(hidden.detach(), later, prev, source)  # (..., len(later), V)
        if 0 in heads:  # p_1 from the states themselves, in the listed order
            logits = torch.cat([self.model.logits_heads(hidden, [0], prev, source), logits], dim=-2)
            logits = logits[..., [0 if i == 0 else 1 + later.index(i) for i in heads], :]
        return logits

    @torch.no_grad()
    def head_target_tokens(self, hidden: Tensor, tgt: Tensor) -> Tensor:
        """What heads 2..k train towards (B, T), read ``i - 1`` positions on by head i: the data ``tgt``,
        or with ``head_targets: own`` (while training) the model's own greedy choice at each position given
        the teacher-forced prefix, the argmax of p_1 from this batch's decoder states ``hidden`` (B, T, D)
        (no extra decoder pass; padding stays padding). Decoding accepts a head's token when it equals
        greedy's, so its target is greedy's choice, not the data's: the same aim as self-distilled targets
        (``distill --beam 1``), taken on the fly, though under the data's prefix rather than greedy's own."""
        if self.options.head_targets == "data" or not self.training:
            return tgt
        logits = self.model.logits_first(hidden.detach()).float()  # (B, T, V)
        own = self.ordinary_argmax(logits)  # (B, T)
        eos = self.model.eos_id
        if eos is not None:  # or the end, where greedy would end the sequence
            own = torch.where(logits[..., eos] >= logits.gather(-1, own[..., None])[..., 0], eos, own)
        return torch.where(tgt == self.model.pad_id, tgt, own)

    def train_kernel(self) -> Tensor | None:
        """Soft training targets (V, V) (:func:`~lightning_bpd.nn.loss.blockwise_loss`); None = one-hot.
        Used while training only: evaluation scores the plain cross-entropy."""
        return None

    def ordinary_tokens(self) -> tuple[int, int]:
        """[low, high): the ids of ordinary target tokens (above pad, BOS and EOS)."""
        m = self.model
        return max(m.pad_id, m.bos_id, m.eos_id if m.eos_id is not None else -1) + 1, m.config.tgt_vocab_size

    @torch.no_grad()
    def own_predictions(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """The model's own greedy guesses as decoder inputs (B, T): position t + 1 holds the argmax of p_1
        (over ordinary tokens) at position t given the clean teacher-forced inputs; BOS stays first.
        One extra forward pass without gradients and without dropout, as when decoding (parallel scheduled
        sampling, Duckworth et al. 2019)."""
        was_training = self.training
        self.train(False)
        try:
            logits = self.model.logits_first(self.model(src, tgt_in))  # (B, T, V)
        finally:
            self.train(was_training)
        return decoder_inputs(self.ordinary_argmax(logits), self.model.bos_id)  # (B, T)

    def ordinary_argmax(self, logits: Tensor) -> Tensor:
        """The model's guess of each target from p_1's ``logits`` (..., V): the argmax over ordinary tokens (...)."""
        low, high = self.ordinary_tokens()
        return logits[..., low:high].argmax(dim=-1) + low

    def corrupt_inputs(self, tgt_in: Tensor, generator: torch.Generator | None = None,
                       own: Tensor | None = None) -> Tensor:
        """Teacher-forced decoder inputs (B, T) with a share ``input_noise`` of the non-BOS, non-pad tokens
        replaced: ``shuffle`` by the token at a random other position of the same row (a plausible but
        misplaced value, like the ones greedy decoding copies forward once it has made one), ``uniform``
        by a uniformly drawn ordinary token, ``span`` by runs of 1..64 tokens copied from elsewhere in
        the row (a whole run of misplaced values, as when greedy decoding has drifted), ``self`` by the
        model's own guess there (``own`` (B, T), :meth:`own_predictions`: the mistakes it really makes). The targets
        stay clean: the model learns not to trust its last tokens blindly, which greedy decoding
        punishes when they are its own (exposure bias; super-resolution decodes 3,072 of them)."""
        m = self.model
        b, t = tgt_in.shape
        if self.options.input_noise_kind == "span":
            return self.corrupt_spans(tgt_in, generator)
        draw = torch.rand(tgt_in.shape, generator=generator)  # (B, T)
        if self.options.input_noise_kind == "self":
            if own is None:
                raise ValueError("input_noise_kind 'self' needs the model's own guesses: pass own=own_predictions(...)")
            noise = own
        elif self.options.input_noise_kind == "uniform":
            noise = torch.randint(*self.ordinary_tokens(), tgt_in.shape, generator=generator).to(tgt_in.device)
        else:  # a random position of the row among its real tokens (after BOS, before padding)
            real = ((tgt_in != m.pad_id).sum(dim=1, keepdim=True) - 1).clamp(min=1).cpu()  # (B, 1)
            pick = 1 + (torch.rand(b, t, generator=generator) * real).long().clamp(max=t - 1)  # (B, T) in [1, real]
            noise = tgt_in.gather(1, pick.to(tgt_in.device))  # (B, T)
        hit = (draw < self.options.input_noise).to(tgt_in.device) & (tgt_in != m.pad_id) & (tgt_in != m.bos_id)
        return torch.where(hit, noise, tgt_in)

    def corrupt_spans(self, tgt_in: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``span`` noise: per row, runs of 1..:data:`SPAN_MAX` real tokens (after BOS) overwritten by a run
        of the same length copied from a random place of the row, until about ``input_noise`` of its
        real tokens are covered (runs may overlap)."""
        out = tgt_in.clone()
        real = ((tgt_in != self.model.pad_id).sum(dim=1) - 1).tolist()  # real tokens after BOS, per row
        for row, n in enumerate(real):
            covered = 0
            while n >= 2 and covered < self.options.input_noise * n:
                length = int(torch.randint(1, min(SPAN_MAX, n - 1) + 1, (1,), generator=generator))
                start, source = (1 + int(torch.randint(0, n - length + 1, (1,), generator=generator)) for _ in range(2))
                out[row, start : start + length] = tgt_in[row, source : source + length]
                covered += length
        return out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        g = torch.Generator().manual_seed(self.options.seed * 1_000_003 + self.global_step)
        heads = choose_heads(self.model.k, self.options.loss_mode, g, skip=self.trainable_heads_skip(),
                             keep_first=self.options.head1_weight > 0, weights=self.head_weights(list(range(self.model.k))))
        out = self.blockwise_step(batch["src"], batch["tgt"], heads, self.options.loss_fraction, g, self.options.head1_weight,
                                  batch.get("index"), self.head_weights(heads))
        n = batch["src"].shape[0]
        self.log("train/loss", out.loss, prog_bar=True, batch_size=n)
        for i in out.head_loss:
            self.log(f"train/head{i}_loss", out.head_loss[i], batch_size=n)
            self.log(f"train/head{i}_acc", out.head_acc[i], batch_size=n)
        self.log("train/tokens", (batch["tgt"] != self.model.pad_id).sum().float(), reduce_fx="sum", batch_size=n)
        if getattr(self.model, "prior", None) is not None:  # the intensity prior's learned width, in intensity levels
            self.log("train/prior_sigma", self.model.prior.sigma, batch_size=n)
        return out.loss

    def eval_step(self, batch: dict[str, Tensor], prefix: str) -> None:
        out = self.blockwise_step(batch["src"], batch["tgt"], list(range(self.model.k)))
        n = batch["src"].shape[0]
        # val/loss: the mean over all k heads (what improves in every stage, so checkpoints follow it);
        # head1_loss is the scoring model p_1 alone.
        self.log(f"{prefix}/loss", out.loss, prog_bar=True, batch_size=n, sync_dist=True)
        for i in out.head_loss:
            self.log(f"{prefix}/head{i}_loss", out.head_loss[i], batch_size=n, sync_dist=True)
            self.log(f"{prefix}/head{i}_acc", out.head_acc[i], batch_size=n, sync_dist=True)

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.eval_step(batch, "val")

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self.eval_step(batch, "test")

    def configure_optimizers(self) -> dict[str, Any]:
        head = [p for name, p in self.model.named_parameters() if p.requires_grad and name.startswith("head.")]
        base = [p for name, p in self.model.named_parameters() if p.requires_grad and not name.startswith("head.")]
        groups = [{"params": group, "lr": self.options.lr * scale}
                  for group, scale in ((base, self.options.base_lr_scale), (head, 1.0)) if group]
        opt = torch.optim.AdamW(groups, lr=self.options.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=self.options.weight_decay)
        warmup = max(1, self.options.warmup_steps)

        def inverse_sqrt(step: int) -> float:  # linear warm-up, then 1 / sqrt(step) decay (Vaswani et al.)
            step = step + 1
            return min(step / warmup, math.sqrt(warmup / step))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

