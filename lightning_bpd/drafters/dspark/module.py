"""Training a DSpark drafter (:mod:`lightning_bpd.drafters.dspark.network`) on a frozen causal LM: DFlash's module
(:class:`~lightning_bpd.drafters.dflash.module.DFlashModule`: the frozen target, anchors, the feature store or the
per-sequence cache, the optimizer, validation decodes) with DSpark's blocks and loss.

A training step, as DeepSpec and speculators train DSpark:

* anchors a (B, M) as DFlash's; block ``[src[a], mask x (K - 1)]`` at ``a + j``; anchor-first, slot j is trained
  toward ``labels[a + j]`` (the target's greedy choice of the token at ``a + j + 1``), its Markov bias reading the
  data's token at ``a + j`` (slot 0: the anchor); slots whose label reads past the data are masked;
* the target's distribution there, ``p_t = softmax(lm_head(last[a + j]))``, from its last hidden state ``last``
  (the live target's, or the feature store's: a store made with ``--no-last`` is refused);
* ``w_j = exp(-j / gamma)``; with m the mask, ``TV = 1 - sum_v min(q, p_t)`` (q: the drafter's softmax) and
  ``c* = 1 - TV`` (detached, the analytic acceptance), the loss is
  ``sum(w m (ce_alpha CE + tv_alpha TV + confidence_alpha BCE(conf, c*))) / sum(m)``
  (0.1, 0.9, 1.0 by default: the paper's; the normaliser is speculators').

Logged besides DFlash's ``loss``, ``accepted`` (exact acceptance, teacher-forced) and ``acc_slot<j>``: ``ce``,
``tv``, ``conf`` (the three terms), ``soft_accepted`` (``1 + sum_j prod_{i <= j} c*_i``) and ``conf_error``
(``|sigmoid(conf) - c*|`` on the unmasked slots).
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.drafters.common.trainer import load_drafter_state
from lightning_bpd.drafters.dflash.module import (
    DFlashModule,
    block_acceptance,
    check_drafter_fits,
    drafter_for,
    embedding_weight,
    sample_anchors,
)
from lightning_bpd.drafters.dspark.network import DSparkConfig, DSparkDrafter
from lightning_bpd.drafters.dspark.proposer import DSpark
from lightning_bpd.nn.argmax import argmax
from lightning_bpd.tasks.lm.feature_store import store_batch

DSPARK_CLASS = "lightning_bpd.drafters.dspark.module.DSparkModule"


def slot_weights(block_size: int, gamma: float) -> Tensor:
    """The loss weights of slots 0..K-1 (K,): ``exp(-j / gamma)`` (every slot drafts)."""
    return torch.exp(-torch.arange(block_size, dtype=torch.float32) / gamma)


def check_dspark_fits(drafter: Any, model: Any, what: str = "the drafter") -> None:
    """DFlash's check (:func:`~lightning_bpd.drafters.dflash.module.check_drafter_fits`) and the heads' vocabulary."""
    check_drafter_fits(drafter, model, what)
    if model.vocab_size is not None and drafter.config.vocab_size != model.vocab_size:
        raise ValueError(f"{what} was trained on another target: vocab_size {drafter.config.vocab_size} (target "
                         f"{model.vocab_size})")


def dspark_proposer(drafter: Any, model: Any, block_size: int | None = None, confidence_threshold: float = 0.0,
                    what: str = "the drafter") -> DSpark:
    """The DSpark proposer of ``drafter`` on the target ``model`` (checked to fit it; a copy in its dtype)."""
    check_dspark_fits(drafter, model, what)
    return DSpark(drafter_for(drafter, model), block_size, confidence_threshold)


def load_drafter(path: str | os.PathLike) -> DSparkDrafter:
    """The drafter alone of a DSparkModule checkpoint; one-line ValueError on a file that is none."""
    return load_drafter_state(path, DSPARK_CLASS, "dspark_config", lambda c: DSparkDrafter(DSparkConfig.from_dict(c)),
                              "a DSpark drafter", "give the .ckpt of a fit with conf/lm/dspark.yaml")


class DSparkModule(DFlashModule):
    """A DSpark drafter trained on a frozen causal LM. The arguments are DFlashModule's (``block_size``: K slots, all
    drafting; ``gamma``: slot j's weight ``exp(-j / gamma)``) and:

    Args:
        markov_rank: the Markov head's rank r (its two matrices hold ``2 V r`` parameters).
        enable_confidence_head: train a confidence head (what ``confidence_threshold`` reads when decoding).
        confidence_head_with_markov: the confidence head reads ``W1[prev]`` besides the state.
        ce_alpha, tv_alpha, confidence_alpha: the loss terms' weights (the paper's 0.1, 0.9, 1.0).
    """

    drafter_kind = "dspark"
    config_key = "dspark_config"

    def __init__(self, pretrained: str | None = None, num_layers: int = 1, block_size: int = 8,
                 target_layer_ids: list[int] | None = None, mask_token_id: int | None = None, anchors: int = 32,
                 gamma: float = 4.0, feature_noise: float = 0.0, lr: float = 6e-4, warmup_steps: int = 100,
                 weight_decay: float = 0.01, max_new_tokens: int = 32, feature_cache_gb: float = 4.0,
                 feature_store: str | None = None, markov_rank: int = 256, enable_confidence_head: bool = True,
                 confidence_head_with_markov: bool = True, ce_alpha: float = 0.1, tv_alpha: float = 0.9,
                 confidence_alpha: float = 1.0) -> None:
        alphas = (ce_alpha, tv_alpha, confidence_alpha)
        if not isinstance(markov_rank, int) or markov_rank < 1 or min(alphas) < 0 or ce_alpha + tv_alpha <= 0:
            raise ValueError(f"model: need markov_rank >= 1, ce_alpha, tv_alpha, confidence_alpha >= 0 and "
                             f"ce_alpha + tv_alpha > 0, got {markov_rank}, {ce_alpha}, {tv_alpha}, {confidence_alpha}")
        super().__init__(pretrained, num_layers, block_size, target_layer_ids, mask_token_id, anchors, gamma,
                         feature_noise, lr, warmup_steps, weight_decay, max_new_tokens, feature_cache_gb,
                         feature_store)
        if self.store is not None:  # p_t reads the target's last hidden state: one line where the store has none
            self.store.check(self.model, self.tokenizer, self.drafter.config.target_layer_ids, last=True)
        config = DSparkConfig(**self.drafter.config.to_dict(), vocab_size=int(self.model.vocab_size),
                              markov_rank=markov_rank, enable_confidence_head=bool(enable_confidence_head),
                              confidence_head_with_markov=bool(confidence_head_with_markov))
        self.drafter = DSparkDrafter(config)
        self.save_hyperparameters({**dict(self.hparams), "markov_rank": markov_rank,
                                   "enable_confidence_head": bool(enable_confidence_head),
                                   "confidence_head_with_markov": bool(confidence_head_with_markov),
                                   "ce_alpha": ce_alpha, "tv_alpha": tv_alpha, "confidence_alpha": confidence_alpha})
        self.weights = slot_weights(block_size, gamma)  # the buffer DFlashModule registered, now K long
        self.alphas = alphas

    # ---- the frozen target: features, then the last hidden state ----------------------------------------------
    @torch.no_grad()
    def target_pass(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """The target over ``src`` (B, T): its features at ``target_layer_ids`` followed by its last hidden state
        (B, T, A*H + H), and its greedy next token at every position (B, T) (DFlashModule's per-sequence cache keeps
        both as they are)."""
        last, features = self.model.full_features(src, self.drafter.config.target_layer_ids)  # (B, T, H), (B, T, A*H)
        labels = torch.stack([argmax(self.model.logits_first(h)) for h in last])  # row by row
        return torch.cat([features, last.to(features.dtype)], dim=-1), labels

    def target_outputs(self, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """:meth:`target_pass`'s values, from the feature store while training with one (its ``last`` included)."""
        if self.store is None or not self.training:
            return super().target_outputs(batch)
        rows = store_batch(self.store, batch["src"], batch.get("index"), self.drafter.config.target_layer_ids,
                           last=True)
        weight = embedding_weight(self.model)
        both = torch.cat([rows.features, rows.last], dim=-1)  # type: ignore[list-item]
        return both.to(device=weight.device, dtype=weight.dtype), rows.labels.to(batch["src"].device)

    # ---- a step ------------------------------------------------------------------------------------------------
    def step(self, batch: dict[str, Tensor], generator: torch.Generator, noise: float) -> dict[str, Tensor]:
        """The loss and metrics of one batch (anchors from ``generator``, feature noise ``noise``)."""
        src = batch["src"]
        b, t = src.shape
        if t <= self.block_size:
            raise ValueError(f"a training sequence of {t} tokens is not longer than model.block_size "
                             f"{self.block_size}: raise data.seq_len")
        both, labels = self.target_outputs(batch)
        hidden = self.drafter.config.hidden_size
        features, last = both[..., :-hidden], both[..., -hidden:]  # (B, T, A*H), (B, T, H)
        length = batch.get("length")
        real = (length + 1).clamp(max=t) if length is not None else torch.full((b,), t, device=src.device)
        anchors = sample_anchors(b, t, self.block_size, self.anchors, generator).to(src.device)
        embeds, positions, _, _, valid = self.blocks(src, anchors, labels, real.to(src.device))
        where = positions.flatten(1)  # (B, M K): slot j sits at a + j and predicts the token after it
        y, prev = labels.gather(1, where).view(positions.shape), src.gather(1, where).view(positions.shape)
        mask = (positions < real.to(src.device)[:, None, None]) & valid[..., None]  # (B, M, K)
        dtype = self.drafter.fc.weight.dtype
        features = features.to(dtype)
        if noise > 0:
            features = features + (torch.rand_like(features) * 2 - 1) * noise
        h = self.drafter.train_forward(features, embeds.to(dtype), anchors, positions, valid)  # (B, M, K, H)
        flat = h.reshape(-1, hidden).to(embedding_weight(self.model).dtype)  # one (N, H) x (H, V) product
        base = self.model.logits_first(flat).float().view(*h.shape[:-1], -1)  # (B, M, K, V)
        logits, conf = self.drafter.heads(h, base, prev)  # (B, M, K, V), (B, M, K) or None
        with torch.no_grad():
            at = last.gather(1, where[..., None].expand(-1, -1, hidden))  # (B, M K, H)
            p_t = torch.softmax(self.model.logits_first(at).float(), dim=-1).view(logits.shape)  # (B, M, K, V)
        ce = F.cross_entropy(logits.flatten(0, 2), y.flatten(), reduction="none").view(y.shape)  # (B, M, K)
        tv = 1 - torch.minimum(torch.softmax(logits, dim=-1), p_t).sum(dim=-1)  # (B, M, K)
        target = (1 - tv).detach().clamp(0, 1)  # c*: the analytic acceptance of each slot
        m, w = mask.float(), self.weights
        total = m.sum() + 1e-5
        terms = {"ce": (ce * w * m).sum() / total, "tv": (tv * w * m).sum() / total}
        if conf is not None:
            bce = F.binary_cross_entropy_with_logits(conf.float(), target, reduction="none")
            terms["conf"] = (bce * w * m).sum() / total
            terms["conf_error"] = ((torch.sigmoid(conf.float()) - target).abs() * m).sum().detach() / total
        a_ce, a_tv, a_conf = self.alphas
        loss = a_ce * terms["ce"] + a_tv * terms["tv"] + (a_conf * terms["conf"] if conf is not None else 0.0)
        acc, accepted = block_acceptance(logits.detach(), y, mask)
        soft = 1 + torch.cumprod(target * m, dim=-1).sum(dim=-1)  # (B, M)
        first = mask[..., 0]
        soft = (soft * first).sum() / first.sum().clamp(min=1)
        return {"loss": loss, "acc": acc, "accepted": accepted, "soft_accepted": soft,
                **{k: v.detach() for k, v in terms.items()}}

    def log_metrics(self, prefix: str, out: dict[str, Tensor], n: int) -> None:
        super().log_metrics(prefix, out, n)
        for key in ("ce", "tv", "conf", "conf_error", "soft_accepted"):
            if key in out:
                self.log(f"{prefix}/{key}", out[key], batch_size=n, sync_dist=prefix != "train")

    def decode_eval_proposer(self, model: Any) -> DSpark:
        """The drafter proposing in DecodeEval's blockwise methods (a copy in the dtype of ``model``)."""
        return dspark_proposer(self.drafter, model)


__all__ = ["DSPARK_CLASS", "DSparkModule", "check_dspark_fits", "dspark_proposer", "load_drafter",
           "slot_weights"]
