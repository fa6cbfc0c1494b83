"""Prompt lookup as a proposer: candidates copied from the row itself, no heads and no draft model. Torch only.

As transformers' ``prompt_lookup_num_tokens`` (Saxena's prompt lookup decoding): the row's history is its prompt
(the source's non-pad tokens, in order) followed by what it committed and greedy's next token ``first``; its last
n tokens (n from ``max_ngram`` down to 1) are looked up earlier in the history, and the up to ``num_tokens`` tokens
that followed the match are proposed after ``first``. Unlike transformers (batch 1 only), every row of a ragged batch
looks up its own history at once: a row without a match proposes ``first`` alone (its ``widths`` entry), and the
verify pass is as wide as the longest row's proposal. Any base: the verify pass is the model's own ``decode_step``.

``match="last"`` takes the most recent match (code repeats what it just wrote); ``"first"`` the earliest, as
transformers does. Deterministic rules only: a copied token has no distribution to sample it from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Path
from lightning_bpd.decoding.proposers.base import Proposer, check_counts, opening_token
from lightning_bpd.decoding.protocol import BlockwiseModel, valid_first
from lightning_bpd.decoding.state import DecodeState, Features


@dataclass(frozen=True)
class PromptLookup(Proposer):
    """Propose the ``num_tokens`` tokens that followed the last earlier occurrence of the row's last n-gram
    (n = ``max_ngram``, ..., 1), after greedy's next token."""

    max_ngram: int = 3
    num_tokens: int = 8
    match: str = "last"

    deterministic_only = True

    def __post_init__(self) -> None:
        check_counts(self, ("max_ngram", "num_tokens"))
        if self.match not in ("last", "first"):
            raise ValueError(f"PromptLookup match must be 'last' or 'first', got {self.match!r}")

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.num_tokens + 1

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        if criterion.stochastic:
            raise ValueError(f"prompt lookup takes deterministic rules (exact, topN, epsX, minL_...), not "
                             f"{criterion.name}: copied tokens have no distribution to sample from")
        criterion.validate(self.width)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> PromptLookupRun:
        """This decode's state: every row's prompt left-aligned once (the rows' histories start with it)."""
        return PromptLookupRun(self, *left_aligned(state.src, state.target.pad_id))


@dataclass
class HistoryRun(Proposer):
    """One decode of a proposer that reads the rows' histories (``spec``: prompt lookup, retrieval): ``prompts``
    (B, S) each row's prompt tokens first (-1 after), ``lengths`` (B,) their count, for every original row (the live
    ones are ``book.live``); its width and extra slots are the spec's."""

    spec: Proposer
    prompts: Tensor
    lengths: Tensor

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.spec.width

    @property
    def extra_slots(self) -> int:  # type: ignore[override]
        return self.spec.extra_slots

    def histories(self, state: DecodeState, first: Tensor) -> tuple[Tensor, Tensor]:
        """The live rows' histories (b, L), -1 past their lengths (b,): prompt, committed tokens, then ``first``."""
        book = state.book
        live = book.live
        return joined(self.prompts[live], self.lengths[live], book.tokens[live], book.committed(),
                      max(book.live_lengths), first)


@dataclass
class PromptLookupRun(HistoryRun):
    """One decode of :class:`PromptLookup`."""

    spec: PromptLookup

    def propose(self, state: DecodeState, features: Features) -> Path:
        spec = self.spec
        first = opening_token(state, features)  # (b,)
        history, lengths = self.histories(state, first)
        found, count = lookup(history, lengths, spec.max_ngram, spec.num_tokens, spec.match == "last")
        width = min(state.width - 1, int(count.max()))  # host read: the pass's width
        found = torch.where(torch.arange(width, device=first.device) < count[:, None], found[:, :width],
                            first[:, None])
        tokens = torch.cat([first[:, None], found], dim=1)  # (b, 1 + width): past a row's count, fillers
        return Path(Block(tokens, widths=1 + count.clamp(max=width)))


def histories(prompts: Tensor, outputs: Tensor, committed: Tensor, first: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Each row's history, left-aligned (b, L) with -1 past its length (b,): the prompt's non-pad tokens (prompts
    (b, S)), the first ``committed`` (b,) tokens of ``outputs`` (b, T), then ``first`` (b,)."""
    longest = int(committed.max()) if committed.numel() else 0
    return joined(*left_aligned(prompts, pad_id), outputs, committed, longest, first)


def left_aligned(prompts: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
    """Each row's non-pad tokens of ``prompts`` (b, S) first, in order, -1 after them (b, S), and their count (b,)."""
    valid = prompts != pad_id  # (b, S)
    order = valid_first(valid)
    return torch.where(valid.gather(1, order), prompts.gather(1, order), -1), valid.sum(dim=1)


def joined(prompts: Tensor, plen: Tensor, outputs: Tensor, committed: Tensor, longest: int,
           first: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`histories` from left-aligned ``prompts`` (b, S) of ``plen`` (b,) tokens; ``longest``: the most tokens a
    row committed (a host int, at least ``committed.max()``)."""
    b, s = prompts.shape
    lengths = plen + committed + 1  # (b,)
    width = s + longest + 2  # the last column takes what lies past a row's history
    history = torch.full((b, width), -1, dtype=torch.long, device=prompts.device)
    history[:, :s] = prompts
    j = torch.arange(longest, device=prompts.device)
    at = torch.where(j < committed[:, None], plen[:, None] + j, width - 1)  # (b, longest)
    history.scatter_(1, at, outputs[:, :longest])
    history.scatter_(1, (plen + committed)[:, None], first[:, None])
    history[:, -1] = -1
    return history[:, :-1], lengths


def lookup(history: Tensor, lengths: Tensor, max_ngram: int, num_tokens: int,
           latest: bool = True) -> tuple[Tensor, Tensor]:
    """For each row of ``history`` (b, L) (-1 past ``lengths`` (b,)): the ``num_tokens`` tokens after the last
    (``latest``) or first earlier occurrence of its last n tokens, n from ``max_ngram`` down to 1, the largest n
    with a match winning (b, num_tokens), and how many of them lie inside the history (b,): 0 where nothing matched."""
    b, L = history.shape
    device = history.device
    start = torch.zeros(b, dtype=torch.long, device=device)  # where the copied tokens start
    found = torch.zeros(b, dtype=torch.bool, device=device)
    for n in range(max_ngram, 0, -1):
        if L < n + 1:
            continue
        tail = history.gather(1, (lengths[:, None] - n + torch.arange(n, device=device)).clamp(min=0))  # (b, n)
        hit = (history.unfold(1, n, 1) == tail[:, None, :]).all(dim=-1)  # (b, L - n + 1): windows equal to it
        s = torch.arange(L - n + 1, device=device)
        hit &= (s[None, :] + n < lengths[:, None]) & (lengths[:, None] > n)  # a continuation before the tail
        key = torch.where(hit, s if latest else L - s, -1)  # (b, L - n + 1)
        best, ok = key.argmax(dim=1), key.amax(dim=1) >= 0  # (b,) each
        start = torch.where(ok & ~found, best + n, start)
        found |= ok
    at = (start[:, None] + torch.arange(num_tokens, device=device)).clamp(max=L - 1)  # (b, num_tokens)
    count = torch.where(found, (lengths - start).clamp(min=0, max=num_tokens), 0)  # (b,)
    return history.gather(1, at), count
