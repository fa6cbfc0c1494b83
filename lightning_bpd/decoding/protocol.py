"""What the decoding core needs from a model, and what it returns. Torch only.

The decoding core knows nothing about tokenizers, images, Lightning or tasks: a model is anything
with this small interface (:class:`~lightning_bpd.nn.model.BlockwiseTransformer` is one; the
tests use hand-written stubs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from lightning_bpd.nn.argmax import argmax


class Context(Protocol):
    """Per-source state computed once (encoder output, cross-attention K/V)."""

    def select(self, rows: Tensor) -> Context: ...


class Cache(Protocol):
    """Decoder KV cache with a length per row (see :class:`~lightning_bpd.nn.kv_cache.KVCache`)."""

    lengths: Tensor

    def crop(self, lengths: Tensor, bounds: tuple[int, int] | None = None, check: bool = True) -> None: ...

    def select(self, rows: Tensor) -> None: ...


class BlockwiseModel(Protocol):
    """A model with k heads; ``k = 1`` is an ordinary autoregressive model."""

    k: int
    pad_id: int
    bos_id: int
    eos_id: int | None

    def encode(self, src: Tensor) -> Context: ...

    def new_cache(self, batch_size: int, capacity: int) -> Cache: ...

    def decode_step(self, tokens: Tensor, context: Context, cache: Cache) -> Tensor:
        """(B, T) new inputs -> (B, T, D) hidden states; appends T positions to the cache."""
        ...

    def decode_full(self, tgt_in: Tensor, context: Context) -> Tensor:
        """Uncached: (B, T) whole prefixes starting with BOS -> (B, T, D)."""
        ...

    def logits_first(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., V): p_1."""
        ...

    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None) -> Tensor:
        """(..., D) -> (..., len(heads), V): p_1..p_k (all by default)."""
        ...


class ChainedModel(BlockwiseModel, Protocol):
    """A model whose head i also sees the token proposed for head i-1 (``chained_heads = True``);
    :func:`~lightning_bpd.decoding.blockwise.propose` then calls :meth:`chain_step` k - 1 times."""

    chained_heads: bool

    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None, prev_tokens: Tensor | None = None) -> Tensor:
        """(..., D), prev_tokens (..., m) -> (..., len(heads), V): heads fed the given earlier proposals."""
        ...

    def chain_step(self, z: Tensor, token: Tensor, i: int) -> tuple[Tensor, Tensor]:
        """Head i's state (b, D) and logits (b, V) from head i-1's state z (b, D) and its token (b,)."""
        ...


@dataclass
class DecodeResult:
    """Output of a decoder. ``tokens`` (B, L) are padded with the pad id past ``lengths`` (B,);
    an EOS, when produced, is the last counted token of its row. ``iterations`` (B,) counts the
    decoding iterations of each row (one per token for greedy); ``model_calls`` counts batched
    decoder calls; ``block_sizes[b]`` lists the tokens row b accepted at each iteration."""

    tokens: Tensor
    lengths: Tensor
    iterations: Tensor
    model_calls: int
    block_sizes: list[list[int]] = field(default_factory=list)

    @property
    def mean_accepted_block_size(self) -> float:
        """Generated tokens per iteration over the whole batch (the paper's k-hat)."""
        return float(self.lengths.sum()) / max(1, int(self.iterations.sum()))

    def sequences(self) -> list[list[int]]:
        """Each row's tokens as a list, up to its length (EOS included when produced)."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths.tolist())]


def first_argmax(model: BlockwiseModel, h: Tensor) -> Tensor:
    """Greedy's next tokens (...) at hidden states h (..., D): ``model.argmax_first`` when the model has one
    (e.g. a screened argmax that needs no float32 logits), else the argmax of ``model.logits_first``."""
    own = getattr(model, "argmax_first", None)
    return own(h) if own is not None else argmax(model.logits_first(h))


def check_decode_args(model: BlockwiseModel, src: Tensor, max_len: int) -> None:
    """Raise ValueError, naming the argument and the allowed range, on unusable decode input."""
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    if src.dim() != 2 or src.shape[0] == 0 or src.shape[1] == 0:
        raise ValueError(f"src must be a non-empty (batch, length) tensor, got shape {tuple(src.shape)}")
    if not bool((src != model.pad_id).any(dim=1).all()):
        raise ValueError("src: every row needs at least one non-pad token (got an empty source)")


def pack_rows(rows: list[list[int]], pad_id: int, device: torch.device | None = None) -> Tensor:
    """Pad a list of token lists into a (B, L) long tensor (L >= 1)."""
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
