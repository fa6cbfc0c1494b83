"""The proposer protocol of the one loop (:mod:`~lightning_bpd.decoding.loop`). Torch only.

A proposer is built once with its options (``Heads(k=4)``, ``PromptLookup(max_ngram=3, num_tokens=8)``) and can
serve any number of decodes. For each decode the loop asks it, in order:

- :meth:`Proposer.check`: can it propose for this model under this rule (ValueError saying what to fix otherwise);
  it returns the rule to decode with (a tree decodes sampling at temperature 0 as exact);
- :meth:`Proposer.start`: the object that proposes during this decode (then its :meth:`Proposer.encode` encodes the
  sources) (``self`` when it keeps no state; a draft
  model returns a fresh drafting object holding its own cache), with ``width`` (tokens per verify pass at most,
  token 1 included) and ``extra_slots`` (a tree's nodes beyond its depth);
- per iteration, :meth:`Proposer.propose` (candidates at the hidden state of each live row's last accepted
  position) and, after the verdict, :meth:`Proposer.advance` (rows that finished are gone: ``rows``).

A proposer of a path returns :class:`~lightning_bpd.decoding.candidates.Path` (a
:class:`~lightning_bpd.decoding.acceptance.Block` of tokens (b, w), token 1 first); a tree proposer
:class:`~lightning_bpd.decoding.candidates.SharedTree` or :class:`~lightning_bpd.decoding.candidates.RowTree`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion

if TYPE_CHECKING:
    from lightning_bpd.decoding.candidates import Candidates, Outcome
    from lightning_bpd.decoding.loop import Run
    from lightning_bpd.decoding.protocol import BlockwiseModel


class Proposer:
    """Base of every proposer: override :meth:`propose` and set ``width``; the rest has defaults."""

    width: int = 1  # tokens per verify pass at most, token 1 (the verdict's ``first``) included
    extra_slots: int = 0  # cache slots past ``width`` that a tree's nodes take
    deterministic_only: bool = False  # proposes only for deterministic rules (no distributions to sample with)

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        """The rule to decode with; ValueError where this proposer cannot serve it."""
        if self.deterministic_only and criterion.stochastic:
            raise ValueError(f"{type(self).__name__} proposes for deterministic rules (exact, topN, epsX, minL_...), "
                             f"not {criterion.name}")
        criterion.validate(self.width)
        return criterion

    def start(self, run: Run) -> Proposer:
        """The object that proposes during this decode (``self``: no per-decode state)."""
        return self

    def encode(self, run: Run) -> Any:
        """The sources' context (``run.model.encode``; a proposer that reads what the encoding computes, a block
        drafter the target's features of the prompts, encodes through the model itself)."""
        return run.model.encode(run.src)

    def propose(self, run: Run, h: Tensor, first: Tensor | None) -> Candidates:
        """Candidates at the hidden states h (b, D) of each live row's last accepted position. ``first`` (b,): the
        verdict's next token (greedy's, for deterministic rules; for sampling -1 where p_1 draws it); None at the
        first proposal, where the proposer reads p_1 itself (``run.p1()`` or the model)."""
        raise NotImplementedError

    def advance(self, run: Run, outcome: Outcome, rows: Tensor | None) -> None:
        """After the verdict, the cache kept and finished rows dropped (``rows``: the live rows kept, None: all)."""


def opening_token(run: Run, h: Tensor, first: Tensor | None) -> Tensor:
    """Token 1 of a deterministic proposal: ``first``, or at the first proposal the rule's own from p_1 at h (b, D)
    under the generation rules."""
    if first is not None:
        return first
    reader: Any = run.p1() or run.model
    return run.criterion.first_token(reader, h)  # (b,)


def opening_block(run: Run, h: Tensor, first: Tensor | None) -> Block:
    """Token 1 of a drafter's proposal (b, 1): greedy's (:func:`opening_token`) under a deterministic rule; under
    speculative sampling the verdict's residual draw, or a draw from p_1 at h (b, D) under the generation rules where
    there is none (the block keeps its distribution for the verdict)."""
    criterion = run.criterion
    if not criterion.stochastic:
        return Block(opening_token(run, h, first)[:, None])
    p1 = run.model.logits_first(h)  # (b, V): token 1 where no residual token was drawn
    reader = run.p1()
    return criterion.draft((p1 if reader is None else reader.rule(p1))[:, None], first)  # (b, 1)
