"""What the drafter trainers share (DFlash, :mod:`~lightning_bpd.drafters.dflash.module`; EAGLE-3,
:mod:`~lightning_bpd.drafters.eagle3.module`): a frozen target held outside the module's registered children, the
drafter alone in the checkpoint (its config under ``config_key``), AdamW on the drafter with warmup then cosine decay,
the per-position acceptance logs, the LM task's prompt and validation-decode hooks, and reading the drafter alone
back from a checkpoint."""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor

from lightning_bpd.class_paths import current
from lightning_bpd.tasks.lm.module import LMModule


def lr_factor(step: int, warmup: int, total: float) -> float:
    """Linear warmup over ``warmup`` steps, then cosine decay to 10% at ``total`` steps (inverse square root after
    the warmup where ``total`` is unknown, infinite)."""
    if step < warmup:
        return (step + 1) / warmup
    if not math.isfinite(total) or total <= warmup:
        return math.sqrt(max(1, warmup) / max(1, step))
    progress = min(1.0, (step - warmup) / (total - warmup))
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def load_drafter_state(path: str | os.PathLike, class_path: str, config_key: str, build: Callable[[dict], Any],
                       what: str, hint: str) -> Any:
    """The drafter alone of a checkpoint written by the module ``class_path`` (its config under ``config_key``,
    ``build(config)`` making the empty drafter; the target is not loaded), in eval mode; one-line ValueError on a
    file that is none: ``what`` names the drafter ("a DFlash drafter"), ``hint`` says what to give."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no {what.split(' ', 1)[1]} checkpoint there ({hint})")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 (a corrupt or foreign file: say so once)
        raise ValueError(f"{path} is not a readable PyTorch checkpoint ({type(err).__name__})") from None
    kind = ckpt.get("lightning_bpd_class") if isinstance(ckpt, dict) else None
    if (current(kind) if isinstance(kind, str) else kind) != class_path or config_key not in ckpt:
        raise ValueError(f"{path} is not {what} checkpoint ({str(kind or 'not lightning_bpd').rpartition('.')[2]}): "
                         f"{hint}")
    drafter = build(ckpt[config_key])
    state = {k.removeprefix("drafter."): v for k, v in ckpt["state_dict"].items() if k.startswith("drafter.")}
    drafter.load_state_dict(state, strict=True)
    return drafter.eval()


class DrafterModule(pl.LightningModule):
    """A drafter (``self.drafter``) trained on a frozen target (``self.model``, set with ``object.__setattr__`` so
    that neither the optimizer nor the checkpoint sees it; :meth:`_apply` moves it along) whose tokenizer is
    ``self.lm``'s. Subclasses set ``config_key`` (where the checkpoint keeps the drafter's config) and ``position``
    (the name of a logged per-position accuracy: ``acc_<position><j>``)."""

    config_key = "drafter_config"
    position = "slot"

    # ---- the frozen target -----------------------------------------------------------------------------------
    def _apply(self, fn: Any, *args: Any, **kwargs: Any) -> DrafterModule:
        super()._apply(fn, *args, **kwargs)
        self.model._apply(fn, *args, **kwargs)
        return self

    @property
    def tokenizer(self) -> Any:
        return self.lm.tokenizer

    # ---- logs ------------------------------------------------------------------------------------------------
    def log_metrics(self, prefix: str, out: dict[str, Tensor], n: int) -> None:
        sync = prefix != "train"
        self.log(f"{prefix}/loss", out["loss"], prog_bar=True, batch_size=n, sync_dist=sync)
        self.log(f"{prefix}/accepted", out["accepted"], prog_bar=True, batch_size=n, sync_dist=sync)
        for j, value in enumerate(out["acc"].tolist(), start=1):
            self.log(f"{prefix}/acc_{self.position}{j}", value, batch_size=n, sync_dist=sync)

    # ---- optimizer: AdamW on the drafter's trainable parameters (decay on its matrices), warmup then cosine ------
    def configure_optimizers(self) -> Any:
        hp = self.hparams
        params = [p for p in self.drafter.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": hp.weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=(0.9, 0.95))
        total = float(self.trainer.estimated_stepping_batches) if self._trainer is not None else math.inf
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, hp.warmup_steps, total))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    # ---- checks and checkpoints ------------------------------------------------------------------------------
    def check_seq_len(self, least: int, name: str) -> None:
        """A training sequence must exceed ``least`` (the option ``name``) and fit the target's context (checked
        before any step)."""
        seq_len = getattr(getattr(self._trainer, "datamodule", None), "seq_len", None)
        if seq_len is not None and seq_len <= least:
            raise ValueError(f"data.seq_len {seq_len} must exceed model.{name} {least}")
        positions = self.model.n_positions
        if seq_len is not None and positions is not None and seq_len > positions:
            raise ValueError(f"data.seq_len {seq_len} is longer than the model's context ({positions} positions)")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        cls = type(self)
        checkpoint["lightning_bpd_class"] = f"{cls.__module__}.{cls.__qualname__}"
        checkpoint[self.config_key] = self.drafter.config.to_dict()
        checkpoint["hf_pretrained"] = self.hparams.pretrained

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The drafter rebuilt from the hyperparameters must be the one saved (same target, same shapes)."""
        saved = checkpoint.get(self.config_key)
        if saved is not None and saved != self.drafter.config.to_dict():
            raise ValueError(f"the checkpoint's drafter {saved} is not the one its options build on "
                             f"{self.hparams.pretrained} ({self.drafter.config.to_dict()}): was the target changed?")

    @classmethod
    def init_args_of_checkpoint(cls, hparams: Mapping[str, Any]) -> dict[str, Any]:
        """The ``__init__`` arguments kept in a checkpoint's hyperparameters."""
        names = set(inspect.signature(cls.__init__).parameters) - {"self"}
        return {key: value for key, value in hparams.items() if key in names}

    # ---- held-out prompts (LMModule's, on the target) and DecodeEval's hooks ------------------------------------
    encode_prompts = LMModule.encode_prompts
    detokenize = LMModule.detokenize
    max_decode_len = LMModule.max_decode_len
    make_criterion = LMModule.make_criterion
    decode_eval_batches = LMModule.decode_eval_batches
    decode_eval_metrics = LMModule.decode_eval_metrics
    render_blocks = LMModule.render_blocks
    decode_eval_samples = LMModule.decode_eval_samples


__all__ = ["DrafterModule", "load_drafter_state", "lr_factor"]
