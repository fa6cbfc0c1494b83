"""A retrieval datastore on disk: a target's training text as its own tokenizer reads it, one token stream, for the
retrieval proposer (:class:`~lightning_bpd.decoding.proposers.retrieval.Retrieval`).

The file (``torch.save`` of plain types, read with ``weights_only``) holds ``format``, ``tokenizer`` (the fingerprint
and size of the tokenizer that made it, :func:`~lightning_bpd.tasks.lm.feature_store.tokenizer_fingerprint`),
``data`` (the folder, split and suffixes it read), ``tokens`` (L,) int32: the split's files as :meth:`LMDataModule.
stream` makes them (each file's tokens, then EOS), then, where asked (``datastore --greedy N``), the target's own
greedy continuations of N prompts of the split, each after its prompt (:func:`greedy_tokens`: what the model itself
writes after such text, the continuations its greedy decoding will accept). The n-gram index is built when it is loaded (a few seconds for
three million tokens), so the file is 4 bytes a token.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from lightning_bpd.decoding.proposers.retrieval import ORDERS, Datastore

FORMAT = "lightning_bpd.datastore/1"


def save_datastore(path: str | os.PathLike, tokens: list[int], tokenizer: Any, data: dict[str, Any]) -> Path:
    """Write the datastore of ``tokens`` (made by ``tokenizer`` from ``data``) to ``path`` (a temporary file first,
    then renamed: an interrupted write leaves no datastore behind)."""
    from lightning_bpd.tasks.lm.feature_store import tokenizer_fingerprint

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {"format": FORMAT, "tokenizer": {"fingerprint": tokenizer_fingerprint(tokenizer), "size": len(tokenizer)},
              "data": data, "tokens": torch.tensor(tokens, dtype=torch.int32)}
    tmp = out.with_name(out.name + ".tmp")
    torch.save(record, tmp)
    os.replace(tmp, out)
    return out


def greedy_tokens(module: Any, runtime: Any, prompts: list[str], max_new_tokens: int, batch_size: int,
                  progress: Any = None) -> list[int]:
    """The target's own greedy continuations of ``prompts`` (``module``: an LM task module, for its tokenizer;
    ``runtime``: its model or a runtime of it), each as the prompt's tokens, at most ``max_new_tokens`` new tokens
    and EOS, concatenated; ``progress(done, total)`` after each batch of ``batch_size`` prompts."""
    from lightning_bpd.decoding import greedy_decode

    eos = module.tokenizer.eos_token_id
    out: list[int] = []
    for start in range(0, len(prompts), batch_size):
        batch = prompts[start : start + batch_size]
        lengths = [module.encode_prompts([p]).shape[1] for p in batch]  # each prompt's own tokens
        src = module.encode_prompts(batch)  # (B, P), left-padded
        result = greedy_decode(runtime, src, max_new_tokens)
        for row, n, continuation in zip(src.tolist(), lengths, result.sequences()):
            out += row[len(row) - n :] + list(continuation) + ([eos] if eos is not None else [])
        if progress is not None:
            progress(min(start + batch_size, len(prompts)), len(prompts))
    return out


def read_record(path: str | os.PathLike) -> dict[str, Any]:
    """The datastore file's record; ValueError (one line) for a missing, unreadable or foreign file."""
    where = os.fspath(path)
    if not os.path.isfile(where):
        raise ValueError(f"{where}: no such datastore file (make one: python -m lightning_bpd datastore --pretrained "
                         "MODEL --data-root DIR --out FILE)")
    try:
        record = torch.load(where, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - a truncated or foreign file: one line
        raise ValueError(f"{where}: not a readable datastore ({type(err).__name__}); make it again with python -m "
                         "lightning_bpd datastore") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{where}: not a datastore of this package (format {FORMAT} expected)")
    return record


def load_datastores(path: str | os.PathLike, tokenizer: Any = None,
                    orders: tuple[int, ...] = ORDERS) -> tuple[Datastore, Datastore | None]:
    """The datastore file at ``path`` as the retrieval proposer reads it: its text and its greedy continuations (None
    where it holds none), each indexed for ``orders``; with ``tokenizer`` (the target's), ValueError (one line) where
    another tokenizer made it."""
    record = checked_record(path, tokenizer)
    tokens, text = record["tokens"], int(record["data"].get("text_tokens", record["tokens"].numel()))
    greedy = Datastore.of(tokens[text:], orders) if text < tokens.numel() else None
    return Datastore.of(tokens[:text], orders), greedy


def checked_record(path: str | os.PathLike, tokenizer: Any = None) -> dict[str, Any]:
    """:func:`read_record`, checked against ``tokenizer`` where one is given."""
    record = read_record(path)
    if tokenizer is not None:
        from lightning_bpd.tasks.lm.feature_store import tokenizer_fingerprint

        made = record["tokenizer"]["fingerprint"]
        if made != tokenizer_fingerprint(tokenizer):
            raise ValueError(f"{os.fspath(path)}: a datastore of another tokenizer ({made}); make one with this "
                             "target's: python -m lightning_bpd datastore --pretrained MODEL ...")
    return record
