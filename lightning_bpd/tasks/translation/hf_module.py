"""Blockwise heads on a pretrained Hugging Face translation model: the LightningModule.

:class:`HFTranslationModule` trains the heads of an :class:`~lightning_bpd.hf.HFSeq2SeqBlockwise` (a local
``AutoModelForSeq2SeqLM`` checkpoint, ``pretrained``) with the shared blockwise training step
(:class:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule`): frozen base (only the heads train; the base's
decoder states can be cached per example) or joint fine-tuning (``freeze_base: false``, ``base_lr_scale``).
Text goes through the checkpoint's own tokenizer (:class:`~lightning_bpd.tasks.translation.hf_tokenizer.HFTokenizer`);
decoding, ``decode --ckpt`` and DecodeEval work as for :class:`TranslationModule`.

The checkpoint of a run names the base directory (``pretrained``, stored absolute) and holds every weight; the
heads alone go out with :func:`save_heads` (``heads.safetensors`` + ``heads.json``) and come back on a base
directory with :meth:`HFTranslationModule.from_heads` (``lightning_bpd.load_model(heads_dir, base=...)``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn

from lightning_bpd.decoding.trees import budget as tree_budget
from lightning_bpd.hf.base import HEAD_TYPES, HFSeq2SeqBlockwise, load_base
from lightning_bpd.tasks.blockwise_module import MAX_K, BlockwiseModule, options_of, split_flat
from lightning_bpd.tasks.training_options import TrainingOptions
from lightning_bpd.tasks.translation.hf_tokenizer import HFTokenizer
from lightning_bpd.tasks.translation.module import TranslationModule
from lightning_bpd.version import __version__

__all__ = ["HEADS_JSON", "HEADS_WEIGHTS", "HFTranslationModule", "attach_heads", "config_hash", "read_heads_meta",
           "save_heads"]

HEADS_JSON, HEADS_WEIGHTS = "heads.json", "heads.safetensors"
# heads.json's "module": the task module that re-attaches the heads (seq2seq, causal); older files name none (seq2seq)
HEADS_MODULES = ("lightning_bpd.tasks.translation.hf_module.HFTranslationModule", "lightning_bpd.tasks.lm.module.LMModule")
PAD_MULTIPLE = 64  # a model's vocabulary may be its tokenizer's padded up to a multiple of this (T5: 32100 -> 32128)


def check_vocabularies(path: str, tokenizer: HFTokenizer, model: HFSeq2SeqBlockwise) -> None:
    """The tokenizer beside a checkpoint must index the model's vocabulary and share its pad and EOS ids."""
    n, v = tokenizer.vocab_size, model.vocab_size
    padded = n < v and v % PAD_MULTIPLE == 0 and v - n < 2 * PAD_MULTIPLE
    if n != v and not padded:
        raise ValueError(f"{path}: the tokenizer has {n} tokens but the model's vocabulary has {v} (vocab_size "
                         "mismatch): the tokenizer beside the checkpoint must be the model's own")
    if tokenizer.pad_id != model.pad_id:
        raise ValueError(f"{path}: the tokenizer's pad id {tokenizer.pad_id} is not the model's {model.pad_id}")
    if model.eos_id is not None and tokenizer.eos_id != model.eos_id:
        raise ValueError(f"{path}: the tokenizer's EOS id {tokenizer.eos_id} is not the model's {model.eos_id}")


def config_hash(model: HFSeq2SeqBlockwise) -> str:
    """SHA-256 (16 hex digits) of the base's architecture config (names, dtypes and versions left out)."""
    config = model.base.config.to_dict()
    kept = {key: value for key, value in config.items()
            if not key.startswith("_") and key not in ("transformers_version", "dtype", "torch_dtype", "name_or_path")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:16]


def base_fingerprint(model: HFSeq2SeqBlockwise) -> str:
    """SHA-256 (16 hex digits) of the base's output layer weights (float32): which trained base the heads read."""
    weight = model.base.get_output_embeddings().weight.detach().float().cpu().contiguous()
    return hashlib.sha256(weight.numpy().tobytes()).hexdigest()[:16]


def head_dtype(model: HFSeq2SeqBlockwise) -> torch.dtype:
    return model.base.get_output_embeddings().weight.dtype


# An HF run's training defaults: the heads alone on the frozen pretrained base.
TRAINING = TrainingOptions(freeze_base=True, warmup_steps=500)


