"""Training a DFlash block drafter (:mod:`lightning_bpd.drafters.dflash.network`) on a frozen Hugging Face causal LM: the
LightningModule.

The target (``pretrained``, a local checkpoint directory) is frozen: no gradients, eval mode (no dropout), and held
outside the module's registered children, so that neither the optimizer nor the checkpoint's ``state_dict`` sees it
(a checkpoint holds the drafter alone and re-reads the target from ``pretrained``; ``.to()`` still moves it).

A training step, as speculators trains DFlash (the target's own greedy output, not the data, is the label):

* the target reads the packed sequence ``src`` (B, T) once under ``no_grad``: its features, the concatenated
  outputs of the decoder layers ``target_layer_ids`` (``hidden_states[i + 1]``) (B, T, A*H), and its greedy next token
  at every position, ``labels[t] = argmax(lm_head(last_hidden[t]))`` (B, T);
* ``M = min(anchors, T - block_size)`` distinct anchors per sequence are drawn from ``[1, T - block_size]`` (sorted;
  a generator seeded by the step); block m is ``[src[a], mask x (Bk - 1)]`` at positions ``a + [0, Bk)``, embedded
  with the target's embedding, and sees the features of the positions ``< a``
  (:meth:`~lightning_bpd.drafters.dflash.network.DFlashDrafter.train_forward`);
* slot j >= 1 is read through the target's LM head and trained toward ``labels[a + j - 1]`` (the target's choice
  of the token at position ``a + j``), with the weight ``w_j = exp(-(j - 1) / gamma)``; the loss is the weighted
  cross-entropy summed over the slots and divided by the number of slots (speculators' normaliser).

Metrics (:func:`block_acceptance`): per-slot accuracy and the expected accepted block size of exact acceptance,
``1 + sum_j prod_{i <= j} correct_i``. At the end of validation :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval`
decodes held-out prompts greedily and with its blockwise rules (``decode_eval.criteria: [exact]``), the drafter
proposing (:meth:`DFlashModule.decode_eval_proposer`, :class:`~lightning_bpd.decoding.proposers.DFlash` through the
one decoding loop): ``val/exact/matches_greedy`` (1.0 when every continuation equals greedy's),
``val/exact/mean_accepted_block_size``, ``val/exact/model_calls`` and ``val/exact/speedup`` beside greedy's.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.drafters.common.target import frozen_target, is_own_base
from lightning_bpd.drafters.common.trainer import DrafterModule, load_drafter_state, lr_factor
from lightning_bpd.drafters.dflash.network import DFlashConfig, DFlashDrafter, default_target_layers
from lightning_bpd.drafters.dflash.proposer import DFlash
from lightning_bpd.hf.prompts import CausalLM
from lightning_bpd.nn.argmax import argmax
from lightning_bpd.tasks.frozen_states import FrozenStates
from lightning_bpd.tasks.lm.feature_store import open_store, store_batch, train_from_store


def slot_weights(block_size: int, gamma: float) -> Tensor:
    """The loss weights of slots 1..Bk-1 (Bk - 1,): ``exp(-(j - 1) / gamma)`` (slot 0, the given token, has none)."""
    return torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)


def block_acceptance(logits: Tensor, labels: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Teacher-forced acceptance of drafted blocks. logits (N, M, K, V) of slots 1..K, labels (N, M, K), mask (N, M, K)
    bool (default all) -> per-slot accuracy (K,) over the unmasked slots, and the expected accepted block size of
    exact acceptance ``1 + sum_j prod_{i <= j} correct_i`` (a masked slot counts as wrong) averaged over the blocks
    whose first slot is unmasked (a scalar; 1 where there is none)."""
    correct = argmax(logits) == labels  # (N, M, K)
    mask = torch.ones_like(correct) if mask is None else mask.bool()
    correct = correct & mask
    acc = correct.sum(dim=(0, 1)).float() / mask.sum(dim=(0, 1)).clamp(min=1).float()  # (K,)
    accepted = 1 + torch.cumprod(correct.long(), dim=-1).sum(dim=-1).float()  # (N, M)
    blocks = mask[..., 0]
    mean = (accepted * blocks).sum() / blocks.sum() if bool(blocks.any()) else accepted.new_ones(())
    return acc, mean


