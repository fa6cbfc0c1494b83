"""A trained model's draft vocabulary as state: the token ids its heads may propose. Torch only.

A model built with ``ModelConfig.draft_vocab = N`` holds N token ids (:class:`DraftIds`, saved with it as
``draft_vocab.ids``), set at the start of training to the N most frequent tokens of its training targets
(:func:`ids_from_counts`). What proposing from them takes (the projection rows of the listed tokens, cached, and the
argmax over them in a runtime's products) is inference's: :mod:`lightning_bpd.inference.draft_vocab`, which a runtime
builds from these ids or from a list its options name. Here is only what the model itself offers with them: the
reference decoders' view of a proposing head's logits, every token outside the list at -inf (:func:`restrict`).

The ids are kept in increasing order, so an argmax over the list breaks ties as an argmax over the full vocabulary
does (lowest id first).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor, nn


def ids_from_counts(counts: Tensor, size: int, always: Iterable[int] = ()) -> Tensor:
    """The ``size`` most frequent token ids of ``counts`` (V,), ``always`` included, in increasing order."""
    if not 1 <= size <= counts.numel():
        raise ValueError(f"draft vocabulary size must lie in [1, {counts.numel()}], got {size}")
    score = counts.double().clone()
    for i in always:
        score[i] = float("inf")
    return score.topk(size).indices.sort().values


def checked_ids(ids: Tensor | Iterable[int], vocab_size: int, size: int | None = None) -> Tensor:
    """``ids`` (distinct token ids in [0, vocab_size), any order; ``size`` of them when given) as a 1-D long tensor
    in increasing order. Raises ValueError otherwise."""
    ids = torch.as_tensor(ids if isinstance(ids, Tensor) else list(ids), dtype=torch.long).flatten()
    if ids.numel() == 0:
        raise ValueError(f"a draft vocabulary needs at least one token id in [0, {vocab_size - 1}], got none")
    distinct = ids.unique()  # sorted
    want = ids.numel() if size is None else size
    if distinct.numel() != want or int(distinct[0]) < 0 or int(distinct[-1]) >= vocab_size:
        raise ValueError(f"need {want} distinct token ids in [0, {vocab_size - 1}], got {distinct.numel()} in "
                         f"[{int(distinct[0])}, {int(distinct[-1])}]")
    return distinct


class DraftIds(nn.Module):
    """``size`` token ids of a ``vocab_size``-token vocabulary, in increasing order: the ``ids`` buffer, saved with
    the model. Holds nothing else."""

    def __init__(self, vocab_size: int, size: int) -> None:
        super().__init__()
        if not 1 <= size <= vocab_size:
            raise ValueError(f"draft_vocab must lie in [1, {vocab_size}] (the target vocabulary), got {size}")
        self.vocab_size = vocab_size
        self.register_buffer("ids", torch.arange(size))  # (N,) increasing; set from data by set_ids

    def set_ids(self, ids: Tensor) -> None:
        """Hold these token ids (1-D, distinct, any order), in place."""
        self.ids.copy_(checked_ids(ids, self.vocab_size, self.ids.numel()).to(self.ids.device))


def restrict(logits: Tensor, ids: Tensor) -> Tensor:
    """Full-vocabulary logits (..., V) with every token outside ``ids`` at -inf (the reference decoders' view of a
    proposing head)."""
    keep = torch.zeros(logits.shape[-1], dtype=torch.bool, device=logits.device)
    keep[ids] = True
    return logits.masked_fill(~keep, float("-inf"))
