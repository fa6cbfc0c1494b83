"""A local Hugging Face checkpoint directory read with one clear line for what is wrong with it (never downloaded)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from transformers import AutoConfig

LOAD_ERRORS = (OSError, ValueError, KeyError)


def first_line(err: BaseException) -> str:
    """An exception's first line (its type's name when it has no message)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def read_config(path: str | os.PathLike, seq2seq: bool) -> Any:
    """The config of the checkpoint directory ``path``; a missing directory, something that is no checkpoint, or a
    checkpoint of the other kind (``seq2seq``: an encoder-decoder is wanted, else a causal LM) is one ValueError."""
    path = os.fspath(path)
    if not os.path.isdir(path):
        raise ValueError(f"{path}: not a directory (a local Hugging Face checkpoint is expected)")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except LOAD_ERRORS as err:
        raise ValueError(f"{path}: not a Hugging Face checkpoint ({first_line(err)})") from None
    if seq2seq and not getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{path}: a {config.model_type} checkpoint is decoder-only, not a seq2seq one: load it "
                         "with lightning_bpd.hf.load_causal")
    if not seq2seq and getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"{path}: a {config.model_type} checkpoint is an encoder-decoder (seq2seq) one, not a "
                         "causal LM: load it with lightning_bpd.hf.load_base")
    return config


def load_weights(path: str | os.PathLike, loader: Callable[..., Any], kind: str) -> Any:
    """``loader.from_pretrained(path)`` (local files only); a failure is one ValueError naming ``kind``."""
    try:
        return loader.from_pretrained(os.fspath(path), local_files_only=True)
    except LOAD_ERRORS as err:
        raise ValueError(f"{os.fspath(path)}: not a {kind} checkpoint ({first_line(err)})") from None
