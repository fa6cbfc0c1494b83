"""Batch-invariant float32 inference: matrix products and attention accumulated in float64. Torch only.

Exact blockwise decoding reproduces greedy decoding when p_1 at a position comes out bit for bit the
same from the k-token verify pass as from greedy's 1-token step. In float32 it does not quite: MKL
multiplies 1 row and k rows with different kernels, and fused attention blocks k queries differently
from 1, so results differ by ~1e-7 relative. A categorical output rarely has a near-tie that small; the
Gaussian intensity output (:mod:`~lightning_bpd.nn.intensity_prior`) has one wherever the predicted mean
sits near a half level, so exact decoding of a 3,072-intensity image drifts from greedy on many faces.

With these products (:class:`~lightning_bpd.inference.product_kinds.WideProducts`, precision ``float32-invariant``), every product of the model (:func:`linear`, :func:`attention`) casts its
float32 operands to float64, multiplies there and rounds the result to float32. The float64 results of
two kernels differ by ~1e-16 relative, so after rounding to float32 they agree unless a value falls
within that distance of a float32 rounding boundary (a chance of ~2^-29 per value), and the rest of the
model (layer norms, residual adds, softmax inside attention is float64 too) works row by row. Weights,
activations between the products, and the KV cache stay float32, so the outputs are float32 inference
(they differ from plain float32 ones only where plain float32 rounding itself was ambiguous). Measured
cost on these CPUs (1 thread, batch 1): 1.15x a plain float32 decode for a d 64 image model, 1.45x at d 128
(float64 copies of the weights are made once, when the runtime is built). Greedy and blockwise decoding
must run with the same products (one runtime).

A bfloat16 model needs only its attention widened: oneDNN's bfloat16 products are batch-invariant on
these CPUs already (:mod:`~lightning_bpd.inference.precision`), so with ``bfloat16-invariant`` its products stay
bfloat16 and attention is taken in float64 and rounded to bfloat16 (``bfloat16-invariant``).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

WIDENED = (torch.float32, torch.bfloat16)  # attention in these dtypes is taken in float64 (products: float32 only)


def linear(x: Tensor, wide_weight: Tensor, wide_bias: Tensor | None = None) -> Tensor:
    """``F.linear`` in float64 with float64 copies of the weight and bias, rounded to float32: (..., in) -> (..., out)."""
    return F.linear(x.double(), wide_weight, wide_bias).float()


def attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """``F.scaled_dot_product_attention`` of (B, H, T, Dh) tensors taken in float64 and rounded back to the
    inputs' dtype (float32 or bfloat16)."""
    if attn_mask is not None and attn_mask.is_floating_point():
        attn_mask = attn_mask.double()
    return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=attn_mask,
                                          dropout_p=dropout_p).to(q.dtype)
