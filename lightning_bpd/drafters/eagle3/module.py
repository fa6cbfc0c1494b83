"""Training an EAGLE-3 drafter (:mod:`lightning_bpd.drafters.eagle3.network`) on a frozen causal LM: the LightningModule.

The target (``pretrained``: a local Hugging Face causal LM directory, or the .ckpt of an LM run on our own
decoder-only base) is frozen and held outside the module's registered children, as
:class:`~lightning_bpd.drafters.dflash.module.DFlashModule` holds it: neither the optimizer nor the checkpoint sees
it. The drafter's ``embed_tokens`` are the target's input embeddings, copied at init and frozen (never trained); they
stay in the drafter's state_dict, so the checkpoint holds them once, as the export needs them.

A training step, as speculators trains EAGLE-3 (its ``Eagle3DraftModel.forward`` with ``compute_metrics``):

* the target reads the packed sequence ``src`` (B, T) once under ``no_grad``: its features, the concatenated outputs
  of the layers ``target_layer_ids`` (B, T, A*H), and its last hidden states (B, T, H), through the per-sequence
  cache (``feature_cache_gb``) while training; its logits are recomputed from the last hidden states by its LM head
  (the vocabulary is too big to cache), and restricted to the draft vocabulary;
* the training-time test (:meth:`~lightning_bpd.drafters.eagle3.network.Eagle3Drafter.train_forward`): the drafter unrolled
  ``ttt_steps`` steps over its own output states, step s at slot t drafting the token at t + 2 + s, the data's
  tokens as its inputs;
* the loss of step s is the mean over the valid slots of the forward KL from the target's distribution over the draft
  vocabulary (at position t + 1 + s) to the drafter's (``loss: kl_div``, speculators' default; ``ce``: the
  cross-entropy to the target's most likely draft-vocabulary token), weighted ``ttt_step_loss_decay ** s``; the
  steps' losses are summed.

Metrics: ``acc_depth<d>`` (d = 1..ttt_steps): the drafter's argmax equals the target's greedy token (over the whole
vocabulary: a token outside the draft vocabulary is never right) at depth d of the chain, teacher-forced; and
``accepted``, the expected accepted length of exact acceptance of a chain of ``ttt_steps`` drafts,
``1 + sum_d prod_{i <= d} correct_i`` (:func:`~lightning_bpd.drafters.dflash.module.block_acceptance`). At the end of
validation :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval` decodes held-out prompts greedily and with exact
acceptance, the drafter proposing chains of ``block_size`` (:meth:`Eagle3Module.decode_eval_proposer`).

Draft vocabulary (``draft_vocab``): the most frequent tokens of the training data (the datamodule's training
sequences, counted at ``setup("fit")``, as speculators counts its data's tokens), mapped by
:func:`~lightning_bpd.drafters.eagle3.network.vocab_mapping`; every rank counts the same sequences, so they agree under DDP.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.drafters.common.target import frozen_target, is_own_base
from lightning_bpd.drafters.common.trainer import DrafterModule, load_drafter_state
from lightning_bpd.drafters.dflash.module import (
    anchor_seed,
    block_acceptance,
    drafter_for,
    embedding_weight,
    target_shape,
)
from lightning_bpd.drafters.eagle3.network import Eagle3Config, Eagle3Drafter, default_eagle3_layers, vocab_mapping
from lightning_bpd.drafters.eagle3.proposer import MAX_BLOCK, Eagle3
from lightning_bpd.hf.prompts import CausalLM
from lightning_bpd.nn.argmax import argmax
from lightning_bpd.tasks.frozen_states import FrozenStates
from lightning_bpd.tasks.lm.feature_store import open_store, store_batch, train_from_store

EAGLE3_CLASS = "lightning_bpd.drafters.eagle3.module.Eagle3Module"
LOSSES = ("kl_div", "ce")
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")
DRAFT_VOCAB = 8192  # conf/lm/eagle3.yaml's draft vocabulary (speculators' practice: 32k of Llama 3's 128k)
HINT_ABOVE = 32768  # a whole vocabulary larger than this gets a hint toward draft_vocab


def ttt_loss(logits: Tensor, targets: Tensor, valid: Tensor, decay: float = 1.0, kind: str = "kl_div"
             ) -> tuple[Tensor, Tensor]:
    """The training-time test's loss. logits (B, S, T, Vd) of :meth:`Eagle3Drafter.train_forward`, targets (B, T, Vd)
    the target's logits over the draft vocabulary at every position, valid (B, S, T) -> (the loss, a scalar: the sum
    over steps s of ``decay ** s`` times the mean over step s's valid slots of the per-slot loss; the per-step
    means (S,)). ``[:, s, t]`` is trained toward ``targets[:, t + 1 + s]``; ``kind`` ``kl_div``: KL(target || draft),
    ``ce``: cross-entropy to the target's argmax."""
    if kind not in LOSSES:
        raise ValueError(f"model.loss must be one of {', '.join(LOSSES)}, got {kind!r}")
    steps, t = logits.shape[1], logits.shape[2]
    total = logits.new_zeros((), dtype=torch.float32)
    per_step = []
    for s in range(steps):
        n = t - 1 - s
        draft = logits[:, s, :n].float()  # (B, n, Vd)
        target = targets[:, 1 + s:].float()  # (B, n, Vd)
        if kind == "kl_div":
            each = F.kl_div(F.log_softmax(draft, -1), F.log_softmax(target, -1), reduction="none",
                            log_target=True).sum(-1)  # (B, n)
        else:
            each = F.cross_entropy(draft.flatten(0, 1), argmax(target).flatten(), reduction="none").view(draft.shape[:2])
        m = valid[:, s, :n].float()
        mean = (each * m).sum() / (m.sum() + 1e-5)
        per_step.append(mean.detach())
        total = total + decay**s * mean
    return total, torch.stack(per_step)