class HFTranslationModule(TranslationModule):
    """Blockwise heads on a pretrained Hugging Face seq2seq translation model.

    Args:
        pretrained: a local checkpoint directory (``save_pretrained`` output with its tokenizer; never downloaded).
        k: number of heads (2..16 with a frozen base; 1 = the base alone).
        head_type: ``paper``, ``chained`` or ``chained_attn`` (chained heads that also attend to the source).
        head_hidden: the head's hidden size (default: the base's d_model).
        training: as in :class:`TranslationModule` (:class:`~lightning_bpd.tasks.training_options.TrainingOptions`;
            here ``freeze_base`` by default: the base's weights stay bit-identical, its dropout off; ``init_from``: a
            checkpoint of an earlier run on the same base whose weights, base and heads of the same shape, this run
            starts from, e.g. joint fine-tuning after the frozen stage). The base's decoder inputs are not corrupted
            (``input_noise`` 0) and it has no readout to train apart.
        max_len_a, max_len_b: decoding stops after ``a * source_length + b`` tokens (at most the base's positions).
    """

    def __init__(
        self,
        pretrained: str | None = None,
        k: int = 8,
        head_type: str = "chained_attn",
        head_hidden: int | None = None,
        training: TrainingOptions = TRAINING,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
    ) -> None:
        if pretrained is None:
            raise ValueError("model.init_args.pretrained: give the directory of a local Hugging Face seq2seq checkpoint")
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"model.k must lie in [1, {MAX_K}] (1 = the base model), got {k!r}")
        if head_type not in HEAD_TYPES:
            raise ValueError(f"model.head_type must be one of {HEAD_TYPES}, got {head_type!r}")
        _, training = options_of(None, training)
        for name in ("input_noise", "train_readout"):
            if getattr(training, name):
                raise ValueError(f"model.training.{name} is not supported on Hugging Face models: leave it out")
        pretrained = os.path.abspath(os.fspath(pretrained))  # load_model from any folder (the CLI hands it as given)
        model = load_base(pretrained, k=k, head_type=head_type, head_hidden=head_hidden, frozen=training.freeze_base)
        tokenizer = HFTokenizer.load(pretrained)
        check_vocabularies(pretrained, tokenizer, model)
        BlockwiseModule.__init__(self, None, training, model=model)
        self.save_options(pretrained=pretrained, k=k, head_type=head_type, head_hidden=head_hidden, training=training,
                          max_len_a=max_len_a, max_len_b=max_len_b)
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self._tokenizer = tokenizer  # type: ignore[assignment]
        self.train(self.training)  # load_base hands the base in eval mode: a trained base needs its dropout

    @classmethod
    def flat_init_args(cls, flat: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's flat hyperparameters of before ``training`` (its ``vocab_size``: the CLI's link from the
        data's tokenizer, no option here)."""
        flat = {key: value for key, value in flat.items() if key != "vocab_size"}
        return split_flat(flat, None, TRAINING)

    # ---- tokenizer and checkpoints ------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        """The data must be tokenized with the checkpoint's own tokenizer (``data.tokenizer_path: hf:<dir>``), and the
        base's generation config must be one the validation decodes can apply (refused settings fail here, before
        any training, not at the first validation)."""
        self.model.generation_rules.check()
        dm = getattr(self.trainer, "datamodule", None)
        theirs = getattr(dm, "tokenizer", None)
        if theirs is None:
            return
        ours = self.tokenizer
        if (theirs.vocab_size, theirs.pad_id, theirs.eos_id) != (ours.vocab_size, ours.pad_id, ours.eos_id):
            raise ValueError(f"the data's tokenizer ({theirs!r}) is not the checkpoint's own ({ours!r}): leave "
                             f"data.init_args.tokenizer_path unset or set it to hf:{self.hparams.pretrained}")

    @property
    def target_vocab_size(self) -> int:
        return self.model.vocab_size

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        BlockwiseModule.on_save_checkpoint(self, checkpoint)
        checkpoint["hf_pretrained"] = self.hparams.pretrained

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """The tokenizer is the checkpoint directory's (read in ``__init__``); the rank agreement table as stored."""
        BlockwiseModule.on_load_checkpoint(self, checkpoint)

    # ---- training ---------------------------------------------------------------------------------------
    def blockwise_step(self, *args: Any, **kwargs: Any):
        """The teacher-forced loss without ``generate``'s token bans (Marian's pad at -inf would make the
        label-smoothed loss inf); decoding keeps them."""
        with self.model.unbanned():
            return super().blockwise_step(*args, **kwargs)

    def ordinary_argmax(self, logits: Tensor) -> Tensor:
        """The argmax of p_1's ``logits`` (..., V) over the tokenizer's ordinary tokens (special ones left out)."""
        special = torch.tensor(sorted(self.tokenizer.special_ids), dtype=torch.long, device=logits.device)
        return logits.index_fill(-1, special, float("-inf")).argmax(dim=-1)

    # ---- decoding ---------------------------------------------------------------------------------------
    def max_decode_len(self, src: Tensor) -> int:
        """``a * longest source + b``, at most the base's decoder positions."""
        length = super().max_decode_len(src)
        positions = self.model.n_positions
        return length if positions is None else min(length, positions)

    # ---- heads on their own ----------------------------------------------------------------------------
    @classmethod
    def from_heads(cls, heads_dir: str | os.PathLike, base: str | os.PathLike | None = None,
                   device: str | torch.device = "cpu") -> HFTranslationModule:
        """The heads saved by :func:`save_heads` in ``heads_dir`` re-attached to ``base`` (a checkpoint directory;
        default: the one named in ``heads.json``), in eval mode. ValueError if the base is not the one they
        were trained on (architecture or output layer)."""
        folder, meta = Path(heads_dir), read_heads_meta(heads_dir)
        base_dir = os.fspath(base) if base is not None else meta["base"]
        module = cls(base_dir, k=meta["k"], head_type=meta["head_type"], head_hidden=meta["head_hidden"],
                     training=TRAINING, max_len_a=meta.get("max_len_a", 1.5),
                     max_len_b=meta.get("max_len_b", 10))
        return attach_heads(module, folder, meta, base_dir).to(device).eval()


