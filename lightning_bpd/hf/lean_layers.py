"""A BART-family decoder step (Marian, BART, mBART) from the layers' weights, without the modules around them.

:meth:`HFSeq2SeqBlockwise.decode_step <lightning_bpd.hf.base.HFSeq2SeqBlockwise.decode_step>` calls each Hugging
Face decoder layer as a module, which is the reference. At batch 1 on a CPU most of such a step is the code
around its products: the attention module's cache protocol, shape bookkeeping, kwargs plumbing and the
attention-interface lookup, about 1.3 ms per layer of the Multi30k-shaped Marian (d 256) against well under a
millisecond of arithmetic. :class:`LeanDecoder` runs the same products, layer norms, activation and attention
kernel (``F.scaled_dot_product_attention`` with the layer's scaling for ``sdpa``, HF's eager formula for
``eager``) in the same order from the weights listed once, and writes the keys and values into the same
:class:`~lightning_bpd.nn.kv_cache.KVCache`. Its products go through the runtime's ``products`` as the layers'
own do (``ProductLinear``), so every precision applies unchanged. The two are compared in ``tests/hf/``.

A runtime turns it on (``InferenceOptions.lean_steps``); the model itself, training and T5 (its relative
position bias and gated, bias-free blocks) keep the modules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.products import Products

Affine = tuple[Tensor, Tensor | None]  # weight (out, in), bias
Norm = tuple[Tensor, Tensor, float]  # layer norm weight, bias, eps


@dataclass(frozen=True)
class LeanLayer:
    """One decoder layer's tensors, in the order the step reads them."""

    q: Affine
    k: Affine
    v: Affine
    o: Affine
    self_norm: Norm
    cross_q: Affine
    cross_o: Affine
    cross_norm: Norm
    fc1: Affine
    fc2: Affine
    final_norm: Norm
    activation: Callable[[Tensor], Tensor]


def affine(linear: nn.Linear) -> Affine:
    return linear.weight, linear.bias


def norm(layer_norm: nn.LayerNorm) -> Norm:
    return layer_norm.weight, layer_norm.bias, layer_norm.eps


def layer_norm(x: Tensor, n: Norm) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], n[0], n[1], n[2])


def sublayer(x: Tensor, n: Norm, pre_norm: bool, fn: Callable[[Tensor], Tensor]) -> Tensor:
    """A residual sublayer as the HF layers run it: pre-norm (mBART) x + fn(LN(x)); post-norm (Marian, BART)
    LN(x + fn(x))."""
    return x + fn(layer_norm(x, n)) if pre_norm else layer_norm(x + fn(x), n)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scaling: float, sdpa: bool) -> Tensor:
    """(B, H, T, Dh) queries over (B, H, S, Dh) keys and values -> (B, T, H * Dh), as transformers'
    ``sdpa_attention_forward`` (not causal: a mask or none) or ``eager_attention_forward`` computes it."""
    if sdpa:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    else:
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling
        if mask is not None:
            scores = scores + mask
        out = torch.matmul(F.softmax(scores, dim=-1), v)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def feed_forward(h: Tensor, fc1: Affine, fc2: Affine, activation: Callable[[Tensor], Tensor],
                 linear: Callable[..., Tensor]) -> Tensor:
    return linear(activation(linear(h, *fc1)), *fc2)


def lean_layer(layer: nn.Module) -> LeanLayer:
    """A Marian / BART / mBART decoder layer's tensors (the parameters themselves, not copies)."""
    attn, cross = layer.self_attn, layer.encoder_attn
    return LeanLayer(affine(attn.q_proj), affine(attn.k_proj), affine(attn.v_proj), affine(attn.out_proj),
                     norm(layer.self_attn_layer_norm), affine(cross.q_proj), affine(cross.out_proj),
                     norm(layer.encoder_attn_layer_norm), affine(layer.fc1), affine(layer.fc2),
                     norm(layer.final_layer_norm), layer.activation_fn)