def sample_anchors(batch: int, length: int, block_size: int, count: int, generator: torch.Generator) -> Tensor:
    """``min(count, length - block_size)`` distinct anchors per row in ``[1, length - block_size]``, sorted (B, M)
    (on the CPU, from ``generator``)."""
    room = length - block_size
    if room < 1:
        raise ValueError(f"a training sequence of {length} tokens leaves no anchor for blocks of {block_size}: "
                         "data.seq_len must exceed model.block_size")
    m = min(count, room)
    order = torch.rand(batch, room, generator=generator).argsort(dim=1)[:, :m]  # (B, M) distinct
    return order.sort(dim=1).values + 1


def anchor_seed(step: int, rank: int, world: int) -> int:
    """The seed of a training step's anchors on one rank: every (step, rank) its own, so ranks under DDP draw
    different anchors from one another and from their other steps."""
    return step * max(1, world) + rank


def drafter_shape(config: Any) -> dict[str, Any]:
    """The DFlashConfig fields that follow the target's config (Llama/Qwen-like keys, GPT-2-like ones as their
    attribute aliases: hidden size, heads; head_dim = H // heads, intermediate 4H where the config names none)."""
    hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    inter = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * hidden
    out: dict[str, Any] = {"hidden_size": hidden, "num_heads": heads, "num_kv_heads": int(kv),
                           "head_dim": int(head_dim), "intermediate_size": int(inter)}
    if getattr(config, "rms_norm_eps", None):
        out["rms_norm_eps"] = float(config.rms_norm_eps)
    theta = getattr(config, "rope_theta", None) or (getattr(config, "rope_parameters", None) or {}).get("rope_theta")
    if theta:
        out["rope_theta"] = float(theta)
    return out


