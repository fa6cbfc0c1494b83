"""Batch-invariant float32 products with oneDNN's packed weights (what inductor's CPU freezing uses). Torch only.

Exact blockwise decoding reproduces greedy decoding when p_1 at a position comes out bit for bit the
same from the k-token verify pass as from greedy's 1-token step. MKL's float32 ``F.linear`` is not
batch-invariant: a row's bits depend on how many rows were multiplied with it (its small-row panels
round differently). :mod:`~lightning_bpd.kernels.invariant` fixes that by taking products in float64, at a
cost. This module instead packs the weight once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplies with ``torch.ops.mkldnn._linear_pointwise``:
oneDNN then runs one brgemm kernel (``brg_matmul:avx512_core``) for every row count, and each row is
reduced over ``in`` in the same order however many rows come with it.

Measured on these CPUs (AMD EPYC, family 25 model 17 = Zen 4, AVX-512; torch 2.14.1 with oneDNN 3.12;
``tests/kernels/test_onednn.py``, ``python -m lightning_bpd.benchmarks.onednn_products``):

* With a weight packed without a batch-size hint (or with any hint >= 2, which gives the same
  ``AB16b64a`` layout), rows 1..64 are bitwise invariant for ``in <= 1024``, at 1 and 2 threads, and
  1 and 2 threads give the same bits. One packed weight serves every row count.
* For ``in > 1024`` (seen at 1152 .. 4096) a **1-row** product reduces over ``in`` in other blocks
  than a product of 2..64 rows (which all agree with one another). :class:`PackedLinear` therefore
  multiplies a single row as two copies of it and keeps the first (:data:`PAD_SINGLE_ROW_ABOVE`);
  with that, rows 1..64 are invariant for those shapes too. A 2-row product costs about what a
  1-row one does.
* A hint of 1 packs the weight in the plain ``ab`` layout; oneDNN then runs an AVX2 kernel for 1 row
  and an AVX-512 one for more: not invariant at any shape, and slower. :func:`pack` refuses it.

It is also cheap for several rows (``results/runtime/onednn_products.json``, 1 thread; first taken beside another
job, so noisy; ranges over three runs):
256 -> 8000 costs 0.19-0.37 ms for 1 row and 0.56-0.71 for 8 (``F.linear``: 0.29-0.77 and 1.14-1.48;
MKL's products are slow on this AMD CPU); 512 -> 58101 costs 7.4-11.9 and 7.8-8.4 ms (``F.linear``:
11.0-11.8 and 22.1-22.4). Each call has a fixed cost of ~15 us in the op (building the oneDNN
primitive's key and looking it up) plus ~1 us here, against ~5 us for ``F.linear``, so small 1-row
products are slower packed: 1024 -> 256 costs 0.037-0.045 ms against 0.026-0.027. The batch-size hint changes
neither speed nor bits (None, 2 and 8 pack one layout), except a hint of 1 (above).

The packed weight is a ``torch._mkldnn`` tensor: inference only (no autograd, CPU, float32).
"""

# no ``from __future__ import annotations``: TorchScript reads :func:`product`'s signature (it is called from the
# scripted lean step, back in Python) and cannot resolve string annotations of an ignored function
from typing import Optional

import torch
from torch import Tensor
from torch.nn import functional as F

PAD_SINGLE_ROW_ABOVE = 1024  # in_features above which a 1-row product is taken as 2 rows (see the module doc)


def available() -> bool:
    """Whether this torch has oneDNN (mkldnn) and the packed-linear ops this module uses."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


def pack(weight: Tensor, batch_size_hint: int | None = None) -> Tensor:
    """``weight`` (out, in) float32 reordered into oneDNN's layout for a product with
    ``batch_size_hint`` rows (None: oneDNN's default). The result is a ``torch._mkldnn`` tensor (out, in).

    A hint of 1 is refused: it keeps the plain layout, whose 1-row and n-row products use different
    kernels (not batch-invariant). Hints >= 2 and None give the same blocked layout on these CPUs."""
    if weight.dim() != 2 or weight.dtype != torch.float32:
        raise ValueError(f"expected a 2-D float32 weight (out, in), got {tuple(weight.shape)} {weight.dtype}")
    if batch_size_hint is not None and batch_size_hint < 2:
        raise ValueError(f"batch_size_hint {batch_size_hint}: use None or >= 2 (1 packs a layout whose 1-row "
                         "and n-row products differ in their bits)")
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), batch_size_hint)


def packed_product(x: Tensor, packed: Tensor, bias: Tensor | None) -> Tensor:
    """oneDNN's ``x @ W.T + bias`` for ``x`` (rows, in) float32 and ``packed`` from :func:`pack`: (rows, out).
    No single-row padding (see :class:`PackedLinear`)."""
    return torch.ops.mkldnn._linear_pointwise.default(x, packed, bias, "none", [], "")


@torch.jit.ignore
def product(x: Tensor, packed: Tensor, bias: Optional[Tensor]) -> Tensor:  # noqa: UP045 (TorchScript)
    """``x`` (..., in) float32 times a :func:`pack`-ed weight (out, in), plus ``bias``: (..., out), batch-invariant;
    a single row with ``in`` > :data:`PAD_SINGLE_ROW_ABOVE` is multiplied as two copies of itself (see the module
    doc)."""
    flat = x.reshape(-1, x.shape[-1])  # (rows, in)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    if flat.shape[0] == 1 and flat.shape[1] > PAD_SINGLE_ROW_ABOVE:  # a 2-row product reduces like every n >= 2
        out = packed_product(flat.expand(2, -1).contiguous(), packed, bias)[:1]  # (1, out)
    else:
        out = packed_product(flat, packed, bias)  # (rows, out)
    return out.reshape(list(x.shape[:-1]) + [out.shape[-1]])


class PackedLinear:
    """``F.linear(x, weight, bias)`` with the weight packed once for oneDNN: batch-invariant in float32.

    ``PackedLinear(weight, bias=None)`` with ``weight`` (out, in) and ``bias`` (out,) float32; calling it on
    ``x`` (..., in) float32 returns (..., out), whatever the leading dims and row count. Row r of the
    result has the same bits however many rows were multiplied with it (1..64 measured; see the module
    doc). Inference only: the packed copy does not follow later changes to ``weight`` and has no autograd.
    """

    def __init__(self, weight: Tensor, bias: Tensor | None = None, *, batch_size_hint: int | None = None) -> None:
        if not available():
            raise RuntimeError("oneDNN packed linear ops are not available in this torch build")
        self.out_features, self.in_features = weight.shape
        self.weight = pack(weight, batch_size_hint)  # (out, in), torch._mkldnn layout
        if bias is not None:
            if bias.shape != (self.out_features,) or bias.dtype != torch.float32:
                raise ValueError(f"expected a float32 bias ({self.out_features},), got "
                                 f"{tuple(bias.shape)} {bias.dtype}")
            bias = bias.detach().contiguous().clone()
        self.bias = bias  # (out,) or None

    def __repr__(self) -> str:
        return f"PackedLinear(in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None})"

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) float32 -> (..., out) float32."""
        if x.dtype != torch.float32 or x.shape[-1] != self.in_features or not x.is_cpu:
            raise ValueError(f"expected a CPU float32 (..., {self.in_features}) input, got "
                             f"{tuple(x.shape)} {x.dtype} on {x.device}")
        return product(x, self.weight, self.bias)


def reference(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """Plain ``F.linear(x, weight, bias)`` (MKL on CPU): (..., in) -> (..., out), for tests to compare with."""
    return F.linear(x, weight, bias)
