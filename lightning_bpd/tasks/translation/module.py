"""English->German translation with a blockwise Transformer: the LightningModule.

The model's shape is its ``architecture`` and the two-stage recipe its ``training`` options, each overridable
from the command line (``--model.init_args.architecture.k=8 --model.init_args.training.freeze_base=true
--model.init_args.training.init_from=base.ckpt``). The SentencePiece model is stored inside every checkpoint;
:func:`lightning_bpd.load_model` restores both.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sacrebleu
import torch
from torch import Tensor

from lightning_bpd.decoding import Criterion, parse_criterion
from lightning_bpd.evaluation import EvalBatch, MethodRun, run_batch
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.draft_ids import ids_from_counts
from lightning_bpd.tasks.blockwise_module import BlockwiseModule, options_of, split_flat
from lightning_bpd.tasks.training_options import TrainingOptions
from lightning_bpd.tasks.translation.datamodule_utils import collate_pairs
from lightning_bpd.tasks.translation.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer


@dataclass
class TranslationConfig(ModelConfig):
    """A :class:`ModelConfig` with the translation model's defaults: one embedding table for both languages (their
    joint vocabulary). A config leaves the vocabulary sizes null: they are the data module's tokenizer's
    (``lightning_bpd/commands/cli.py`` links them)."""

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    share_embeddings: bool = True


ARCHITECTURE, TRAINING = TranslationConfig(), TrainingOptions()  # the defaults (BlockwiseModule copies the config)
# What the tokenizer fixes (tokenizer.py; a model of other ids would read its pieces wrongly), and no image options.
FIXED = {"pad_id": PAD_ID, "bos_id": BOS_ID, "eos_id": EOS_ID, "image": None}


class TranslationModule(BlockwiseModule):
    """Blockwise Transformer for translation.

    Args:
        architecture: the model (:class:`TranslationConfig`, a ModelConfig with shared embeddings by default; its
            vocabulary sizes and token ids are the tokenizer's, it has no image options). ``k``: number of heads (1 = base model, up
            to 16); ``head_hidden``: d_hidden of the blockwise head (default d_ff, as in the paper);
            ``identity_first``: p_1 bypasses the head layer (a frozen base then decodes exactly as before);
            ``head_type``: ``paper`` (the paper's parallel head), ``chained`` (head i also sees the token proposed
            for head i-1; Hydra-style) or ``chained_attn``; ``draft_vocab``: the heads propose only this many most
            frequent target tokens of the training data (set when fitting starts; exact decoding unchanged).
        training: the two-stage recipe and its optimization (:class:`~lightning_bpd.tasks.training_options.
            TrainingOptions`; ``freeze_base`` needs ``init_from``, a base trained with this run's tokenizer).
        max_len_a, max_len_b: decoding stops after ``a * source_length + b`` tokens.
    """

    def __init__(
        self,
        architecture: TranslationConfig = ARCHITECTURE,
        training: TrainingOptions = TRAINING,
        max_len_a: float = 1.5,
        max_len_b: int = 10,
    ) -> None:
        architecture, training = options_of(architecture, training)
        for key, value in FIXED.items():
            if getattr(architecture, key) != value:
                raise ValueError(f"model.architecture.{key} is {value!r} in translation (the tokenizer's), "
                                 f"got {getattr(architecture, key)!r}")
        super().__init__(architecture, training)
        self.save_options(architecture=architecture, training=training, max_len_a=max_len_a, max_len_b=max_len_b)
        self.max_len_a, self.max_len_b = max_len_a, max_len_b
        self._tokenizer: Tokenizer | None = None

    @classmethod
    def flat_init_args(cls, flat: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint's flat hyperparameters of before ``architecture``: one ``vocab_size`` for both languages,
        one embedding table (as they were trained)."""
        rest = split_flat(flat, ARCHITECTURE, TRAINING)
        vocab = rest.pop("vocab_size", 8000)
        rest["architecture"].update(src_vocab_size=vocab, tgt_vocab_size=vocab, share_embeddings=True)
        return rest

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
            self.set_draft_ids(counts, self.model.draft_vocab.ids.numel())

    def set_draft_ids(self, counts: Tensor, size: int) -> None:
        """The model's draft vocabulary: the ``size`` most frequent tokens of ``counts`` (V,) (EOS always)."""
        self.model.set_draft_ids(ids_from_counts(counts, size, always=[self.model.eos_id]))

    def draft_vocab_ids(self, lines: list[str], size: int) -> list[int]:
        """The ``size`` most frequent token ids of target-language ``lines`` (EOS always): a draft vocabulary for
        :class:`~lightning_bpd.inference.InferenceOptions` (the trained model is not changed)."""
        ids = torch.tensor([i for piece_ids in self.tokenizer.encode_batch(lines) for i in piece_ids], dtype=torch.long)
        counts = torch.bincount(ids, minlength=self.target_vocab_size)
        return ids_from_counts(counts, size, always=[self.model.eos_id]).tolist()

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
                f"model.training.init_from={path} was trained with another SentencePiece model than this run's data "
                f"(different pieces): leave data.init_args.tokenizer_path unset (a warm start then uses the "
                f"base's) or set --data.init_args.tokenizer_path={path}"
            )

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["tokenizer_proto"] = self.tokenizer.to_bytes()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
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
              model: Any = None, max_new_tokens: int | None = None) -> tuple[list[str], dict[str, float]]:
    """Translate raw sentences with ``method`` (a :class:`~lightning_bpd.decoding.methods.DecodeMethod`
    or any ``fn(model, src, max_len) -> DecodeResult``; greedy when None) on ``model`` (default: the module's;
    or a runtime of it, :func:`lightning_bpd.inference.build_runtime`); returns texts and decode stats.
    An empty (or blank) sentence translates to an empty line without being decoded. ``progress(n)``
    is called after each batch of n sentences. ``max_new_tokens``: the cap of every translation (default: the
    module's own, :meth:`max_decode_len`)."""
    from lightning_bpd.decoding import greedy_decode

    method = method if method is not None else greedy_decode
    texts, run = [""] * len(sentences), MethodRun()
    todo = [i for i, sentence in enumerate(sentences) if sentence.strip()]
    for start in range(0, len(todo), batch_size):
        idx = todo[start : start + batch_size]
        src = module.encode_sources([sentences[i] for i in idx])
        cap = module.max_decode_len(src) if max_new_tokens is None else max_new_tokens
        _, part = run_batch(method, module.model if model is None else model, EvalBatch(src, cap))
        run.merge(part)
        for i, text in zip(idx, module.detokenize(part.outputs)):
            texts[i] = text
        if progress is not None:
            progress(len(idx))
    return texts, {"sentences": len(sentences), "tokens": run.tokens, "iterations": run.iterations,
                   "mean_accepted_block_size": run.mean_accepted_block_size, "seconds": run.seconds}
