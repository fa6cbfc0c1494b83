"""How a model's matrix products and attention are taken: an object each module holds, not a global switch.

Every module that multiplies (attention, feed-forward, heads, the vocabulary projection) calls
``self.products.linear(x, weight, bias)`` and ``self.products.attention(q, k, v, mask)``. A freshly built
model holds :data:`FLOAT`: plain float products in the model's own dtype (:func:`~lightning_bpd.kernels.fast_linear.linear`
and ``F.scaled_dot_product_attention``), the reference arithmetic of training and of a model decoded directly.
An inference runtime (:func:`lightning_bpd.inference.build_runtime`) gives *its own copy* of the model another
kind (:mod:`lightning_bpd.inference.product_kinds`: float64-accumulated ``float32-invariant``, batch-invariant int8),
built once with every packed or widened weight it needs, so two runtimes of one model in two precisions live
in one process and neither changes the other's arithmetic, nor the model's. Torch only.

A kind decides only at inference: with gradients enabled every kind multiplies as :data:`FLOAT` does. A
runtime's calls run without gradients (:class:`~lightning_bpd.inference.runtime.Runtime`), so its kind holds under
``torch.enable_grad()`` too.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F

from lightning_bpd.kernels.fast_linear import linear as float_linear


class Products:
    """Plain products in the operands' own dtype: the reference kind. Subclasses override :meth:`linear`,
    :meth:`attention` and the lean step's hooks (:meth:`lean_int8_weights`, :meth:`lean_wide_weights`,
    :meth:`widens_attention`). Instances hold no state that changes after they are built."""

    name = "float"
    #: whether an encoder may run this kind through its TorchScript lean function (the float64 products of
    #: the invariant kinds run only through the modules and the lean decoder step)
    lean_encoder = True

    def __deepcopy__(self, memo: dict) -> Products:
        """Shared, not copied: a copy of a module multiplies as the module does (its packed copies of the
        original's weights are not the copy's; it makes its own on first use)."""
        return self

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """``F.linear(x, weight, bias)``: (..., in) -> (..., out)."""
        return float_linear(x, weight, bias)

    def attention(self, q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None,
                  dropout_p: float = 0.0) -> Tensor:
        """``F.scaled_dot_product_attention`` of (B, H, T, Dh) tensors."""
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)

    def widens_attention(self, x: Tensor) -> bool:
        """Whether attention of activations like ``x`` is taken in float64 at inference."""
        return False

    def applies(self, x: Tensor) -> bool:
        """Whether this kind may take products of ``x`` at all (else a caller falls back to :data:`FLOAT`'s
        module path): the plain kind takes everything."""
        return True

    def lean_int8_weights(self, x: Tensor, weights: list[Tensor]) -> list:
        """For the lean step: the packed int8 weight of every (weight, bias) pair in ``weights``, or [] when
        products of ``x`` are not int8."""
        return []

    def lean_fused(self, x: Tensor, groups: list[list[tuple[Tensor, Tensor | None]]]) -> tuple[list, list, list]:
        """For a lean step that fuses the products of one input: per group of (weight, bias) pairs, a copy of their
        stacked rows as this kind multiplies it, as (int8 packed weights, oneDNN-packed weights, stacked biases),
        one of the first two empty; or ([], [], []) when products of ``x`` are not taken from such copies."""
        return [], [], []

    def lean_wide_weights(self, x: Tensor, weights: list[Tensor]) -> list[Tensor]:
        """For the lean step: float64 copies of ``weights`` when products of ``x`` are taken in float64, else []."""
        return []

    def lean_onednn_weights(self, x: Tensor, weights: list[Tensor]) -> list[Tensor]:
        """For the lean step: the oneDNN-packed weight of every (weight, bias) pair in ``weights`` when products of
        ``x`` take them, else []."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


FLOAT = Products()  # stateless: the default of every module


def inference(x: Tensor) -> bool:
    """Whether a product of ``x`` happens at inference (no gradients), where a kind may differ from FLOAT."""
    return not torch.is_grad_enabled()


def version(t: Tensor | None) -> int:
    """A tensor's in-place version counter, for keying what is made from it (a projection's rows, an assembled output
    layer; -1: no tensor; 0: an inference tensor, which keeps none and cannot change outside inference mode)."""
    if t is None:
        return -1
    return 0 if t.is_inference() else t._version
