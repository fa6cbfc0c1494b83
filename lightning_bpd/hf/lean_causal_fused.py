"""The Llama-family layers of :class:`~lightning_bpd.hf.lean_causal.LeanCausal` as one TorchScript function for the
runtimes whose products are copies made once (int8, float32-packed), with the products that read one input fused:
q, k and v as one product, gate and up as another; and the arithmetic it shares with the Python lean layers
(:func:`rms_weighted`, :func:`rotate_heads`, :func:`attend`: transformers' ops, attention widened to float64 where
the products ask for it).

At batch 1 on a CPU the int8 step of SmolLM2-135M spent about a third of its time outside any kernel: 211 products,
each a Python call through the runtime's products and :func:`~lightning_bpd.kernels.int8.row_int8`'s six small ops,
and the layer's own Python around them. Here the layer loop runs in TorchScript's interpreter, and a layer makes 4
products instead of 7 (on an AMD EPYC core, 1 thread, SmolLM2's shape: an int8 step 29.5 -> 15.1 ms).

Fusing is bitwise the separate products, which the tests check against the lean Python layers
(``tests/hf/test_lean_causal.py``). In int8 :func:`~lightning_bpd.kernels.int8.row_int8` scales each input row by
its own max |x| and quantizes it on one fixed grid, so q, k and v (and gate and up) quantize their common input to
the same integers; their weights are quantized per output row, so stacking their rows changes no row's integers;
the int32 accumulation is exact and each output column is scaled back by its own row's scales. oneDNN's packed
float32 product reduces each output column over the input in blocks that do not depend on the number of columns
(:mod:`~lightning_bpd.kernels.onednn`). Torch only.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.kernels import int8, onednn
from lightning_bpd.nn.lean_step import script


def fused_groups(layers: list) -> list[list[tuple[Tensor, Tensor | None]]]:
    """The (weight, bias) pairs each fused product stacks, per layer in order: [q, k, v], [o], [gate, up], [down]
    (``layers``: :class:`~lightning_bpd.hf.lean_causal.LlamaLayer` s)."""
    groups = []
    for w in layers:
        groups += [[w.q, w.k, w.v], [w.o], [w.gate, w.up], [w.down]]
    return groups


def scriptable(config: object) -> bool:
    """Whether :func:`fused_layers` computes the layers of a trunk of this config: SiLU-gated MLPs (``hidden_act``
    "silu" or its other name "swish", transformers' ``SiLUActivation``: ``F.silu``)."""
    return getattr(config, "hidden_act", None) in ("silu", "swish")


def rms_weighted(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """transformers' Llama RMSNorm: in float32, back to x's dtype, then the weight."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rotate_heads(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding of x (B, T, H, Dh) at cos, sin (B, T, 1, Dh): ``apply_rotary_pos_emb``'s arithmetic."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def repeat_kv(x: Tensor, groups: int) -> Tensor:
    """(B, Hkv, S, Dh) -> (B, Hkv * groups, S, Dh), each key head repeated for its query heads."""
    if groups == 1:
        return x
    b, h, s, d = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def attend_as(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, groups: int, scaling: float, sdpa: bool,
              wide: bool) -> Tensor:
    """Queries (B, H, T, Dh) over keys and values (B, Hkv, S, Dh) under ``mask`` (B, 1, T, S) -> (B, T, H * Dh), as
    transformers' ``sdpa_attention_forward`` (one query: packed onto the key heads) or ``eager_attention_forward``
    (its softmax in float32) computes it, in the dtype they come in. ``wide`` (float64 inputs, :func:`attend`):
    eager's softmax in float64, and sdpa's T > 1 queries packed onto the key heads too ((B, Hkv, groups * T, Dh), each
    row's mask repeated for its heads) instead of the keys and values repeated for the query heads: the same rows
    attended, no copy of the cache per query head (transformers repeats them)."""
    b, heads, t, dh = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    if not sdpa:
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling + mask
        softmax_dtype = torch.float64 if wide else torch.float32
        out = torch.matmul(F.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype), v)
        return out.transpose(1, 2).reshape(b, t, -1)
    if groups > 1 and t == 1:
        q = q.reshape(b, heads // groups, groups, dh)  # the mask (B, 1, 1, S) is every head's
    elif groups > 1 and wide:
        q = q.reshape(b, heads // groups, groups * t, dh)  # row g * T + j: query j of the key head's g-th query head
        mask = mask.expand(mask.shape[0], mask.shape[1], t, mask.shape[3]).repeat(1, 1, groups, 1)  # (B, 1, G*T, S)
    elif groups > 1:
        k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    return out.reshape(b, -1, t, dh).transpose(1, 2).reshape(b, t, -1)


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, groups: int, scaling: float, sdpa: bool,
           wide: bool = False) -> Tensor:
    """:func:`attend_as` in q's dtype, or with ``wide`` in float64 (eager's softmax too) rounded back to it (the
    runtime's products widen attention: int8, float32-packed, the invariant kinds), so that a query's output does not
    depend on how many queries and masked keys come with it, and the verify pass rounds as the greedy step does."""
    if wide:
        m = mask.double() if mask.is_floating_point() else mask
        return attend_as(q.double(), k.double(), v.double(), m, groups, scaling, sdpa, True).to(q.dtype)
    return attend_as(q, k, v, mask, groups, scaling, sdpa, False)


def _product(x: Tensor, j: int, packed: list[torch.classes.quantized.LinearPackedParamsBase],
             mkldnn: list[Tensor], biases: list[Optional[Tensor]]) -> Tensor:  # noqa: UP045 (TorchScript)
    """Fused product ``j``: int8 (:func:`~lightning_bpd.kernels.int8.row_int8`) when ``packed`` holds the weights,
    else oneDNN's packed float32 (:func:`~lightning_bpd.kernels.onednn.product`)."""
    bias = biases[j]
    if len(packed) > 0:
        assert bias is not None
        return int8.row_int8(x, packed[j], bias)
    return onednn.product(x, mkldnn[j], bias)


def fused_layers(x: Tensor, cos: Tensor, sin: Tensor, masks: list[Tensor], k_cache: Tensor, v_cache: Tensor,
                 start: int, rows: Tensor, slots: Tensor, stop: int, norms: list[Tensor], eps: list[float],
                 packed: list[torch.classes.quantized.LinearPackedParamsBase], mkldnn: list[Tensor],
                 biases: list[Optional[Tensor]], q_width: int, kv_width: int, ffn: int, head_dim: int,  # noqa: UP045
                 groups: int, scaling: float, sdpa: bool, wide: bool, keep: list[int]) -> tuple[Tensor, list[Tensor]]:
    """The decoder layers on x (B, T, D) -> (the last layer's output (B, T, D), the outputs of layers ``keep``).

    ``cos``, ``sin`` (B, T, Dh): the rotary embedding of the inputs' positions; ``masks``: per layer (B, 1, T, P + S')
    as :func:`~lightning_bpd.hf.step_cache.as_mask` makes them. Keys and values go into ``k_cache`` / ``v_cache``
    (L, B, P + S, Hkv, Dh) at slots ``start`` .. ``start + T - 1`` of every row when ``start >= 0``, else at
    ``slots`` (B, T) of rows ``rows`` (B, 1) (:meth:`~lightning_bpd.nn.kv_cache.KVCache.write_place`); attention
    reads slots 0 .. ``stop`` - 1 (the prefix counted), in float64 with ``wide``. ``norms``: per layer input, post-attention, q and k norm
    weights (the last two empty without per-head norms), ``eps`` theirs; ``packed``, ``mkldnn``, ``biases``: per
    layer the four products of :meth:`~lightning_bpd.nn.products.Products.lean_fused` (int8 ``packed`` or
    oneDNN-packed ``mkldnn`` weights, the other list empty; int8's biases are tensors)."""
    b, t = x.shape[0], x.shape[1]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, T, 1, Dh)
    kept: list[Tensor] = []
    for i in range(len(masks)):
        n, e = norms[4 * i : 4 * i + 4], eps[4 * i : 4 * i + 4]
        p, m, c = packed[4 * i : 4 * i + 4], mkldnn[4 * i : 4 * i + 4], biases[4 * i : 4 * i + 4]
        qkv = _product(rms_weighted(x, n[0], e[0]), 0, p, m, c)  # (B, T, q + 2 kv)
        q = qkv[:, :, :q_width].view(b, t, -1, head_dim)  # (B, T, H, Dh)
        k = qkv[:, :, q_width : q_width + kv_width].view(b, t, -1, head_dim)  # (B, T, Hkv, Dh)
        v = qkv[:, :, q_width + kv_width :].view(b, t, -1, head_dim)
        if n[2].numel() > 0:
            q, k = rms_weighted(q, n[2], e[2]), rms_weighted(k, n[3], e[3])
        q, k = rotate_heads(q, cos, sin), rotate_heads(k, cos, sin)
        if start >= 0:
            k_cache[i, :, start : start + t] = k
            v_cache[i, :, start : start + t] = v
        else:
            k_cache[i][rows, slots] = k
            v_cache[i][rows, slots] = v
        keys, values = k_cache[i, :, :stop], v_cache[i, :, :stop]  # (B, P + S', Hkv, Dh)
        a = attend(q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2), masks[i], groups, scaling, sdpa,
                   wide)
        x = x + _product(a, 1, p, m, c)
        gate_up = _product(rms_weighted(x, n[1], e[1]), 2, p, m, c)  # (B, T, 2 ffn)
        x = x + _product(F.silu(gate_up[:, :, :ffn]) * gate_up[:, :, ffn:], 3, p, m, c)
        if i in keep:
            kept.append(x)
    return x, kept


fused_layers = script(fused_layers) if int8.available() else fused_layers
