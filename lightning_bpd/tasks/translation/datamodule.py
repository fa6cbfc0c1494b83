"""Translation data: aligned plain-text files (or the built-in synthetic corpus) -> token batches.

Layout of ``root``: ``{prefix}.{src_lang}`` and ``{prefix}.{tgt_lang}`` (``.gz`` allowed) for each
split; several training prefixes are concatenated (WMT14: Europarl + Common Crawl + News Commentary).
With ``root: null`` the project's synthetic English->German-like corpus is generated (deterministic
by seed) into ``cache_dir``: smoke data, not a benchmark.

A joint SentencePiece model is trained on the training text (``vocab_size``) and stored under
``cache_dir``, keyed by the training files and settings; the LightningModule copies it into every
checkpoint, so ``decode`` and :func:`lightning_bpd.load_model` reuse exactly the same one.
"""

from __future__ import annotations

import hashlib
import json
import logging
from functools import cached_property, partial
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

from lightning_bpd.tasks import STAGE_SPLITS
from lightning_bpd.tasks.resumable import ResumableLoader
from lightning_bpd.tasks.translation.datamodule_utils import TokenBatchSampler, TokenPairDataset, collate_pairs
from lightning_bpd.tasks.translation.synthetic import write_corpus
from lightning_bpd.tasks.translation.text_files import file_sha256, read_parallel, resolve_split_files
from lightning_bpd.tasks.translation.tokenizer import Tokenizer

logger = logging.getLogger("lightning_bpd")


