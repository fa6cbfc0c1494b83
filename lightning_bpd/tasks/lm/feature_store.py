"""A target-feature store: what drafters and heads learn from, computed once per frozen target and training data.

Training a drafter on a frozen target runs the target over every training sequence at every step; on a real model
that forward is nearly all of a step's cost. The store computes it once (:mod:`~lightning_bpd.tasks.lm.store_writer`,
``python -m lightning_bpd store``) and keeps, per training sequence (a window of
:class:`~lightning_bpd.tasks.lm.datamodule.PackedDataset`, keyed by its dataset ``index``):

* ``tokens`` (n, T) int32: the window itself (checked against the data at every read: a store of other data or another
  tokenizer is refused);
* ``labels`` (n, T) int32: the target's greedy next token at every position, from its float logits (never from the
  rounded states);
* ``features`` (n, T, A, H) in 16 bits: the outputs of the stored decoder layers (``hidden_states[i + 1]``);
* ``last`` (n, T, H) in 16 bits: the last hidden state (after the final norm), what heads and EAGLE-3's targets read.

Layout of a store folder: ``store.json`` (the target's and tokenizer's fingerprints, the data, the layers, the dtype,
the chosen sequences and the shards) and ``shard-00000.pt`` ... (``shard_size`` sequences each, written whole and
renamed, so a stopped run resumes at the first missing shard). Shards are read memory-mapped: a training batch touches
only its rows.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FORMAT = "lightning_bpd.feature_store/1"
META = "store.json"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def shard_name(i: int) -> str:
    return f"shard-{i:05d}.pt"


def target_fingerprint(model: Any) -> str:
    """A digest of a frozen target: its config (a Hugging Face causal LM's, or our own base's) and, for every
    parameter, its name, shape and first and last 4,096 values (a target with any retrained layer differs)."""
    h = hashlib.sha256()
    base = getattr(model, "base", None)
    config = getattr(base, "config", None) if base is not None else getattr(model, "config", None)
    if config is not None:
        fields = config.to_dict() if hasattr(config, "to_dict") else dict(vars(config))
        kept = {k: v for k, v in fields.items() if k not in ("_name_or_path", "transformers_version", "torch_dtype",
                                                             "dtype", "architectures")}
        h.update(json.dumps(kept, sort_keys=True, default=str).encode())
    module = base if base is not None else model
    for name, p in sorted(module.state_dict().items()):
        flat = p.detach().reshape(-1).float().cpu()
        h.update(f"{name}{tuple(p.shape)}".encode())
        h.update(torch.cat([flat[:4096], flat[-4096:]]).numpy().tobytes())
    return h.hexdigest()[:16]


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of a tokenizer: its vocabulary (token -> id) and its special ids."""
    h = hashlib.sha256()
    vocab = tokenizer.get_vocab()
    h.update(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode())
    h.update(json.dumps([tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]).encode())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class StoreRows:
    """One batch's rows of a store: tokens (B, T), labels (B, T) long, features (B, T, A*H) of the asked layers and
    the last hidden states (B, T, H), in the store's 16-bit dtype."""

    tokens: Tensor
    labels: Tensor
    features: Tensor | None
    last: Tensor | None


