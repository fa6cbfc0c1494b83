"""What drafters' proposers share: the prefill's features in each row's own order. Torch only."""

from __future__ import annotations

from torch import Tensor

from lightning_bpd.decoding.protocol import valid_first
from lightning_bpd.decoding.state import Features


def prompt_rows(prompt: Features) -> tuple[Tensor, Tensor, Tensor]:
    """The prefill's features (:class:`~lightning_bpd.decoding.state.Features`: layers (B, S, A * D), valid (B, S))
    with each row's token slots first, in order (B, S, A * D); that slot order (B, S) (gathering with it left-aligns
    a padded row); and each row's token count (B,)."""
    features, valid = prompt.layers, prompt.valid
    assert features is not None and valid is not None, "the loop hands a drafter the prefill's features"
    order = valid_first(valid)  # (B, S)
    return features.gather(1, order[:, :, None].expand(-1, -1, features.shape[-1])), order, valid.sum(dim=1)