class TranslationDataModule(pl.LightningDataModule):
    """Parallel text -> (src, tgt) token batches under a token budget.

    Args:
        root: folder with the aligned files; ``None`` generates the synthetic corpus.
        src_lang, tgt_lang: file suffixes of the two sides.
        train_prefix: one prefix or a list of prefixes (concatenated) for training.
        val_prefix, test_prefix: prefixes of the validation and test files.
        vocab_size: SentencePiece vocabulary size (a soft limit on tiny corpora).
        tokenizer_type: ``unigram`` or ``bpe``.
        tokenizer_path: reuse this SentencePiece ``.model`` (or the one stored in a translation
            ``.ckpt``, e.g. the base a warm start begins from) instead of training one; ``hf:<dir>``: the
            tokenizer of a local Hugging Face checkpoint (its own ids; set from ``model.init_args.pretrained``
            when unset).
        max_words: drop training pairs with more whitespace words than this on either side.
        max_tokens: token budget of a training batch (padded positions).
        eval_max_tokens: token budget of a validation/test batch.
        synthetic_sizes: split sizes of the synthetic corpus (``root: null``).
        synthetic_zipf: word frequencies of the synthetic corpus: 0 = every word of the lexicon equally
            likely; s > 0 = Zipfian (weight 1 / rank ** s), as in real text (the default run uses 1.5).
        cache_dir: where the synthetic corpus and trained tokenizers are kept.
        seed: seed of the synthetic corpus and of batch shuffling.
        num_workers: DataLoader workers.
    """

    def __init__(
        self,
        root: str | None = None,
        src_lang: str = "en",
        tgt_lang: str = "de",
        train_prefix: str | list[str] = "train",
        val_prefix: str = "val",
        test_prefix: str = "test",
        vocab_size: int = 8000,
        tokenizer_type: str = "unigram",
        tokenizer_path: str | None = None,
        max_words: int = 100,
        max_tokens: int = 3000,
        eval_max_tokens: int = 6000,
        synthetic_sizes: dict[str, int] | None = None,
        synthetic_zipf: float = 0.0,
        cache_dir: str = "runs/cache",
        seed: int = 0,
        num_workers: int = 0,
    ) -> None:
        super().__init__()
        if vocab_size < 8:
            raise ValueError(f"data.vocab_size must be >= 8, got {vocab_size}")
        if tokenizer_type not in ("unigram", "bpe"):
            raise ValueError(f"data.tokenizer_type must be 'unigram' or 'bpe', got {tokenizer_type!r}")
        for name, value in (("max_tokens", max_tokens), ("eval_max_tokens", eval_max_tokens), ("max_words", max_words)):
            if value < 1:
                raise ValueError(f"data.{name} must be >= 1, got {value}")
        self.save_hyperparameters()
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.train_prefixes = [train_prefix] if isinstance(train_prefix, str) else list(train_prefix)
        self.val_prefix, self.test_prefix = val_prefix, test_prefix
        self.vocab_size_requested = vocab_size
        self.tokenizer_type, self.tokenizer_path = tokenizer_type, tokenizer_path
        self.max_words, self.max_tokens, self.eval_max_tokens = max_words, max_tokens, eval_max_tokens
        self.synthetic_sizes = synthetic_sizes or {"train": 20000, "val": 500, "test": 500}
        if not 0.0 <= synthetic_zipf <= 4.0:
            raise ValueError(f"data.synthetic_zipf must lie in [0, 4] (0 = uniform word choice), got {synthetic_zipf}")
        self.synthetic_zipf = synthetic_zipf
        self.cache_dir, self.seed, self.num_workers = Path(cache_dir), seed, num_workers
        self.root = Path(root) if root is not None else None
        self.texts: dict[str, tuple[list[str], list[str]]] = {}
        self.datasets: dict[str, TokenPairDataset] = {}

    # ---- files and tokenizer ---------------------------------------------------------------------
    @cached_property
    def data_root(self) -> Path:
        """The folder holding the split files (generating the synthetic corpus when ``root`` is null)."""
        if self.root is not None:
            if not self.root.is_dir():
                resolve_split_files(self.root, self.train_prefixes[0], self.src_lang, self.tgt_lang)  # raises with layout
            return self.root
        if (self.src_lang, self.tgt_lang) != ("en", "de"):
            raise ValueError("the synthetic corpus (data.root: null) is English->German: set src_lang=en, tgt_lang=de")
        name = f"synthetic-seed{self.seed}" + (f"-zipf{self.synthetic_zipf:g}" if self.synthetic_zipf else "")
        return write_corpus(self.cache_dir / name, seed=self.seed, sizes=self.synthetic_sizes, zipf=self.synthetic_zipf)

    def split_texts(self, split: str) -> tuple[list[str], list[str]]:
        """Raw (source, target) sentences of ``split`` (train / val / test), read once."""
        if split not in self.texts:
            prefixes = {"train": self.train_prefixes, "val": [self.val_prefix], "test": [self.test_prefix]}[split]
            src, tgt = [], []
            for prefix in prefixes:
                src_path, tgt_path = resolve_split_files(self.data_root, prefix, self.src_lang, self.tgt_lang)
                s, t, _ = read_parallel(src_path, tgt_path, self.max_words if split == "train" else None)
                src += s
                tgt += t
            if not src:
                raise ValueError(f"the {split} split under {self.data_root} has no usable sentence pairs")
            self.texts[split] = (src, tgt)
        return self.texts[split]

    def tokenizer_key(self) -> str:
        """Cache key of the tokenizer: the training files' contents (not their dates: a data folder
        mounted again must not retrain it) and the tokenizer settings."""
        files = [
            file_sha256(p)
            for prefix in self.train_prefixes
            for p in resolve_split_files(self.data_root, prefix, self.src_lang, self.tgt_lang)
        ]
        spec = json.dumps([files, self.vocab_size_requested, self.tokenizer_type, self.max_words], sort_keys=True)
        return hashlib.sha1(spec.encode()).hexdigest()[:12]

    @cached_property
    def tokenizer(self) -> Tokenizer:
        """The joint SentencePiece tokenizer: loaded from ``tokenizer_path``, the cache, or trained now; or a Hugging
        Face checkpoint's own (``tokenizer_path: hf:<dir>``, an :class:`HFTokenizer` with the same methods)."""
        if self.tokenizer_path is not None and str(self.tokenizer_path).startswith("hf:"):
            from lightning_bpd.tasks.translation.hf_tokenizer import HF_PREFIX, HFTokenizer

            return HFTokenizer.load(str(self.tokenizer_path).removeprefix(HF_PREFIX))  # type: ignore[return-value]
        if self.tokenizer_path is not None:
            return Tokenizer.load(self.tokenizer_path)
        prefix = self.cache_dir / "tokenizers" / f"spm-{self.tokenizer_key()}"
        if prefix.with_suffix(".model").is_file():
            return Tokenizer.load(prefix.with_suffix(".model"))
        src, tgt = self.split_texts("train")
        logger.info("training a %d-piece SentencePiece model on %d sentence pairs", self.vocab_size_requested, len(src))
        return Tokenizer.train(
            src + tgt, prefix, self.vocab_size_requested, model_type=self.tokenizer_type, seed=self.seed,
            input_sentence_size=2_000_000,
        )

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the (possibly freshly trained) tokenizer: linked into the model config."""
        return self.tokenizer.vocab_size

    # ---- Lightning hooks -------------------------------------------------------------------------
    def check_data(self, stage: str | None = "fit") -> None:
        """Fail now, with one line, if the data of ``stage`` (fit: train and val) is missing or unusable: no folder,
        no split files, files that are not UTF-8 or not aligned, or no sentence pairs. The CLI calls this before it
        builds the trainer, so that nothing (W&B, the run folder) is written first; the texts read are kept for
        :meth:`setup`."""
        for split in STAGE_SPLITS.get(stage or "fit", []):
            self.split_texts(split)

    def prepare_data(self) -> None:
        self.tokenizer  # noqa: B018 (train and cache it once, before any split is encoded)

    def dataset(self, split: str) -> TokenPairDataset:
        if split not in self.datasets:
            src, tgt = self.split_texts(split)
            tok = self.tokenizer
            self.datasets[split] = TokenPairDataset(tok.encode_batch(src), tok.encode_targets(tgt))
        return self.datasets[split]

    def setup(self, stage: str | None = None) -> None:
        for split in STAGE_SPLITS.get(stage or "fit", []):
            self.dataset(split)

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        """Training (``shuffle``): a :class:`ResumableLoader`, which a resumed run continues at the batch after the
        last one trained. No loader draws from torch's global RNG (the model's dropout does)."""
        ds = self.dataset(split)
        sampler = TokenBatchSampler(
            ds.src_lengths, ds.tgt_lengths, self.max_tokens if shuffle else self.eval_max_tokens,
            shuffle=shuffle, seed=self.seed, drop_uneven=False, split_examples=not shuffle,
        )
        collate = partial(collate_pairs, pad_id=self.tokenizer.pad_id, eos_id=self.tokenizer.eos_id)
        return (ResumableLoader if shuffle else DataLoader)(
            ds, batch_sampler=sampler, collate_fn=collate, num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0, generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)

    def eval_examples(self, split: str, limit: int | None) -> tuple[list[str], list[str], TokenPairDataset]:
        """The first ``limit`` (all when None) examples of a split: raw source, raw reference, tokens."""
        src, tgt = self.split_texts(split)
        n = len(src) if limit is None else min(limit, len(src))
        ds = self.dataset(split)
        return src[:n], tgt[:n], ds
