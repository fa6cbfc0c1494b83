"""The inference kinds of :class:`~lightning_bpd.nn.products.Products`, each built once for one model. Torch only.

- :class:`WideProducts` (``float32-invariant``, ``bfloat16-invariant``): float32 products accumulated in float64
  and rounded back (:mod:`~lightning_bpd.kernels.invariant`); attention of float32 or bfloat16 activations in float64.
  The verify pass and the greedy step then round alike, so exact decoding reproduces this precision's greedy.
- :class:`PackedProducts` (``float32-packed``): float32 products with weights packed once for oneDNN, whose
  products are batch-invariant on these CPUs (:mod:`~lightning_bpd.kernels.onednn`); attention in float64.
- :class:`Int8Products` (``int8``): float32 weights multiplied in int8 with a scale per weight row and per
  activation row (:class:`~lightning_bpd.kernels.int8.RowInt8`), attention in float64: batch-invariant by
  construction.

Both make their float64 or packed copies of the model's weights when they are built (:meth:`prepare`), from the
runtime's own snapshot of the model, and look them up by the weight tensor; a tensor made per call (a
projection assembled from the embedding, a draft vocabulary's rows) is converted per call. Nothing here is
shared between two instances, so two runtimes in two precisions can decode interleaved in one process.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lightning_bpd.kernels import int8 as int8_ops
from lightning_bpd.kernels import invariant, onednn
from lightning_bpd.nn.products import Products, inference
from lightning_bpd.nn.runtime_parts import RuntimeParts


class WideAttention(Products):
    """Attention of float32 / bfloat16 activations taken in float64 at inference (every kind below); products
    as their subclass says."""

    def widens_attention(self, x: Tensor) -> bool:
        return x.dtype in invariant.WIDENED and inference(x)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                  dropout_p: float = 0.0) -> Tensor:
        if not self.widens_attention(q):
            return super().attention(q, k, v, attn_mask, dropout_p)
        return invariant.attention(q, k, v, attn_mask, dropout_p)


class WideProducts(WideAttention):
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

    def lean_wide_weights(self, x: Tensor, weights: list[Tensor]) -> list[Tensor]:
        return [self.widened(w) for w in weights] if self.active(x) else []


class CopiedProducts(WideAttention):
    """float32 inference on CPU through copies of the weights made once (:class:`Int8Products`,
    :class:`PackedProducts`); float64 attention. A subclass says what a copy is (:meth:`copy`) and how it
    multiplies (:meth:`multiply`)."""

    lean_encoder = True
    MAX_MADE = 64  # copies of tensors that are not the model's own (made per call) kept, keyed by the tensor (and of
    # views of its own, keyed by their place)
    needs = "a CPU build of torch"  # what a subclass's kernel needs, for the error when it is missing

    def __init__(self) -> None:
        self.fused: tuple[Tensor, Tensor, tuple[list, list, list]] | None = None  # lean_fused's (first, last, copies)
        self.copies: dict[int, tuple[Tensor, Tensor | None, object]] = {}  # id(weight) -> (weight, bias, copy)
        self.made: dict[int, tuple[Tensor, Tensor | None, object]] = {}  # the same for others, made when first met
        self.prepared: dict[int, Tensor] = {}  # id -> every prepared weight and bias (whose views are kept by place)
        self.views: dict[tuple, object] = {}  # a view's place in prepared tensors (view_key) -> its copy

    def available(self) -> bool:
        return True

    def copy(self, weight: Tensor, bias: Tensor | None) -> object:
        raise NotImplementedError

    def fuse(self, groups: list[list[tuple[Tensor, Tensor | None]]]) -> tuple[list, list, list]:
        """:meth:`lean_fused`'s copies of ``groups``, made now."""
        raise NotImplementedError

    def lean_fused(self, x: Tensor, groups: list[list[tuple[Tensor, Tensor | None]]]) -> tuple[list, list, list]:
        """Made on first use for one list of groups (a runtime's snapshot, whose weights do not change) and kept
        while its first and last weights are the ones listed (one trunk a runtime)."""
        if not self.active(x):
            return [], [], []
        first, last = groups[0][0][0], groups[-1][-1][0]
        if self.fused is None or self.fused[0] is not first or self.fused[1] is not last:
            self.fused = (first, last, self.fuse(groups))
        return self.fused[2]

    def multiply(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        raise NotImplementedError

    def prepare(self, model: nn.Module) -> CopiedProducts:
        """Copies of every float32 ``nn.Linear`` of ``model`` (weight with its bias) and of its vocabulary
        projection, made now."""
        if not self.available():
            raise ValueError(f"precision {self.precision} needs {self.needs}; this build has none: pick "
                             "float32-invariant or float32")
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise ValueError(f"precision {self.precision} runs on the CPU; the model is on {device}: decode on "
                             "--device cpu, or pick bfloat16 / float32 on a GPU")
        pairs = [(m.weight, m.bias) for m in model.modules() if isinstance(m, nn.Linear)]
        if isinstance(model, RuntimeParts):  # its vocabulary projection (ours may be the tied embedding)
            pairs.append(model.output_layer())
        for weight, bias in pairs:
            if weight.dtype == torch.float32:
                self.copies[id(weight)] = (weight, bias, self.copy(weight, bias))
                self.prepared.update({id(t): t for t in (weight, bias) if t is not None})
        return self

    def copy_of(self, weight: Tensor, bias: Tensor | None) -> object:
        """The copy of a prepared (weight, bias) pair, or of another pair (a draft vocabulary's rows, a projection
        made per call) made now and kept while its tensors are (at most ``MAX_MADE`` pairs). A view of prepared
        weights (a slice of the paper head's rows, made anew at every call) is kept by where it lies in them, so it
        is copied once, not at every call."""
        for book in (self.copies, self.made):
            hit = book.get(id(weight))
            if hit is not None and hit[0] is weight and hit[1] is bias:
                return hit[2]
        place = self.view_key(weight, bias)
        if place is not None and place in self.views:
            return self.views[place]
        kept: dict = self.views if place is not None else self.made
        if len(kept) >= self.MAX_MADE:
            kept.clear()
        made = self.copy(weight, bias)
        if place is not None:
            self.views[place] = made
        else:
            self.made[id(weight)] = (weight, bias, made)
        return made

    def view_key(self, weight: Tensor, bias: Tensor | None) -> tuple | None:
        """Where ``weight`` and ``bias`` lie in prepared weights (the prepared base tensors stay alive in
        ``copies``, so their ids are theirs), or None if either is not a view of one."""
        key: list = []
        for t in (weight, bias):
            if t is None:
                key.append(None)
                continue
            base = t._base
            if base is None or id(base) not in self.prepared or self.prepared[id(base)] is not base:
                return None
            key.append((id(base), t.storage_offset(), tuple(t.shape), t.stride()))
        return tuple(key)

    def active(self, x: Tensor) -> bool:
        return x.dtype == torch.float32 and x.device.type == "cpu" and inference(x)

    def applies(self, x: Tensor) -> bool:
        return self.active(x)

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        if not self.active(x):
            return super().linear(x, weight, bias)
        return self.multiply(x, weight, bias)


def stacked_bias(pairs: list[tuple[Tensor, Tensor | None]]) -> Tensor | None:
    """The biases of (weight, bias) pairs stacked as their weights' rows are (zeros for a pair without), or None."""
    if all(b is None for _, b in pairs):
        return None
    return torch.cat([w.new_zeros(w.shape[0]) if b is None else b.detach() for w, b in pairs])


class Int8Products(CopiedProducts):
    """int8 products per weight row and activation row (float32 activations on CPU); float64 attention."""

    name = precision = "int8"
    needs = "torch's fbgemm/x86 quantized engine (CPU)"

    def available(self) -> bool:
        return int8_ops.available()

    def copy(self, weight: Tensor, bias: Tensor | None) -> int8_ops.RowInt8:
        return int8_ops.RowInt8(weight, bias)

    def multiply(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return self.copy_of(weight, bias)(x)  # type: ignore[operator]

    def lean_int8_weights(self, x: Tensor, weights: list[Tensor]) -> list:
        return [self.copy_of(weights[j], weights[j + 1]).packed for j in range(0, len(weights), 2)]  # type: ignore[attr-defined]

    def fuse(self, groups: list[list[tuple[Tensor, Tensor | None]]]) -> tuple[list, list, list]:
        """Per group a :class:`~lightning_bpd.kernels.int8.RowInt8` of the stacked rows: bitwise the separate
        products (per-row scales)."""
        made = [int8_ops.RowInt8(torch.cat([w for w, _ in group]), stacked_bias(group)) for group in groups]
        return [m.packed for m in made], [], [m.bias for m in made]


class PackedProducts(CopiedProducts):
    """float32 products with weights packed once for oneDNN (batch-invariant on these CPUs, cheap for several
    rows: :mod:`~lightning_bpd.kernels.onednn`); attention of float32 / bfloat16 in float64."""

    name = "packed"
    precision = "float32-packed"
    needs = "torch's oneDNN (mkldnn) packed-linear ops"

    def available(self) -> bool:
        return onednn.available()

    def copy(self, weight: Tensor, bias: Tensor | None) -> Tensor:
        return onednn.pack(weight.detach())  # the bias is added by the product

    def multiply(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return onednn.product(x, self.copy_of(weight, bias), None if bias is None else bias.detach())  # type: ignore[arg-type]

    def lean_onednn_weights(self, x: Tensor, weights: list[Tensor]) -> list[Tensor]:
        if not self.active(x):
            return []
        return [self.copy_of(weights[j], weights[j + 1]) for j in range(0, len(weights), 2)]  # type: ignore[misc]

    def fuse(self, groups: list[list[tuple[Tensor, Tensor | None]]]) -> tuple[list, list, list]:
        """Per group the stacked rows packed for oneDNN (each output column reduced as alone)."""
        return [], [onednn.pack(torch.cat([w.detach() for w, _ in group])) for group in groups], [
            stacked_bias(group) for group in groups]
