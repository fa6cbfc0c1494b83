"""An EAGLE-3 drafter as a proposer: a chain of drafts, each from the drafter's own state at the token before it.
Torch only.

EAGLE-3 (Li, Wei, Zhang, Zhang, arXiv 2503.01840) keeps, per row, one cached entry per committed position ``p >= 1``:
the drafter's layer over the token at ``p`` and the target's features at ``p - 1`` (a low, a middle and a high
layer, fused by ``fc``). Each iteration, the entries the last verify pass made final go in first, in one call: the
positions the row accepted, then ``first`` (greedy's next token, from the verdict) with the target's features of the
last accepted position; that call's last entry drafts token 2. Each further draft feeds the drafter's own output
state back with the draft before it (one call each); those chain entries are dropped once the block is drafted. The
loop verifies ``[first, d_2, .., d_w]`` in one pass of the target, whose features at the accepted positions wait for
the next iteration. So the drafter reads exactly the target features of the row's prompt and output, as in training
(:meth:`~lightning_bpd.drafters.eagle3.network.Eagle3Drafter.train_forward`, step 0), and its own states along the chain (the
training-time test's later steps).

The loop owns the target: it runs the prefill and each verify pass with the layers this proposer reads (``reads``:
the drafter's ``target_layer_ids``) and hands their hidden states over (:class:`~lightning_bpd.decoding.state.
Features`); the proposer calls one projection of the target, ``logits_first`` (for token 1 under sampling), through
``state.target``, and its draft-vocabulary restriction. The drafter (:class:`~lightning_bpd.drafters.eagle3.network.
Eagle3Drafter`, seen through its methods only) brings ``config`` (``target_layer_ids``, ``vocab_size``),
``new_cache``, ``extend``, ``draft_to_target`` and ``t2d`` (its draft vocabulary, or None). No host read in a step:
the drafter cache is bounded by the loop's host counts. Exact reproduces greedy; speculative sampling draws each
draft from the drafter's distribution (zero outside its draft vocabulary) and stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Outcome, Path
from lightning_bpd.decoding.proposers.base import Proposer, opening_block
from lightning_bpd.decoding.protocol import BlockwiseModel, restricted
from lightning_bpd.decoding.state import DecodeState, Features, Readout
from lightning_bpd.decoding.target import target_of
from lightning_bpd.drafters.common.proposing import prompt_rows
from lightning_bpd.nn.argmax import argmax

MAX_BLOCK = 64  # the longest chain a block may hold (token 1 and 63 drafts)


@dataclass(frozen=True)
class Eagle3(Proposer):
    """``drafter`` proposes chains: greedy's next token and ``block_size - 1`` drafts (default 8 in all)."""

    drafter: Any
    block_size: int = 8

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.block_size

    @property
    def reads(self) -> tuple[int, ...]:  # type: ignore[override]
        return tuple(self.drafter.config.target_layer_ids)

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        if not target_of(model).spec.layers:
            raise ValueError(f"{type(model).__name__} offers no target features (encode_features, "
                             "decode_step_features): an EAGLE-3 drafter needs a causal base")
        size = self.block_size
        if isinstance(size, bool) or not isinstance(size, int) or not 2 <= size <= MAX_BLOCK:
            raise ValueError(f"EAGLE-3 block_size (token 1 and its drafts) must be an integer in [2, {MAX_BLOCK}], "
                             f"got {size}")
        vocab = target_of(model).spec.vocab_size
        if vocab is not None and int(self.drafter.config.vocab_size) != vocab:
            raise ValueError(f"the EAGLE-3 drafter's vocabulary ({self.drafter.config.vocab_size}) is not the "
                             f"target's ({vocab}): it was trained on another target")
        criterion.validate(size)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> Eagle3Drafting:
        """This decode's drafter state; every prompt position waits to go into its cache."""
        drafting = Eagle3Drafting(self.drafter, self.block_size, self.reads)
        drafting.fill(state, prompt)
        return drafting


