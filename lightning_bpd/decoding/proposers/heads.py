"""The model's own heads as a proposer: the paper's block, chained heads' chain, Medusa heads. Torch only.

The combined scoring and proposal model of Stern et al., section 4: the verify pass that checks a block also gives,
at the last accepted position, the hidden state the heads read for the next block, and greedy's token there (from
the verdict) opens it, so n tokens cost one call. Only heads 2..k are projected for a proposal.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Path
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.protocol import BlockwiseModel, Source, resolve_k, restricted
from lightning_bpd.decoding.state import DecodeState, Features


def check_stop_below(stop_below: float | None, criterion: Criterion) -> None:
    """The confidence stop is a probability in (0, 1) and needs a deterministic rule."""
    if stop_below is None:
        return
    if not 0.0 < stop_below < 1.0:
        raise ValueError(f"stop_below (the confidence stop) must lie in (0, 1), got {stop_below}")
    if criterion.stochastic:
        raise ValueError(f"the confidence stop takes deterministic rules (exact, topN, epsX, ...), not {criterion.name}")


@dataclass(frozen=True)
class Heads(Proposer):
    """The model's own heads propose the next ``k`` tokens (default: all of them) as one block per row.

    ``lazy``: prefix rules verify position by position (:func:`~lightning_bpd.decoding.verify.verify_lazily`).
    ``stop_below``: the confidence stop of deterministic rules (:func:`propose`)."""

    k: int | None = None
    lazy: bool = False
    stop_below: float | None = None

    @property
    def width(self) -> int:  # type: ignore[override]
        return 1 if self.k is None else self.k

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        criterion.validate(resolve_k(model, self.k))
        check_stop_below(self.stop_below, criterion)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> Heads:
        return replace(self, k=resolve_k(state.heads, self.k))

    def propose(self, state: DecodeState, features: Features) -> Path:
        """The heads read the last hidden state ``features.last`` (b, D); ``state.width`` tokens at most."""
        first, criterion = features.first, state.criterion
        p1 = state.p1() if first is None or criterion.stochastic else None  # p_1 for a token 1 not given
        block = propose(state.heads, criterion, features.last, state.width, first, state.chain_source(),
                        self.stop_below, p1)
        return Path(block, self.lazy)


def propose(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor | None = None,
            source: Source | None = None, stop_below: float | None = None, p1: Any = None) -> Block:
    """Next block (b, k) from the hidden state (b, D) of each row's last accepted position.

    Deterministic rules: token 1 is ``first`` (b,), greedy's next token from the verdict, or else the
    rule's :meth:`~lightning_bpd.decoding.acceptance.Criterion.first_token` at h (from p_1); tokens 2..k are
    the heads' argmaxes, over the model's draft vocabulary when it has one
    (:mod:`lightning_bpd.inference.draft_vocab`; only p_1's verification needs the whole vocabulary).
    Sampling rules: the heads' draws, ``first`` (-1: none) replacing token 1 where a residual token was
    drawn. Chained heads (``model.chained_heads``) propose one token at a time, each step fed the
    token before it (and, source-attending ones, the ``source`` of each row: :func:`chain_source`).

    ``stop_below`` (deterministic rules, the model's own heads): the confidence stop. A row's proposal
    ends before its first head whose probability of its own token is below it (``Block.widths``; the
    verdict never accepts past it, so a row's output does not depend on the other rows), and the block
    is as wide as the widest row (a chain stops computing links once every row stopped): the verify
    pass checks fewer tokens that would mostly be rejected. Exact decoding stays exact.

    ``p1``: what reads p_1 for token 1 under the generation rules (:class:`~lightning_bpd.decoding.generation_rules.RuleBook`,
    at the index of token 1); None: the model itself.
    """
    chained = model.chained_heads and k > 1
    reader = model if p1 is None else p1
    if criterion.stochastic:
        if chained:
            return propose_chained_sampled(model, criterion, h, k, first, source, reader)
        logits = model.logits_heads(h, range(k))  # (b, k, V): head 1 is p_1
        if p1 is not None:
            logits = torch.cat([p1.rule(logits[:, 0])[:, None], logits[:, 1:]], dim=1)
        return criterion.draft(logits, first)
    if first is None:
        first = criterion.first_token(reader, h)  # (b,)
    if k == 1:
        return Block(first[:, None])
    if chained:
        return chain_tokens(model, criterion, h, k, first, source, stop_below)
    draft = model.draft_tokens
    if stop_below is None:
        rest = draft(h, range(1, k)) if draft is not None else criterion.propose(
            restricted(model, model.logits_heads(h, range(1, k))))
        return Block(torch.cat([first[:, None], rest], dim=1))  # (b, k)
    if draft is not None:
        rest, p = draft(h, range(1, k), confidence=True)  # (b, k - 1) each
    else:
        logits = restricted(model, model.logits_heads(h, range(1, k)))  # (b, k - 1, V)
        rest = criterion.propose(logits)
        p = confidence_of(logits, rest)
    widths = 1 + (p >= stop_below).long().cumprod(dim=1).sum(dim=1)  # (b,): up to the first unsure head
    width = int(widths.max())  # host read: the verify pass's width
    return Block(torch.cat([first[:, None], rest[:, : width - 1]], dim=1), widths=widths)  # (b, width)


def confidence_of(logits: Tensor, tokens: Tensor) -> Tensor:
    """The probability (...) that logits (..., V) give to ``tokens`` (...)."""
    return (logits.gather(-1, tokens[..., None])[..., 0] - logits.logsumexp(dim=-1)).float().exp()


def chain_tokens(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor,
                 source: Source | None = None, stop_below: float | None = None) -> Block:
    """Chained heads, deterministic: the block (b, <= k), token i+1 the argmax of head i+1 fed token i.
    With ``stop_below`` a row's width ends before its first head below that probability, and the chain
    stops once no row is still going (a host read per link)."""
    draft = model.chain_draft
    sure = stop_below is not None
    whole = model.chain_drafts
    rest = whole(h, first, k, source) if whole is not None and not sure else None  # (b, k - 1): all links at once
    if rest is not None:
        return Block(torch.cat([first[:, None], rest], dim=1))
    tokens, z = [first], h
    going = widths = torch.ones_like(first) if sure else None  # (b,) rows whose heads were all sure so far
    for i in range(1, k):
        if draft is not None:
            z, token, *p = draft(z, tokens[-1], i, source, confidence=True) if sure else draft(z, tokens[-1], i, source)
        else:
            z, logits = model.chain_step(z, tokens[-1], i, source)  # (b, D), (b, V)
            logits = restricted(model, logits)
            token = criterion.propose(logits[:, None])[:, 0]
            p = [confidence_of(logits, token)] if sure else []
        if sure:
            going = going * (p[0] >= stop_below).long()
            if not bool(going.any()):
                break
            widths = widths + going
        tokens.append(token)
    return Block(torch.stack(tokens, dim=1), widths=widths)


def propose_chained_sampled(model: BlockwiseModel, criterion: Criterion, h: Tensor, k: int, first: Tensor | None,
                            source: Source | None = None, reader: Any = None) -> Block:
    """Chained heads, sampling rules: token 1 drawn from p_1 (read by ``reader``, default the model; or the
    carried residual token), token i drawn from head i fed token i-1; the block keeps each draw's distribution."""
    reader = model if reader is None else reader
    parts = [criterion.draft(reader.logits_first(h)[:, None], first)]  # (b, 1)
    z = h
    for i in range(1, k):
        z, logits = model.chain_step(z, parts[-1].tokens[:, 0], i, source)  # (b, D), (b, V)
        parts.append(criterion.draft(logits[:, None]))  # (b, 1)
    return Block.cat(parts)
