"""A Llama-family decoder step (Llama, Qwen2, Qwen3, Mistral) from the layers' weights, without the modules around them.

:meth:`HFCausalBlockwise.step <lightning_bpd.hf.causal.HFCausalBlockwise.step>` runs the base model's own forward,
which is the reference. At batch 1 on a CPU part of such a step is the code around its products: the decoder
layer's and the attention module's calls, kwargs plumbing, the mask and cache protocols and the attention-interface
lookup. :class:`LeanCausal` runs the same products (through the runtime's ``products``, as the layers' own
``ProductLinear`` do), RMSNorms, rotary embedding, activation and attention kernel in the same order from the
weights listed once, and writes the keys and values into the same :class:`~lightning_bpd.nn.kv_cache.KVCache`
(the prompt region and the decoded positions read as one view). Attention is taken as transformers' ``sdpa`` and
``eager`` functions take it, grouped-query attention included (one query: the query heads packed onto their key
heads; several: the keys repeated per query head), so the hidden states are bitwise the modules' (tested in
``tests/hf/test_lean_causal.py``). Other families keep the modules (:func:`lean_family`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lightning_bpd.hf.lean_causal_fused import (
    attend,
    fused_groups,
    fused_layers,
    rms_weighted,
    rotate_heads,
    scriptable,
)
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.products import Products

Affine = tuple[Tensor, Tensor | None]  # weight (out, in), bias
RMS = tuple[Tensor, float]  # RMSNorm weight, eps
Linear = Callable[[Tensor, Tensor, Tensor | None], Tensor]

FAMILIES = ("llama", "qwen2", "qwen3", "mistral")  # RMSNorm, rotary positions, (grouped-query) attention, gated MLP


@dataclass(frozen=True)
class LlamaLayer:
    """One decoder layer's tensors (the parameters themselves) and its mask's layer type ('' for one mask)."""

    input_norm: RMS
    q: Affine
    k: Affine
    v: Affine
    q_norm: RMS | None  # Qwen3: RMSNorm of each query / key head
    k_norm: RMS | None
    o: Affine
    post_norm: RMS
    gate: Affine
    up: Affine
    down: Affine
    activation: Callable[[Tensor], Tensor]
    layer_type: str


def affine(linear: nn.Linear) -> Affine:
    return linear.weight, linear.bias


def rms(norm: nn.Module | None) -> RMS | None:
    return None if norm is None else (norm.weight, float(norm.variance_epsilon))


def rms_norm(x: Tensor, n: RMS) -> Tensor:
    """transformers' Llama RMSNorm (:func:`~lightning_bpd.hf.lean_causal_fused.rms_weighted`) with ``n`` (weight, eps)."""
    return rms_weighted(x, n[0], n[1])


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x (B, T, H, Dh) at cos, sin (B, T, Dh): ``apply_rotary_pos_emb``'s arithmetic."""
    return rotate_heads(x, cos.unsqueeze(2), sin.unsqueeze(2))


def lean_family(base: nn.Module) -> bool:
    """Whether ``base`` (a transformers causal LM) is one :class:`LeanCausal` runs exactly: a family in
    :data:`FAMILIES` whose layers are the modules it reads (RMSNorm, q/k/v/o, gate/up/down)."""
    config = base.config
    if config.model_type not in FAMILIES or getattr(config, "pretraining_tp", 1) != 1:
        return False
    trunk = base.base_model
    layers = getattr(trunk, "layers", None)
    if layers is None or not all(hasattr(trunk, a) for a in ("embed_tokens", "rotary_emb", "norm")):
        return False
    return all(hasattr(layer, "self_attn") and hasattr(layer, "mlp") and hasattr(layer.mlp, "gate_proj")
               and hasattr(layer.input_layernorm, "variance_epsilon") for layer in layers)


def lean_layer(layer: nn.Module, layer_type: str) -> LlamaLayer:
    attn, mlp = layer.self_attn, layer.mlp
    return LlamaLayer(rms(layer.input_layernorm), affine(attn.q_proj), affine(attn.k_proj), affine(attn.v_proj),
                      rms(getattr(attn, "q_norm", None)), rms(getattr(attn, "k_norm", None)), affine(attn.o_proj),
                      rms(layer.post_attention_layernorm), affine(mlp.gate_proj), affine(mlp.up_proj),
                      affine(mlp.down_proj), mlp.act_fn, layer_type)


