"""What drafters' proposers share: a path whose verify pass also returns the target's features. Torch only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import Tensor

from lightning_bpd.decoding.candidates import Path
from lightning_bpd.decoding.protocol import BlockwiseModel, Cache, Context


@dataclass
class FeaturePath(Path):
    """A path whose verify pass also hands the target's features at the drafter's layers to ``sink``."""

    sink: Any = None  # a drafting object with ``layers`` and a ``pending`` slot

    def verify_pass(self, model: BlockwiseModel, context: Context, cache: Cache) -> Tensor:
        hidden, self.sink.pending = model.decode_step_features(  # type: ignore[union-attr,misc]
            self.block.tokens, context, cache, self.sink.layers)  # type: ignore[union-attr]
        return hidden  # (b, w, D)
