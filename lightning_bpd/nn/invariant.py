"""Batch-invariant float32 inference: matrix products and attention accumulated in float64. Torch only.

Exact blockwise decoding reproduces greedy decoding when p_1 at a position comes out bit for bit the
same from the k-token verify pass as from greedy's 1-token step. In float32 it does not quite: MKL
multiplies 1 row and k rows with different kernels, and fused attention blocks k queries differently
from 1, so results differ by ~1e-7 relative. A categorical output rarely has a near-tie that small; the
Gaussian intensity output (:mod:`~lightning_bpd.nn.intensity_prior`) has one wherever the predicted mean
sits near a half level, so exact decoding of a 3,072-intensity image drifts from greedy on many faces.

Inside :func:`batch_invariant`, every product of the model (:func:`linear`, :func:`attention`) casts its
float32 operands to float64, multiplies there and rounds the result to float32. The float64 results of
two kernels differ by ~1e-16 relative, so after rounding to float32 they agree unless a value falls
within that distance of a float32 rounding boundary (a chance of ~2^-29 per value), and the rest of the
model (layer norms, residual adds, softmax inside attention is float64 too) works row by row. Weights,
activations between the products, and the KV cache stay float32, so the outputs are float32 inference
(they differ from plain float32 ones only where plain float32 rounding itself was ambiguous). Measured
cost on these CPUs (1 thread, batch 1): 1.15x a plain float32 decode for a d 64 image model, 1.45x at d 128
(float64 copies of the weights are made once per context). Both greedy and blockwise decoding must run inside the same context.

A bfloat16 model needs only its attention widened: oneDNN's bfloat16 products are batch-invariant on
these CPUs already (:mod:`~lightning_bpd.nn.precision`), so inside the context its products stay
bfloat16 and attention is taken in float64 and rounded to bfloat16 (``bfloat16-invariant``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor
from torch.nn import functional as F

from lightning_bpd.nn import int8

_state = {"on": False}
WIDENED = (torch.float32, torch.bfloat16)  # attention in these dtypes is taken in float64 (products: float32 only)
_wide: dict[int, tuple[Tensor, int, Tensor]] = {}  # id(weight) -> (weight, its version, float64 copy)


def enabled() -> bool:
    """Whether batch-invariant inference is on (:func:`batch_invariant` or :func:`set_batch_invariant`)."""
    return _state["on"]


def is_active(x: Tensor) -> bool:
    """Whether products of the float32 tensor ``x`` are to be taken in float64 now (inference only)."""
    return _state["on"] and x.dtype == torch.float32 and not torch.is_grad_enabled()


@contextmanager
def batch_invariant(on: bool = True) -> Iterator[None]:
    """Float32 products accumulated in float64 for the ``with`` block (``on=False``: a no-op)."""
    before = _state["on"]
    _state["on"] = before or on
    try:
        yield
    finally:
        _state["on"] = before
        if not before:
            _wide.clear()


def set_batch_invariant(on: bool) -> None:
    """Switch it on (or off) for the rest of the process: ``decode`` and ``bench`` with that precision."""
    _state["on"] = on
    if not on:
        _wide.clear()


def wide(weight: Tensor) -> Tensor:
    """A float64 copy of a weight; of a parameter made once while it is unchanged (its in-place version
    counter), of any other tensor (e.g. an output layer assembled per call) made now."""
    if not isinstance(weight, torch.nn.Parameter):
        return weight.detach().double()
    key = id(weight)
    hit = _wide.get(key)
    if hit is not None and hit[0] is weight and hit[1] == weight._version:
        return hit[2]
    copy = weight.detach().double()
    _wide[key] = (weight, weight._version, copy)
    return copy


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear`` in float64, rounded to float32: (..., in) -> (..., out)."""
    return F.linear(x.double(), wide(weight), None if bias is None else wide(bias)).float()


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` of (B, H, T, Dh) tensors; inside :func:`batch_invariant` (and with
    int8 products, :mod:`~lightning_bpd.nn.int8`) taken in float64 and rounded back to the inputs' dtype
    (float32 or bfloat16), the plain kernel otherwise."""
    if not ((_state["on"] or int8.enabled()) and q.dtype in WIDENED and not torch.is_grad_enabled()):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=attn_mask,
                                          dropout_p=dropout_p).to(q.dtype)