class LeanDecoder:
    """The decoder layers of a BART-family base as one function of (inputs, positions, masks, cache).

    ``pre_norm``: mBART's layers (norm, sublayer, residual); else Marian's and BART's (sublayer, residual, norm).
    ``implementation``: the base's attention (``sdpa``: boolean masks; ``eager``: additive float masks).
    """

    def __init__(self, layers: nn.ModuleList, pre_norm: bool, n_heads: int, head_dim: int, implementation: str) -> None:
        self.layers = [lean_layer(layer) for layer in layers]
        self.pre_norm = pre_norm
        self.n_heads, self.head_dim = n_heads, head_dim
        self.scaling = float(layers[0].self_attn.scaling)
        self.sdpa = implementation == "sdpa"

    def __call__(self, x: Tensor, positions: Tensor, stop: int, self_mask: Tensor, cache: KVCache,
                 cross: list[tuple[Tensor, Tensor]], cross_mask: Tensor, products: Products) -> Tensor:
        """First-layer inputs x (B, T, D) at ``positions`` (B, T) -> the last layer's output (B, T, D), writing
        each layer's keys and values at ``positions`` of ``cache`` and reading its slots 0..stop-1.
        ``self_mask`` (B, 1, T, stop) and ``cross_mask`` (B, 1, 1, S) as :func:`~lightning_bpd.hf.step_cache.as_mask`
        makes them; ``cross``: per layer the source keys and values (B, H, S, Dh)."""
        for i, w in enumerate(self.layers):
            x = self.layer(x, i, w, positions, stop, self_mask, cache, cross[i], cross_mask, products.linear)
        return x

    def layer(self, x: Tensor, i: int, w: LeanLayer, positions: Tensor, stop: int, self_mask: Tensor, cache: KVCache,
              cross: tuple[Tensor, Tensor], cross_mask: Tensor, linear: Callable[..., Tensor]) -> Tensor:
        """Decoder layer ``i`` (its tensors ``w``) on x (B, T, D); ``cross``: its source keys and values."""
        heads = (x.shape[0], x.shape[1], self.n_heads, self.head_dim)
        scaling, sdpa = self.scaling, self.sdpa

        def self_attention(h: Tensor) -> Tensor:
            q = linear(h, *w.q).view(heads).transpose(1, 2)  # (B, H, T, Dh)
            cache.write(i, positions, linear(h, *w.k).view(heads), linear(h, *w.v).view(heads))
            keys, values = cache.view(i, stop)  # (B, S', H, Dh)
            return linear(attend(q, keys.transpose(1, 2), values.transpose(1, 2), self_mask, scaling, sdpa), *w.o)

        def cross_attention(h: Tensor) -> Tensor:
            q = linear(h, *w.cross_q).view(heads).transpose(1, 2)
            return linear(attend(q, *cross, cross_mask, scaling, sdpa), *w.cross_o)

        x = sublayer(x, w.self_norm, self.pre_norm, self_attention)
        x = sublayer(x, w.cross_norm, self.pre_norm, cross_attention)
        return sublayer(x, w.final_norm, self.pre_norm, lambda h: feed_forward(h, w.fc1, w.fc2, w.activation, linear))


class LeanEncoderLayer:
    """A Marian / BART / mBART encoder layer's forward from its weights: installed as the layer's ``forward`` on a
    runtime's snapshot (:meth:`install`), so the HF encoder keeps its own embeddings, mask and loop while each layer
    runs the same products, norms and attention kernel without the attention module's plumbing. With gradients
    on or in training mode it hands the call to the layer's own forward."""

    def __init__(self, layer: nn.Module, pre_norm: bool, implementation: str) -> None:
        attn = layer.self_attn
        self.layer, self.pre_norm, self.sdpa = layer, pre_norm, implementation == "sdpa"
        self.q, self.k, self.v, self.o = affine(attn.q_proj), affine(attn.k_proj), affine(attn.v_proj), affine(attn.out_proj)
        self.self_norm, self.final_norm = norm(layer.self_attn_layer_norm), norm(layer.final_layer_norm)
        self.fc1, self.fc2 = affine(layer.fc1), affine(layer.fc2)
        self.n_heads, self.head_dim, self.scaling = attn.num_heads, attn.head_dim, float(attn.scaling)

    @classmethod
    def install(cls, layers: nn.ModuleList, pre_norm: bool, implementation: str) -> None:
        for layer in layers:
            if not isinstance(layer.__dict__.get("forward"), cls):
                layer.forward = cls(layer, pre_norm, implementation)

    def __call__(self, hidden_states: Tensor, attention_mask: Tensor | None, **kwargs) -> Tensor:
        layer = self.layer
        if torch.is_grad_enabled() or layer.training:
            return type(layer).forward(layer, hidden_states, attention_mask, **kwargs)
        heads = (hidden_states.shape[0], hidden_states.shape[1], self.n_heads, self.head_dim)
        linear = layer.self_attn.q_proj.products.linear  # the runtime's products (ProductLinear)

        def self_attention(h: Tensor) -> Tensor:
            q, k, v = (linear(h, *w).view(heads).transpose(1, 2) for w in (self.q, self.k, self.v))  # (B, H, S, Dh)
            return linear(attend(q, k, v, attention_mask, self.scaling, self.sdpa), *self.o)

        x = sublayer(hidden_states, self.self_norm, self.pre_norm, self_attention)
        x = sublayer(x, self.final_norm, self.pre_norm,
                     lambda h: feed_forward(h, self.fc1, self.fc2, layer.activation_fn, linear))
        if x.dtype == torch.float16 and not torch.isfinite(x).all():  # as the HF layers clamp half precision
            limit = torch.finfo(x.dtype).max - 1000
            x = torch.clamp(x, min=-limit, max=limit)
        return x
