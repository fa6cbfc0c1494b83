"""English->German translation with a blockwise Transformer: the LightningModule.

Model shape and the two-stage recipe are flat arguments so the CLI can override them
(``--model.k=8 --model.freeze_base=true --model.init_from=base.ckpt``). The SentencePiece model
is stored inside every checkpoint; :func:`lightning_bpd.load_model` restores both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sacrebleu
import torch
from torch import Tensor

from lightning_bpd.decoding import Criterion, parse_criterion
from lightning_bpd.evaluation import EvalBatch, MethodRun, run_batch
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.draft_vocab import ids_from_counts
from lightning_bpd.tasks.blockwise_module import BlockwiseModule
from lightning_bpd.tasks.translation.datamodule_utils import collate_pairs
from lightning_bpd.tasks.translation.tokenizer import Tokenizer


class TranslationModule(BlockwiseModule):
    """Blockwise Transformer for translation.

    Args:
        vocab_size: joint vocabulary size (linked from the data module's tokenizer).
        d_model, n_heads, n_encoder_layers, n_decoder_layers, d_ff, dropout: Transformer shape.
        k: number of heads (1 = base model, up to 16).
        head_hidden: d_hidden of the blockwise head (its hidden layer has k * head_hidden units);
            defaults to d_ff as in the paper.
        identity_first: p_1 bypasses the head layer (a frozen base then decodes exactly as before).
        loss_mode: ``random`` (one head per minibatch) or ``mean``.
        freeze_base: train only the head (needs ``init_from``).
        init_from: checkpoint whose non-head weights initialize this model.
        lr, warmup_steps, label_smoothing, weight_decay: optimization (inverse-sqrt schedule).
        max_len_a, max_len_b: decoding stops after ``a * source_length + b`` tokens.
        seed: seed of the per-minibatch head choice.
        loss_fraction: share of target positions at which the training loss is evaluated (1.0 = all,
            the paper; less trades gradient noise for cheaper vocabulary projections on CPU).
        head1_weight: when fine-tuning, p_1's loss is kept in every minibatch with this weight
            (``w * L_1 + (1 - w) * mean of the other heads``); 0 = the paper's loss.
        head_type: ``paper`` (the paper's parallel head, the default) or ``chained`` (head i also sees
            the token proposed for head i-1; Hydra-style, beyond the paper).
        head_loss_decay: head i (1-based) weighs ``head_loss_decay ** (i - 1)`` in the loss (Medusa-2's
            decaying head weights; in random mode the trained head is drawn with these odds); 1 = equal.
        base_lr_scale: when fine-tuning, the base's learning rate is ``lr * base_lr_scale`` (the heads
            keep ``lr``): Medusa-2's joint schedule after a frozen warm-up of the heads.
        frozen_cache_gb: with a frozen base, keep up to this many GiB of its decoder states per
            training example (computed once, no dropout) so that a head step skips the base; 0 = off.
        draft_vocab: the heads propose only the this many most frequent target tokens of the training
            data (set when fitting starts; cheaper proposals, exact decoding unchanged); null = all.
        head_targets: ``data`` (default): heads 2..k train towards the data; ``own``: towards the model's own
            greedy choice at each position given the teacher-forced prefix (argmax of p_1, taken from the same
            decoder pass while training): self-distilled targets on the fly, without a ``distill`` run.
        detach_heads: when training the base and the heads together, keep heads 2..k's losses out of the base:
            ``states``: the decoder learns from p_1's loss alone (the shared output layer from every head's);
            ``base``: no base weight learns from them; ``none`` (default): the paper's joint training. Pairs
            with ``head_targets: own`` (the base keeps learning the data while the heads follow its choices).
    """

    def __init__(
        self,
        vocab_size: int = 8000,
        d_model: int = 256,
        n_heads: int = 4,
        n_encoder_layers: int = 3,
        n_decoder_layers: int = 3,
        d_ff: int = 1024,
        dropout: float = 0.1,
        k: int = 1,
        head_hidden: int | None = None,
        identity_first: bool = False,
        loss_mode: str = "random",
        freeze_base: bool = False,
        init_from: str | None = None,
        lr: float = 1e-3,
        warmup_steps: int = 1000,
        label_smoothing: float = 0.1,
        weight_decay: float = 0.0,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
        seed: int = 0,
        loss_fraction: float = 1.0,
        head1_weight: float = 0.0,
        head_type: str = "paper",
        head_loss_decay: float = 1.0,
        base_lr_scale: float = 1.0,
        frozen_cache_gb: float = 4.0,
        draft_vocab: int | None = None,
        head_targets: str = "data",
        detach_heads: str = "none",
    ) -> None:
        config = ModelConfig(
            src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=d_model, n_heads=n_heads,
            n_encoder_layers=n_encoder_layers, n_decoder_layers=n_decoder_layers, d_ff=d_ff, dropout=dropout, k=k,
            head_hidden=head_hidden, identity_first=identity_first, head_type=head_type, draft_vocab=draft_vocab,
            share_embeddings=True,
        )
        super().__init__(config, loss_mode, freeze_base, init_from, lr, warmup_steps, label_smoothing, weight_decay,
                         seed, loss_fraction, head1_weight, head_loss_decay, base_lr_scale, frozen_cache_gb,
                         head_targets=head_targets, detach_heads=detach_heads)
        self.save_hyperparameters()
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self._tokenizer: Tokenizer | None = None

    # ---- tokenizer ---------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        """The data module's tokenizer while training, else the one stored in the checkpoint."""
        if self._tokenizer is None:
            dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
            if dm is None or not hasattr(dm, "tokenizer"):
                raise RuntimeError("no tokenizer: attach a TranslationDataModule or load a checkpoint")
            self._tokenizer = dm.tokenizer
        return self._tokenizer

    @tokenizer.setter
    def tokenizer(self, tok: Tokenizer) -> None:
        self._tokenizer = tok

    def on_fit_start(self) -> None:
        if self.tokenizer.vocab_size != self.model.config.tgt_vocab_size:
            raise ValueError(
                f"tokenizer has {self.tokenizer.vocab_size} pieces but the model was built for "
                f"{self.model.config.tgt_vocab_size}: use the tokenizer the base checkpoint was trained with "
                "(data.tokenizer_path) or the same data.vocab_size"
            )
        if self.model.draft_vocab is not None:  # the most frequent target tokens of this run's training data
            counts = self.trainer.datamodule.dataset("train").target_counts(self.model.config.tgt_vocab_size)
            self.use_draft_vocab(counts, self.model.draft_vocab.ids.numel())

    def use_draft_vocab(self, counts: Tensor, size: int) -> None:
        """Let the heads propose only the ``size`` most frequent tokens of ``counts`` (V,) (EOS always)."""
        self.model.use_draft_vocab(ids_from_counts(counts, size, always=[self.model.eos_id]))

    def draft_vocab_from_text(self, lines: list[str], size: int) -> None:
        """:meth:`use_draft_vocab` with the token counts of target-language ``lines``."""
        ids = torch.tensor([i for piece_ids in self.tokenizer.encode_batch(lines) for i in piece_ids], dtype=torch.long)
        self.use_draft_vocab(torch.bincount(ids, minlength=self.target_vocab_size), size)

    @property
    def target_vocab_size(self) -> int:
        """The size of the vocabulary the heads propose from."""
        return self.model.config.tgt_vocab_size

    def check_warm_start(self, path: str, checkpoint: dict[str, Any]) -> None:
        """The base must have been trained with this run's tokenizer: token ids index its embeddings."""
        theirs = checkpoint.get("tokenizer_proto")
        if theirs is None or (self._trainer is None and self._tokenizer is None):
            return  # an old checkpoint, or a warm start outside a Trainer with no data attached
        if not self.tokenizer.segments_like(Tokenizer.from_bytes(theirs)):
            raise ValueError(
                f"model.init_from={path} was trained with another SentencePiece model than this run's data "
                f"(different pieces): leave data.init_args.tokenizer_path unset (a warm start then uses the "
                f"base's) or set --data.init_args.tokenizer_path={path}"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["tokenizer_proto"] = self.tokenizer.to_bytes()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if "tokenizer_proto" in checkpoint:
            self._tokenizer = Tokenizer.from_bytes(checkpoint["tokenizer_proto"])

    # ---- decoding helpers --------------------------------------------------------------------------
    def max_decode_len(self, src: Tensor) -> int:
        longest = int((src != self.model.pad_id).sum(dim=1).max())
        return max(1, int(self.max_len_a * longest + self.max_len_b))

    def encode_sources(self, sentences: list[str]) -> Tensor:
        """Raw sentences -> (B, S) source tensor (with EOS, padded) on the model's device."""
        ids = self.tokenizer.encode_batch(sentences)
        batch = collate_pairs([(s, [], i) for i, s in enumerate(ids)], self.model.pad_id, self.model.eos_id)
        return batch["src"].to(self.device)

    def detokenize(self, outputs: list[list[int]]) -> list[str]:
        return [self.tokenizer.decode(ids) for ids in outputs]

    # ---- DecodeEval hooks --------------------------------------------------------------------------
    def make_criterion(self, spec: str) -> Criterion:
        return parse_criterion(spec)

    def decode_eval_batches(self, stage: str, limit: int | None, batch_size: int) -> list[EvalBatch]:
        dm = self.trainer.datamodule
        sources, references, _ = dm.eval_examples(stage, limit)
        batches = []
        for start in range(0, len(sources), batch_size):
            src = self.encode_sources(sources[start : start + batch_size])
            batches.append(EvalBatch(src, self.max_decode_len(src), references[start : start + batch_size],
                                     sources[start : start + batch_size], list(range(start, start + src.shape[0]))))
        return batches

    def decode_eval_metrics(
        self, outputs: list[list[int]], batches: list[EvalBatch], greedy: list[list[int]] | None = None
    ) -> dict[str, float]:
        refs = [ref for b in batches for ref in b.references]
        hyps = self.detokenize(outputs)
        bleu = sacrebleu.BLEU()
        score = bleu.corpus_score(hyps, [refs])
        self.quality_signature = str(bleu.get_signature())
        metrics = {"bleu": score.score, "chrf": sacrebleu.CHRF().corpus_score(hyps, [refs]).score}
        if greedy is not None:  # how far an approximate rule strays from greedy's own translations (100 = same)
            metrics["bleu_vs_greedy"] = sacrebleu.BLEU().corpus_score(hyps, [self.detokenize(greedy)]).score
        return metrics

    def render_blocks(self, ids: list[int], blocks: list[int]) -> str:
        """Subword pieces with a bar between the blocks accepted at each iteration."""
        parts, start = [], 0
        for size in blocks:
            pieces = [self.tokenizer.id_to_piece(i) for i in ids[start : start + size] if i != self.model.eos_id]
            parts.append("".join(pieces).replace("\u2581", " ").strip())
            start += size
        return " | ".join(p for p in parts if p)

    def decode_eval_samples(self, outputs: dict[str, list[list[int]]], blocks: dict[str, list[list[int]]],
                            batches: list[EvalBatch], n: int) -> tuple[list[str], list[list[Any]]]:
        sources = [s for b in batches for s in b.sources]
        refs = [r for b in batches for r in b.references]
        methods = [m for m in outputs if m != "greedy"]
        columns = ["source", "reference", "greedy"] + [f"{m}" for m in methods] + [f"{m}_blocks" for m in methods]
        rows = []
        for i in range(min(n, len(sources))):
            row = [sources[i], refs[i], self.tokenizer.decode(outputs["greedy"][i])]
            row += [self.tokenizer.decode(outputs[m][i]) for m in methods]
            row += [self.render_blocks(outputs[m][i], blocks[m][i]) for m in methods]
            rows.append(row)
        return columns, rows


def translate(module: TranslationModule, sentences: list[str], method: Callable | None = None,
              batch_size: int = 32, progress: Callable[[int], object] | None = None,
              model: Any = None) -> tuple[list[str], dict[str, float]]:
    """Translate raw sentences with ``method`` (a :class:`~lightning_bpd.decoding.methods.DecodeMethod`
    or any ``fn(model, src, max_len) -> DecodeResult``; greedy when None) on ``model`` (default: the module's;
    or a runtime of it, :func:`lightning_bpd.inference.build_runtime`); returns texts and decode stats.
    An empty (or blank) sentence translates to an empty line without being decoded. ``progress(n)``
    is called after each batch of n sentences."""
    from lightning_bpd.decoding import greedy_decode

    method = method if method is not None else greedy_decode
    texts, run = [""] * len(sentences), MethodRun()
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    for start in range(0, len(todo), batch_size):
        idx = todo[start : start + batch_size]
        src = module.encode_sources([sentences[i] for i in idx])
        _, part = run_batch(method, module.model if model is None else model, EvalBatch(src, module.max_decode_len(src)))
        run.merge(part)
        for i, text in zip(idx, module.detokenize(part.outputs)):
            texts[i] = text
        if progress is not None:
            progress(len(idx))
    return texts, {"sentences": len(sentences), "tokens": run.tokens, "iterations": run.iterations,
                   "mean_accepted_block_size": run.mean_accepted_block_size, "seconds": run.seconds}