class FeatureStore:
    """A finished store folder, read memory-mapped (:func:`open_store` checks it against a target)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        meta_path = self.path / META
        if not meta_path.is_file():
            raise ValueError(f"{self.path}: no feature store there (no {META}; make one with python -m lightning_bpd "
                             "store)")
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{meta_path}: not a readable feature store ({type(err).__name__})") from None
        if meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path}: not a feature store of this version ({meta.get('format')!r}, "
                             f"want {FORMAT!r})")
        self.meta = meta
        missing = [i for i in range(meta["n_shards"]) if not (self.path / shard_name(i)).is_file()]
        if missing:
            raise ValueError(f"{self.path}: the store is unfinished ({len(missing)} of {meta['n_shards']} shards "
                             "missing): run the same store command again to complete it")
        self.layers: tuple[int, ...] = tuple(meta["layers"])
        self.shard_size = int(meta["shard_size"])
        self.indices: list[int] = list(meta["indices"])
        self.row_of = {index: r for r, index in enumerate(self.indices)}
        self.shards: dict[int, dict[str, Tensor]] = {}

    @property
    def seq_len(self) -> int:
        return int(self.meta["data"]["seq_len"])

    def describe(self) -> str:
        return (f"{self.path} ({len(self.indices)} sequences of {self.seq_len} tokens, layers {list(self.layers)}"
                f"{' + the last hidden state' if self.meta['last_hidden'] else ''}, {self.meta['dtype']})")

    def check(self, target: Any, tokenizer: Any, layers: Sequence[int] = (), last: bool = False,
              what: str = "model.feature_store") -> None:
        """ValueError (one line) unless this store was made by ``target`` with ``tokenizer`` and holds ``layers``
        (and the last hidden state when ``last``)."""
        meta = self.meta
        if meta["target"]["fingerprint"] != target_fingerprint(target):
            raise ValueError(f"{what}: {self.path} was made by another target ({meta['target']['path']}, "
                             f"{meta['target']['fingerprint']}): make a store of this one")
        if meta["tokenizer"]["fingerprint"] != tokenizer_fingerprint(tokenizer):
            raise ValueError(f"{what}: {self.path} was made with another tokenizer: make a store with the target's own")
        absent = [int(i) for i in layers if int(i) not in self.layers]
        if absent:
            raise ValueError(f"{what}: {self.path} holds layers {list(self.layers)}, not {absent} that this model "
                             f"reads: set its target_layer_ids within them, or make a store with --layers "
                             f"{','.join(str(i) for i in sorted(set(self.layers) | set(absent)))}")
        if last and not meta["last_hidden"]:
            raise ValueError(f"{what}: {self.path} holds no last hidden state, which this model reads: make it "
                             "without --no-last")

    def check_windows(self, dataset: Any, what: str = "model.feature_store") -> None:
        """ValueError (one line) unless every stored sequence is the window of ``dataset`` (a PackedDataset) at its
        index: same seq_len, same tokens (another data folder, split or tokenizer fails here)."""
        if int(dataset.seq_len) != self.seq_len:
            raise ValueError(f"{what}: {self.path} holds sequences of {self.seq_len} tokens, the data's are "
                             f"{dataset.seq_len}: set data.init_args.seq_len={self.seq_len}")
        n = len(dataset)
        for s in range(self.meta["n_shards"]):
            shard = self.shard(s)
            for index, tokens in zip(shard["index"].tolist(), shard["tokens"]):
                if index >= n or not torch.equal(dataset[index]["src"], tokens.long()):
                    raise ValueError(f"{what}: {self.path} was made from other data (its sequence {index} is not the "
                                     f"data's; store data: {self.meta['data']['root']}): give the data it was made "
                                     "from, or make a store of this data")

    def shard(self, s: int) -> dict[str, Tensor]:
        if s not in self.shards:
            path = self.path / shard_name(s)
            try:
                self.shards[s] = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
            except Exception as err:  # noqa: BLE001 (a truncated or foreign file: say so once)
                raise ValueError(f"{path}: a corrupt store shard ({type(err).__name__}): delete it and run the store "
                                 "command again") from None
        return self.shards[s]

    def rows(self, index: Tensor, layers: Sequence[int] = (), last: bool = False) -> StoreRows:
        """The stored rows of the dataset indices ``index`` (B,): features of ``layers`` (in that order, concatenated)
        and the last hidden states when ``last``; ValueError for an index the store does not hold."""
        picks = [self.layers.index(int(i)) for i in layers]
        tokens, labels, feats, lasts = [], [], [], []
        for i in index.tolist():
            r = self.row_of.get(int(i))
            if r is None:
                raise ValueError(f"{self.path}: training sequence {i} is not in the store (it holds "
                                 f"{len(self.indices)}): train on the store's sequences only")
            shard = self.shard(r // self.shard_size)
            j = r % self.shard_size
            tokens.append(shard["tokens"][j])
            labels.append(shard["labels"][j])
            if picks:
                feats.append(shard["features"][j][:, picks].flatten(1))  # (T, A*H)
            if last:
                lasts.append(shard["last"][j])  # (T, H)
        return StoreRows(torch.stack(tokens).long(), torch.stack(labels).long(),
                         torch.stack(feats) if feats else None, torch.stack(lasts) if lasts else None)


def open_store(path: str | os.PathLike | None, target: Any, tokenizer: Any, layers: Sequence[int] = (),
               last: bool = False, what: str = "model.feature_store") -> FeatureStore | None:
    """The store at ``path`` checked against ``target``, ``tokenizer`` and what the model reads (None for None)."""
    if path is None:
        return None
    store = FeatureStore(path)
    store.check(target, tokenizer, layers, last, what)
    return store


def store_batch(store: FeatureStore, src: Tensor, index: Tensor | None, layers: Sequence[int] = (),
                last: bool = False) -> StoreRows:
    """The store's rows of a training batch ``src`` (B, T) (its dataset ``index`` (B,)), whose tokens must be the
    batch's."""
    if index is None:
        raise ValueError("model.feature_store: the training batches carry no index: train with LMDataModule")
    rows = store.rows(index, layers, last)
    if not torch.equal(rows.tokens, src.cpu()):
        raise ValueError(f"model.feature_store: {store.path} holds other tokens for training sequences "
                         f"{index.tolist()[:4]}: give the data and seq_len it was made from")
    return rows


def train_from_store(store: FeatureStore, datamodule: Any, what: str = "model.feature_store") -> None:
    """Point ``datamodule``'s training at the store's windows, after checking they are its data's."""
    if datamodule is None or not hasattr(datamodule, "train_on"):
        raise ValueError(f"{what}: a feature store trains with LMDataModule (the data it was made from)")
    store.check_windows(datamodule.dataset("train"), what)
    datamodule.train_on(store.indices)


__all__ = ["DTYPES", "FORMAT", "META", "FeatureStore", "StoreRows", "open_store", "shard_name", "store_batch",
           "target_fingerprint", "tokenizer_fingerprint", "train_from_store"]