def depth_labels(greedy: Tensor, steps: int, t2d: Tensor | None) -> Tensor:
    """The target's greedy tokens (B, T) (target ids, position p's next token) -> the label of each TTT logit
    (B, S, T): ``[:, s, t]`` = the draft id of ``greedy[:, t + 1 + s]``, -1 past the end or outside the draft
    vocabulary (never matched)."""
    if t2d is not None:
        draft_id = torch.cumsum(t2d.long(), 0) - 1  # (V,) target id -> its draft id where t2d holds
        greedy = torch.where(t2d[greedy], draft_id[greedy], torch.full_like(greedy, -1))
    rows = [F.pad(greedy[:, 1 + s:], (0, 1 + s), value=-1) for s in range(steps)]
    return torch.stack(rows, dim=1)


def token_counts(datamodule: Any, vocab_size: int) -> Tensor:
    """How often each target id occurs in the datamodule's training sequences (V,): a packed LM dataset's token stream
    (``dataset("train").tokens``, its real part), else every training item's ``src`` (its first ``length + 1``
    tokens where it gives a length). One clear line where there is no such data or an id is out of range."""
    dataset = datamodule.dataset("train") if hasattr(datamodule, "dataset") else None
    if dataset is None:
        raise ValueError("model.draft_vocab: the draft vocabulary is counted from the training data, and this data "
                         f"module ({type(datamodule).__name__}) offers no dataset('train'): set model.draft_vocab=null")
    if hasattr(dataset, "tokens") and hasattr(dataset, "targets"):
        ids = dataset.tokens[: int(dataset.targets) + 1]
    else:
        parts = []
        for i in range(len(dataset)):
            item = dataset[i]
            src = torch.as_tensor(item["src"])
            parts.append(src[: int(item["length"]) + 1] if "length" in item else src)
        ids = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
    ids = ids.long().flatten()
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise ValueError(f"model.draft_vocab: the training data holds token id {int(ids.max())} outside the target's "
                         f"vocabulary [0, {vocab_size}): is data.tokenizer_path the target's tokenizer?")
    return torch.bincount(ids, minlength=vocab_size)


def check_eagle3_fits(drafter: Any, model: Any, what: str = "the drafter") -> None:
    """ValueError (one line) unless ``drafter`` (an Eagle3Drafter) was made for the target ``model`` (a causal LM, or
    a runtime of one): its hidden size, vocabulary and layers."""
    config = getattr(getattr(model, "base", None), "config", None)
    own = is_own_base(model)
    if (config is None and not own) or getattr(config, "is_encoder_decoder", False) or \
            getattr(model, "encode_features", None) is None:
        raise ValueError(f"{what} drafts for a causal LM (Hugging Face or our own decoder-only base); this "
                         f"checkpoint's model ({type(model).__name__}) offers no target features")
    have = drafter.config
    hidden = target_shape(model)["hidden_size"]
    differ = [] if have.hidden_size == hidden else [f"hidden_size {have.hidden_size} (target {hidden})"]
    if model.vocab_size is not None and have.vocab_size != model.vocab_size:
        differ.append(f"vocab_size {have.vocab_size} (target {model.vocab_size})")
    layers = int(model.n_layers)
    if any(not 0 <= i < layers for i in have.target_layer_ids):
        differ.append(f"target_layer_ids {list(have.target_layer_ids)} (target layers 0..{layers - 1})")
    if differ:
        raise ValueError(f"{what} was trained on another target: " + ", ".join(differ))