@dataclass
class Eagle3Drafting(Proposer):
    """One decode's drafter state: its cache (one entry per committed position after the first) and what waits to
    go in: the target's features of the positions committed since (b, m, A*D), the tokens after the first m - 1 of
    them (b, m - 1) (the m-th is the next proposal's token 1) and m per row (b,); the padded prompts' width
    (``prompt_width``: with the loop's committed counts, a host bound on every row's entries)."""

    drafter: Any
    size: int
    layers: tuple[int, ...]
    cache: Any = None
    features: Tensor | None = field(default=None, repr=False)
    tokens: Tensor | None = field(default=None, repr=False)
    counts: Tensor | None = field(default=None, repr=False)
    prompt_width: int = 0

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.size

    @property
    def reads(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.layers

    def fill(self, state: DecodeState, prompt: Features) -> None:
        """Every prompt position waits to go into the drafter's cache (with the token after it: the prompt's next,
        the last one's the first proposal's token 1)."""
        self.features, order, self.counts = prompt_rows(prompt)  # (B, S, A*D), (B, S), (B,)
        b, s = order.shape
        self.tokens = state.src.gather(1, order)[:, 1:]  # (B, S - 1): the token after each prompt position
        self.prompt_width = s
        capacity = s + 1 + state.max_len + self.draft_slots
        self.cache = self.drafter.new_cache(b, capacity, dtype=self.features.dtype, device=self.features.device)

    @property
    def draft_slots(self) -> int:
        """Cache entries past the committed ones that one proposal takes at most (the chain's)."""
        return self.size

    def settle(self, state: DecodeState, opening: Tensor) -> tuple[Tensor, Tensor]:
        """The waiting positions into the cache, ``opening`` (b,) after the last of each row -> the drafter's state
        (b, D) and draft logits (b, Vd) there (what drafts token 2)."""
        b, m = self.features.shape[:2]  # type: ignore[union-attr]
        rows = torch.arange(b, device=opening.device)
        last = self.counts - 1  # type: ignore[operator]
        tokens = torch.cat([self.tokens, opening.new_zeros(b, 1)], dim=1)  # type: ignore[list-item]
        tokens[rows, last] = opening
        positions = self.cache.lengths[:, None] + 1 + torch.arange(m, device=opening.device)  # (b, m)
        state_, logits = self.drafter.extend(self.cache, self.features, tokens, positions, self.counts)
        self.cache.bound(self.prompt_width + state.longest)  # each row: its prompt and what it committed
        self.features = self.tokens = self.counts = None
        return state_[rows, last], logits[rows, last]

    def target_logits(self, target: Readout, logits: Tensor) -> Tensor:
        """Draft logits (..., Vd) over the target's vocabulary (..., V): -inf outside the draft vocabulary, then the
        model's own restrictions (what speculative sampling draws from)."""
        t2d = self.drafter.t2d
        if t2d is not None:
            full = logits.new_full((*logits.shape[:-1], t2d.shape[0]), float("-inf"))
            full[..., t2d] = logits
            logits = full
        return restricted(target, logits)

    def propose(self, state: DecodeState, features: Features) -> Path:
        """Deterministic rules: token 1 is greedy's, each draft the argmax of the drafter's logits. Speculative
        sampling: token 1 the verdict's residual draw (or a draw from p_1 under the rules), then each draft drawn
        from the drafter's distribution (the block keeps them for the verdict, which stays lossless)."""
        target, criterion, width = state.target, state.criterion, state.width
        one = opening_block(state, features)  # (b, 1)
        h, logits = self.settle(state, one.tokens[:, 0])  # (b, D), (b, Vd)
        committed, span = self.cache.lengths.clone(), self.cache.span
        drafts: list[Block] = []
        for j in range(1, width):
            if criterion.stochastic:
                drawn = criterion.draft(self.target_logits(target, logits)[:, None])  # (b, 1) target ids
            else:
                drawn = Block(self.drafter.draft_to_target(argmax(logits))[:, None])  # (b, 1)
            drafts.append(drawn)
            if j < width - 1:  # the chain: the drafter's own state with the draft it made
                h, logits = self.drafter.extend(self.cache, h[:, None], drawn.tokens, self.cache.lengths[:, None] + 1)
                h, logits = h[:, 0], logits[:, 0]
        self.cache.crop(committed, span)  # the chain's entries go; the verify pass's features replace them
        return Path(Block.cat([one, *drafts]) if drafts else one)

    def advance(self, state: DecodeState, outcome: Outcome, features: Features, rows: Tensor | None) -> None:
        """The verify pass's features at the positions each row accepted wait for the next proposal, with the
        accepted tokens after the first (the candidates' own, forced tokens included)."""
        if rows is not None:
            self.cache.select(rows)
        self.features = features.layers  # (b, w, A*D): those past each row's accepted count are never read
        self.tokens = outcome.tokens[:, 1:]  # (b, w - 1)
        self.counts = outcome.accepted.to(torch.long)