class LeanCausal:
    """The layers of a Llama-family trunk (``base.base_model``) as one function of (inputs, positions, masks,
    cache). ``implementation``: the base's attention (``sdpa``: boolean masks; ``eager``: additive float masks);
    ``typed``: the masks come by layer type (the config's ``layer_types``), else one mask for every layer."""

    def __init__(self, trunk: nn.Module, implementation: str, typed: bool) -> None:
        config = trunk.config
        types = list(config.layer_types) if typed else [""] * config.num_hidden_layers
        self.trunk = trunk
        self.layers = [lean_layer(layer, types[i]) for i, layer in enumerate(trunk.layers)]
        attn = trunk.layers[0].self_attn
        self.head_dim, self.groups_per_kv, self.scaling = attn.head_dim, attn.num_key_value_groups, float(attn.scaling)
        self.sdpa = implementation == "sdpa"
        first = self.layers[0]
        self.q_width, self.kv_width, self.ffn = first.q[0].shape[0], first.k[0].shape[0], first.gate[0].shape[0]
        self.scripted = scriptable(config)  # int8 and float32-packed runtimes: the layers in TorchScript, products fused
        self.groups = fused_groups(self.layers)  # (weight, bias) pairs of each fused product
        none = torch.zeros(0)
        self.norms = [t for w in self.layers for t in (w.input_norm[0], w.post_norm[0], *(
            (none, none) if w.q_norm is None or w.k_norm is None else (w.q_norm[0], w.k_norm[0])))]
        self.eps = [e for w in self.layers for e in (w.input_norm[1], w.post_norm[1], *(
            (0.0, 0.0) if w.q_norm is None or w.k_norm is None else (w.q_norm[1], w.k_norm[1])))]

    def lists(self, trunk: nn.Module) -> bool:
        """Whether these are ``trunk``'s own tensors (its first and last layers' first and last weights)."""
        first, last = trunk.layers[0], trunk.layers[-1]
        return (self.trunk is trunk and self.layers[0].q[0] is first.self_attn.q_proj.weight
                and self.layers[-1].down[0] is last.mlp.down_proj.weight)

    def __call__(self, tokens: Tensor, positions: Tensor, masks: dict[str, Tensor], cache: KVCache, slots: Tensor,
                 stop: int, products: Products, layers: tuple[int, ...] = ()) -> Any:
        """Inputs (B, T) at ``positions`` (B, T) -> the final-norm hidden states (B, T, D), writing each layer's keys
        and values at the cache ``slots`` (B, T) and reading its prompt region and slots 0..stop-1 under
        ``masks[layer type]`` (B, 1, T, P + stop) as :func:`~lightning_bpd.hf.step_cache.as_mask` makes them.
        ``products``: the runtime's (int8 and float32-packed ones run the layers as
        :func:`~lightning_bpd.hf.lean_causal_fused.fused_layers`, their products fused).
        With ``layers``: (hidden, the outputs of those decoder layers (B, T, len(layers) * D), as transformers'
        ``hidden_states[i + 1]``: the last layer's after the final norm)."""
        x = self.trunk.embed_tokens(tokens)  # (B, T, D)
        cos, sin = self.trunk.rotary_emb(x, position_ids=positions)  # (B, T, Dh) each
        fused = products.lean_fused(x, self.groups) if self.scripted else ([], [], [])
        wide = products.widens_attention(x)
        outputs: dict[int, Tensor] = {}
        if fused[0] or fused[1]:
            keep = sorted(set(layers))
            x, kept = self.fused_layers(x, cos, sin, masks, cache, slots, stop, fused, keep, wide)
            outputs = dict(zip(keep, kept))
        else:
            for i, w in enumerate(self.layers):
                x = self.layer(x, i, w, cos, sin, masks[w.layer_type], cache, slots, stop, products.linear, wide)
                if i in layers:
                    outputs[i] = x
        h = self.trunk.norm(x)
        if not layers:
            return h
        last = len(self.layers) - 1
        return h, torch.cat([h if i == last else outputs[i] for i in layers], dim=-1)

    def fused_layers(self, x: Tensor, cos: Tensor, sin: Tensor, masks: dict[str, Tensor], cache: KVCache,
                     slots: Tensor, stop: int, fused: tuple[list, list, list], keep: list[int],
                     wide: bool) -> Any:
        """The layers through :func:`~lightning_bpd.hf.lean_causal_fused.fused_layers` with ``fused`` products (the
        runtime's :meth:`~lightning_bpd.nn.products.Products.lean_fused` of :attr:`groups`) -> (x, the outputs of
        the layers ``keep``, in order)."""
        start, rows, places = cache.write_place(slots)
        return fused_layers(x, cos, sin, [masks[w.layer_type] for w in self.layers], cache.k, cache.v, start, rows,
                            places, cache.prefix + stop, self.norms, self.eps, *fused, self.q_width, self.kv_width,
                            self.ffn, self.head_dim, self.groups_per_kv, self.scaling, self.sdpa, wide, keep)

    def layer(self, x: Tensor, i: int, w: LlamaLayer, cos: Tensor, sin: Tensor, mask: Tensor, cache: KVCache,
              slots: Tensor, stop: int, linear: Linear, wide: bool = False) -> Tensor:
        """Decoder layer ``i`` (its tensors ``w``) on x (B, T, D); ``wide``: attention in float64 (:func:`attend`)."""
        b, t = x.shape[0], x.shape[1]
        h = rms_norm(x, w.input_norm)
        q = linear(h, *w.q).view(b, t, -1, self.head_dim)  # (B, T, H, Dh)
        k = linear(h, *w.k).view(b, t, -1, self.head_dim)  # (B, T, Hkv, Dh)
        v = linear(h, *w.v).view(b, t, -1, self.head_dim)
        if w.q_norm is not None and w.k_norm is not None:
            q, k = rms_norm(q, w.q_norm), rms_norm(k, w.k_norm)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        cache.write(i, slots, k, v)
        keys, values = cache.view_with_prefix(i, stop)  # (B, P + S', Hkv, Dh)
        a = attend(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), mask, self.groups_per_kv, self.scaling,
                   self.sdpa, wide)
        x = x + linear(a, *w.o)
        h = rms_norm(x, w.post_norm)
        return x + linear(w.activation(linear(h, *w.gate)) * linear(h, *w.up), *w.down)
