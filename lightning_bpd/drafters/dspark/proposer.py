"""A DSpark drafter as a proposer: DFlash's drafting (its cache of the target's features, filled at the prefill and
after every verdict: :class:`~lightning_bpd.drafters.dflash.proposer.DFlashDrafting`) with DSpark's block. Torch only.

Each iteration the block ``[first, mask x (n - 1)]`` runs at the row's next positions in one pass; anchor-first, slot
j proposes the token after ``first``'s j-th successor, and the Markov bias is added slot by slot, each slot reading
the token proposed before it (:meth:`~lightning_bpd.drafters.dspark.network.DSparkDrafter.chain`). A proposal is
``[first, d_0 .. d_{n-1}]``: up to ``block_size + 1`` tokens, one more than DFlash's.

* Deterministic rules: each slot's argmax (greedy's chain); the loop verifies, so the output is greedy's.
* Speculative sampling: each slot drawn from its own distribution given the token drawn before it, the block keeping
  those distributions for the verdict (lossless: an autoregressive draft judged token by token).
* ``confidence_threshold`` > 0 (0: off, the head is not evaluated): a row keeps its drafts before the first slot
  whose confidence is below the threshold (DeepSpec's and llama.cpp's per-position rule); the verify pass is as wide
  as the widest row (``Block.widths``: a row accepts nothing past its own). Only the number of verified drafts
  changes: still exact, still lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from lightning_bpd.decoding.acceptance import Block, Criterion
from lightning_bpd.decoding.candidates import Path
from lightning_bpd.decoding.proposers.base import opening_block
from lightning_bpd.decoding.protocol import BlockwiseModel, restricted
from lightning_bpd.decoding.state import DecodeState, Features, Readout
from lightning_bpd.drafters.dflash.proposer import DFlash, DFlashDrafting
from lightning_bpd.nn.argmax import argmax


@dataclass(frozen=True)
class DSpark(DFlash):
    """``drafter`` (a :class:`~lightning_bpd.drafters.dspark.network.DSparkDrafter`) proposes ``first`` and
    ``block_size`` drafts (default: all its slots); ``confidence_threshold`` in [0, 1) ends a row's block at its
    first slot less confident than that (0: never)."""

    confidence_threshold: float = 0.0

    @property
    def width(self) -> int:  # type: ignore[override]
        size = self.block_size if self.block_size is not None else int(self.drafter.config.block_size)
        return size + 1 if isinstance(size, int) and not isinstance(size, bool) else size

    def check(self, model: BlockwiseModel, criterion: Criterion) -> Criterion:
        DFlash(self.drafter, 2).check(model, criterion)  # the target offers its features
        most, width = int(self.drafter.config.block_size), self.width
        if isinstance(width, bool) or not isinstance(width, int) or not 2 <= width <= most + 1:
            raise ValueError(f"a DSpark proposal holds 2..{most + 1} tokens (token 1 and up to the drafter's {most} "
                             f"drafts): block_size must be an integer in [1, {most}], got {self.block_size}")
        t = self.confidence_threshold
        if not (isinstance(t, (int, float)) and 0 <= t < 1):
            raise ValueError(f"DSpark confidence_threshold must lie in [0, 1) (0: off), got {t}")
        if t > 0 and self.drafter.confidence_head is None:
            raise ValueError(f"DSpark confidence_threshold {t}: this drafter has no confidence head (trained with "
                             "enable_confidence_head false): use 0")
        criterion.validate(width)
        return criterion

    def start(self, state: DecodeState, prompt: Features) -> DSparkDrafting:
        drafting = DSparkDrafting(self.drafter, self.width, self.reads, int(self.drafter.config.mask_token_id),
                                  threshold=float(self.confidence_threshold))
        drafting.fill(state, prompt)
        return drafting


@dataclass
class DSparkDrafting(DFlashDrafting):
    """DFlash's drafting state (cache, fill, advance) proposing DSpark's blocks."""

    threshold: float = 0.0

    def propose(self, state: DecodeState, features: Features) -> Path:
        one = opening_block(state, features)  # (b, 1)
        if state.width < 2:
            return Path(one)
        return Path(self.block(state.target, state.criterion, one, state.width - 1))

    def block(self, model: Readout, criterion: Criterion, one: Block, n: int) -> Block:
        """``one`` (b, 1) and the n drafts after it (:mod:`the module's notes <lightning_bpd.drafters.dspark.proposer>`),
        cut at the confidence threshold."""
        opening = one.tokens  # (b, 1)
        tokens = torch.cat([opening, opening.new_full((opening.shape[0], n - 1), self.mask_id)], dim=1)  # (b, n)
        positions = self.cache.lengths[:, None] + torch.arange(n, device=opening.device)  # the rows' next positions
        h = self.drafter.draft(self.cache, model.embed_tokens(tokens), positions)  # (b, n, D)
        base = restricted(model, model.logits_first(h))  # (b, n, V): the target's LM head, before the Markov bias
        sampling = criterion.stochastic
        pick = (lambda logits: criterion.draft(logits[:, None]).tokens[:, 0]) if sampling else argmax
        drafts, logits, conf = self.drafter.chain(h, base, opening[:, 0], pick, confidence=self.threshold > 0)
        drafted = Block(drafts, criterion.distribution(logits) if sampling else None)  # type: ignore[attr-defined]
        block = Block.cat([one, drafted])  # (b, n + 1)
        if conf is None:
            return block
        widths = 1 + (torch.sigmoid(conf) >= self.threshold).long().cumprod(dim=1).sum(dim=1)  # (b,)
        w = int(widths.max())  # host read: the verify pass's width
        return Block(block.tokens[:, :w], None if block.probs is None else block.probs[:, :w], widths=widths)


__all__ = ["DSpark", "DSparkDrafting"]
