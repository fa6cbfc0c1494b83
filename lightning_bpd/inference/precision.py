"""Inference precision: the model's weights (and so its KV cache) in float32, bfloat16 or float64. Torch only.

Exact blockwise decoding reproduces greedy decoding *in the same precision*: both run the model cast
to one dtype. It does so token for token when p_1 at a position comes out the same from the k-token
verify pass as from the 1-token greedy step. In bfloat16 the CPU's matrix products (oneDNN) are
batch-invariant: a row's result does not depend on how many rows were multiplied with it (checked
for 1..300 rows of the model's shapes, ``tests/inference/test_precision.py``), which float32's MKL products
are not (its small-row panels round differently). Attention is not strictly invariant in either
precision (the fused kernel blocks a k-query pass differently from a 1-query step: differences of
~1e-7 relative, in float32 accumulators), so exactness is measured on data (``bench``'s
``equals_greedy``, ``test``'s ``exact/matches_greedy``). bfloat16 is also where these CPUs are fast for
several rows at once: a 256 -> 8000 projection of 8 rows costs little more than 1 row, so a k-token
verify pass costs about what a greedy step costs.

``float32-packed`` keeps float32 weights and arithmetic but multiplies with oneDNN's packed weights
(:mod:`~lightning_bpd.kernels.onednn`), whose products are batch-invariant on these CPUs (a hardware property,
``tests/kernels/test_onednn.py -m hardware``) and cheap for the 8 rows of a verify pass; attention is taken in float64.

``int8`` keeps float32 weights and activations but multiplies in int8, with a scale per weight row and per
activation row, and takes attention in float64 (:mod:`~lightning_bpd.kernels.int8`): batch-invariant by
construction, and a quarter of the weight bytes per product.

``bfloat16-invariant`` is bfloat16 with attention taken in float64 (its products are invariant already).
``float32-invariant`` keeps float32 weights, activations and cache but takes every matrix product and
attention in float64, rounded back to float32 (:mod:`~lightning_bpd.kernels.invariant`): the verify pass
and the greedy step then agree bit for bit (up to a ~2^-29 chance per value), so exact decoding
reproduces float32-invariant greedy decoding even with the Gaussian intensity output, for 1.15-1.45x
the cost of a float32 decode.

A precision is chosen for one runtime (:func:`lightning_bpd.inference.build_runtime`), never for the process.
Cheap proposals (:meth:`~lightning_bpd.nn.model.BlockwiseTransformer.set_proposal_precision`) use a
reduced-precision copy of the proposal path only (the heads and the output projection they argmax
over) while verification keeps the model's own precision: exact decoding stays exact, a proposal
that rounding changed is rejected like any wrong one.
"""

from __future__ import annotations

from types import MappingProxyType

import torch
from torch import nn

PRECISIONS = MappingProxyType({"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64,
              "float32-invariant": torch.float32, "bfloat16-invariant": torch.bfloat16, "int8": torch.float32,
              "float32-packed": torch.float32})  # read-only
ALIASES = MappingProxyType({"fp32": "float32", "32": "float32", "bf16": "bfloat16", "fp64": "float64", "64": "float64",
           "fp32i": "float32-invariant", "fp32-invariant": "float32-invariant", "bf16i": "bfloat16-invariant",
           "bf16-invariant": "bfloat16-invariant", "i8": "int8", "fp32p": "float32-packed",
           "fp32-packed": "float32-packed", "packed": "float32-packed"})
# batch-invariant precisions (:mod:`lightning_bpd.kernels.invariant`): float32 with float64 products and attention;
# bfloat16 (its oneDNN products are invariant already) with float64 attention
INVARIANT = ("float32-invariant", "bfloat16-invariant")
# float32 weights, int8 products with per-row activation scales, float64 attention (:mod:`lightning_bpd.kernels.int8`)
INT8 = "int8"
# float32 weights packed once for oneDNN (batch-invariant products on these CPUs), float64 attention
# (:mod:`lightning_bpd.kernels.onednn`)
PACKED = "float32-packed"


def canonical_precision(name: str) -> str:
    """``float32`` / ``bfloat16`` / ``float64`` / ``float32-invariant`` (or ``fp32``, ``bf16``, ``fp64``,
    ``fp32i``, ``bf16i``) -> its canonical name; one clear error for any other."""
    key = ALIASES.get(str(name).lower(), str(name).lower())
    if key not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}: use one of {', '.join(PRECISIONS)} (or bf16, fp32, fp32i, bf16i, fp32p)")
    return key


def parse_precision(name: str) -> torch.dtype:
    """A precision name (:func:`canonical_precision`) -> the dtype of the model's weights."""
    return PRECISIONS[canonical_precision(name)]


def precision_name(dtype: torch.dtype) -> str:
    """The canonical name of a precision dtype (``torch.bfloat16`` -> ``bfloat16``)."""
    for name, value in PRECISIONS.items():
        if value == dtype:
            return name
    raise ValueError(f"no inference precision for dtype {dtype}")


def model_dtype(model: nn.Module) -> torch.dtype:
    """The dtype of the model's floating-point parameters."""
    return next(p.dtype for p in model.parameters() if p.is_floating_point())
