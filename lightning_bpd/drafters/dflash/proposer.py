"""A DFlash block drafter as a proposer: a whole block proposed in one pass from the target's features. Torch only.

DFlash (Chen, Liang, Liu, arXiv 2602.06036) keeps, per row, the target's hidden states at a few of its layers for
every committed position (its context, fused and projected into each draft layer's keys and values: the drafter's
own cache). Each iteration it drafts the block ``[first, mask x (w - 1)]`` at the row's next positions, ``first``
being greedy's next token (from the verdict), in one bidirectional pass; draft slot j >= 1 is read through the
target's LM head as the token at the block's position j. The loop verifies the block in one pass of the target, and
that pass's features at the positions the row accepted (``first`` and the accepted drafts) join the drafter's
context. So the drafter sees exactly the target features of the row's prompt and output, as in training
(:meth:`~lightning_bpd.drafters.dflash.network.DFlashDrafter.train_forward`: the context strictly before the block's anchor).

The target offers its features through ``encode_features`` and ``decode_step_features``
(:class:`~lightning_bpd.decoding.protocol.BlockwiseModel`); the drafter (:class:`~lightning_bpd.drafters.dflash.network.
DFlashDrafter`, seen here through its methods only) brings ``config`` (``block_size``, ``target_layer_ids``,
``mask_token_id``), ``new_cache``, ``extend`` and ``draft``. Exact reproduces greedy; speculative sampling draws each
slot from the drafter's distribution and stays lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Outcome
from lightning_bpd.decoding.proposers.base import Proposer, opening_block
from lightning_bpd.decoding.protocol import BlockwiseModel, Context, restricted, valid_first
from lightning_bpd.drafters.common.proposing import FeaturePath
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

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        if model.encode_features is None or model.decode_step_features is None:
            raise ValueError(f"{type(model).__name__} offers no target features (encode_features, "
                             "decode_step_features): a DFlash drafter needs a Hugging Face causal base")
        most = int(self.drafter.config.block_size)
        if isinstance(self.width, bool) or not isinstance(self.width, int) or not 2 <= self.width <= most:
            raise ValueError(f"DFlash block_size must be an integer in [2, {most}] (the drafter's), got {self.width}")
        criterion.validate(self.width)
        return criterion

    def start(self, run: Any) -> DFlashDrafting:
        return DFlashDrafting(self.drafter, self.width, tuple(self.drafter.config.target_layer_ids),
                              int(self.drafter.config.mask_token_id))


@dataclass
class DFlashDrafting(Proposer):
    """One decode's drafter state: its cache of the target's fused features (one row per live row) and the features
    of the last verify pass, waiting for the verdict."""

    drafter: Any
    size: int
    layers: tuple[int, ...]
    mask_id: int
    cache: Any = None
    pending: Tensor | None = field(default=None, repr=False)

    @property
    def width(self) -> int:  # type: ignore[override]
        return self.size

    def encode(self, run: Any) -> Context:
        """The target's prefill, and the drafter's cache filled with the prompts' features."""
        context, features, valid, positions = run.model.encode_features(run.src, self.layers)
        b, s = valid.shape
        order = valid_first(valid)  # (B, S): each row's tokens first, in order
        features = features.gather(1, order[:, :, None].expand(-1, -1, features.shape[-1]))  # (B, S, A * D)
        counts = valid.sum(dim=1)  # (B,)
        capacity = s + 1 + run.max_len + self.size
        self.cache = self.drafter.new_cache(b, capacity, dtype=features.dtype, device=features.device)
        self.drafter.extend(self.cache, features, positions.gather(1, order), counts)
        return context

    def propose(self, run: Any, h: Tensor, first: Tensor | None) -> FeaturePath:
        """Deterministic rules: token 1 is greedy's, the drafts the argmax of each slot. Speculative sampling: token 1
        the verdict's residual draw (or, where there is none, a draw from p_1 under the rules), then each slot's draft
        drawn from the drafter's distribution there (the block keeps them for the verdict, which stays lossless)."""
        model, criterion = run.model, run.criterion
        one = opening_block(run, h, first)  # (b, 1)
        width = run.book.block_width(self.size, run.room)
        if width < 2:
            return FeaturePath(one, sink=self)
        opening = one.tokens  # (b, 1)
        block = torch.cat([opening, opening.new_full((opening.shape[0], width - 1), self.mask_id)], dim=1)  # (b, w)
        positions = self.cache.lengths[:, None] + torch.arange(width, device=opening.device)  # the rows' next positions
        out = self.drafter.draft(self.cache, model.embed_tokens(block), positions)  # (b, w, D)
        logits = restricted(model, model.logits_first(out[:, 1:]))  # (b, w - 1, V): the tokens at 1..w-1
        if criterion.stochastic:
            return FeaturePath(Block.cat([one, criterion.draft(logits)]), sink=self)
        tokens = run.rules.forced_proposals(run.book, torch.cat([opening, argmax(logits)], dim=1))
        return FeaturePath(Block(tokens), sink=self)

    def advance(self, run: Any, outcome: Outcome, rows: Tensor | None) -> None:
        """The verify pass's features at the positions each row accepted join its context."""
        features, self.pending = self.pending, None
        if rows is not None:
            self.cache.select(rows)
            features = features[rows]  # type: ignore[index]
        n = features.shape[1]  # type: ignore[union-attr]
        positions = self.cache.lengths[:, None] + torch.arange(n, device=features.device)  # type: ignore[union-attr]
        self.drafter.extend(self.cache, features, positions, outcome.accepted)
