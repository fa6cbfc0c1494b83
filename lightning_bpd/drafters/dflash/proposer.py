"""A DFlash block drafter as a proposer: a whole block proposed in one pass from the target's features. Torch only.

DFlash (Chen, Liang, Liu, arXiv 2602.06036) keeps, per row, the target's hidden states at a few of its layers for
every committed position (its context, fused and projected into each draft layer's keys and values: the drafter's
own cache). Each iteration it drafts the block ``[first, mask x (w - 1)]`` at the row's next positions, ``first``
being greedy's next token (from the verdict), in one bidirectional pass; draft slot j >= 1 is read through the
target's LM head as the token at the block's position j. The loop verifies the block in one pass of the target, and
that pass's features at the positions the row accepted (``first`` and the accepted drafts) join the drafter's
context. So the drafter sees exactly the target features of the row's prompt and output, as in training
(:meth:`~lightning_bpd.drafters.dflash.network.DFlashDrafter.train_forward`: the context strictly before the block's anchor).

The loop owns the target: it runs the prefill and each verify pass with the layers this proposer reads (``reads``:
the drafter's ``target_layer_ids``) and hands their hidden states over (:class:`~lightning_bpd.decoding.state.
Features`); the proposer calls two of the target's projections only, ``embed_tokens`` (the block's inputs) and
``logits_first`` (its LM head, reading each slot), through ``state.target``. The drafter (:class:`~lightning_bpd.
drafters.dflash.network.DFlashDrafter`, seen here through its methods only) brings ``config`` (``block_size``,
``target_layer_ids``, ``mask_token_id``), ``new_cache``, ``extend`` and ``draft``. No host read in a step: the
drafter cache is bounded by the loop's host counts (:meth:`~lightning_bpd.drafters.common.cache.DrafterCache.bound`).
Exact reproduces greedy; speculative sampling draws each slot from the drafter's distribution and stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Outcome, Path
from lightning_bpd.decoding.proposers.base import Proposer, opening_block
from lightning_bpd.decoding.protocol import BlockwiseModel, restricted
from lightning_bpd.decoding.state import DecodeState, Features
from lightning_bpd.decoding.target import target_of
from lightning_bpd.drafters.common.proposing import prompt_rows
from lightning_bpd.nn.argmax import argmax


@dataclass(frozen=True)
class DFlash(Proposer):
    """``drafter`` proposes blocks of ``block_size`` tokens (greedy's next token and ``block_size - 1`` drafts;
    default: the drafter's own block size)."""

    drafter: Any
    block_size: int | None = None

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.block_size if self.block_size is not None else int(self.drafter.config.block_size)

    @property
    def reads(self) -> tuple[int, ...]:  # type: ignore[override]
        return tuple(self.drafter.config.target_layer_ids)

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        if not target_of(model).spec.layers:
            raise ValueError(f"{type(model).__name__} offers no target features (encode_features, "
                             "decode_step_features): a DFlash drafter needs a Hugging Face causal base")
        most = int(self.drafter.config.block_size)
        if isinstance(self.width, bool) or not isinstance(self.width, int) or not 2 <= self.width <= most:
            raise ValueError(f"DFlash block_size must be an integer in [2, {most}] (the drafter's), got {self.width}")
        criterion.validate(self.width)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> DFlashDrafting:
        """This decode's drafter state, its cache filled with the prompts' features (the prefill's)."""
        drafting = DFlashDrafting(self.drafter, self.width, self.reads, int(self.drafter.config.mask_token_id))
        drafting.fill(state, prompt)
        return drafting


@dataclass
class DFlashDrafting(Proposer):
    """One decode's drafter state: its cache of the target's fused features (one row per live row) and the padded
    prompts' width (``prompt_width``: with the loop's committed counts, a host bound on every row's context)."""

    drafter: Any
    size: int
    layers: tuple[int, ...]
    mask_id: int
    cache: Any = None
    prompt_width: int = 0

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.size

    @property
    def reads(self) -> tuple[int, ...]:  # type: ignore[override]
        return self.layers

    def fill(self, state: DecodeState, prompt: Features) -> None:
        """The drafter's cache made and filled with the prompts' features."""
        features, order, counts = prompt_rows(prompt)  # (B, S, A * D), (B, S), (B,)
        b, s = order.shape
        self.prompt_width = s
        capacity = s + 1 + state.max_len + self.size
        self.cache = self.drafter.new_cache(b, capacity, dtype=features.dtype, device=features.device)
        self.drafter.extend(self.cache, features, prompt.positions.gather(1, order), counts)  # type: ignore[union-attr]

    def propose(self, state: DecodeState, features: Features) -> Path:
        """Deterministic rules: token 1 is greedy's, the drafts the argmax of each slot. Speculative sampling: token 1
        the verdict's residual draw (or, where there is none, a draw from p_1 under the rules), then each slot's draft
        drawn from the drafter's distribution there (the block keeps them for the verdict, which stays lossless)."""
        target, criterion, width = state.target, state.criterion, state.width
        one = opening_block(state, features)  # (b, 1)
        if width < 2:
            return Path(one)
        opening = one.tokens  # (b, 1)
        block = torch.cat([opening, opening.new_full((opening.shape[0], width - 1), self.mask_id)], dim=1)  # (b, w)
        positions = self.cache.lengths[:, None] + torch.arange(width, device=opening.device)  # the rows' next positions
        out = self.drafter.draft(self.cache, target.embed_tokens(block), positions)  # (b, w, D)
        logits = restricted(target, target.logits_first(out[:, 1:]))  # (b, w - 1, V): the tokens at 1..w-1
        if criterion.stochastic:
            return Path(Block.cat([one, criterion.draft(logits)]))
        return Path(Block(torch.cat([opening, argmax(logits)], dim=1)))

    def advance(self, state: DecodeState, outcome: Outcome, features: Features, rows: Tensor | None) -> None:
        """The verify pass's features at the positions each row accepted join its context."""
        if rows is not None:
            self.cache.select(rows)
        layers = features.layers  # (b, w, A * D)
        n = layers.shape[1]  # type: ignore[union-attr]
        positions = self.cache.lengths[:, None] + torch.arange(n, device=layers.device)  # type: ignore[union-attr]
        self.drafter.extend(self.cache, layers, positions, outcome.accepted)
        self.cache.bound(self.prompt_width + state.longest)  # each row: its prompt and what it committed
