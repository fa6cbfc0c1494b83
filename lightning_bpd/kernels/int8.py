"""int8 inference that stays batch-invariant: int8 weights per output row, int8 activations per input row. Torch only.

On CPU a decoder step at batch 1 streams its weights for one row, so its cost follows their bytes: in int8 a
product streams a quarter of float32's, and fbgemm's int8 kernels cost little more for the 8 rows of a
verify pass than for 1 (a 256 -> 1024 product on an AMD EPYC core, cold weights: the int8 kernel 22 / 30 us
for 1 / 8 rows, float32 119 / 193 us; the per-row scaling below adds ~20 us a product).

Plain dynamic quantization (``torch.ao`` dynamic ``Linear``) quantizes the activations of a whole call with
one scale, so a row's result depends on the other rows multiplied with it: the k-token verify pass would
round differently from the 1-token greedy step, and exact decoding would drift from greedy. Here every input
row x is divided by its own max |x| (so it lies in [-1, 1], its largest entry exactly +-1), the int8 product
quantizes it on one fixed grid, that of [-1, 1] (``UNIT_SCALE``, ``UNIT_ZERO_POINT``: what fbgemm's dynamic
product picks for a call whose activations span exactly [-1, 1]), its int32 accumulation is exact, and the
row's scale multiplies the result back. A row's output is then the same function of that row alone, whatever
the batch: with attention taken in float64 (:func:`lightning_bpd.kernels.invariant.attention`, as in
``bfloat16-invariant``) exact blockwise decoding reproduces int8 greedy decoding by construction. Activations
get 7 bits (fbgemm's ``reduce_range``: u8 x s8 pairs stay inside its int16 sums) and the weights 8, like
CTranslate2's int8 (per-row activation scales, per-channel weight scales). :func:`appended_range_product` is
the first construction of the same product (two constant columns +1, -1 appended so that the dynamic product
picks that grid), kept as the check that the fixed grid is fbgemm's.

Weights stay float32 in the model: an int8 runtime (:class:`~lightning_bpd.inference.product_kinds.Int8Products`,
precision ``int8`` of ``decode``, ``bench`` and the validation callback) packs its own copy of every weight once,
when it is built; :func:`reference_linear` is the slow, obviously correct version the tests compare.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

ENGINES = ("x86", "fbgemm")  # quantized engines with the dynamic int8 product this needs


def available() -> bool:
    """Whether this torch build has the CPU int8 dynamic product (fbgemm / x86 engine)."""
    return any(e in torch.backends.quantized.supported_engines for e in ENGINES) and all(
        hasattr(torch.ops.quantized, op) for op in ("linear_dynamic", "linear_with_input_q_dq_qweight_dq_output_fp32"))


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row symmetric int8 of ``weight`` (V, D): (the dequantized weight w^ (V, D) float64, the scales (V,))."""
    w = weight.detach().to(torch.float64)
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-30)  # (V,)
    q = (w / scale[:, None]).round().clamp(-127, 127)
    return q * scale[:, None], scale


