"""A separate draft model as a proposer (speculative decoding). Torch only.

A small draft model (any :class:`~lightning_bpd.decoding.protocol.BlockwiseModel` with the target's
vocabulary and special ids; only its p_1 is used) proposes tokens autoregressively with its own KV
cache, and the target verifies a whole block in one call, in the one loop
(:mod:`~lightning_bpd.decoding.loop`). One iteration of block size k::

    y_1      = target's own token (p_1 at the last accepted position, or the carried residual token)
    y_2..y_k = k-1 cached draft steps: feed (last committed token, y_1), then y_2, ..., y_{k-1}
    hidden   = target.decode_step(y_1..y_k)                      # one target call, (b, k, D)
    accepted, first = verify(target, criterion, block, hidden)   # as in blockwise decoding
    commit(y_1..y_n);  crop both caches;  next y_1 = first (greedy's next token), or sampled

The draft's cache always holds BOS and every committed token but the newest one, which is fed
again with the next y_1, so every draft step has the same width for every row. The deterministic
rules (:class:`~lightning_bpd.decoding.acceptance.Exact`, ``TopK``, ...) take the argmax of the draft;
``Exact`` reproduces the target's greedy output. :class:`~lightning_bpd.decoding.acceptance.SpeculativeSampling`
samples the draft tokens with q_i = the draft's distribution at step i and is lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Outcome, Path
from lightning_bpd.decoding.generation_rules import RuleBook
from lightning_bpd.decoding.proposers.base import Proposer
from lightning_bpd.decoding.protocol import BlockwiseModel, Cache, Context
from lightning_bpd.decoding.row_book import RowBook
from lightning_bpd.decoding.state import DecodeState, Features
from lightning_bpd.decoding.target import target_of


@dataclass(frozen=True)
class DraftModel(Proposer):
    """``draft`` proposes k-1 tokens of every block of ``k`` (its p_1, step by step, with its own KV cache)."""

    draft: BlockwiseModel
    k: int = 4

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.k

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        check_draft_args(model, self.draft, self.k)
        criterion.validate(self.k)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> Drafting:
        batch, capacity = state.src.shape[0], 1 + state.max_len + self.k
        last = torch.full((batch,), state.target.bos_id, dtype=torch.long, device=state.device)  # (B,)
        return Drafting(self.draft, self.k, self.draft.encode(state.src), self.draft.new_cache(batch, capacity), last)


@dataclass
class Drafting(Proposer):
    """One decode's draft state: its context and cache (BOS and every committed token but the newest), and the
    newest committed token of each live row (``last``, BOS at the start), which the draft's cache lacks."""

    draft: BlockwiseModel
    k: int
    context: Context
    cache: Cache
    last: Tensor
    block: Block | None = field(default=None)

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.k

    def propose(self, state: DecodeState, features: Features) -> Path:
        """Always ``k`` wide: a draft's proposals past a row's room are never read (the target computes them)."""
        target, criterion, h, first = state.target, state.criterion, features.last, features.first
        logits = None  # the target's p_1 at h (b, V) under the rules, where token 1 is not given
        if first is None:  # the opening
            opening = state.reader()
            logits = opening.logits_first(h)  # (B, V)
            check_draft_vocabulary(target, self.draft, logits)
            if not criterion.stochastic:  # greedy's first token (under the rules)
                first = criterion.first_token(opening, h)
        elif criterion.stochastic:  # token 1 drawn from p_1 where no residual token was
            logits = target.logits_first(h)  # (b, V)
            reader = state.p1()
            if reader is not None:
                logits = reader.rule(logits)
        self.block = draft_block(self.draft, criterion, logits, first, self.last, self.context, self.cache, self.k,
                                 state.rules, state.book)
        return Path(self.block)

    def advance(self, state: DecodeState, outcome: Outcome, features: Features, rows: Tensor | None) -> None:
        self.last = outcome.tokens.gather(1, (outcome.accepted - 1)[:, None])[:, 0]  # (b,)
        if rows is not None:
            self.context = self.context.select(rows)
            self.cache.select(rows)
        if self.k > 1:  # BOS and every committed token but the newest
            self.cache.crop(self.cache.lengths - self.k + outcome.accepted, bounds=state.book.length_bounds(offset=0),
                            check=False)


def check_draft_args(target: BlockwiseModel, draft: BlockwiseModel, k: int) -> None:
    """Raise ValueError on a block size below 1 or a draft whose special token ids differ from the target's."""
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1 (tokens per target call), got {k!r}")
    spec = target_of(target).spec
    ids = {"pad_id": (spec.pad_id, draft.pad_id), "bos_id": (spec.bos_id, draft.bos_id),
           "eos_id": (spec.eos_id, draft.eos_id)}
    for name, (want, got) in ids.items():
        if got != want:
            raise ValueError(f"draft {name}={got!r} differs from the target's {want!r}")


def draft_block(
    draft: BlockwiseModel,
    criterion: Criterion,
    first_logits: Tensor | None,
    first: Tensor | None,
    last_token: Tensor,
    context: Context,
    cache: Cache,
    k: int,
    rules: RuleBook | None = None,
    book: RowBook | None = None,
) -> Block:
    """One block (b, k): y_1 from the target's p_1 logits (b, V) or ``first`` (b,), then k-1 draft steps.

    ``first`` is the verdict's opening token: complete for deterministic rules (then ``first_logits``
    may be None), -1 where p_1 must be sampled for sampling rules. ``last_token`` (b,) is the newest
    committed token (BOS at the start), the one the draft's cache lacks. ``rules`` (with the loop's ``book``):
    the target's generation rules, applied to the draft's steps too, so that its proposals obey them.
    """
    if first is not None and not criterion.stochastic:
        parts = [Block(first[:, None])]  # (b, 1)
    else:
        parts = [criterion.draft(first_logits[:, None], first)]  # type: ignore[index]  # tokens (b, 1)
    inputs = torch.stack([last_token, parts[0].tokens[:, 0]], dim=1)  # (b, 2)
    for _ in range(k - 1):
        logits = draft.logits_first(draft.decode_step(inputs, context, cache)[:, -1])  # (b, V)
        reader = None if rules is None or book is None else rules.verifying(book, Block.cat(parts).tokens)
        if reader is not None:  # the rules at the draft token's index
            logits = reader.rule(logits[:, None, :].expand(-1, len(parts), -1))[:, -1]
        parts.append(criterion.draft(logits[:, None]))  # tokens (b, 1)
        inputs = parts[-1].tokens  # (b, 1)
    return Block.cat(parts)


def check_draft_vocabulary(target: object, draft: BlockwiseModel, target_logits: Tensor) -> None:
    """Raise ValueError when the draft's vocabulary size (``draft.vocab_size``, when known) differs from the
    target's, the width of its p_1 logits (..., V)."""
    size = draft.vocab_size
    if size is not None and size != target_logits.shape[-1]:
        raise ValueError(f"draft vocabulary ({size}) differs from the target's ({target_logits.shape[-1]})")
