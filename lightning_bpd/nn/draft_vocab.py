"""The draft vocabulary: the most frequent target tokens, the only ones the heads propose. Torch only.

Proposals only need an argmax, and verification (p_1 over the whole vocabulary) decides what is
accepted, so restricting the proposals to the N most frequent target tokens keeps exact decoding
exact: a token outside the list is never proposed, and a proposal that should have been such a
token is rejected as any wrong proposal is. What it saves is the vocabulary projection of every
proposal. On CPU a one-row projection streams the whole V x D matrix (8000 x 256: ~0.8 ms on these
cores, ~0.1 ms for 2000 rows), and chained heads make k - 1 of them one after the other. The idea
follows the frequency-ranked draft vocabularies of speculative decoding (e.g. FR-Spec, 2025).

The ids are kept in increasing order, so an argmax over the list breaks ties as an argmax over the
full vocabulary does (lowest id first).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn

from lightning_bpd.nn.argmax import argmax
from lightning_bpd.nn.products import FLOAT, Products


def ids_from_counts(counts: Tensor, size: int, always: Iterable[int] = ()) -> Tensor:
    """The ``size`` most frequent token ids of ``counts`` (V,), ``always`` included, in increasing order."""
    if not 1 <= size <= counts.numel():
        raise ValueError(f"draft vocabulary size must lie in [1, {counts.numel()}], got {size}")
    score = counts.double().clone()
    for i in always:
        score[i] = float("inf")
    return score.topk(size).indices.sort().values


def version(t: Tensor | None) -> int:
    """A tensor's in-place version counter, for keying what is made from it (-1: no tensor; 0: an inference
    tensor, which keeps none and cannot change outside inference mode)."""
    if t is None:
        return -1
    return 0 if t.is_inference() else t._version


class DraftVocabulary(nn.Module):
    """``size`` token ids (a buffer saved with the model) and argmaxes restricted to them."""

    products: Products = FLOAT  # how it multiplies (:mod:`~lightning_bpd.nn.products`)

    def __init__(self, vocab_size: int, size: int) -> None:
        super().__init__()
        if not 1 <= size <= vocab_size:
            raise ValueError(f"draft_vocab must lie in [1, {vocab_size}] (the target vocabulary), got {size}")
        self.vocab_size = vocab_size
        self.register_buffer("ids", torch.arange(size))  # (N,) increasing; set from data by set_ids
        self._rows: tuple[tuple[int, int, int], Tensor, Tensor | None] | None = None

    def set_ids(self, ids: Tensor) -> None:
        """Use these token ids (1-D, distinct, any order) as the draft vocabulary."""
        ids = torch.as_tensor(ids, dtype=torch.long).flatten().unique()  # sorted
        if ids.numel() != self.ids.numel() or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
            raise ValueError(f"need {self.ids.numel()} distinct token ids in [0, {self.vocab_size - 1}], "
                             f"got {ids.numel()} in [{int(ids.min())}, {int(ids.max())}]")
        self.ids.copy_(ids.to(self.ids.device))

    def rows(self, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The projection's rows (and bias) of the draft tokens, cached until either changes."""
        key = (version(weight), version(self.ids), weight.data_ptr())
        if self._rows is None or self._rows[0] != key:
            self._rows = (key, weight[self.ids], None if bias is None else bias[self.ids])
        return self._rows[1], self._rows[2]

    def logits(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """Logits (..., N) of the draft tokens only, for states h (..., D) under ``weight`` (V, D)."""
        return self.products.linear(h, *self.rows(weight, bias))

    def argmax(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """Token ids (...) of the most likely draft token of states h (..., D) under ``weight`` (V, D)."""
        return self.ids[argmax(self.logits(h, weight, bias))]

    def restrict(self, logits: Tensor) -> Tensor:
        """Full-vocabulary logits (..., V) with every token outside the list at -inf (the reference's view)."""
        keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
        keep[self.ids] = True
        return logits.masked_fill(~keep, float("-inf"))
