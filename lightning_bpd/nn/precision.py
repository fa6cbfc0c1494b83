"""Inference precision: the model's weights (and so its KV cache) in float32, bfloat16 or float64. Torch only.

Exact blockwise decoding reproduces greedy decoding *in the same precision*: both run the model cast
to one dtype. It does so token for token when p_1 at a position comes out the same from the k-token
verify pass as from the 1-token greedy step. In bfloat16 the CPU's matrix products (oneDNN) are
batch-invariant: a row's result does not depend on how many rows were multiplied with it (checked
for 1..300 rows of the model's shapes, ``tests/nn/test_precision.py``), which float32's MKL products
are not (its small-row panels round differently). Attention is not strictly invariant in either
precision (the fused kernel blocks a k-query pass differently from a 1-query step: differences of
~1e-7 relative, in float32 accumulators), so exactness is measured on data (``bench``'s
``equals_greedy``, ``test``'s ``exact/matches_greedy``). bfloat16 is also where these CPUs are fast for
several rows at once: a 256 -> 8000 projection of 8 rows costs little more than 1 row, so a k-token
verify pass costs about what a greedy step costs.

``int8`` keeps float32 weights and activations but multiplies in int8, with a scale per weight row and per
activation row, and takes attention in float64 (:mod:`~lightning_bpd.nn.int8`): batch-invariant by
construction, and a quarter of the weight bytes per product.

``bfloat16-invariant`` is bfloat16 with attention taken in float64 (its products are invariant already).
``float32-invariant`` keeps float32 weights, activations and cache but takes every matrix product and
attention in float64, rounded back to float32 (:mod:`~lightning_bpd.nn.invariant`): the verify pass
and the greedy step then agree bit for bit (up to a ~2^-29 chance per value), so exact decoding
reproduces float32-invariant greedy decoding even with the Gaussian intensity output, for 1.15-1.45x
the cost of a float32 decode.

Cheap proposals (:meth:`~lightning_bpd.nn.model.BlockwiseTransformer.set_proposal_precision`) use a
reduced-precision copy of the proposal path only (the heads and the output projection they argmax
over) while verification keeps the model's own precision: exact decoding stays exact, a proposal
that rounding changed is rejected like any wrong one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from lightning_bpd.nn import int8, invariant

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64,
              "float32-invariant": torch.float32, "bfloat16-invariant": torch.bfloat16, "int8": torch.float32}
ALIASES = {"fp32": "float32", "32": "float32", "bf16": "bfloat16", "fp64": "float64", "64": "float64",
           "fp32i": "float32-invariant", "fp32-invariant": "float32-invariant", "bf16i": "bfloat16-invariant",
           "bf16-invariant": "bfloat16-invariant", "i8": "int8"}
# batch-invariant precisions (:mod:`lightning_bpd.nn.invariant`): float32 with float64 products and attention;
# bfloat16 (its oneDNN products are invariant already) with float64 attention
INVARIANT = ("float32-invariant", "bfloat16-invariant")
# float32 weights, int8 products with per-row activation scales, float64 attention (:mod:`lightning_bpd.nn.int8`)
INT8 = "int8"


def canonical_precision(name: str) -> str:
    """``float32`` / ``bfloat16`` / ``float64`` / ``float32-invariant`` (or ``fp32``, ``bf16``, ``fp64``,
    ``fp32i``, ``bf16i``) -> its canonical name; one clear error for any other."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}: use one of {', '.join(PRECISIONS)} (or bf16, fp32, fp32i, bf16i)")
    return key


def parse_precision(name: str) -> torch.dtype:
    """A precision name (:func:`canonical_precision`) -> the dtype of the model's weights."""
    return PRECISIONS[canonical_precision(name)]


def active_precision_name(model: nn.Module) -> str:
    """The precision ``model`` decodes in now: its dtype's name, ``float32-invariant`` or ``int8`` while on."""
    name = precision_name(model_dtype(model))
    if int8.enabled() and name == "float32":
        return INT8
    return f"{name}-invariant" if invariant.enabled() and f"{name}-invariant" in INVARIANT else name


def precision_name(dtype: torch.dtype) -> str:
    """The canonical name of a precision dtype (``torch.bfloat16`` -> ``bfloat16``)."""
    for name, value in PRECISIONS.items():
        if value == dtype:
            return name
    raise ValueError(f"no inference precision for dtype {dtype}")


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())


@contextmanager
def inference_precision(model: nn.Module, precision: str | torch.dtype | None) -> Iterator[nn.Module]:
    """Cast ``model`` to ``precision`` (None: leave it) for the ``with`` block, then cast it back.

    A float32 -> bfloat16 -> float32 round trip loses bits, so the original parameters and buffers are
    kept aside and restored bitwise.
    """
    dtype = parse_precision(precision) if isinstance(precision, str) else precision
    wide = isinstance(precision, str) and canonical_precision(precision) in INVARIANT
    eight = isinstance(precision, str) and canonical_precision(precision) == INT8
    check_int8_device(model, precision)
    original = model_dtype(model)
    if dtype is None or dtype == original:
        with invariant.batch_invariant(wide), int8.int8_products(eight):
            yield model
        return
    tensors = lambda: {**dict(model.named_parameters()), **dict(model.named_buffers())}
    saved = {name: t.detach().clone() for name, t in tensors().items() if t.is_floating_point()}
    model.to(dtype)
    try:
        with invariant.batch_invariant(wide), int8.int8_products(eight):
            yield model
    finally:
        model.to(original)
        with torch.no_grad():
            now = tensors()
            for name, value in saved.items():
                now[name].copy_(value)


def check_int8_device(model: nn.Module, precision: str | torch.dtype | None) -> None:
    """``int8`` products are fbgemm's CPU kernels: refuse them for a model on another device."""
    if isinstance(precision, str) and canonical_precision(precision) == INT8:
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"precision int8 runs on the CPU (fbgemm's int8 products); the model is on {device}: "
                             "decode on --device cpu, or pick bfloat16 / float32 on a GPU")


def set_inference_precision(model: nn.Module, precision: str | None = None, proposals: str | None = None) -> None:
    """For decoding only (``decode``, ``bench``): cast ``model`` to ``precision`` (None: keep it), then let
    its deterministic proposals use a copy in ``proposals`` precision (None: the model's own), when the
    model has a proposal path (``set_proposal_precision``). ``float32-invariant`` stays on for the process."""
    if precision is not None:
        check_int8_device(model, precision)
        model.to(parse_precision(precision))
        invariant.set_batch_invariant(canonical_precision(precision) in INVARIANT)
        int8.set_int8(canonical_precision(precision) == INT8)
    if proposals is not None:
        setter = getattr(model, "set_proposal_precision", None)
        if setter is None:
            raise ValueError(f"{type(model).__name__} has no proposal path to give another precision")
        setter(proposals)
