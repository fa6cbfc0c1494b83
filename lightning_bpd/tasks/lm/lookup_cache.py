"""A retrieval datastore (:mod:`lightning_bpd.tasks.lm.datastore`) as llama.cpp's n-gram lookup cache: the file that
``llama-lookup`` and ``llama-server --spec-type ngram-cache`` read with ``--lookup-cache-dynamic`` (``-lcd``), so that
llama.cpp drafts from the target's own greedy continuations and its training text, as our retrieval proposer does.

The format is llama.cpp's ``common_ngram_cache_save`` (``common/ngram-cache.cpp``), little-endian int32 throughout:
one record per n-gram, its :data:`NGRAM_MAX` token ids (-1 past the n-gram's end: ``LLAMA_TOKEN_NULL``), the number of
distinct tokens seen after it, then each such token and its count. llama.cpp reads every n-gram of 1 to 4 tokens of
the cache and drafts, per position, the token after the longest n-gram ending the text whose counts pass its strict
thresholds (:data:`STRICT_SAMPLES`, :data:`STRICT_PERCENT`: at least that many observations, and the most seen token
at least that share of them); an n-gram that cannot pass them is never drafted from, so :func:`lookup_counts` leaves it
out (its file holds only what llama.cpp can use). The greedy continuations can weigh more than the text
(``greedy_weight``: each of their observations counts that many times).

Unlike our retrieval proposer (a tree of continuations, verified in one pass), llama.cpp drafts one chain.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

__all__ = ["NGRAM_MAX", "STRICT_PERCENT", "STRICT_SAMPLES", "LookupCounts", "draftable", "export_lookup_cache",
           "lookup_counts", "read_lookup_cache", "reference_counts", "write_lookup_cache"]

NGRAM_MAX = 4  # LLAMA_NGRAM_MAX: the tokens of a record's key
INT32_MAX = 2**31 - 1  # a record's counts are int32
STRICT_SAMPLES = (4, 3, 2, 2)  # draft_min_sample_size_strict: observations an n-gram of 1..4 tokens needs
STRICT_PERCENT = (75, 66, 66, 66)  # draft_min_percent_strict: the share (%) its most seen next token needs


def draftable(n: int, counts: list[int]) -> bool:
    """Whether llama.cpp can draft from an n-gram of ``n`` tokens whose next tokens were seen ``counts`` times (its
    strict thresholds: enough observations, and one token seen at least the share)."""
    total = sum(counts)
    return total >= STRICT_SAMPLES[n - 1] and 100 * max(counts) >= STRICT_PERCENT[n - 1] * total


@dataclass(frozen=True)
class LookupCounts:
    """The n-grams of ``n`` tokens of a cache: ``keys`` (m, n), and for each its next tokens, flattened: ``starts``
    (m + 1,) offsets into ``tokens`` (t,) and ``counts`` (t,)."""

    n: int
    keys: np.ndarray
    starts: np.ndarray
    tokens: np.ndarray
    counts: np.ndarray

    def as_dict(self) -> dict[tuple[int, ...], dict[int, int]]:
        return {tuple(int(t) for t in key): {int(t): int(c) for t, c in zip(self.tokens[a:b], self.counts[a:b])}
                for key, a, b in zip(self.keys, self.starts[:-1], self.starts[1:])}


def lookup_counts(parts: list[tuple[np.ndarray, int]], n: int, prune: bool = True) -> LookupCounts:
    """The n-grams of ``n`` tokens over the token streams of ``parts`` ((L,) ids, the weight of each observation) and
    the weighted counts of the token after each; with ``prune``, only those llama.cpp can draft from
    (:func:`draftable`). Keys in ascending order, next tokens ascending within a key."""
    if not 1 <= n <= NGRAM_MAX:
        raise ValueError(f"llama.cpp's lookup cache holds n-grams of 1 to {NGRAM_MAX} tokens, got {n}")
    rows, weights = [], []
    for stream, weight in parts:
        stream = np.asarray(stream, dtype=np.int64)
        if len(stream) > n:
            rows.append(np.lib.stride_tricks.sliding_window_view(stream, n + 1))  # (L - n, n + 1): n-gram, next
            weights.append(np.full(len(stream) - n, weight, dtype=np.int64))
    if not rows:
        empty = np.zeros((0, n), dtype=np.int64)
        return LookupCounts(n, empty, np.zeros(1, dtype=np.int64), empty[:, 0], empty[:, 0])
    grams, inverse = np.unique(np.concatenate(rows), axis=0, return_inverse=True)  # (u, n + 1)
    counts = np.bincount(inverse.ravel(), weights=np.concatenate(weights), minlength=len(grams)).astype(np.int64)
    new_key = np.ones(len(grams), dtype=bool)
    new_key[1:] = (grams[1:, :n] != grams[:-1, :n]).any(axis=1)
    starts = np.append(np.flatnonzero(new_key), len(grams))  # (m + 1,)
    keep = np.ones(len(starts) - 1, dtype=bool)
    if prune:
        total = np.add.reduceat(counts, starts[:-1])
        most = np.maximum.reduceat(counts, starts[:-1])
        keep = (total >= STRICT_SAMPLES[n - 1]) & (100 * most >= STRICT_PERCENT[n - 1] * total)
    spans = np.diff(starts)[keep]
    take = np.repeat(starts[:-1][keep], spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
    return LookupCounts(n, grams[starts[:-1][keep], :n], np.append(0, np.cumsum(spans)), grams[take, n], counts[take])


def reference_counts(parts: list[tuple[list[int], int]], n: int, prune: bool = True) -> dict[tuple[int, ...],
                                                                                           dict[int, int]]:
    """:func:`lookup_counts` written plainly (the reference its test compares with)."""
    table: dict[tuple[int, ...], dict[int, int]] = {}
    for stream, weight in parts:
        for i in range(len(stream) - n):
            after = table.setdefault(tuple(stream[i : i + n]), {})
            after[stream[i + n]] = after.get(stream[i + n], 0) + weight
    return {k: v for k, v in table.items() if not prune or draftable(n, list(v.values()))}


def write_lookup_cache(path: str | os.PathLike, tables: list[LookupCounts]) -> Path:
    """``tables`` in llama.cpp's lookup-cache format at ``path`` (a temporary file first, then renamed)."""
    out = Path(path)
    largest = max((int(t.counts.max()) for t in tables if len(t.counts)), default=0)
    if largest > INT32_MAX:
        raise ValueError(f"a count of {largest:,} does not fit llama.cpp's 32-bit counts: give a smaller --greedy-weight")
    tmp = out.with_name(out.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            write_records(f, tables)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return out


def write_records(f: BinaryIO, tables: list[LookupCounts]) -> None:
    """Each table's records, as :func:`write_lookup_cache` lays them out, into the open file ``f``."""
    for t in tables:
        if not len(t.keys):
            continue
        spans = np.diff(t.starts)  # (m,)
        head = np.full((len(t.keys), NGRAM_MAX + 1), -1, dtype="<i4")
        head[:, : t.n], head[:, NGRAM_MAX] = t.keys, spans
        pairs = np.stack([t.tokens, t.counts], axis=1).astype("<i4")  # (t, 2)
        # one buffer: each key's header, then its pairs
        record = np.zeros(len(t.keys) * (NGRAM_MAX + 1) + 2 * len(pairs), dtype="<i4")
        at = np.arange(len(t.keys)) * (NGRAM_MAX + 1) + 2 * t.starts[:-1]  # where each record begins
        record[at[:, None] + np.arange(NGRAM_MAX + 1)] = head
        pair_at = np.repeat(at + NGRAM_MAX + 1, spans) + 2 * (np.arange(len(pairs)) - np.repeat(t.starts[:-1], spans))
        record[pair_at[:, None] + np.arange(2)] = pairs
        f.write(record.tobytes())


def read_lookup_cache(path: str | os.PathLike) -> dict[tuple[int, ...], dict[int, int]]:
    """A lookup-cache file read back record by record (as llama.cpp's ``common_ngram_cache_load`` does): n-gram (its
    -1 padding dropped) -> next token -> count; ValueError (one line) for a truncated file."""
    data = np.fromfile(path, dtype="<i4")
    out: dict[tuple[int, ...], dict[int, int]] = {}
    i = 0
    while i < len(data):
        if i + NGRAM_MAX + 1 > len(data):
            raise ValueError(f"{os.fspath(path)}: a truncated lookup cache (a record's header is cut off)")
        key, m = tuple(int(t) for t in data[i : i + NGRAM_MAX] if t != -1), int(data[i + NGRAM_MAX])
        i += NGRAM_MAX + 1
        if m < 1 or i + 2 * m > len(data):
            raise ValueError(f"{os.fspath(path)}: a truncated or corrupt lookup cache (a record of {m} tokens)")
        out[key] = {int(t): int(c) for t, c in data[i : i + 2 * m].reshape(m, 2)}
        i += 2 * m
    return out


def export_lookup_cache(datastore: str | os.PathLike, out: str | os.PathLike, greedy_weight: int = 1,
                        tokenizer: object = None) -> dict[str, object]:
    """The datastore file ``datastore`` as llama.cpp's lookup cache at ``out``: the n-grams of 1 to 4 tokens llama.cpp
    can draft from (the greedy continuations' observations weighing ``greedy_weight`` each); what it wrote (a record
    for the bench and the command)."""
    from lightning_bpd.tasks.lm.datastore import checked_record

    if isinstance(greedy_weight, bool) or not isinstance(greedy_weight, int) or greedy_weight < 1:
        raise ValueError(f"--greedy-weight must be an integer >= 1, got {greedy_weight!r}")
    target = Path(out)
    if target.is_dir():
        raise ValueError(f"--out {os.fspath(out)} is a folder: give the lookup cache's file path")
    if target.exists() and Path(datastore).exists() and target.samefile(datastore):
        raise ValueError(f"--out {os.fspath(out)} is the datastore itself: give another file")
    record = checked_record(datastore, tokenizer)
    tokens = record["tokens"].to(torch.int64).numpy()
    text = int(record["data"].get("text_tokens", len(tokens)))
    parts = [(tokens[:text], 1), (tokens[text:], greedy_weight)]
    tables = [lookup_counts(parts, n) for n in range(1, NGRAM_MAX + 1)]
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    path = write_lookup_cache(out, tables)
    return {"datastore": os.fspath(datastore), "lookup_cache": os.fspath(path), "bytes": path.stat().st_size,
            "tokens": len(tokens), "greedy_tokens": len(tokens) - text, "greedy_weight": greedy_weight,
            "ngrams": {str(t.n): len(t.keys) for t in tables},
            "kept": "the n-grams of 1 to 4 tokens llama.cpp can draft from (its strict thresholds)"}