def eagle3_proposer(drafter: Any, model: Any, block_size: int | None = None, what: str = "the drafter") -> Eagle3:
    """The EAGLE-3 proposer (:class:`~lightning_bpd.decoding.proposers.Eagle3`) of ``drafter`` on the target
    ``model`` (checked to fit it; a copy in the target's dtype and device, :func:`drafter_for`), proposing chains of
    ``block_size`` (greedy's next token and ``block_size - 1`` drafts; None: the proposer's default)."""
    check_eagle3_fits(drafter, model, what)
    copy = drafter_for(drafter, model)
    return Eagle3(copy) if block_size is None else Eagle3(copy, block_size)


def load_eagle3_drafter(path: str | os.PathLike) -> Eagle3Drafter:
    """The drafter alone of an Eagle3Module checkpoint (its target is not loaded); one-line ValueError on a file
    that is none (a DFlash drafter's, a heads checkpoint, a folder, ...)."""
    return load_drafter_state(path, EAGLE3_CLASS, "eagle3_config", lambda c: Eagle3Drafter(Eagle3Config.from_dict(c)),
                              "an EAGLE-3 drafter", "give the .ckpt of a fit with conf/lm/eagle3.yaml")


def whole_vocab_hint(config: Eagle3Config, trained: int) -> str | None:
    """One hint line for a drafter of ``trained`` parameters over a whole vocabulary above :data:`HINT_ABOVE` tokens:
    the LM head's parameters that ``draft_vocab`` :data:`DRAFT_VOCAB` would not train; None for a smaller one."""
    if config.vocab_size <= HINT_ABOVE:
        return None
    saved = (config.vocab_size - DRAFT_VOCAB) * config.hidden_size  # lm_head: (draft vocabulary, hidden)
    return (f"hint: model.init_args.draft_vocab is null: the drafter's LM head covers all {config.vocab_size:,} tokens "
            f"of the target's vocabulary ({trained / 1e6:.1f}M trained parameters); "
            f"--model.init_args.draft_vocab={DRAFT_VOCAB} (the training data's most frequent tokens, as speculators "
            f"trains EAGLE-3) trains {saved / 1e6:.1f}M fewer")


