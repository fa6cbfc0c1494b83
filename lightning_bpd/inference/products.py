"""The inference kinds of :class:`~lightning_bpd.nn.products.Products`, each built once for one model. Torch only.

- :class:`WideProducts` (``float32-invariant``, ``bfloat16-invariant``): float32 products accumulated in float64
  and rounded back (:mod:`~lightning_bpd.nn.invariant`); attention of float32 or bfloat16 activations in float64.
  The verify pass and the greedy step then round alike, so exact decoding reproduces this precision's greedy.
- :class:`Int8Products` (``int8``): float32 weights multiplied in int8 with a scale per weight row and per
  activation row (:class:`~lightning_bpd.nn.int8.RowInt8`), attention in float64: batch-invariant by
  construction.

Both make their float64 or packed copies of the model's weights when they are built (:meth:`prepare`), from the
runtime's own snapshot of the model, and look them up by the weight tensor; a tensor made per call (a
projection assembled from the embedding, a draft vocabulary's rows) is converted per call. Nothing here is
shared between two instances, so two runtimes in two precisions can decode interleaved in one process.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_bpd.nn import int8 as int8_ops
from lightning_bpd.nn import invariant
from lightning_bpd.nn.products import Products, inference


class WideProducts(Products):
    """float32 products in float64 rounded to float32; attention of float32 / bfloat16 in float64."""

    name = "wide"
    lean_encoder = False

    def __init__(self) -> None:
        self.wide: dict[int, tuple[Tensor, Tensor]] = {}  # id(weight) -> (weight, its float64 copy)

    def prepare(self, model: nn.Module) -> WideProducts:
        """float64 copies of every float32 parameter of ``model``, made now."""
        for p in model.parameters():
            if p.dtype.is_floating_point and p.dtype != torch.float64:
                self.wide[id(p)] = (p, p.detach().double())
        return self

    def widened(self, weight: Tensor) -> Tensor:
        """The float64 copy of a prepared weight, or of any other tensor made now."""
        hit = self.wide.get(id(weight))
        return hit[1] if hit is not None and hit[0] is weight else weight.detach().double()

    def active(self, x: Tensor) -> bool:
        return x.dtype == torch.float32 and inference(x)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if not self.active(x):
            return super().linear(x, weight, bias)
        return invariant.linear(x, self.widened(weight), None if bias is None else self.widened(bias))

    def widens_attention(self, x: Tensor) -> bool:
        return x.dtype in invariant.WIDENED and inference(x)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                  dropout_p: float = 0.0) -> Tensor:
        if not self.widens_attention(q):
            return super().attention(q, k, v, attn_mask, dropout_p)
        return invariant.attention(q, k, v, attn_mask, dropout_p)

    def lean_wide_weights(self, x: Tensor, weights: list[Tensor]) -> list[Tensor]:
        return [self.widened(w) for w in weights] if self.active(x) else []


class Int8Products(WideProducts):
    """int8 products per weight row and activation row (float32 activations on CPU); float64 attention."""

    name = "int8"
    lean_encoder = True

    def __init__(self) -> None:
        super().__init__()
        self.packed: dict[int, tuple[Tensor, Tensor | None, int8_ops.RowInt8]] = {}  # id(weight) -> packed

    def prepare(self, model: nn.Module) -> Int8Products:
        """Packed int8 copies of every ``nn.Linear`` of ``model`` (weight with its bias), made now."""
        if not int8_ops.available():
            raise ValueError("precision int8 needs torch's fbgemm/x86 quantized engine (CPU); this build has "
                             f"{torch.backends.quantized.supported_engines}")
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"precision int8 runs on the CPU (fbgemm's int8 products); the model is on {device}: "
                             "decode on --device cpu, or pick bfloat16 / float32 on a GPU")
        for m in model.modules():
            if isinstance(m, nn.Linear) and m.weight.dtype == torch.float32:
                self.packed[id(m.weight)] = (m.weight, m.bias, int8_ops.RowInt8(m.weight, m.bias))
        return self

    def row_int8(self, weight: Tensor, bias: Tensor | None) -> int8_ops.RowInt8:
        """The packed copy of a prepared (weight, bias) pair, or of any other pair packed now."""
        hit = self.packed.get(id(weight))
        if hit is not None and hit[0] is weight and hit[1] is bias:
            return hit[2]
        return int8_ops.RowInt8(weight, bias)

    def active(self, x: Tensor) -> bool:
        return x.dtype == torch.float32 and x.device.type == "cpu" and inference(x)

    def applies(self, x: Tensor) -> bool:
        return self.active(x)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if not self.active(x):
            return Products.linear(self, x, weight, bias)
        return self.row_int8(weight, bias)(x)

    def lean_int8_weights(self, x: Tensor, weights: list[Tensor]) -> list:
        return [self.row_int8(weights[j], weights[j + 1]).packed for j in range(0, len(weights), 2)]

    def lean_wide_weights(self, x: Tensor, weights: list[Tensor]) -> list[Tensor]:
        return []