def pack_int8(weight: Tensor, bias: Tensor | None = None) -> object:
    """``weight`` (V, D) as packed per-row int8 for ``quantized::linear_dynamic`` (float32 ``bias`` added in)."""
    if not available():
        raise RuntimeError("int8 products need a torch build with the fbgemm/x86 quantized engine (CPU)")
    w = weight.detach().float()
    _, scale = quantize_rows(w)
    with warnings.catch_warnings():  # quantized tensor creation warns about its future deprecation
        warnings.simplefilter("ignore")
        q = torch.quantize_per_channel(w, scale, torch.zeros(w.shape[0], dtype=torch.long), 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(q, None if bias is None else bias.detach().float())


def int8_linear(x: Tensor, packed: object, out_features: int) -> Tensor:
    """The plain dynamic int8 product (activations quantized per call, not per row: proposals only) of ``x``
    (..., D) float32 with a :func:`pack_int8` weight: (..., out_features) float32."""
    flat = x.reshape(-1, x.shape[-1]).float()
    return torch.ops.quantized.linear_dynamic(flat, packed, True).reshape(*x.shape[:-1], out_features)


UNIT_SCALE = 2.0 / 127  # fbgemm's 7-bit activation grid of [-1, 1] (scale, zero point)
UNIT_ZERO_POINT = 64  # (row_int8 spells both out)

class RowInt8:
    """``F.linear(x, weight, bias)`` with int8 weights (per output row) and int8 activations (per input row)."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        w = weight.detach().float()
        self.out_features, self.in_features = w.shape
        self.packed = pack_int8(w)  # (out, in)
        self.bias = w.new_zeros(w.shape[0]) if bias is None else bias.detach().float().clone()  # (out,)

    def __call__(self, x: Tensor) -> Tensor:
        """(..., in) float32 -> (..., out) float32."""
        return row_int8(x, self.packed, self.bias)


def row_int8(x: Tensor, packed: torch.classes.quantized.LinearPackedParamsBase, bias: Tensor) -> Tensor:
    """The product of :class:`RowInt8` (also compiled into :mod:`~lightning_bpd.nn.lean_step`'s TorchScript):
    x (..., in) scaled per row to [-1, 1], quantized on [-1, 1]'s fixed grid, the exact int8 product with the
    packed weight (out, in), the row's scale multiplied back and ``bias`` (out,) added -> (..., out)."""
    flat = x.reshape(-1, x.shape[-1])  # (N, in)
    scale = flat.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)  # (N, 1) (vector_norm(inf) is slower)
    # UNIT_SCALE, UNIT_ZERO_POINT spelled out (TorchScript reads no float globals)
    out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(flat / scale, 2.0 / 127, 64, packed)
    return torch.addcmul(bias, out, scale).reshape(list(x.shape[:-1]) + [out.shape[1]])


def appended_range_product(x: Tensor, weight: Tensor) -> Tensor:
    """The first construction of :func:`row_int8`'s product, without the bias: x (..., in) scaled per row to
    [-1, 1], two constant columns +1, -1 appended (against two zero weight columns) so that fbgemm's dynamic
    product quantizes every call on exactly [-1, 1], the row's scale multiplied back -> (..., out). Tests check
    that the fixed grid gives the same bits."""
    w = weight.detach().float()
    packed_w = pack_int8(torch.cat([w, w.new_zeros(w.shape[0], 2)], dim=1))  # (out, in + 2): zeros
    flat = x.reshape(-1, x.shape[-1])
    scale = flat.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)
    unit = torch.cat([flat / scale, torch.tensor([[1.0, -1.0]]).expand(flat.shape[0], 2)], dim=1)  # range [-1, 1]
    out = torch.ops.quantized.linear_dynamic(unit, packed_w, True)
    return (out * scale).reshape(list(x.shape[:-1]) + [w.shape[0]])


def reference_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """The same arithmetic spelled out in float64, one row at a time: each row scaled to [-1, 1] and rounded to
    the int8 product's activation grid (step 2/127, as fbgemm's ``reduce_range`` quantization of [-1, 1] lands),
    the weights per row to +-127 levels, exact integer products, scaled back (float rounding differs)."""
    w = weight.detach().double()
    w_scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-30)  # (out,)
    q_w = (w / w_scale[:, None]).round().clamp(-127, 127)  # (out, in)
    step = UNIT_SCALE
    rows = []
    for row in x.reshape(-1, x.shape[-1]).double():
        scale = row.abs().max().clamp(min=1e-30)
        q_x = (row / scale / step).round()  # integer levels -64 .. 64
        rows.append((q_w @ q_x) * w_scale * step * scale)
    out = torch.stack(rows).reshape(*x.shape[:-1], w.shape[0])
    return out if bias is None else out + bias.double()
