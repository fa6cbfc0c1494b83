"""Joint (source + target) SentencePiece tokenizer with the project's fixed special ids.

Special ids: pad=0, bos=1, eos=2, unk=3. ``encode`` never adds BOS/EOS; the collate function appends EOS.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import sentencepiece as spm

__all__ = ["BOS_ID", "EOS_ID", "PAD_ID", "UNK_ID", "Tokenizer"]

logger = logging.getLogger("lightning_bpd")

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3


def _clean_sentences(texts: Iterable[str]) -> Iterator[str]:
    """Yield non-empty, single-line sentences (sentencepiece treats each item as one sentence)."""
    for text in texts:
        text = " ".join(text.split())
        if text:
            yield text


class Tokenizer:
    """Thin wrapper around a ``sentencepiece.SentencePieceProcessor`` with fixed special ids."""

    pad_id: int = PAD_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    unk_id: int = UNK_ID

    def __init__(self, processor: spm.SentencePieceProcessor, model_path: str | Path | None = None) -> None:
        expected = {"pad": PAD_ID, "bos": BOS_ID, "eos": EOS_ID, "unk": UNK_ID}
        actual = {
            "pad": processor.pad_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
            "unk": processor.unk_id(),
        }
        if actual != expected:
            raise ValueError(
                f"SentencePiece model {model_path or ''} has special ids {actual}, but this project requires "
                f"{expected}. Retrain it with Tokenizer.train (pad_id=0, bos_id=1, eos_id=2, unk_id=3)."
            )
        self._sp = processor
        self.model_path: Path | None = Path(model_path) if model_path is not None else None

    # ------------------------------------------------------------------ construction
    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load a trained ``*.model`` file, or the tokenizer stored in a translation ``*.ckpt``."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(
                f"SentencePiece model not found: '{path}'. Train one with Tokenizer.train(...) (or let the "
                f"data module build it) or fix the tokenizer path in the config."
            )
        if path.suffix == ".ckpt":
            import torch

            ckpt = torch.load(path, map_location="cpu", weights_only=False)
            if not isinstance(ckpt, dict) or "tokenizer_proto" not in ckpt:
                raise ValueError(f"checkpoint '{path}' holds no tokenizer (not a translation run's checkpoint)")
            return cls.from_bytes(ckpt["tokenizer_proto"])
        processor = spm.SentencePieceProcessor()
        try:
            processor.Load(model_file=str(path))
        except (OSError, RuntimeError) as e:
            raise ValueError(f"'{path}' is not a valid SentencePiece model: {e}") from e
        return cls(processor, path)

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        model_prefix: str | Path,
        vocab_size: int,
        model_type: Literal["unigram", "bpe"] = "unigram",
        character_coverage: float = 1.0,
        seed: int = 0,
        input_sentence_size: int = 0,
        num_threads: int = 1,
    ) -> Tokenizer:
        """Train a joint SentencePiece model from in-memory sentences; writes ``{model_prefix}.model``/``.vocab``.

        ``vocab_size`` is a soft limit (``hard_vocab_limit=False``): a corpus too small to support it yields a
        smaller vocabulary and a warning instead of a sentencepiece error. ``input_sentence_size > 0`` subsamples
        that many sentences (shuffled with ``seed``). Training is deterministic for the same inputs and arguments.
        """
        if model_type not in ("unigram", "bpe"):
            raise ValueError(f"model_type must be 'unigram' or 'bpe', got {model_type!r}")
        if vocab_size <= 4:
            raise ValueError(f"vocab_size must be > 4 (4 special ids are reserved), got {vocab_size}")
        prefix = Path(model_prefix)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        spm.set_random_generator_seed(seed)
        try:
            spm.SentencePieceTrainer.train(
                sentence_iterator=_clean_sentences(texts),
                model_prefix=str(prefix),
                vocab_size=vocab_size,
                model_type=model_type,
                character_coverage=character_coverage,
                hard_vocab_limit=False,
                pad_id=PAD_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                unk_id=UNK_ID,
                input_sentence_size=input_sentence_size,
                shuffle_input_sentence=input_sentence_size > 0,
                num_threads=num_threads,
                minloglevel=2,
            )
        except RuntimeError as e:
            raise RuntimeError(
                f"SentencePiece training failed for '{prefix}.model' (vocab_size={vocab_size}, "
                f"model_type={model_type}): {e}"
            ) from e
        tok = cls.load(f"{prefix}.model")
        if tok.vocab_size < vocab_size:
            logger.warning(
                "SentencePiece corpus too small for vocab_size=%d: trained vocabulary has %d pieces ('%s.model')",
                vocab_size,
                tok.vocab_size,
                prefix,
            )
        return tok

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model (stored inside checkpoints)."""
        return self._sp.serialized_model_proto()

    def segments_like(self, other: Tokenizer) -> bool:
        """Same pieces, scores and normalization: both map every text to the same ids.

        The serialized models of two identical trainings still differ in their training record (the
        output file name), so that part is left out of the comparison.
        """
        from sentencepiece import sentencepiece_model_pb2

        def essential(tok: Tokenizer) -> bytes:
            proto = sentencepiece_model_pb2.ModelProto()
            proto.ParseFromString(tok.to_bytes())
            proto.ClearField("trainer_spec")
            return proto.SerializeToString(deterministic=True)

        return essential(self) == essential(other)

    @classmethod
    def from_bytes(cls, proto: bytes) -> Tokenizer:
        """A tokenizer from :meth:`to_bytes` output."""
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(proto)
        return cls(processor)

    # ------------------------------------------------------------------ pickling (dataloader workers)
    def __getstate__(self) -> dict[str, Any]:
        return {"proto": self._sp.serialized_model_proto(), "model_path": self.model_path}

    def __setstate__(self, state: dict[str, Any]) -> None:
        processor = spm.SentencePieceProcessor()
        processor.LoadFromSerializedProto(state["proto"])
        self._sp = processor
        self.model_path = state["model_path"]

    # ------------------------------------------------------------------ API
    @property
    def vocab_size(self) -> int:
        """Number of pieces, special ids included (size of the embedding table)."""
        return int(self._sp.GetPieceSize())

    def encode(self, text: str) -> list[int]:
        """Encode one sentence to piece ids, without BOS/EOS."""
        return list(self._sp.EncodeAsIds(text))

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode many sentences (no BOS/EOS)."""
        return [list(ids) for ids in self._sp.EncodeAsIds(list(texts))]

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Encode target sentences: :meth:`encode_batch` (one joint vocabulary)."""
        return self.encode_batch(texts)

    def decode(self, ids: Iterable[int]) -> str:
        """Decode ids to text: stops at the first EOS and ignores PAD/BOS (accepts lists or 1-D tensors)."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            kept.append(i)
        return self._sp.DecodeIds(kept)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        """Decode each row of a batch with :meth:`decode`."""
        return [self.decode(ids) for ids in batch]

    def id_to_piece(self, idx: int) -> str:
        """The piece string of one id."""
        return self._sp.IdToPiece(int(idx))

    def __len__(self) -> int:
        return self.vocab_size

    def __repr__(self) -> str:
        return f"Tokenizer(model_path={str(self.model_path)!r}, vocab_size={self.vocab_size})"
