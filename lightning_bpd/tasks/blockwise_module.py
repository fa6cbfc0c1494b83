"""What both tasks' LightningModules share: the model, the blockwise loss, the two-stage recipe.

Stage 1 trains the base (``k: 1``). Stage 2 sets ``init_from`` to a stage-1 checkpoint, ``k`` in
2..16, ``freeze_base`` (train only the head) or not (fine-tune everything), and ``loss_mode``
``random`` (one head per minibatch, the paper's choice) or ``mean``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.loss import LOSS_MODES, blockwise_loss, choose_heads, decoder_inputs, shifted_targets
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.nn.transformer import EncoderContext
from lightning_bpd.nn.warm_start import CheckpointMismatchError, base_detached, load_base_weights
from lightning_bpd.nn.warm_start import freeze_base as freeze_base_params
from lightning_bpd.tasks.frozen_states import FrozenStates

logger = logging.getLogger("lightning_bpd")

MAX_K = 16


NOISE_KINDS = ("shuffle", "uniform", "span", "self")  # how corrupt_inputs replaces decoder inputs
HEAD_TARGETS = ("data", "own")  # what heads 2..k train towards (BlockwiseModule.head_target_tokens)
DETACH_HEADS = ("none", "states", "base")  # what heads 2..k's losses may not train (BlockwiseModule.head_logits)
SPAN_MAX = 64  # longest run of inputs one ``span`` corruption replaces


class BlockwiseModule(pl.LightningModule):
    """A :class:`BlockwiseTransformer` trained with the blockwise loss (task-independent part)."""

    def __init__(
        self,
        model_config: ModelConfig | None,
        loss_mode: str = "random",
        freeze_base: bool = False,
        init_from: str | None = None,
        lr: float = 1e-3,
        warmup_steps: int = 1000,
        label_smoothing: float = 0.1,
        weight_decay: float = 0.0,
        seed: int = 0,
        loss_fraction: float = 1.0,
        head1_weight: float = 0.0,
        head_loss_decay: float = 1.0,
        base_lr_scale: float = 1.0,
        frozen_cache_gb: float = 4.0,
        input_noise: float = 0.0,
        input_noise_kind: str = "shuffle",
        head_targets: str = "data",
        detach_heads: str = "none",
        train_readout: bool = False,
        model: nn.Module | None = None,
    ) -> None:
        """``model``: a model built by the subclass (a pretrained one, e.g. :class:`~lightning_bpd.hf.HFSeq2SeqBlockwise`
        with the same training interface) instead of a :class:`BlockwiseTransformer` of ``model_config``."""
        super().__init__()
        if (model is None) == (model_config is None):
            raise ValueError("BlockwiseModule takes a model_config or a built model, not both")
        k = model.k if model is not None else model_config.k  # type: ignore[union-attr]
        if detach_heads not in DETACH_HEADS:
            raise ValueError(f"model.detach_heads must be one of {DETACH_HEADS}, got {detach_heads!r}")
        self.detach_heads = detach_heads
        if head_targets not in HEAD_TARGETS:
            raise ValueError(f"model.head_targets must be one of {HEAD_TARGETS}, got {head_targets!r}")
        self.head_targets = head_targets
        if not 0.0 < loss_fraction <= 1.0:
            raise ValueError(f"model.loss_fraction must lie in (0, 1], got {loss_fraction}")
        self.loss_fraction = loss_fraction
        if not 1 <= k <= MAX_K:
            raise ValueError(f"model.k must lie in [1, {MAX_K}] (1 = the base model), got {k}")
        if loss_mode not in LOSS_MODES:
            raise ValueError(f"model.loss_mode must be one of {LOSS_MODES}, got {loss_mode!r}")
        if freeze_base and init_from is None and model is None:
            raise ValueError("model.freeze_base needs model.init_from: a trained base checkpoint to freeze")
        if freeze_base and k == 1:
            raise ValueError("model.freeze_base with k=1 leaves nothing to train: set model.k >= 2")
        if train_readout and not freeze_base:
            raise ValueError("model.train_readout trains the base's readout beside an otherwise frozen base: set "
                             "model.freeze_base: true (fine-tuning trains the readout anyway) or train_readout: false")
        self.train_readout = train_readout
        if not 0.0 <= head1_weight < 1.0:
            raise ValueError(f"model.head1_weight must lie in [0, 1) (0 = the paper's loss), got {head1_weight}")
        if head1_weight > 0 and freeze_base and not train_readout:
            raise ValueError("model.head1_weight weights p_1's loss, which a frozen base does not train: "
                             "set model.freeze_base: false (or model.train_readout: true) or model.head1_weight: 0")
        self.head1_weight = head1_weight
        if not 0.0 < head_loss_decay <= 1.0:
            raise ValueError(f"model.head_loss_decay must lie in (0, 1] (1 = equal weights), got {head_loss_decay}")
        if not 0.0 < base_lr_scale <= 1.0:
            raise ValueError(f"model.base_lr_scale must lie in (0, 1] (1 = one learning rate), got {base_lr_scale}")
        if base_lr_scale < 1.0 and freeze_base and not train_readout:
            raise ValueError("model.base_lr_scale scales the base's learning rate, which a frozen base does not have: "
                             "set model.freeze_base: false (or model.train_readout: true) or model.base_lr_scale: 1")
        if frozen_cache_gb < 0:
            raise ValueError(f"model.frozen_cache_gb must be >= 0 (0 = recompute the frozen base), got {frozen_cache_gb}")
        if not 0.0 <= input_noise < 1.0:
            raise ValueError(f"model.input_noise must lie in [0, 1) (0 = plain teacher forcing), got {input_noise}")
        if input_noise_kind not in NOISE_KINDS:
            raise ValueError(f"model.input_noise_kind must be one of {NOISE_KINDS}, got {input_noise_kind!r}")
        self.input_noise, self.input_noise_kind = input_noise, input_noise_kind
        self.head_loss_decay, self.base_lr_scale = head_loss_decay, base_lr_scale
        if lr <= 0 or warmup_steps < 0 or not 0 <= label_smoothing < 1:
            raise ValueError("model.lr must be > 0, model.warmup_steps >= 0 and model.label_smoothing in [0, 1)")
        self.model = model if model is not None else BlockwiseTransformer(model_config)
        self.loss_mode, self.freeze, self.init_from = loss_mode, freeze_base, init_from
        self.lr, self.warmup_steps = lr, warmup_steps
        self.label_smoothing, self.weight_decay, self.seed = label_smoothing, weight_decay, seed
        self.frozen_states = None
        if freeze_base:
            freeze_base_params(self.model)
            if train_readout:
                readout = self.model.readout_parameters()
                if not readout:
                    raise ValueError("model.train_readout needs a readout that acts after the decoder states: a "
                                     "gaussian intensity output with head_centres: own (its shift-and-width layer); "
                                     "this model has none: set train_readout: false")
                for param in readout.values():
                    param.requires_grad_(True)
            if frozen_cache_gb > 0:
                self.frozen_states = FrozenStates(int(frozen_cache_gb * 2**30))

    def train(self, mode: bool = True) -> BlockwiseModule:
        """A frozen base always runs in eval mode (no dropout): the heads train on the states they
        will see when decoding, and those states can be cached (:class:`FrozenStates`)."""
        super().train(mode)
        if self.freeze:
            for name, child in self.model.named_children():
                if name != "head":
                    child.eval()
        return self

    # ---- two-stage recipe -------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        if stage == "fit" and self.init_from is not None:
            self.warm_start(self.init_from)

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

    # ---- training ---------------------------------------------------------------------------------
    def trainable_heads_skip(self) -> list[int]:
        """Heads with nothing to train (p_1 bypassing the head while the base is frozen)."""
        frozen_p1 = self.freeze and not self.train_readout  # a trained readout learns from p_1 too
        return [i for i in range(self.model.k) if frozen_p1 and self.model.head.head_is_identity(i)]

    def head_weights(self, heads: list[int]) -> list[float]:
        """Loss weight of each listed head: ``head_loss_decay ** i`` for head i (0-based)."""
        return [self.head_loss_decay**i for i in heads]

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
        if self.training and self.input_noise > 0 and not self.freeze:  # a frozen base has nothing to learn from it
            own = self.own_predictions(src, tgt_in) if self.input_noise_kind == "self" else None
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
            return blockwise_loss(logits, tgt, heads, self.model.pad_id, self.label_smoothing,
                                  head1_weight=head1_weight, weights=weights, target_kernel=kernel, later_targets=later)
        draw = torch.rand(tgt.shape, generator=generator).to(tgt.device)
        positions = (draw < fraction) & (tgt != self.model.pad_id)  # (B, T)
        if source is not None:
            source = source.take(positions.nonzero()[:, 0])  # one source row per selected position
        logits = self.head_logits(hidden[positions], heads, None if prev is None else prev[positions], source)  # (N, h, V)
        return blockwise_loss(logits, tgt, heads, self.model.pad_id, self.label_smoothing, positions, head1_weight,
                              weights, kernel, later)

    def head_logits(self, hidden: Tensor, heads: list[int], prev: Tensor | None, source) -> Tensor:
        """Logits (..., len(heads), V) of the listed heads at decoder states ``hidden`` (..., D). While training,
        ``detach_heads`` keeps heads 2..k's losses out of the base: ``states``: they read the decoder states
        detached (the decoder learns from p_1's loss alone; the shared output layer from every head's);
        ``base``: every base weight they use (output layer, intensity prior, embeddings) is read detached too,
        so they train the head (``head.*``) alone; ``none``: the paper's joint training."""
        if self.detach_heads == "none" or not self.training or max(heads) == 0:
            return self.model.logits_heads(hidden, heads, prev, source)
        later = [i for i in heads if i > 0]
        with base_detached(self.model) if self.detach_heads == "base" else contextlib.nullcontext():
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
        if self.head_targets == "data" or not self.training:
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
        if self.input_noise_kind == "span":
            return self.corrupt_spans(tgt_in, generator)
        draw = torch.rand(tgt_in.shape, generator=generator)  # (B, T)
        if self.input_noise_kind == "self":
            if own is None:
                raise ValueError("input_noise_kind 'self' needs the model's own guesses: pass own=own_predictions(...)")
            noise = own
        elif self.input_noise_kind == "uniform":
            noise = torch.randint(*self.ordinary_tokens(), tgt_in.shape, generator=generator).to(tgt_in.device)
        else:  # a random position of the row among its real tokens (after BOS, before padding)
            real = ((tgt_in != m.pad_id).sum(dim=1, keepdim=True) - 1).clamp(min=1).cpu()  # (B, 1)
            pick = 1 + (torch.rand(b, t, generator=generator) * real).long().clamp(max=t - 1)  # (B, T) in [1, real]
            noise = tgt_in.gather(1, pick.to(tgt_in.device))  # (B, T)
        hit = (draw < self.input_noise).to(tgt_in.device) & (tgt_in != m.pad_id) & (tgt_in != m.bos_id)
        return torch.where(hit, noise, tgt_in)

    def corrupt_spans(self, tgt_in: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """``span`` noise: per row, runs of 1..:data:`SPAN_MAX` real tokens (after BOS) overwritten by a run
        of the same length copied from a random place of the row, until about ``input_noise`` of its
        real tokens are covered (runs may overlap)."""
        out = tgt_in.clone()
        real = ((tgt_in != self.model.pad_id).sum(dim=1) - 1).tolist()  # real tokens after BOS, per row
        for row, n in enumerate(real):
            covered = 0
            while n >= 2 and covered < self.input_noise * n:
                length = int(torch.randint(1, min(SPAN_MAX, n - 1) + 1, (1,), generator=generator))
                start, source = (1 + int(torch.randint(0, n - length + 1, (1,), generator=generator)) for _ in range(2))
                out[row, start : start + length] = tgt_in[row, source : source + length]
                covered += length
        return out

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.global_step)
        heads = choose_heads(self.model.k, self.loss_mode, g, skip=self.trainable_heads_skip(),
                             keep_first=self.head1_weight > 0, weights=self.head_weights(list(range(self.model.k))))
        out = self.blockwise_step(batch["src"], batch["tgt"], heads, self.loss_fraction, g, self.head1_weight,
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
        groups = [{"params": group, "lr": self.lr * scale}
                  for group, scale in ((base, self.base_lr_scale), (head, 1.0)) if group]
        opt = torch.optim.AdamW(groups, lr=self.lr, betas=(0.9, 0.98), eps=1e-9, weight_decay=self.weight_decay)
        warmup = max(1, self.warmup_steps)

        def inverse_sqrt(step: int) -> float:  # linear warm-up, then 1 / sqrt(step) decay (Vaswani et al.)
            step = step + 1
            return min(step / warmup, math.sqrt(warmup / step))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, inverse_sqrt)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