def read_heads_meta(heads_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``heads.json`` of a folder written by :func:`save_heads` (one-line ValueError without one)."""
    meta_path = Path(heads_dir) / HEADS_JSON
    if not meta_path.is_file():
        raise ValueError(f"{heads_dir}: no {HEADS_JSON} (a folder written by save_heads is expected)")
    return json.loads(meta_path.read_text())


def attach_heads(module: pl.LightningModule, folder: Path, meta: dict[str, Any], base_dir: str) -> pl.LightningModule:
    """Load the heads of ``folder`` into ``module`` (built on ``base_dir`` with the heads' shape) and their rank
    agreement table; ValueError if the base is not the one they were trained on (architecture or output layer)."""
    from safetensors.torch import load_file

    model = module.model
    if model.vocab_size != meta["vocab_size"] or config_hash(model) != meta["config_hash"]:
        raise ValueError(f"{base_dir}: not the base the heads of {folder} were trained on (its config or "
                         f"vocabulary differs from {meta['base']}'s)")
    if base_fingerprint(model) != meta["base_fingerprint"]:
        raise ValueError(f"{base_dir}: not the base the heads of {folder} were trained on (same architecture, "
                         f"other weights than {meta['base']}'s)")
    state = load_file(str(folder / HEADS_WEIGHTS))
    model.head.load_state_dict({key: value.to(head_dtype(model)) for key, value in state.items()})
    module.rank_agreement = tree_budget.from_record(meta.get(tree_budget.KEY), str(folder / HEADS_JSON))
    return module


def save_heads(module_or_model: pl.LightningModule | nn.Module, out_dir: str | os.PathLike) -> Path:
    """Write the heads of an :class:`HFTranslationModule` or an :class:`~lightning_bpd.tasks.lm.LMModule` (or of their
    Hugging Face model) on their own:
    ``heads.safetensors`` (the head's weights only) and ``heads.json`` (k, head type and size, the base's
    directory, config hash and output-layer fingerprint, vocabulary size, lightning_bpd version). Refused for a
    fine-tuned base: its heads need that base (save the whole checkpoint)."""
    from safetensors.torch import save_file

    from lightning_bpd.hf.causal import HFCausalBlockwise

    model = getattr(module_or_model, "model", module_or_model)
    if not isinstance(model, (HFSeq2SeqBlockwise, HFCausalBlockwise)):
        raise TypeError("save_heads takes an HFTranslationModule, an LMModule or their Hugging Face model, got "
                        f"{type(model).__name__}")
    if not model.frozen:
        raise ValueError("the base was fine-tuned with the heads: the heads alone do not fit the pretrained base "
                         "(keep the whole checkpoint)")
    hparams = getattr(module_or_model, "hparams", {})
    base = hparams.get("pretrained") or model.base.name_or_path
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().cpu().contiguous() for key, value in model.head.state_dict().items()}
    save_file(state, str(folder / HEADS_WEIGHTS), metadata={"format": "pt"})
    meta = {"k": model.k, "head_type": model.head_type, "head_hidden": model.head_hidden, "base": base,
            "model_type": model.base.config.model_type, "config_hash": config_hash(model),
            "base_fingerprint": base_fingerprint(model), "vocab_size": model.vocab_size,
            "dtype": str(head_dtype(model)).removeprefix("torch."), "lightning_bpd_version": __version__,
            "module": HEADS_MODULES[isinstance(model, HFCausalBlockwise)]}  # the class that re-attaches them
    for key in ("max_len_a", "max_len_b", "max_new_tokens"):
        if key in hparams:
            meta[key] = hparams[key]
    table = getattr(module_or_model, "rank_agreement", None)
    if table is not None:  # what decode --tree-nodes builds its tree from
        meta[tree_budget.KEY] = tree_budget.as_record(table)
    (folder / HEADS_JSON).write_text(json.dumps(meta, indent=2) + "\n")
    return folder
