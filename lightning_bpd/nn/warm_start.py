"""Warm-starting a blockwise model from a base model's weights (the paper's two-stage recipe)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from torch import Tensor, nn


class CheckpointMismatchError(ValueError):
    """A checkpoint does not fit the model it is loaded into."""


def load_base_weights(model: nn.Module, state: Mapping[str, Tensor], *, strict_head: bool = False) -> list[str]:
    """Copy every non-head parameter of ``state`` into ``model``; return the keys left as initialized.

    Raises :class:`CheckpointMismatchError` naming every key whose shape differs, and every
    non-head key the model expects but the checkpoint lacks (or has but the model does not).
    Head weights are copied only when their shapes match (a base k=1 has none; a checkpoint of
    another k is skipped unless ``strict_head``).
    """
    own = model.state_dict()
    optional = ("head.", "draft_vocab.")  # the head's own weights, and a draft vocabulary (set from data at fit start)
    mismatched = [
        f"{key}: checkpoint {tuple(value.shape)} vs model {tuple(own[key].shape)}"
        for key, value in state.items()
        if key in own and own[key].shape != value.shape and (strict_head or not key.startswith(optional))
    ]
    missing = [key for key in own if key not in state and not key.startswith(optional)]
    unexpected = [key for key in state if key not in own and not key.startswith(optional)]
    if mismatched or missing or unexpected:
        lines = [f"shape mismatch {m}" for m in mismatched[:10]]
        lines += [f"missing from checkpoint: {key}" for key in missing[:10]]
        lines += [f"not in model: {key}" for key in unexpected[:10]]
        raise CheckpointMismatchError(
            "checkpoint does not fit this model (check d_model, layers, heads, vocabulary size):\n  "
            + "\n  ".join(lines)
        )
    loadable = {key: value for key, value in state.items() if key in own and own[key].shape == value.shape}
    model.load_state_dict(loadable, strict=False)
    fresh = [key for key in own if key not in loadable]
    after = getattr(model, "after_base_loaded", None)  # a model may start fresh head parts from base weights
    if after is not None:
        after(fresh)
    return fresh


def freeze_base(model: nn.Module) -> None:
    """Freeze everything but the blockwise head's own layer (``head.*``)."""
    for name, param in model.named_parameters():
        param.requires_grad_(name.startswith("head."))


@contextmanager
def base_detached(model: nn.Module) -> Iterator[None]:
    """Within the block every parameter outside ``head.*`` reads as a detached tensor (the same values, no
    gradient), wherever it is used (tied weights too); the Parameter objects themselves are put back after."""
    swapped = []
    for name, module in model.named_modules(remove_duplicate=False):
        if name == "head" or name.startswith("head."):
            continue
        for key, param in module._parameters.items():
            if param is not None:
                swapped.append((module, key, param))
    try:
        for module, key, param in swapped:
            module._parameters[key] = param.detach()
        yield
    finally:
        for module, key, param in swapped:
            module._parameters[key] = param