def target_shape(model: Any) -> dict[str, Any]:
    """:func:`drafter_shape` of the target ``model``: a Hugging Face causal LM's config, or our own base's (hidden
    size, heads, head_dim = d_model // heads, intermediate d_ff)."""
    if is_own_base(model):
        c = model.config
        return {"hidden_size": c.d_model, "num_heads": c.n_heads, "num_kv_heads": c.n_heads,
                "head_dim": c.d_model // c.n_heads, "intermediate_size": c.d_ff}
    return drafter_shape(model.base.config)


def embedding_weight(model: Any) -> Tensor:
    """The target's input embedding table (V, D): its dtype and device are the features'."""
    return model.tgt_embed.weight if is_own_base(model) else model.base.get_input_embeddings().weight


def default_mask_id(tokenizer: Any) -> int:
    """The tokenizer's mask id, else its pad id, else its EOS id."""
    for name in ("mask_token_id", "pad_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("model.mask_token_id: the tokenizer has no mask, pad or EOS token: give one")


DFLASH_CLASS = "lightning_bpd.drafters.dflash.module.DFlashModule"


def check_drafter_fits(drafter: Any, model: Any, what: str = "the drafter") -> None:
    """ValueError (one line) unless ``drafter``'s shapes are those the target ``model`` (a causal LM, or a runtime of
    one) gives it: hidden size, heads, its layers and mask id within the target's."""
    config = getattr(getattr(model, "base", None), "config", None)
    own = is_own_base(model)
    if (config is None and not own) or getattr(config, "is_encoder_decoder", False) or model.encode_features is None:
        raise ValueError(f"{what} drafts for a causal LM (Hugging Face or our own decoder-only base); this "
                         f"checkpoint's model ({type(model).__name__}) offers no target features")
    want, have = target_shape(model), drafter.config
    differ = [f"{key} {getattr(have, key)} (target {value})" for key, value in want.items()
              if key in ("hidden_size", "num_heads", "num_kv_heads", "head_dim") and getattr(have, key) != value]
    layers = int(model.n_layers)
    if any(not 0 <= i < layers for i in have.target_layer_ids):
        differ.append(f"target_layer_ids {list(have.target_layer_ids)} (target layers 0..{layers - 1})")
    if model.vocab_size is not None and not 0 <= have.mask_token_id < model.vocab_size:
        differ.append(f"mask_token_id {have.mask_token_id} (target vocabulary {model.vocab_size})")
    if differ:
        raise ValueError(f"{what} was trained on another target: " + ", ".join(differ))


def drafter_for(drafter: Any, model: Any) -> Any:
    """A copy of ``drafter`` in eval mode, in the dtype and on the device of ``model``'s embeddings (a causal LM or a
    runtime of one: its features come in that dtype), for decoding; the trained drafter is not touched."""
    weight = embedding_weight(model)
    return copy.deepcopy(drafter).to(device=weight.device, dtype=weight.dtype).eval()


def dflash_proposer(drafter: Any, model: Any, block_size: int | None = None, what: str = "the drafter") -> DFlash:
    """The DFlash proposer of ``drafter`` on the target ``model`` (checked to fit it; :func:`drafter_for`)."""
    check_drafter_fits(drafter, model, what)
    return DFlash(drafter_for(drafter, model), block_size)


def load_drafter(path: str | os.PathLike) -> DFlashDrafter:
    """The drafter alone of a DFlashModule checkpoint (its target is not loaded); one-line ValueError on a file that
    is none (a heads checkpoint, a folder, ...)."""
    return load_drafter_state(path, DFLASH_CLASS, "dflash_config", lambda c: DFlashDrafter(DFlashConfig.from_dict(c)),
                              "a DFlash drafter", "give the .ckpt of a fit with conf/lm/dflash.yaml")


class DFlashModule(DrafterModule):
    """A DFlash drafter trained on a frozen causal LM (``pretrained``).

    Args:
        pretrained: the target, frozen: a local Hugging Face causal LM directory with its tokenizer (never
            downloaded), or the .ckpt of a language-modelling run on our own decoder-only base.
        num_layers: draft decoder layers.
        block_size: tokens per drafted block (slot 0 the given token, ``block_size - 1`` drafts), >= 2.
        target_layer_ids: the target's decoder layers whose outputs are the context (default z-lab's
            ``default_target_layers(n_target_layers, num_layers)``).
        mask_token_id: the id of the mask slots (default: the tokenizer's mask, else pad, else EOS id).
        anchors: random blocks per training sequence.
        gamma: slot j's loss weight ``exp(-(j - 1) / gamma)``.
        feature_noise: uniform noise in ``[-x, x]`` added to the target features while training.
        feature_cache_gb: up to this many GiB of the target's features and greedy labels are kept per training
            sequence (keyed by the batches' ``index``) and reused in later epochs instead of running the target again
            (the frozen target in eval mode gives the same ones every time); 0 runs the target at every step.
        lr, warmup_steps, weight_decay: AdamW on the drafter (decay on its matrices), linear warmup then cosine
            decay to 10% of ``lr`` at the run's last step.
        max_new_tokens: validation decodes (and ``decode``'s default) continue each prompt by at most this many tokens.
        feature_store: a store of this target's features (``python -m lightning_bpd store``) holding
            ``target_layer_ids``: training reads them and the target's labels from it and trains on its sequences only,
            the target never running in a training step (validation still runs it).
    """

    drafter_kind = "dflash"  # the registry's name of this kind (lightning_bpd.drafters.registry)
    config_key = "dflash_config"
    position = "slot"

    def __init__(self, pretrained: str | None = None, num_layers: int = 1, block_size: int = 8,
                 target_layer_ids: list[int] | None = None, mask_token_id: int | None = None, anchors: int = 32,
                 gamma: float = 4.0, feature_noise: float = 0.0, lr: float = 6e-4, warmup_steps: int = 100,
                 weight_decay: float = 0.01, max_new_tokens: int = 32, feature_cache_gb: float = 4.0,
                 feature_store: str | None = None) -> None:
        super().__init__()
        if not isinstance(block_size, int) or block_size < 2:
            raise ValueError(f"model.block_size must be an integer >= 2, got {block_size!r}")
        for name, value, least in (("num_layers", num_layers, 1), ("anchors", anchors, 1),
                                   ("max_new_tokens", max_new_tokens, 1), ("warmup_steps", warmup_steps, 0)):
            if value < least:
                raise ValueError(f"model.{name} must be >= {least}, got {value}")
        if not gamma > 0 or feature_noise < 0 or not lr > 0 or weight_decay < 0 or feature_cache_gb < 0:
            raise ValueError(f"model: need gamma > 0, feature_noise >= 0, lr > 0, weight_decay >= 0 and "
                             f"feature_cache_gb >= 0, got {gamma}, {feature_noise}, {lr}, {weight_decay}, "
                             f"{feature_cache_gb}")
        pretrained, target, tokenizer = frozen_target(pretrained)
        n = target.n_layers
        layers = list(target_layer_ids) if target_layer_ids is not None else default_target_layers(n, num_layers)
        bad = [i for i in layers if not 0 <= int(i) < n]
        if not layers or bad:
            raise ValueError(f"model.target_layer_ids {layers}: each must be a decoder layer of the target in "
                             f"[0, {n - 1}]")
        mask_id = default_mask_id(tokenizer) if mask_token_id is None else int(mask_token_id)
        if not 0 <= mask_id < target.vocab_size:
            raise ValueError(f"model.mask_token_id {mask_id} is not a token of the target's vocabulary "
                             f"[0, {target.vocab_size})")
        config = DFlashConfig(**target_shape(target), target_layer_ids=tuple(int(i) for i in layers),
                              mask_token_id=mask_id, num_layers=num_layers, block_size=block_size)
        self.store = open_store(feature_store, target, tokenizer, config.target_layer_ids)
        self.drafter = DFlashDrafter(config)
        # the target: not a registered child (no optimizer, no state_dict, no .train()); _apply moves it along
        object.__setattr__(self, "model", target)
        object.__setattr__(self, "lm", CausalLM(target, tokenizer))
        self.save_hyperparameters({"pretrained": pretrained, "num_layers": num_layers, "block_size": block_size,
                                   "target_layer_ids": list(config.target_layer_ids), "mask_token_id": mask_id,
                                   "anchors": anchors, "gamma": gamma, "feature_noise": feature_noise, "lr": lr,
                                   "warmup_steps": warmup_steps, "weight_decay": weight_decay,
                                   "max_new_tokens": max_new_tokens, "feature_cache_gb": feature_cache_gb,
                                   "feature_store": None if feature_store is None else os.path.abspath(feature_store)})
        self.register_buffer("weights", slot_weights(block_size, gamma), persistent=False)
        self.block_size, self.anchors, self.gamma, self.feature_noise = block_size, anchors, gamma, feature_noise
        self.max_new_tokens = max_new_tokens
        self.feature_cache = FrozenStates(int(feature_cache_gb * 2**30)) if feature_cache_gb > 0 else None
        self.rank_agreement = None  # DecodeEval's table of heads (none here)

    # ---- the frozen target: its features and greedy labels ---------------------------------------------------
    @torch.no_grad()
    def target_pass(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The target over ``src`` (B, T): its features at ``target_layer_ids`` (B, T, A*H) and its greedy next token
        at every position (B, T)."""
        last, features = self.model.full_features(src, self.drafter.config.target_layer_ids)  # (B, T, D), (B, T, A*D)
        labels = torch.stack([argmax(self.model.logits_first(h)) for h in last])  # row by row
        return features, labels

    def target_outputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """:meth:`target_pass` over the batch's ``src`` (B, T); while training, through the per-sequence cache
        (``feature_cache_gb``): features (B, T, A*H) and labels (B, T), the same values either way."""
        src, index = batch["src"], batch.get("index")
        if self.store is not None and self.training:
            rows = store_batch(self.store, src, index, self.drafter.config.target_layer_ids)
            weight = embedding_weight(self.model)
            return rows.features.to(device=weight.device, dtype=weight.dtype), rows.labels.to(src.device)
        if self.feature_cache is None or index is None or not self.training:
            return self.target_pass(src)
        if self.model.vocab_size >= 2**24:
            raise ValueError(f"model.feature_cache_gb: a vocabulary of {self.model.vocab_size} ids does not fit the "
                             "cache's float32 label column: set model.init_args.feature_cache_gb=0")

        def packed(rows: Tensor) -> Tensor:  # (b, T, A*H + 1): the labels, exact in float32, as the last column
            features, labels = self.target_pass(src[rows])
            return torch.cat([features.float(), labels[..., None].float()], dim=-1)

        width = src.shape[1]
        both = self.feature_cache.hidden(index, torch.full_like(index, width), width, packed)  # (B, T, A*H + 1)
        return both[..., :-1].to(embedding_weight(self.model).dtype), both[..., -1].long()

    def blocks(self, src: Tensor, anchors: Tensor, labels: Tensor, real: Tensor) -> tuple[Tensor, Tensor, Tensor,
                                                                                          Tensor, Tensor]:
        """For anchors (B, M) of ``src`` (B, T): the block embeddings (B, M, Bk, H), positions (B, M, Bk), slot labels
        (B, M, Bk - 1) (``labels[a + j - 1]`` for slot j), the slot mask (B, M, Bk - 1) (slots whose label reads only
        the first ``real`` (B,) tokens) and the anchors' validity (B, M)."""
        bk = self.block_size
        first = src.gather(1, anchors)  # (B, M)
        tokens = torch.cat([first[..., None], first.new_full((*first.shape, bk - 1), self.drafter.config.mask_token_id)],
                           dim=-1)  # (B, M, Bk)
        with torch.no_grad():
            embeds = self.model.embed_tokens(tokens)
        positions = anchors[..., None] + torch.arange(bk, device=src.device)  # (B, M, Bk)
        where = positions[..., :-1]  # (B, M, Bk - 1): slot j's label sits at a + j - 1
        slot_labels = labels.gather(1, where.flatten(1)).view(where.shape)
        mask = where < real[:, None, None]
        return embeds, positions, slot_labels, mask, anchors < real[:, None]

    def step(self, batch: dict[str, Tensor], generator: torch.Generator, noise: float) -> dict[str, Tensor]:
        """The loss and metrics of one batch (anchors from ``generator``, feature noise ``noise``)."""
        src = batch["src"]
        b, t = src.shape
        if t <= self.block_size:
            raise ValueError(f"a training sequence of {t} tokens is not longer than model.block_size "
                             f"{self.block_size}: raise data.seq_len")
        features, labels = self.target_outputs(batch)
        length = batch.get("length")
        real = (length + 1).clamp(max=t) if length is not None else torch.full((b,), t, device=src.device)
        anchors = sample_anchors(b, t, self.block_size, self.anchors, generator).to(src.device)
        embeds, positions, slot_labels, mask, valid = self.blocks(src, anchors, labels, real.to(src.device))
        dtype = self.drafter.fc.weight.dtype
        features = features.to(dtype)
        if noise > 0:
            features = features + (torch.rand_like(features) * 2 - 1) * noise
        h = self.drafter.train_forward(features, embeds.to(dtype), anchors, positions, valid)  # (B, M, Bk, H)
        drafted = h[:, :, 1:].to(embedding_weight(self.model).dtype)  # (B, M, Bk - 1, H)
        # one (N, H) x (H, V) product: the sliced states are not contiguous, and a 4-D product with them runs as a
        # batched one over an expanded vocabulary matrix (7x slower at batch 8 on a 49,152-token vocabulary)
        logits = self.model.logits_first(drafted.reshape(-1, drafted.shape[-1])).float()  # (B M (Bk - 1), V)
        logits = logits.view(*drafted.shape[:-1], -1)  # (B, M, Bk - 1, V)
        ce = F.cross_entropy(logits.flatten(0, 2), slot_labels.flatten(), reduction="none").view(slot_labels.shape)
        m = mask.float()
        loss = (ce * self.weights * m).sum() / (m.sum() + 1e-5)
        acc, accepted = block_acceptance(logits.detach(), slot_labels, mask)
        return {"loss": loss, "acc": acc, "accepted": accepted}

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator().manual_seed(seed)

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        world = self.trainer.world_size if self._trainer is not None else 1
        out = self.step(batch, self.generator(anchor_seed(self.global_step, self.global_rank, world)),
                        self.feature_noise)
        self.log_metrics("train", out, batch["src"].shape[0])
        return out["loss"]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        out = self.step(batch, self.generator(10**9 + batch_idx), 0.0)  # the same anchors at every validation
        self.log_metrics("val", out, batch["src"].shape[0])

    def decode_eval_proposer(self, model: Any) -> DFlash:
        """What proposes in :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval`'s blockwise methods: the drafter
        (a copy in the dtype of ``model``, the target or a runtime of it)."""
        return dflash_proposer(self.drafter, model)

    # ---- checks --------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """A training sequence must exceed the block size and fit the target's context (checked before any step); with
        a feature store, training reads the store's sequences (checked to be the data's)."""
        self.check_seq_len(self.block_size, "block_size")
        if stage == "fit" and self.store is not None:
            train_from_store(self.store, getattr(self._trainer, "datamodule", None))



__all__ = ["DFlashModule", "block_acceptance", "check_drafter_fits", "default_mask_id", "dflash_proposer",
           "drafter_for", "drafter_shape", "embedding_weight", "frozen_target", "is_own_base", "load_drafter",
           "lr_factor", "sample_anchors", "slot_weights"]

