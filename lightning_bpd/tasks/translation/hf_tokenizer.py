"""A Hugging Face checkpoint's own tokenizer behind the interface of our SentencePiece :class:`Tokenizer`.

The translation data module and :class:`~lightning_bpd.tasks.translation.module.TranslationModule` take it in
place of the SentencePiece one (``data.tokenizer_path: hf:<dir>``). Ids are the checkpoint's own: ``encode``
returns what the HF tokenizer makes of a text (its own leading tokens included) without the final EOS, which
the collate function appends with the checkpoint's own EOS and pad ids, as the HF model expects; targets are
encoded with the tokenizer's target side (``text_target``, Marian's second SentencePiece model).
Imports transformers (only :mod:`lightning_bpd.tasks.translation` modules that need it load this one).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

__all__ = ["HF_PREFIX", "HFTokenizer"]

HF_PREFIX = "hf:"  # data.tokenizer_path: hf:<checkpoint dir>


class HFTokenizer:
    """``transformers.AutoTokenizer`` of a local checkpoint directory with the methods our data path calls."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, path: str | Path | None = None) -> None:
        if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
            raise ValueError(f"{path}: the tokenizer has no {'EOS' if tokenizer.eos_token_id is None else 'pad'} "
                             "token (a seq2seq checkpoint's tokenizer has both)")
        self.hf = tokenizer
        self.model_path: Path | None = Path(path) if path is not None else None
        self.pad_id: int = int(tokenizer.pad_token_id)
        self.eos_id: int = int(tokenizer.eos_token_id)
        self.bos_id: int | None = tokenizer.bos_token_id
        self.unk_id: int | None = tokenizer.unk_token_id
        self.special_ids: frozenset[int] = frozenset(int(i) for i in tokenizer.all_special_ids)

    @classmethod
    def load(cls, path: str | os.PathLike) -> HFTokenizer:
        """The tokenizer saved beside a local checkpoint (never downloaded); one-line ValueError if there is none."""
        path = os.fspath(path)
        if not os.path.isdir(path):
            raise ValueError(f"{path}: not a directory (a local Hugging Face checkpoint with its tokenizer is expected)")
        try:
            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"{path}: no tokenizer beside the checkpoint ({first[:200]})") from None
        if not isinstance(tokenizer, PreTrainedTokenizerBase):
            raise ValueError(f"{path}: no tokenizer beside the checkpoint")  # noqa: TRY004 (bad input, one line)
        return cls(tokenizer, path)

    # ---- the interface of Tokenizer ---------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return len(self.hf)

    def __len__(self) -> int:
        return self.vocab_size

    def strip_eos(self, ids: list[int]) -> list[int]:
        return ids[:-1] if ids and ids[-1] == self.eos_id else ids

    def encode(self, text: str) -> list[int]:
        """One source sentence -> ids without the final EOS (the collate function appends it)."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Source sentences -> ids without the final EOS."""
        if not texts:
            return []
        return [self.strip_eos(list(ids)) for ids in self.hf(list(texts))["input_ids"]]

    def encode_targets(self, texts: Sequence[str]) -> list[list[int]]:
        """Target sentences (training labels) -> ids without the final EOS, with the tokenizer's target side."""
        if not texts:
            return []
        return [self.strip_eos(list(ids)) for ids in self.hf(text_target=list(texts))["input_ids"]]

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text for sacrebleu: stops at the first EOS, special tokens left out."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if i == self.eos_id:
                break
            if i not in self.special_ids:
                kept.append(i)
        return self.hf.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False).strip()

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    def id_to_piece(self, idx: int) -> str:
        return str(self.hf.convert_ids_to_tokens(int(idx)))

    def __repr__(self) -> str:
        return f"HFTokenizer(model_path={str(self.model_path)!r}, vocab_size={self.vocab_size})"
