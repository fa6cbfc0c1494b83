"""The Llama-family layers of :class:`~lightning_bpd.hf.lean_causal.LeanCausal` as one TorchScript function for the
int8 runtime, with the products that read one input fused: q, k and v as one product, gate and up as another.

At batch 1 on a CPU the int8 step of SmolLM2-135M spent about a third of its time outside any kernel: 211 products,
each a Python call through the runtime's products and :func:`~lightning_bpd.kernels.int8.row_int8`'s six small ops,
and the layer's own Python around them. Here the layer loop runs in TorchScript's interpreter, and a layer makes 4
int8 products instead of 7.

Fusing is bitwise the separate products. :func:`~lightning_bpd.kernels.int8.row_int8` scales each input row by its
own max |x| and quantizes it on one fixed grid, so q, k and v (and gate and up) quantize their common input to
the same integers; their weights are quantized per output row, so stacking their rows changes no row's integers;
the int32 accumulation is exact and each output column is scaled back by its own row's scales. The tests check
every hidden state against the modules' (``tests/hf/test_lean_causal.py``). Torch only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.kernels import int8
from lightning_bpd.nn.lean_step import script


@dataclass(frozen=True)
class FusedInt8:
    """A runtime's fused int8 copies of a trunk's products: per layer qkv, o, gate-up, down (packed weights and
    their biases, 4 per layer), and the widths that split them (q, k, v outputs; the MLP's width)."""

    packed: list
    biases: list[Tensor]
    q_width: int
    kv_width: int
    ffn: int


def fused_groups(layers: list) -> list[list[tuple[Tensor, Tensor | None]]]:
    """The (weight, bias) pairs each fused product stacks, per layer in order: [q, k, v], [o], [gate, up], [down]
    (``layers``: :class:`~lightning_bpd.hf.lean_causal.LlamaLayer` s)."""
    groups = []
    for w in layers:
        groups += [[w.q, w.k, w.v], [w.o], [w.gate, w.up], [w.down]]
    return groups


def scriptable(config: object) -> bool:
    """Whether :func:`int8_layers` computes the layers of a trunk of this config: SiLU-gated MLPs (``hidden_act``
    "silu" or its other name "swish", transformers' ``SiLUActivation``: ``F.silu``)."""
    return getattr(config, "hidden_act", None) in ("silu", "swish")


def _rms(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """:func:`~lightning_bpd.hf.lean_causal.rms_norm`'s ops."""
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """:func:`~lightning_bpd.hf.lean_causal.rotate`'s ops (cos, sin already (B, T, 1, Dh))."""
    half = x.shape[-1] // 2
    return (x * cos) + (torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin)


def _repeat_kv(x: Tensor, groups: int) -> Tensor:
    if groups == 1:
        return x
    b, h, s, d = x.shape[0], x.shape[1], x.shape[2], x.shape[3]
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, groups: int, scaling: float, sdpa: bool,
            wide: bool) -> Tensor:
    """:func:`~lightning_bpd.hf.lean_causal.attend`'s ops: q (B, H, T, Dh), k, v (B, Hkv, S, Dh) -> (B, T, H * Dh)
    (in the dtype they come in: the caller widens them)."""
    b, heads, t, dh = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    if not sdpa:
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
        scores = torch.matmul(q, k.transpose(2, 3)) * scaling + mask
        softmax_dtype = torch.float64 if wide else torch.float32
        out = torch.matmul(F.softmax(scores, dim=-1, dtype=softmax_dtype).to(q.dtype), v)
        return out.transpose(1, 2).reshape(b, t, -1)
    if groups > 1 and t == 1:
        q = q.reshape(b, heads // groups, groups, dh)
    elif groups > 1:
        k, v = _repeat_kv(k, groups), _repeat_kv(v, groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scaling)
    return out.reshape(b, -1, t, dh).transpose(1, 2).reshape(b, t, -1)


def int8_layers(x: Tensor, cos: Tensor, sin: Tensor, masks: list[Tensor], k_cache: Tensor, v_cache: Tensor,
                start: int, rows: Tensor, slots: Tensor, stop: int, norms: list[Tensor], eps: list[float],
                packed: list[torch.classes.quantized.LinearPackedParamsBase], biases: list[Tensor], q_width: int,
                kv_width: int, ffn: int, head_dim: int, groups: int, scaling: float, sdpa: bool, wide: bool,
                keep: list[int]) -> tuple[Tensor, list[Tensor]]:
    """The decoder layers on x (B, T, D) -> (the last layer's output (B, T, D), the outputs of layers ``keep``).

    ``cos``, ``sin`` (B, T, Dh): the rotary embedding of the inputs' positions; ``masks``: per layer (B, 1, T, P + S')
    as :func:`~lightning_bpd.hf.step_cache.as_mask` makes them. Keys and values go into ``k_cache`` / ``v_cache``
    (L, B, P + S, Hkv, Dh) at slots ``start`` .. ``start + T - 1`` of every row when ``start >= 0``, else at
    ``slots`` (B, T) of rows ``rows`` (B, 1) (:meth:`~lightning_bpd.nn.kv_cache.KVCache.write_place`); attention
    reads slots 0 .. ``stop`` - 1 (the prefix counted), in float64 with ``wide``. ``norms``: per layer input, post-attention, q and k norm
    weights (the last two empty without per-head norms), ``eps`` theirs; ``packed`` / ``biases``: per layer
    :class:`FusedInt8`'s four products."""
    b, t = x.shape[0], x.shape[1]
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)  # (B, T, 1, Dh)
    kept: list[Tensor] = []
    for i in range(len(masks)):
        n, e, p, c = norms[4 * i : 4 * i + 4], eps[4 * i : 4 * i + 4], packed[4 * i : 4 * i + 4], biases[4 * i : 4 * i + 4]
        qkv = int8.row_int8(_rms(x, n[0], e[0]), p[0], c[0])  # (B, T, q + 2 kv)
        q = qkv[:, :, :q_width].view(b, t, -1, head_dim)  # (B, T, H, Dh)
        k = qkv[:, :, q_width : q_width + kv_width].view(b, t, -1, head_dim)  # (B, T, Hkv, Dh)
        v = qkv[:, :, q_width + kv_width :].view(b, t, -1, head_dim)
        if n[2].numel() > 0:
            q, k = _rms(q, n[2], e[2]), _rms(k, n[3], e[3])
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if start >= 0:
            k_cache[i, :, start : start + t] = k
            v_cache[i, :, start : start + t] = v
        else:
            k_cache[i][rows, slots] = k
            v_cache[i][rows, slots] = v
        keys, values = k_cache[i, :, :stop], v_cache[i, :, :stop]  # (B, P + S', Hkv, Dh)
        q, keys, values = q.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        if wide:  # in float64, rounded back: a query's output whatever comes with it (lean_causal.attend)
            mask = masks[i].double() if masks[i].is_floating_point() else masks[i]
            a = _attend(q.double(), keys.double(), values.double(), mask, groups, scaling, sdpa, True).to(x.dtype)
        else:
            a = _attend(q, keys, values, masks[i], groups, scaling, sdpa, False)
        x = x + int8.row_int8(a, p[1], c[1])
        gate_up = int8.row_int8(_rms(x, n[1], e[1]), p[2], c[2])  # (B, T, 2 ffn)
        x = x + int8.row_int8(F.silu(gate_up[:, :, :ffn]) * gate_up[:, :, ffn:], p[3], c[3])
        if i in keep:
            kept.append(x)
    return x, kept


int8_layers = script(int8_layers) if int8.available() else int8_layers
