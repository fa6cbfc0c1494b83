"""What a proposer is told by the one loop (:mod:`~lightning_bpd.decoding.loop`): the decode's state and the target's
features it declared it reads. Torch only.

The loop owns the target: it runs the prefill and every verify pass, asking the target for the hidden states of the
layers a proposer reads (:attr:`~lightning_bpd.decoding.proposers.base.Proposer.reads`), and hands them over as
:class:`Features`. A proposer never calls a pass of the target; it reads the decode through :class:`DecodeState`,
whose :class:`Readout` offers the target's cheap projections only (its LM head and its token embeddings).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Criterion
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.protocol import Context, HeadsNetwork, Source, chain_source
from lightning_bpd.decoding.row_book import RowBook
from lightning_bpd.decoding.target import Features, Target

__all__ = ["DecodeState", "Features", "Readout"]


class Readout:
    """The target's cheap projections, the only members of the target a proposer may call (none runs a pass):
    ``logits_first`` and ``argmax_first`` (p_1 and greedy's token at hidden states: its LM head), ``embed_tokens``
    (its input embedding: a block drafter embeds its block with it), ``restrict_draft`` (a proposing head's logits
    over its draft vocabulary: the heads network's, None without one), and its ids and vocabulary size."""

    def __init__(self, target: Target, restrict_draft: Callable[[Tensor], Tensor] | None = None) -> None:
        self._target = target
        spec = target.spec
        self.pad_id, self.bos_id, self.eos_id, self.vocab_size = spec.pad_id, spec.bos_id, spec.eos_id, spec.vocab_size
        self.argmax_first = target.argmax_first
        self.restrict_draft = restrict_draft

    def logits_first(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., V): p_1."""
        return self._target.logits_first(h)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """Tokens (...) -> the target's input embeddings (..., D)."""
        return self._target.embed_tokens(tokens)


@dataclass
class DecodeState:
    """One decode as a proposer sees it: the rule (``criterion``), the generation ``rules``, the sources ``src``
    (B, S), ``max_len``, each original row's ``room`` (None: no bound), the target's projections (``target``) and,
    once the loop made them, the ``book`` of committed tokens (:class:`~lightning_bpd.decoding.row_book.RowBook`:
    ``book.live`` maps the live rows to the original ones, ``book.live_lengths`` their committed counts on the host)
    and ``width``, the inputs this iteration's proposal may hold (the loop's room clamp: a proposer proposes at most
    that many). ``heads``: the network of the model's own heads (the target's heads protocol), read by the heads'
    proposers only; ``context``: the live rows' context, what source-attending chained heads read."""

    criterion: Criterion
    rules: RuleBook
    src: Tensor
    max_len: int
    room: list[int] | None
    target: Readout
    heads: HeadsNetwork
    context: Context = field(init=False)
    book: RowBook = field(init=False)
    width: int = 1
    opened: bool = False

    @property
    def device(self) -> torch.device:
        return self.src.device

    def p1(self) -> Any:
        """What reads p_1 for each live row's next token under the generation rules (None: the target's own
        :attr:`target`): the opening's at the first proposal, then after each row's committed tokens."""
        if not self.opened:
            return self.rules.opening(self.src.shape[0])
        return self.rules.next(self.book)

    def reader(self) -> Any:
        """p_1 for each live row's next token: under the rules where they touch it, else the target's own."""
        return self.p1() or self.target

    def chain_source(self) -> Source | None:
        """What source-attending chained heads read for the live rows (None: nothing)."""
        return chain_source(self.heads, self.context)

    @property
    def longest(self) -> int:
        """The most tokens a live row committed (a host int)."""
        return max(self.book.live_lengths)