class Eagle3Module(DrafterModule):
    """An EAGLE-3 drafter trained on a frozen causal LM (``pretrained``).

    Args:
        pretrained: the target, frozen: a local Hugging Face causal LM directory with its tokenizer (never
            downloaded), a ``.gguf`` file (dequantized once into a cached folder,
            :func:`~lightning_bpd.hf.gguf_target.resolve_pretrained`), or the .ckpt of a language-modelling run on our
            own decoder-only base.
        target_layer_ids: the target's layers whose outputs the drafter fuses (default EAGLE-3's low, middle and high
            layers, :func:`~lightning_bpd.drafters.eagle3.network.default_eagle3_layers`; a target of fewer than 7 layers needs them).
        draft_vocab: the drafter's vocabulary: null, the target's whole vocabulary; else this many of the training
            data's most frequent tokens (counted at ``setup("fit")``); at least the target's vocabulary: the whole
            one (conf/lm/eagle3.yaml: 8192). A fit with null on a vocabulary above 32,768 tokens prints a hint.
        ttt_steps: steps of the training-time test (speculators' default 3).
        ttt_step_loss_decay: step s's loss weight ``decay ** s`` (speculators' default 1.0).
        loss: ``kl_div`` (forward KL to the target's distribution over the draft vocabulary) or ``ce``.
        family: the decoder layer, ``llama`` (what vLLM and llama.cpp serve) or ``qwen3`` (q/k norms).
        norm_before_residual, norm_before_fc, fc_norm, norm_output: the drafter's norm flags
            (:class:`~lightning_bpd.drafters.eagle3.network.Eagle3Config`; speculators trains with norm_output true, which vLLM and
            llama.cpp do not run as trained: false here).
        feature_noise: uniform noise in ``[-x, x]`` added to the target features while training.
        feature_cache_gb: up to this many GiB of the target's features and last hidden states are kept per training
            sequence (keyed by the batches' ``index``) and reused later instead of running the target again; 0 runs
            the target at every step.
        lr, warmup_steps, weight_decay: AdamW on the drafter (decay on its matrices), linear warmup then cosine
            decay to 10% of ``lr`` at the run's last step (DFlashModule's).
        block_size: the chains proposed by validation decodes and ``decode``: greedy's next token and
            ``block_size - 1`` drafts (null: ``ttt_steps + 1``, as deep as trained).
        max_new_tokens: validation decodes (and ``decode``'s default) continue each prompt by at most this many tokens.
        feature_store: a store of this target's features (``python -m lightning_bpd store``) holding
            ``target_layer_ids`` and the last hidden state: training reads them and the target's greedy labels from
            it and trains on its sequences only, the target never running in a training step (validation still runs
            it; the target's distribution is its LM head over the stored last states).
    """

    drafter_kind = "eagle3"  # the registry's name of this kind (lightning_bpd.drafters.registry)
    config_key = "eagle3_config"
    position = "depth"

    def __init__(self, pretrained: str | None = None, target_layer_ids: list[int] | None = None,
                 draft_vocab: int | None = None, ttt_steps: int = 3, ttt_step_loss_decay: float = 1.0,
                 loss: str = "kl_div", family: str = "llama", norm_before_residual: bool = True,
                 norm_before_fc: bool = True, fc_norm: bool = False, norm_output: bool = False,
                 feature_noise: float = 0.0, feature_cache_gb: float = 4.0, lr: float = 6e-4, warmup_steps: int = 100,
                 weight_decay: float = 0.01, block_size: int | None = None, max_new_tokens: int = 32,
                 feature_store: str | None = None) -> None:
        super().__init__()
        block_size = ttt_steps + 1 if block_size is None and isinstance(ttt_steps, int) else block_size
        for name, value, least in (("ttt_steps", ttt_steps, 1), ("block_size", block_size, 2),
                                   ("max_new_tokens", max_new_tokens, 1), ("warmup_steps", warmup_steps, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"model.{name} must be an integer >= {least}, got {value!r}")
        if block_size > MAX_BLOCK:
            raise ValueError(f"model.block_size (token 1 and its drafts) must be at most {MAX_BLOCK}, got {block_size}")
        if loss not in LOSSES:
            raise ValueError(f"model.loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        if not ttt_step_loss_decay > 0 or feature_noise < 0 or not lr > 0 or weight_decay < 0 or feature_cache_gb < 0:
            raise ValueError(f"model: need ttt_step_loss_decay > 0, feature_noise >= 0, lr > 0, weight_decay >= 0 and "
                             f"feature_cache_gb >= 0, got {ttt_step_loss_decay}, {feature_noise}, {lr}, {weight_decay}, "
                             f"{feature_cache_gb}")
        pretrained, target, tokenizer = frozen_target(pretrained)
        n, vocab = int(target.n_layers), int(target.vocab_size)
        if target_layer_ids is None:
            try:
                layers = default_eagle3_layers(n)
            except ValueError:
                raise ValueError(f"model.target_layer_ids: EAGLE-3's default layers need a target of >= 7 layers, this "
                                 f"one has {n}: give >= 2 distinct layers in [0, {n - 1}]") from None
        else:
            layers = [int(i) for i in target_layer_ids]
        if len(layers) < 2 or len(set(layers)) != len(layers) or any(not 0 <= i < n for i in layers):
            raise ValueError(f"model.target_layer_ids {layers}: give >= 2 distinct decoder layers of the target in "
                             f"[0, {n - 1}]")
        if draft_vocab is not None and (isinstance(draft_vocab, bool) or not isinstance(draft_vocab, int)
                                        or draft_vocab < 1):
            raise ValueError(f"model.draft_vocab must be null (the whole vocabulary) or an integer >= 1 (at least "
                             f"{vocab}: the whole vocabulary), got {draft_vocab!r}")
        whole = draft_vocab is None
        draft_vocab = None if whole or draft_vocab >= vocab else draft_vocab  # the whole vocabulary: null
        weight = embedding_weight(target)  # (V, H)
        if weight.shape[0] != vocab:
            raise ValueError(f"model.pretrained: the target's input embeddings have {weight.shape[0]} rows, its LM head "
                             f"{vocab}: EAGLE-3 needs one vocabulary")
        shape = target_shape(target)
        flags = {"norm_before_residual": norm_before_residual, "norm_before_fc": norm_before_fc, "fc_norm": fc_norm,
                 "norm_output": norm_output}
        try:
            config = Eagle3Config(**shape, target_layer_ids=tuple(layers), vocab_size=vocab,
                                  draft_vocab_size=draft_vocab or vocab, family=family,
                                  max_position_embeddings=int(target.n_positions or 2048),
                                  **{k: bool(v) for k, v in flags.items()}).validate()
        except ValueError as err:
            raise ValueError(f"model: {err}") from None
        self.store = open_store(feature_store, target, tokenizer, config.target_layer_ids, last=True)
        self.drafter = Eagle3Drafter(config)
        self.drafter.set_embeddings(weight.detach().float())
        # the target: not a registered child (no optimizer, no state_dict, no .train()); _apply moves it along
        object.__setattr__(self, "model", target)
        object.__setattr__(self, "lm", CausalLM(target, tokenizer))
        self.save_hyperparameters({"pretrained": pretrained, "target_layer_ids": layers, "draft_vocab": draft_vocab,
                                   "ttt_steps": ttt_steps, "ttt_step_loss_decay": ttt_step_loss_decay, "loss": loss,
                                   "family": family, **flags, "feature_noise": feature_noise,
                                   "feature_cache_gb": feature_cache_gb, "lr": lr, "warmup_steps": warmup_steps,
                                   "weight_decay": weight_decay, "block_size": block_size,
                                   "max_new_tokens": max_new_tokens,
                                   "feature_store": None if feature_store is None else os.path.abspath(feature_store)})
        self.ttt_steps, self.decay, self.loss_kind = ttt_steps, float(ttt_step_loss_decay), loss
        self.feature_noise, self.block_size, self.max_new_tokens = feature_noise, block_size, max_new_tokens
        self.feature_cache = FrozenStates(int(feature_cache_gb * 2**30)) if feature_cache_gb > 0 else None
        self.vocab_counted = not config.uses_draft_vocab  # the draft vocabulary is counted once, at setup("fit")
        trained = sum(p.numel() for p in self.drafter.parameters() if p.requires_grad)
        self.vocab_hint = whole_vocab_hint(config, trained) if whole else None  # printed when fitting starts
        self.rank_agreement = None  # DecodeEval's table of heads (none here)

    # ---- the frozen target: its features and last hidden states ----------------------------------------------
    @torch.no_grad()
    def target_pass(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The target's own forward over ``src`` (B, T): its features at ``target_layer_ids`` (B, T, A*H) and its last
        hidden states (B, T, H)."""
        last, features = self.model.full_features(src, self.drafter.config.target_layer_ids)  # (B, T, H), (B, T, A*H)
        return features, last

    def target_outputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """:meth:`target_pass` over the batch's ``src`` (B, T); while training, through the per-sequence cache
        (``feature_cache_gb``, in the target's dtype): the same features (B, T, A*H) and last states (B, T, H)."""
        src, index = batch["src"], batch.get("index")
        if self.feature_cache is None or index is None or not self.training:
            return self.target_pass(src)
        width = src.shape[1]
        split = self.drafter.config.num_target_features * self.drafter.config.hidden_size

        def packed(rows: Tensor) -> Tensor:  # (b, T, A*H + H)
            return torch.cat(self.target_pass(src[rows]), dim=-1)

        both = self.feature_cache.hidden(index, torch.full_like(index, width), width, packed)  # (B, T, A*H + H)
        return both[..., :split], both[..., split:]

    @torch.no_grad()
    def target_logits(self, last: Tensor) -> tuple[Tensor, Tensor]:
        """The target's last hidden states (B, T, H) -> its logits over the draft vocabulary (B, T, Vd) (float32) and
        its greedy next token over the whole vocabulary (B, T), row by row (one row's full logits at a time)."""
        restricted, greedy = [], []
        for h in last:
            logits = self.model.logits_first(h)  # (T, V)
            greedy.append(argmax(logits))
            restricted.append(self.drafter.draft_targets(logits).float())
        return torch.stack(restricted), torch.stack(greedy)

    def step(self, batch: dict[str, Tensor], generator: torch.Generator | None = None, noise: float = 0.0
             ) -> dict[str, Tensor]:
        """The loss and metrics of one batch (feature noise ``noise`` drawn from ``generator``, on the features'
        device)."""
        src = batch["src"]
        b, t = src.shape
        if t <= self.ttt_steps:
            raise ValueError(f"a training sequence of {t} tokens is not longer than model.ttt_steps "
                             f"{self.ttt_steps}: raise data.seq_len")
        if self.store is not None and self.training:  # the store's features, last states and greedy labels
            rows = store_batch(self.store, src, batch.get("index"), self.drafter.config.target_layer_ids, last=True)
            weight = embedding_weight(self.model)
            features = rows.features.to(device=weight.device, dtype=weight.dtype)
            targets, _ = self.target_logits(rows.last.to(device=weight.device, dtype=weight.dtype))
            greedy = rows.labels.to(src.device)  # from the target's float logits, not the rounded states
        else:
            features, last = self.target_outputs(batch)  # (B, T, A*H), (B, T, H)
            targets, greedy = self.target_logits(last)  # (B, T, Vd), (B, T)
        length = batch.get("length")
        real = (length + 1).clamp(max=t) if length is not None else torch.full((b,), t)
        valid = Eagle3Drafter.ttt_valid(real.to(src.device), t, self.ttt_steps)  # (B, S, T)
        features = features.to(self.drafter.fc.weight.dtype)
        if noise > 0:
            features = features + (torch.rand(features.shape, generator=generator, device=features.device,
                                              dtype=features.dtype) * 2 - 1) * noise
        logits = self.drafter.train_forward(features, src, self.ttt_steps)  # (B, S, T, Vd)
        loss, per_step = ttt_loss(logits, targets, valid, self.decay, self.loss_kind)
        labels = depth_labels(greedy, self.ttt_steps, self.drafter.t2d)  # (B, S, T)
        acc, accepted = block_acceptance(logits.detach().transpose(1, 2), labels.transpose(1, 2),
                                         valid.transpose(1, 2))
        return {"loss": loss, "loss_depth": per_step, "acc": acc, "accepted": accepted}

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        generator = None
        if self.feature_noise > 0:  # every (step, rank) its own noise
            world = self.trainer.world_size if self._trainer is not None else 1
            generator = torch.Generator(device=batch["src"].device)
            generator.manual_seed(anchor_seed(self.global_step, self.global_rank, world))
        out = self.step(batch, generator, self.feature_noise)
        self.log_metrics("train", out, batch["src"].shape[0])
        return out["loss"]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        out = self.step(batch)
        self.log_metrics("val", out, batch["src"].shape[0])

    def decode_eval_proposer(self, model: Any) -> Eagle3:
        """What proposes in :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval`'s blockwise methods: the drafter
        (a copy in the dtype of ``model``, the target or a runtime of it), chains of ``block_size``."""
        return eagle3_proposer(self.drafter, model, self.block_size)

    # ---- the draft vocabulary --------------------------------------------------------------------------------
    def set_draft_vocab(self, counts: Tensor) -> None:
        """The drafter's vocabulary: the ``draft_vocab`` most frequent target ids of ``counts`` (V,)."""
        c = self.drafter.config
        if not c.uses_draft_vocab:
            raise ValueError(f"model.draft_vocab is null or the whole vocabulary ({c.vocab_size}): nothing to map")
        d2t, t2d = vocab_mapping(counts, c.draft_vocab_size)
        self.drafter.set_vocab_mapping(d2t.to(self.drafter.d2t.device), t2d.to(self.drafter.t2d.device))
        self.vocab_counted = True

    # ---- checks and checkpoints ------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """A training sequence must exceed ``ttt_steps`` and fit the target's context (checked before any step); a
        draft vocabulary is counted from the training data when fitting starts (once)."""
        self.check_seq_len(self.ttt_steps, "ttt_steps")
        datamodule = getattr(self._trainer, "datamodule", None)
        if stage == "fit" and self.store is not None:
            train_from_store(self.store, datamodule)
        if stage == "fit" and self.vocab_hint and self.global_rank == 0:
            print(self.vocab_hint, file=sys.stderr, flush=True)
        if stage == "fit" and not self.vocab_counted:
            if datamodule is None:
                raise ValueError("model.draft_vocab: the draft vocabulary is counted from the training data: fit with "
                                 "a data module, or set model.draft_vocab=null")
            self.set_draft_vocab(token_counts(datamodule, self.drafter.config.vocab_size))

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The drafter rebuilt from the hyperparameters must be the one saved (same target, same shapes); its draft
        vocabulary comes with its state (not counted again)."""
        super().on_load_checkpoint(checkpoint)
        self.vocab_counted = True


__all__ = ["EAGLE3_CLASS", "Eagle3Module", "check_eagle3_fits", "depth_labels", "eagle3_proposer",
           "load_eagle3_drafter", "token_counts", "ttt_loss"]
