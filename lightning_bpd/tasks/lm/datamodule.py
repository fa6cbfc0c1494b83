"""Language-modelling data: a folder of UTF-8 text or source files -> packed token sequences and held-out prompts.

Each split's files (:mod:`lightning_bpd.tasks.lm.files`) are tokenized with the base's own tokenizer (``AutoTokenizer``
of ``tokenizer_path``, the checkpoint directory: the CLI sets it from ``model.init_args.pretrained``), each file as
the tokenizer makes it (its own BOS included) followed by its EOS, concatenated in file order and cut into windows of
``seq_len + 1`` tokens that overlap by one: ``src`` (B, seq_len) the inputs, ``tgt`` (B, seq_len) the next tokens (every
token after the first is a target once; the last window is padded with the pad id, which the loss ignores).

Validation decodes held-out prompts (:meth:`LMDataModule.eval_prompts`): line-aligned windows of the held-out files,
each up to ``prompt_tokens`` tokens of whole lines, with the lines after it as the reference continuation.
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_bpd.tasks import STAGE_SPLITS
from lightning_bpd.tasks.eval_sampler import UnrepeatedSampler
from lightning_bpd.tasks.lm.files import SplitTexts, read_split, split_files
from lightning_bpd.tasks.lm.line_windows import line_spans
from lightning_bpd.tasks.resumable import ResumableLoader, ShuffledSampler

HF_PREFIX = "hf:"


class PackedDataset(Dataset):
    """Windows of one token stream: item i is ``{"src": stream[i L : i L + L], "tgt": stream[i L + 1 : i L + L + 1],
    "index": i, "length": its real targets}`` (L = ``seq_len``), the last padded with ``pad_id``."""

    def __init__(self, stream: list[int], seq_len: int, pad_id: int) -> None:
        n = max(1, -(-(len(stream) - 1) // seq_len))  # windows covering every target
        tokens = torch.full((n * seq_len + 1,), pad_id, dtype=torch.long)
        tokens[: len(stream)] = torch.tensor(stream, dtype=torch.long)
        self.tokens, self.seq_len, self.n, self.targets = tokens, seq_len, n, len(stream) - 1

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        start = i * self.seq_len
        window = self.tokens[start : start + self.seq_len + 1]  # (L + 1,)
        length = max(0, min(self.seq_len, self.targets - start))  # real targets (the model's pad marks the rest)
        return {"src": window[:-1], "tgt": window[1:], "index": i, "length": length}


class Windows(Dataset):
    """The windows ``indices`` of a :class:`PackedDataset`, each keeping its own ``index`` (a feature store's)."""

    def __init__(self, dataset: PackedDataset, indices: list[int]) -> None:
        self.dataset, self.indices, self.seq_len = dataset, list(indices), dataset.seq_len

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.dataset[self.indices[i]]


class LMDataModule(pl.LightningDataModule):
    """A folder of text or source files -> packed (src, tgt) batches and held-out prompts.

    Args:
        root: the data folder (``train/``, ``val/``, ``test/`` folders are the splits, else a fixed hash split).
        tokenizer_path: the checkpoint directory whose tokenizer reads the data (``hf:<dir>`` or ``<dir>``; set from
            ``model.init_args.pretrained`` when null).
        seq_len: tokens per training sequence (at most the model's context).
        batch_size, eval_batch_size: sequences per training / evaluation batch.
        val_fraction, test_fraction: the hash split's shares of the files (without split folders).
        suffixes: only files with these suffixes (e.g. ``[.py]``); null: every file.
        prompt_tokens: at most this many tokens (whole lines) per held-out prompt.
        reference_lines: lines after a prompt kept as its reference continuation.
        seed: of the training order.
        num_workers: DataLoader workers.
    """

    def __init__(self, root: str | None = None, tokenizer_path: str | None = None, seq_len: int = 256,
                 batch_size: int = 8, eval_batch_size: int = 16, val_fraction: float = 0.05,
                 test_fraction: float = 0.05, suffixes: list[str] | None = None, prompt_tokens: int = 64,
                 reference_lines: int = 4, seed: int = 0, num_workers: int = 0) -> None:
        super().__init__()
        if root is None:
            raise ValueError("data.init_args.root: give a folder of UTF-8 text or source files")
        for name, value in (("seq_len", seq_len), ("batch_size", batch_size), ("eval_batch_size", eval_batch_size),
                            ("prompt_tokens", prompt_tokens), ("reference_lines", reference_lines)):
            if value < 1:
                raise ValueError(f"data.{name} must be >= 1, got {value}")
        if not (0 <= val_fraction and 0 <= test_fraction and val_fraction + test_fraction < 1):
            raise ValueError(f"data.val_fraction and data.test_fraction must be >= 0 with a sum < 1, got "
                             f"{val_fraction} and {test_fraction}")
        self.save_hyperparameters()
        self.root, self.tokenizer_path = Path(root), tokenizer_path
        self.seq_len, self.batch_size, self.eval_batch_size = seq_len, batch_size, eval_batch_size
        self.fractions = (val_fraction, test_fraction)
        self.suffixes = tuple(suffixes) if suffixes else None
        self.prompt_tokens, self.reference_lines = prompt_tokens, reference_lines
        self.seed, self.num_workers = seed, num_workers
        self.texts: dict[str, SplitTexts] = {}
        self.datasets: dict[str, PackedDataset] = {}
        self.train_windows: list[int] | None = None  # train on these windows only (a feature store's)
        self.tokenizer_error: str | None = None  # why the tokenizer failed to load: said again, not tried again

    def __str__(self) -> str:
        """The folder, tokenizer and window length. Lightning's own string builds every dataloader: the whole data
        tokenized to print a line (jsonargparse prints it for a link it skips), and a failed tokenizer tried once per
        loader."""
        return f"{type(self).__name__}(root={self.root}, tokenizer_path={self.tokenizer_path}, seq_len={self.seq_len})"

    # ---- files and tokenizer ---------------------------------------------------------------------------------
    @cached_property
    def files(self) -> dict[str, list[Path]]:
        return split_files(self.root, *self.fractions, self.suffixes)

    def split_texts(self, split: str) -> SplitTexts:
        """The readable files of ``split`` (train / val / test), read once."""
        if split not in self.texts:
            self.texts[split] = read_split(self.root, split, self.files[split])
        return self.texts[split]

    @cached_property
    def tokenizer(self) -> Any:
        """The checkpoint's own tokenizer (``AutoTokenizer``)."""
        if self.tokenizer_path is None:
            raise ValueError("data.init_args.tokenizer_path: give the checkpoint directory whose tokenizer reads the "
                             "data (the CLI sets it from model.init_args.pretrained)")
        from lightning_bpd.hf.gguf_target import resolve_pretrained
        from lightning_bpd.hf.prompts import load_tokenizer

        if self.tokenizer_error is not None:
            raise ValueError(self.tokenizer_error)
        try:
            path = resolve_pretrained(os.fspath(self.tokenizer_path).removeprefix(HF_PREFIX))  # a .gguf: its folder
            if not os.path.isdir(path):
                raise ValueError(f"data.tokenizer_path: {path} is not a directory (a local checkpoint with its "
                                 "tokenizer) nor a .gguf file")
            return load_tokenizer(path)
        except ValueError as err:
            self.tokenizer_error = str(err)
            raise

    @property
    def pad_id(self) -> int:
        """The tokenizer's pad id, else its EOS id (as the model pads with)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if pad is None:
            raise ValueError(f"{self.tokenizer_path}: the tokenizer has neither a pad nor an EOS token")
        return int(pad)

    def stream(self, split: str) -> list[int]:
        """The split's files tokenized (each as the tokenizer makes it, then its EOS), concatenated."""
        tok, texts = self.tokenizer, self.split_texts(split).texts
        eos = tok.eos_token_id
        out: list[int] = []
        for ids in tok(texts, add_special_tokens=True)["input_ids"] if texts else []:
            out += list(ids) + ([eos] if eos is not None and (not ids or ids[-1] != eos) else [])
        return out

    # ---- Lightning hooks -------------------------------------------------------------------------------------
    def check_data(self, stage: str | None = "fit") -> None:
        """Fail now, with one line, where the data of ``stage`` is missing or unusable (the CLI calls this before it
        builds the trainer)."""
        for split in STAGE_SPLITS.get(stage or "fit", []):
            self.split_texts(split)

    def dataset(self, split: str) -> PackedDataset:
        if split not in self.datasets:
            self.datasets[split] = PackedDataset(self.stream(split), self.seq_len, self.pad_id)
        return self.datasets[split]

    def train_on(self, indices: list[int]) -> None:
        """Train on the windows ``indices`` of the training split only (those a feature store holds)."""
        self.train_windows = list(indices)

    def setup(self, stage: str | None = None) -> None:
        for split in STAGE_SPLITS.get(stage or "fit", []):
            self.dataset(split)

    def loader(self, split: str, shuffle: bool) -> DataLoader:
        """Training: a new order per epoch from ``seed`` in a :class:`ResumableLoader`; evaluation: every sequence
        once over all ranks."""
        ds = self.dataset(split)
        if split == "train" and self.train_windows is not None:
            ds = Windows(ds, self.train_windows)
        sampler = ShuffledSampler(len(ds), self.seed) if shuffle else UnrepeatedSampler(len(ds))
        return (ResumableLoader if shuffle else DataLoader)(
            ds, batch_size=self.batch_size if shuffle else self.eval_batch_size, sampler=sampler,
            num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.seed))

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self.loader("test", shuffle=False)

    # ---- held-out prompts ------------------------------------------------------------------------------------
    def eval_prompts(self, split: str, limit: int | None) -> tuple[list[str], list[str]]:
        """The first ``limit`` (all when None) held-out prompts of ``split`` and their reference continuations."""
        prompts: list[str] = []
        references: list[str] = []
        for text in self.split_texts(split).texts:
            for prompt, reference in self.windows(text):
                if limit is not None and len(prompts) >= limit:
                    return prompts, references
                prompts.append(prompt)
                references.append(reference)
        return prompts, references

    def windows(self, text: str) -> list[tuple[str, str]]:
        """Line-aligned (prompt, reference) windows of one file: whole lines up to ``prompt_tokens`` tokens (the
        tokenizer's own leading tokens counted), then the next ``reference_lines`` lines; the next window starts
        after them. Blank prompts and prompts with nothing after them are left out."""
        lines = text.splitlines(keepends=True)
        if not lines:
            return []
        counts = [len(ids) for ids in self.tokenizer(lines, add_special_tokens=False)["input_ids"]]
        budget = self.prompt_tokens - len(self.tokenizer("", add_special_tokens=True)["input_ids"])
        out = []
        for start, end in line_spans(counts, budget, gap=self.reference_lines):
            prompt, reference = "".join(lines[start:end]), "".join(lines[end : end + self.reference_lines])
            if prompt.strip() and reference.strip():
                out.append((prompt, reference))
        return out
