"""Blockwise heads on a pretrained Hugging Face causal language model, or on our own decoder-only base: the
LightningModule.

:class:`LMModule` trains the heads of an :class:`~lightning_bpd.hf.causal.HFCausalBlockwise` (a local
``AutoModelForCausalLM`` checkpoint, ``pretrained``), or our own
:class:`~lightning_bpd.nn.causal_model.CausalTransformer` from scratch with its heads (``own``: its shape and a
tokenizer directory, :mod:`~lightning_bpd.tasks.lm.own_base`), with the shared blockwise training step
(:class:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule`) on packed sequences of text
(:class:`~lightning_bpd.tasks.lm.datamodule.LMDataModule`): a batch's ``src`` (B, T) are the inputs and ``tgt`` (B, T)
the next tokens, so the base's hidden state at t reads ``src[:, :t + 1]`` and head i predicts ``tgt[:, t + i]``.
The base is frozen by default (its states cached per sequence; only the heads train) or fine-tuned with them.

Text goes through the checkpoint's own tokenizer: ``encode_prompts(texts)`` (B, P) left-padded, ``detokenize(ids)``
the continuations, as ``tokenizer.batch_decode(generate(...)[:, P:], skip_special_tokens=True)`` gives them.
Validation decodes held-out prompts greedily and blockwise through :class:`~lightning_bpd.callbacks.decode_eval.
DecodeEval` (mean accepted block size, calls, agreement with greedy, chrF against the held-out continuation).
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import sacrebleu
import torch
from torch import Tensor

from lightning_bpd.decoding import Criterion, parse_criterion
from lightning_bpd.evaluation import EvalBatch
from lightning_bpd.hf.causal import HEAD_TYPES, load_causal
from lightning_bpd.hf.prompts import CausalLM, load_tokenizer
from lightning_bpd.nn.transformer import EncoderContext
from lightning_bpd.tasks.blockwise_module import MAX_K, BlockwiseModule, options_of
from lightning_bpd.tasks.lm.feature_store import open_store, store_batch, train_from_store
from lightning_bpd.tasks.lm.own_base import OwnBase, build_own, tokenizer_dir
from lightning_bpd.tasks.training_options import TrainingOptions

# An LM run's training defaults: the heads alone on the frozen base, every head each step, plain cross-entropy.
TRAINING = TrainingOptions(freeze_base=True, loss_mode="mean", warmup_steps=100, label_smoothing=0.0)


class LMModule(BlockwiseModule):
    """Blockwise heads on a pretrained Hugging Face causal LM, or on our own decoder-only base trained with them.

    Args:
        pretrained: a local checkpoint directory (``save_pretrained`` output with its tokenizer; never downloaded), or
            a ``.gguf`` file (dequantized once into a cached folder, :mod:`~lightning_bpd.hf.gguf_target`).
        own: instead of ``pretrained``, our own decoder-only base trained from scratch
            (:class:`~lightning_bpd.tasks.lm.own_base.OwnBase`: its shape and tokenizer directory), with
            ``training.freeze_base: false``; or frozen, warm-started from a run's checkpoint (``training.init_from``).
        k: number of heads (1 = the base alone, up to 16).
        head_type: ``paper``, ``chained`` (each head fed the token before it) or ``medusa`` (Medusa-1's residual
            blocks, exportable to vLLM's Medusa layout; Hugging Face bases only).
        head_hidden: the paper or chained head's hidden size (default: the base's).
        training: :class:`~lightning_bpd.tasks.training_options.TrainingOptions` (here ``freeze_base`` by default:
            the base's weights stay bit-identical, its dropout off).
        max_new_tokens: validation decodes continue each held-out prompt by at most this many tokens.
        feature_store: with a frozen Hugging Face base, a store of its last hidden states (``python -m lightning_bpd
            store``): the heads train on the store's sequences from the stored states toward the base's greedy next
            token after each prefix of the data (the store's labels), the base never running in a training step
            (validation still runs it).
    """

    def __init__(self, pretrained: str | None = None, k: int = 4, head_type: str = "chained",
                 head_hidden: int | None = None, training: TrainingOptions = TRAINING, max_new_tokens: int = 32,
                 own: OwnBase | None = None, feature_store: str | None = None) -> None:
        if (pretrained is None) == (own is None):
            raise ValueError("model.init_args: give pretrained (a local Hugging Face causal LM) or own (our own base's "
                             "shape), one of them")
        if not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise ValueError(f"model.k must lie in [1, {MAX_K}] (1 = the base model), got {k!r}")
        if head_type not in HEAD_TYPES:
            raise ValueError(f"model.head_type must be one of {HEAD_TYPES}, got {head_type!r}")
        if max_new_tokens < 1:
            raise ValueError(f"model.max_new_tokens must be >= 1, got {max_new_tokens}")
        _, training = options_of(None, training)
        for name in ("input_noise", "train_readout"):
            if getattr(training, name):
                raise ValueError(f"model.training.{name} is not supported on language models: leave it out")
        if own is not None:
            own = OwnBase.of(own)
            own = replace(own, tokenizer=tokenizer_dir(own))  # absolute; the caller's object is left as it was
            if training.freeze_base and training.init_from is None:
                raise ValueError("model.init_args.own: a frozen base needs training.init_from (a checkpoint of our own "
                                 "base, trained); to train it from scratch set model.init_args.training.freeze_base "
                                 "false")
            tokenizer = load_tokenizer(own.tokenizer)
            model = build_own(own, tokenizer, k, head_type, head_hidden)
        else:
            pretrained = os.path.abspath(os.fspath(pretrained))
            model = load_causal(pretrained, k=k, head_type=head_type, head_hidden=head_hidden,
                                frozen=training.freeze_base)
            tokenizer = load_tokenizer(pretrained)  # the tokenizer must be the model's own
        if feature_store is not None and (own is not None or not training.freeze_base):
            raise ValueError("model.feature_store: a store feeds heads on a frozen Hugging Face base (pretrained, "
                             "training.freeze_base true)")
        store = open_store(feature_store, model, tokenizer, last=True)
        lm = CausalLM(model, tokenizer)
        BlockwiseModule.__init__(self, None, training, model=model)
        self.save_options(pretrained=pretrained, k=k, head_type=head_type, head_hidden=head_hidden, training=training,
                          max_new_tokens=max_new_tokens, own=own,
                          feature_store=None if feature_store is None else os.path.abspath(feature_store))
        self.store = store
        self.lm, self.max_new_tokens = lm, max_new_tokens
        self.nll: list[float] = [0.0, 0.0]  # an evaluation's summed p_1 loss and target count (its perplexity)
        self.last_step: Any = None  # the last blockwise step's output
        self.train(self.training)  # load_causal hands the base in eval mode: a trained base needs its dropout

    @property
    def tokenizer(self) -> Any:
        """The checkpoint's own tokenizer (``AutoTokenizer``)."""
        return self.lm.tokenizer

    # ---- text in and out -------------------------------------------------------------------------------------
    def encode_prompts(self, prompts: list[str]) -> Tensor:
        """Prompts -> token ids (B, P) as the tokenizer makes them, left-padded with the model's pad id, on the
        model's device."""
        return self.lm.encode_prompts(prompts, device=self.device)

    def detokenize(self, outputs: list[list[int]]) -> list[str]:
        """Generated tokens (one list per row) -> the continuation texts, special tokens skipped."""
        return self.lm.detokenize(outputs)

    def draft_vocab_ids(self, lines: list[str], size: int) -> list[int]:
        """The ``size`` most frequent token ids of a text's ``lines`` (tokenized joined by newlines, in chunks of
        1,000 lines; the EOS ids always in): a draft vocabulary for :class:`~lightning_bpd.inference.InferenceOptions`
        (``--draft-vocab N --draft-vocab-from TEXT``; the trained model is not changed)."""
        from lightning_bpd.nn.draft_ids import ids_from_counts

        chunks = ["\n".join(lines[i : i + 1000]) + "\n" for i in range(0, len(lines), 1000)]
        rows = self.tokenizer(chunks, add_special_tokens=False)["input_ids"] if chunks else []
        ids = [i for row in rows for i in row]
        counts = torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=self.model.vocab_size)
        rules = getattr(self.model, "generation_rules", None)  # none on our own base
        always = (rules.eos_ids if rules is not None else ()) or [self.model.eos_id]
        return ids_from_counts(counts, size, always=[i for i in always if i is not None]).tolist()

    def max_decode_len(self, src: Tensor) -> int:
        """``max_new_tokens``, at most what the model's context leaves after the longest prompt of ``src`` (B, P)."""
        positions = self.model.n_positions
        if positions is None:
            return self.max_new_tokens
        longest = int((src != self.model.pad_id).sum(dim=1).max())
        room = positions - longest  # the last verify passes shrink to it (decoding.protocol.source_room)
        if room < 1:
            raise ValueError(f"a prompt of {longest} tokens leaves no room for new tokens in the model's context "
                             f"({positions} positions)")
        return min(self.max_new_tokens, room)

    # ---- checks and checkpoints ------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        """The base's generation config must be one the validation decodes can apply, and the data must be read with
        the checkpoint's own tokenizer. A frozen base in eval mode (on purpose) is not warned about
        (:meth:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule.hide_frozen_base_warning`)."""
        if self.model.generation_rules is not None:
            self.model.generation_rules.check()
        theirs = getattr(getattr(self.trainer, "datamodule", None), "tokenizer", None)
        if theirs is not None and (len(theirs), theirs.eos_token_id) != (len(self.tokenizer), self.tokenizer.eos_token_id):
            own = self.hparams.get("own")
            raise ValueError(f"the data's tokenizer ({len(theirs)} tokens) is not the model's own "
                             f"({len(self.tokenizer)}): leave data.init_args.tokenizer_path unset or set it to "
                             f"{own['tokenizer'] if own else self.hparams.pretrained}")
        self.hide_frozen_base_warning()  # last: a check that fails leaves no filter behind

    def setup(self, stage: str) -> None:
        """A training sequence must fit the model's context (checked before any step)."""
        super().setup(stage)
        if stage == "fit" and self.store is not None:
            train_from_store(self.store, getattr(self.trainer, "datamodule", None))
        seq_len = getattr(getattr(self.trainer, "datamodule", None), "seq_len", None)
        positions = self.model.n_positions
        if seq_len is not None and positions is not None and seq_len > positions:
            raise ValueError(f"data.seq_len {seq_len} is longer than the model's context ({positions} positions)")

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.hparams.pretrained is not None:
            checkpoint["hf_pretrained"] = self.hparams.pretrained

    @classmethod
    def from_heads(cls, heads_dir: str | os.PathLike, base: str | os.PathLike | None = None,
                   device: str | torch.device = "cpu") -> LMModule:
        """The heads saved by :func:`~lightning_bpd.tasks.translation.hf_module.save_heads` in ``heads_dir``
        re-attached to ``base`` (default: the directory named in ``heads.json``), in eval mode; ValueError if the
        base is not the one they were trained on."""
        from lightning_bpd.tasks.translation.hf_module import attach_heads, read_heads_meta

        folder, meta = Path(heads_dir), read_heads_meta(heads_dir)
        base_dir = os.fspath(base) if base is not None else meta["base"]
        module = cls(base_dir, k=meta["k"], head_type=meta["head_type"], head_hidden=meta["head_hidden"],
                     training=TRAINING, max_new_tokens=meta.get("max_new_tokens", 32))
        return attach_heads(module, folder, meta, base_dir).to(device).eval()

    # ---- training --------------------------------------------------------------------------------------------
    def decoder_states(self, src: Tensor, tgt_in: Tensor, tgt: Tensor, index: Tensor | None,
                       context: EncoderContext | None = None) -> Tensor:
        """The base's last hidden states (B, T, D) over the inputs ``src`` (B, T) (``tgt_in`` is not used: the
        inputs are the sequence itself); a frozen base's come from the per-sequence cache while training."""
        if self.store is not None and self.training:
            last = store_batch(self.store, src, index, last=True).last  # (B, T, D)
            return last.to(device=src.device, dtype=self.model.base.get_input_embeddings().weight.dtype)
        if self.frozen_states is None or index is None or not self.training:
            return self.model(src)
        lengths = torch.full_like(index, src.shape[1])  # (B,): every position (padding's targets are ignored)
        return self.frozen_states.hidden(index, lengths, src.shape[1], lambda rows: self.model(src[rows]))

    def blockwise_step(self, *args: Any, **kwargs: Any):
        """The shared step; its output is kept for :meth:`training_step`'s perplexity."""
        self.last_step = super().blockwise_step(*args, **kwargs)
        return self.last_step

    def model_padded(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """``tgt`` (B, T) with the model's pad id past each window's ``length`` real targets (B,): the loss ignores
        them, whatever id the data padded with (a model may pad with its EOS where the tokenizer has a pad token)."""
        if "length" not in batch:
            return batch
        past = torch.arange(batch["tgt"].shape[1], device=batch["tgt"].device) >= batch["length"][:, None]  # (B, T)
        return {**batch, "tgt": batch["tgt"].masked_fill(past, self.model.pad_id)}

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        """The shared step, and ``train/ppl`` where p_1 trains (a fine-tuned base; a frozen one's is the base's). With
        a feature store head i at position t learns the base's greedy choice after the data's first t + i tokens (the
        store's labels, teacher-forced as DFlash's and EAGLE-3's are), not the data's token there."""
        if self.store is not None:
            labels = store_batch(self.store, batch["src"], batch.get("index")).labels  # (B, T)
            batch = {**batch, "tgt": labels.to(batch["tgt"].device)}
        batch = self.model_padded(batch)
        loss = super().training_step(batch, batch_idx)
        if 1 in self.last_step.head_loss and self.options.label_smoothing == 0:
            self.log("train/ppl", torch.exp(self.last_step.head_loss[1]), batch_size=batch["src"].shape[0])
        return loss

    def ordinary_argmax(self, logits: Tensor) -> Tensor:
        """The argmax of p_1's ``logits`` (..., V) over the tokenizer's ordinary tokens (special ones left out)."""
        special = torch.tensor(sorted(set(self.tokenizer.all_special_ids)), dtype=torch.long, device=logits.device)
        return logits.index_fill(-1, special, float("-inf")).argmax(dim=-1)

    def eval_step(self, batch: dict[str, Tensor], prefix: str) -> None:
        """The loss of every head (plain cross-entropy), and p_1's summed loss for the perplexity."""
        batch = self.model_padded(batch)
        options, self.options = self.options, replace(self.options, label_smoothing=0.0)
        try:
            out = self.blockwise_step(batch["src"], batch["tgt"], list(range(self.model.k)))
        finally:
            self.options = options
        n = batch["src"].shape[0]
        self.log(f"{prefix}/loss", out.loss, prog_bar=True, batch_size=n, sync_dist=True)
        for i in out.head_loss:
            self.log(f"{prefix}/head{i}_loss", out.head_loss[i], batch_size=n, sync_dist=True)
            self.log(f"{prefix}/head{i}_acc", out.head_acc[i], batch_size=n, sync_dist=True)
        count = int((batch["tgt"] != self.model.pad_id).sum())
        self.nll = [self.nll[0] + float(out.head_loss[1]) * count, self.nll[1] + count]

    def log_perplexity(self, prefix: str) -> None:
        """``<prefix>/ppl``: exp of p_1's mean loss per target token over the evaluation (every rank's)."""
        total = torch.tensor(self.nll, dtype=torch.float64, device=self.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(total)
        self.nll = [0.0, 0.0]
        if total[1] > 0:
            self.log(f"{prefix}/ppl", math.exp(float(total[0] / total[1])), rank_zero_only=True)

    def on_validation_epoch_end(self) -> None:
        self.log_perplexity("val")

    def on_test_epoch_end(self) -> None:
        self.log_perplexity("test")

    # ---- DecodeEval hooks ------------------------------------------------------------------------------------
    def make_criterion(self, spec: str) -> Criterion:
        return parse_criterion(spec)

    def decode_eval_batches(self, stage: str, limit: int | None, batch_size: int) -> list[EvalBatch]:
        """Held-out prompts of the data module's ``stage`` split (the first ``limit``), batched."""
        prompts, references = self.trainer.datamodule.eval_prompts(stage, limit)
        pad = self.model.pad_id  # a held-out text may spell the pad token (e.g. an EOS used as pad): left out
        kept = [i for i, ids in enumerate(self.tokenizer(prompts)["input_ids"]) if pad not in ids] if prompts else []
        prompts, references = [prompts[i] for i in kept], [references[i] for i in kept]
        if not prompts:
            raise ValueError(f"the {stage} split has no held-out prompt (whole lines within data.prompt_tokens with "
                             "lines after them)")
        batches = []
        for start in range(0, len(prompts), batch_size):
            src = self.encode_prompts(prompts[start : start + batch_size])
            batches.append(EvalBatch(src, self.max_decode_len(src), references[start : start + batch_size],
                                     prompts[start : start + batch_size], list(range(start, start + src.shape[0]))))
        return batches

    def decode_eval_metrics(self, outputs: list[list[int]], batches: list[EvalBatch],
                            greedy: list[list[int]] | None = None) -> dict[str, float]:
        """chrF of the continuations against the held-out text after each prompt, and their mean length."""
        refs = [ref for b in batches for ref in b.references]
        hyps = self.detokenize(outputs)
        return {"chrf": sacrebleu.CHRF().corpus_score(hyps, [refs]).score,
                "new_tokens": sum(len(o) for o in outputs) / max(1, len(outputs))}

    def render_blocks(self, ids: list[int], blocks: list[int]) -> str:
        """The continuation with a bar between the blocks accepted at each iteration."""
        parts, start = [], 0
        for size in blocks:
            parts.append(self.tokenizer.decode(ids[start : start + size], skip_special_tokens=True))
            start += size
        return " | ".join(parts)

    def decode_eval_samples(self, outputs: dict[str, list[list[int]]], blocks: dict[str, list[list[int]]],
                            batches: list[EvalBatch], n: int) -> tuple[list[str], list[list[Any]]]:
        prompts = [s for b in batches for s in b.sources]
        refs = [r for b in batches for r in b.references]
        methods = [m for m in outputs if m != "greedy"]
        columns = ["prompt", "reference", "greedy", *methods, *[f"{m}_blocks" for m in methods]]
        rows = []
        for i in range(min(n, len(prompts))):
            row = [prompts[i], refs[i], *self.detokenize([outputs["greedy"][i], *[outputs[m][i] for m in methods]])]
            rows.append(row + [self.render_blocks(outputs[m][i], blocks[m][i]) for m in methods])
        return columns, rows
