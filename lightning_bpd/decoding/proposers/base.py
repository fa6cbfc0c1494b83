"""The proposer protocol of the one loop (:mod:`~lightning_bpd.decoding.loop`). Torch only.

A proposer is built once with its options (``Heads(k=4)``, ``PromptLookup(max_ngram=3, num_tokens=8)``) and can
serve any number of decodes. It never calls a pass of the target: the loop owns the target, runs the prefill and
every verify pass, and hands the proposer what it declared it reads (:attr:`Proposer.reads`: the target layers whose
hidden states it needs) as :class:`~lightning_bpd.decoding.state.Features`. For each decode the loop asks it, in
order:

- :meth:`Proposer.check`: can it propose for this model under this rule (ValueError saying what to fix otherwise);
  it returns the rule to decode with (a tree decodes sampling at temperature 0 as exact);
- :meth:`Proposer.start` with the prefill's features: the object that proposes during this decode (``self`` when it
  keeps no state; a draft model or a drafter returns a fresh object holding its own cache), with ``width`` (tokens per
  verify pass at most, token 1 included) and ``extra_slots`` (a tree's nodes beyond its depth);
- per iteration, :meth:`Proposer.propose` (candidates at each live row's tip: the last hidden state at its last
  accepted position and the verdict's next token) and, after the verdict, :meth:`Proposer.advance` (the verify pass's
  features of the live rows; rows that finished are gone: ``rows``).

The loop applies the room (``state.width``: a proposal holds at most that many inputs) and, for deterministic rules,
the tokens the generation rules force (:meth:`~lightning_bpd.decoding.candidates.Path.forced`) once, for every
proposer. A proposer of a path returns :class:`~lightning_bpd.decoding.candidates.Path` (a
:class:`~lightning_bpd.decoding.acceptance.Block` of tokens (b, w), token 1 first); a tree proposer
:class:`~lightning_bpd.decoding.candidates.SharedTree` or :class:`~lightning_bpd.decoding.candidates.RowTree`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.state import DecodeState, Features

if TYPE_CHECKING:
    from lightning_bpd.decoding.candidates import Candidates, Outcome
    from lightning_bpd.decoding.protocol import BlockwiseModel


class Proposer:
    """Base of every proposer: override :meth:`propose` and set ``width``; the rest has defaults."""

    width: int = 1  # tokens per verify pass at most, token 1 (the verdict's ``first``) included
    extra_slots: int = 0  # cache slots past ``width`` that a tree's nodes take
    deterministic_only: bool = False  # proposes only for deterministic rules (no distributions to sample with)
    reads: tuple[int, ...] = ()  # the target layers whose hidden states the loop hands over (prefill and verify)

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        """The rule to decode with; ValueError where this proposer cannot serve it."""
        if self.deterministic_only and criterion.stochastic:
            raise ValueError(f"{type(self).__name__} proposes for deterministic rules (exact, topN, epsX, minL_...), "
                             f"not {criterion.name}")
        criterion.validate(self.width)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> Proposer:
        """The object that proposes during this decode (``self``: no per-decode state). ``prompt``: the prefill's
        features of the layers in :attr:`reads` (empty when it reads none)."""
        return self

    def propose(self, state: DecodeState, features: Features) -> Candidates:
        """Candidates at each live row's tip: ``features.last`` (b, D), the last hidden state at its last accepted
        position, and ``features.first`` (b,), the verdict's next token (greedy's, for deterministic rules; for
        sampling -1 where p_1 draws it; None at the first proposal, where the proposer reads p_1 itself:
        :func:`opening_token`). At most ``state.width`` inputs per row."""
        raise NotImplementedError

    def advance(self, state: DecodeState, outcome: Outcome, features: Features, rows: Tensor | None) -> None:
        """After the verdict, the cache kept and finished rows dropped (``rows``: the live rows kept, None: all);
        ``features``: the verify pass's, of the live rows."""


def check_counts(proposer: object, names: tuple[str, ...]) -> None:
    """ValueError, in one line, where one of the options ``names`` of ``proposer`` is not an integer >= 1."""
    for name in names:
        value = getattr(proposer, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(proposer).__name__} {name} must be an integer >= 1, got {value!r}")


def opening_token(state: DecodeState, features: Features) -> Tensor:
    """Token 1 of a deterministic proposal (b,): the verdict's ``first``, or at the first proposal the rule's own from
    p_1 at ``features.last`` (b, D) under the generation rules."""
    if features.first is not None:
        return features.first
    return state.criterion.first_token(state.reader(), features.last)  # (b,)


def opening_block(state: DecodeState, features: Features) -> Block:
    """Token 1 of a drafter's proposal (b, 1): greedy's (:func:`opening_token`) under a deterministic rule; under
    speculative sampling the verdict's residual draw, or a draw from p_1 at ``features.last`` (b, D) under the
    generation rules where there is none (the block keeps its distribution for the verdict)."""
    criterion = state.criterion
    if not criterion.stochastic:
        return Block(opening_token(state, features)[:, None])
    p1 = state.target.logits_first(features.last)  # (b, V): token 1 where no residual token was drawn
    reader = state.p1()
    return criterion.draft((p1 if reader is None else reader.rule(p1))[:, None], features.first)  # (b, 1)
