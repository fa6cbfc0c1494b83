"""The encoder and the decoder's cached step as TorchScript functions: the same ops as :class:`Encoder` and
:meth:`Decoder.step`, without the Python around them. Torch only; inference only.

At batch 1 a decoder step is a few dozen small products, and on CPU much of its time went to the code around
them: ~670 aten calls through module calls, the KV-cache object and mask helpers. Scripted, the same
sequence of kernels runs from TorchScript's interpreter: on an AMD EPYC core (1 thread, the Multi30k shape:
d 256, 3 layers, 4 heads, ff 1024, weights in cache) a 1-token step takes 0.9-1.1 ms instead of 1.3-1.7; in a
decode the gain shows where the weights' bytes do not dominate (int8, docs/speed.md). It calls the same
kernels in the same order, with the same product layouts as :func:`~lightning_bpd.kernels.fast_linear.linear`
(and, with int8 products on, :class:`~lightning_bpd.kernels.int8.RowInt8`'s ops and float64 attention), so its
output is bitwise the reference's (tested). The modules stay the reference and take every case this does
not: training and static caches (and, for the encoder, the float64 products of the invariant precisions). The
decoder step also takes local windows with ring caches (the image decoder) and float32-invariant's float64 products
and attention. TorchScript is deprecated in torch 2.14 but runs; without it these are plain Python functions.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.kernels import int8, onednn
from lightning_bpd.kernels.fast_linear import LARGE, MAX_ROWS
from lightning_bpd.nn.products import Products

assert LARGE == 1048576, "lean_step's layout_linear spells fast_linear's LARGE out"


def layout_linear(x: Tensor, weight: Tensor, bias: Tensor | None, by_columns: list[bool]) -> Tensor:
    """``F.linear``, or as ``(W @ x.T).T`` where :func:`lightning_bpd.kernels.fast_linear.linear` takes that layout:
    ``by_columns`` = [for a weight below ``LARGE`` entries, for a larger one] (:func:`column_layouts`)."""
    if not by_columns[int(weight.numel() >= 1048576)]:
        return F.linear(x, weight, bias)
    flat = x.reshape(-1, x.shape[-1])
    out = torch.addmm(bias.unsqueeze(1), weight, flat.t()) if bias is not None else weight @ flat.t()
    return out.t().reshape(list(x.shape[:-1]) + [weight.shape[0]])


def column_layouts(x: Tensor) -> list[bool]:
    """:func:`layout_linear`'s ``by_columns`` for products of x (..., in): fast_linear's rule (float32 on CPU, 16..64
    rows, from 8 rows for a weight of ``LARGE`` entries or more)."""
    rows = x.numel() // x.shape[-1]
    cpu32 = x.device.type == "cpu" and x.dtype == torch.float32 and rows <= MAX_ROWS
    return [cpu32 and rows >= 16, cpu32 and rows >= 8]


def _product(x: Tensor, j: int, weights: list[Tensor], packed: list[torch.classes.quantized.LinearPackedParamsBase],
             by_columns: list[bool], wide: list[Tensor], onednn_weights: list[Tensor]) -> Tensor:
    """Product ``j`` of the step (weights[2j], weights[2j + 1]): int8 when ``packed`` holds the packed weights,
    in float64 rounded to float32 when ``wide`` holds float64 copies (:func:`lightning_bpd.kernels.invariant.linear`)."""
    if len(packed) > 0:
        return int8.row_int8(x, packed[j], weights[2 * j + 1])
    if len(onednn_weights) > 0:
        return onednn.product(x, onednn_weights[j], weights[2 * j + 1])  # back in Python (torch.jit.ignore)
    if len(wide) > 0:
        return F.linear(x.double(), wide[2 * j], wide[2 * j + 1]).float()
    return layout_linear(x, weights[2 * j], weights[2 * j + 1], by_columns)


def _attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, wide: bool) -> Tensor:
    """SDPA of (B, T, H, Dh) q and (B, S, H, Dh) k, v -> (B, T, H * Dh); ``wide``: in float64, rounded back
    (:func:`lightning_bpd.kernels.invariant.attention`)."""
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if wide:
        mask = bias.double() if bias.is_floating_point() else bias
        out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask).to(q.dtype)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def lean_decoder_step(x: Tensor, k_cache: Tensor, v_cache: Tensor, positions: Tensor, start: int, stop: int,
                      weights: list[Tensor], norms: list[Tensor], cross_k: list[Tensor], cross_v: list[Tensor],
                      cross_bias: Tensor, n_heads: int, by_columns: list[bool],
                      packed: list[torch.classes.quantized.LinearPackedParamsBase],
                      span_start: int, ring: int, window: int, wide_weights: list[Tensor], wide_attention: bool,
                      onednn_weights: list[Tensor], tree_visible: Tensor) -> Tensor:
    """T new inputs per row x (B, T, D) at ``positions`` (B, T) -> the final-norm hidden states (B, T, D).

    Writes their keys and values into ``k_cache`` / ``v_cache`` (L, B, S, H, Dh): at slots ``start .. start
    + T - 1`` of every row when ``start >= 0`` (every row holds ``start`` positions), else at each row's
    ``positions`` (modulo ``ring`` in a ring cache). Queries see cached positions ``span_start`` .. ``stop`` - 1
    (a ring: every slot, by the position it holds), masked causally by position and, with ``window`` > 0, to the
    ``window`` most recent ones (:func:`lightning_bpd.nn.attention.cached_span`).
    ``weights``: per layer the 12 tensors qkv (w, b), self out (w, b), cross q (w, b), cross out (w, b),
    ff1 (w, b), ff2 (w, b); ``norms``: per layer norm1..3 (w, b), then the final norm (w, b);
    ``cross_k`` / ``cross_v``: per layer (B, S_src, H, Dh); ``cross_bias``: (B, 1, 1, S_src) additive;
    ``by_columns``: the float products' layout (:func:`layout_linear`); ``packed``: empty, or the int8 weights of
    every product (precision int8, :mod:`lightning_bpd.kernels.int8`); ``wide_weights``: empty, or float64 copies of
    ``weights`` (float32-invariant: products in float64, :mod:`lightning_bpd.kernels.invariant`); ``wide_attention``:
    attention in float64, rounded back; ``onednn_weights``: empty, or the oneDNN-packed weights of every product
    (precision float32-packed, :mod:`lightning_bpd.kernels.onednn`); ``tree_visible``: empty, or the boolean mask
    (B, 1, T, S) of a tree's verify pass (:func:`lightning_bpd.nn.attention.tree_span`), which then replaces the causal
    one (``positions`` are the slots written).
    """
    b, t, d = x.shape[0], x.shape[1], x.shape[2]
    dh = d // n_heads
    wide = wide_attention
    q_pos = positions[:, None, :, None]  # (B, 1, T, 1)
    if ring > 0:  # the absolute position each slot holds (KVCache.slot_positions)
        newest = positions[:, -1]
        k_pos = newest[:, None] - (newest[:, None] - torch.arange(ring, device=x.device)) % ring  # (B, R)
        keys = k_pos[:, None, None, :]
    else:
        keys = torch.arange(span_start, stop, device=x.device)[None, None, None, :]
    visible = keys <= q_pos  # (B, 1, T, S)
    if window > 0:
        visible = visible & (keys > q_pos - window)
    if ring > 0:
        visible = visible & (keys >= 0)
    if tree_visible.numel() > 0:
        visible = tree_visible
    self_bias = torch.zeros(visible.shape, dtype=x.dtype, device=x.device).masked_fill_(~visible, float("-inf"))
    rows = torch.arange(b, device=x.device)[:, None]
    for i in range(len(cross_k)):
        w = weights[12 * i : 12 * i + 12]
        p = packed[6 * i : 6 * i + 6]
        ww = wide_weights[12 * i : 12 * i + 12]
        o = onednn_weights[6 * i : 6 * i + 6]
        n = norms[6 * i : 6 * i + 6]
        h = F.layer_norm(x, [d], n[0], n[1])
        qkv = _product(h, 0, w, p, by_columns, ww, o).view(b, t, 3 * n_heads, dh).chunk(3, dim=2)
        if start >= 0:
            k_cache[i, :, start : start + t] = qkv[1]
            v_cache[i, :, start : start + t] = qkv[2]
        elif ring > 0:
            k_cache[i][rows, positions % ring] = qkv[1]
            v_cache[i][rows, positions % ring] = qkv[2]
        else:
            k_cache[i][rows, positions] = qkv[1]
            v_cache[i][rows, positions] = qkv[2]
        span = ring if ring > 0 else stop
        a = _attention(qkv[0], k_cache[i, :, span_start:span], v_cache[i, :, span_start:span], self_bias, wide)
        x = x + _product(a, 1, w, p, by_columns, ww, o)
        q = _product(F.layer_norm(x, [d], n[2], n[3]), 2, w, p, by_columns, ww, o).view(b, t, n_heads, dh)
        x = x + _product(_attention(q, cross_k[i], cross_v[i], cross_bias, wide), 3, w, p, by_columns, ww, o)
        h = torch.relu(_product(F.layer_norm(x, [d], n[4], n[5]), 4, w, p, by_columns, ww, o))
        x = x + _product(h, 5, w, p, by_columns, ww, o)
    return F.layer_norm(x, [d], norms[-2], norms[-1])


def lean_encoder(x: Tensor, mask: Tensor, weights: list[Tensor], norms: list[Tensor], n_heads: int,
                 by_columns: list[bool], packed: list[torch.classes.quantized.LinearPackedParamsBase],
                 wide_attention: bool, onednn_weights: list[Tensor]) -> Tensor:
    """The encoder's layers over embedded sources x (B, S, D) under the boolean ``mask`` (B, 1, 1, S) -> the
    final-norm memory (B, S, D). ``weights``: per layer qkv (w, b), out (w, b), ff1 (w, b), ff2 (w, b);
    ``norms``: per layer norm1, norm2 (w, b), then the final norm; ``packed``, ``wide_attention`` and
    ``onednn_weights`` as for :func:`lean_decoder_step`."""
    b, s, d = x.shape[0], x.shape[1], x.shape[2]
    wide = wide_attention
    none: list[Tensor] = []
    for i in range(len(norms) // 4):
        w = weights[8 * i : 8 * i + 8]
        p = packed[4 * i : 4 * i + 4]
        o = onednn_weights[4 * i : 4 * i + 4]
        qkv = _product(F.layer_norm(x, [d], norms[4 * i], norms[4 * i + 1]), 0, w, p, by_columns, none, o)
        qkv = qkv.view(b, s, 3 * n_heads, d // n_heads).chunk(3, dim=2)
        x = x + _product(_attention(qkv[0], qkv[1], qkv[2], mask, wide), 1, w, p, by_columns, none, o)
        h = torch.relu(_product(F.layer_norm(x, [d], norms[4 * i + 2], norms[4 * i + 3]), 2, w, p, by_columns, none, o))
        x = x + _product(h, 3, w, p, by_columns, none, o)
    return F.layer_norm(x, [d], norms[-2], norms[-1])


def script(fn):
    """``fn`` compiled by TorchScript (which torch 2.14 marks deprecated but runs); ``fn`` itself where it cannot."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return torch.jit.script(fn)
    except Exception:  # noqa: BLE001 (a torch without TorchScript: the same ops from Python)
        return fn


lean_decoder_step = script(lean_decoder_step) if int8.available() else lean_decoder_step
lean_encoder = script(lean_encoder) if int8.available() else lean_encoder


def decoder_tensors(decoder: torch.nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    """The weights and norms of a :class:`~lightning_bpd.nn.transformer.Decoder` in the order
    :func:`lean_decoder_step` reads them (the parameters themselves: always the current values)."""
    weights: list[Tensor] = []
    norms: list[Tensor] = []
    for layer in decoder.layers:
        first, _, _, second = layer.ff.net
        for lin in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.cross_attn.q_proj, layer.cross_attn.o_proj,
                    first, second):
            weights += [lin.weight, lin.bias]
        for norm in (layer.norm1, layer.norm2, layer.norm3):
            norms += [norm.weight, norm.bias]
    norms += [decoder.norm.weight, decoder.norm.bias]
    return weights, norms


def encoder_tensors(encoder: torch.nn.Module) -> tuple[list[Tensor], list[Tensor]]:
    """The weights and norms of an :class:`~lightning_bpd.nn.transformer.Encoder` in :func:`lean_encoder`'s order."""
    weights: list[Tensor] = []
    norms: list[Tensor] = []
    for layer in encoder.layers:
        first, _, _, second = layer.ff.net
        for lin in (layer.attn.qkv_proj, layer.attn.o_proj, first, second):
            weights += [lin.weight, lin.bias]
        norms += [layer.norm1.weight, layer.norm1.bias, layer.norm2.weight, layer.norm2.bias]
    norms += [encoder.norm.weight, encoder.norm.bias]
    return weights, norms


def listed(stack: torch.nn.Module, lister) -> tuple[list[Tensor], list[Tensor]]:
    """``lister(stack)``, kept on the stack as ``lean_tensors`` (the parameter objects, which keep their identity
    through ``.to()`` and ``load_state_dict``) and listed again if the first or the last was replaced."""
    made = getattr(stack, "lean_tensors", None)
    if made is None or made[1][0] is not stack.layers[0].norm1.weight or made[1][-1] is not stack.norm.bias:
        made = stack.lean_tensors = lister(stack)
    return made


def layouts(x: Tensor, weights: list[Tensor], products: Products) -> tuple[list[bool], list]:
    """For a call on x: :func:`layout_linear`'s layout flags (:func:`column_layouts`), and the packed int8 weights of
    every (weight, bias) pair when ``products`` are int8 (else empty)."""
    return column_layouts(x), products.lean_int8_weights(x, weights)


def encode(encoder: torch.nn.Module, x: Tensor, mask: Tensor) -> Tensor:
    """:meth:`Encoder.forward` through :func:`lean_encoder`."""
    weights, norms = listed(encoder, encoder_tensors)
    by_columns, packed = layouts(x, weights, encoder.products)
    products = encoder.products
    return lean_encoder(x, mask, weights, norms, encoder.layers[0].attn.n_heads, by_columns, packed,
                        products.widens_attention(x), products.lean_onednn_weights(x, weights))


def step(decoder: torch.nn.Module, x: Tensor, context, cache, positions: Tensor, stop: int,
         cross_bias: Tensor, tree_visible: Tensor | None = None) -> Tensor:
    """:meth:`Decoder.step`'s work (after its checks) through :func:`lean_decoder_step`; the caller advances
    the cache. With int8 products (``decoder.products``) the products take their packed weights. ``tree_visible``:
    a tree's verify-pass mask (B, 1, T, S) in place of the causal one."""
    products = decoder.products
    weights, norms = listed(decoder, decoder_tensors)
    by_columns, packed = layouts(x, weights, products)
    low, high = cache.length_bounds()
    ring, window = cache.ring or 0, decoder.window or 0
    span_start = 0 if ring or not window else max(0, low - window + 1)  # cached_span's
    wide_weights = products.lean_wide_weights(x, weights)
    wide_attention = products.widens_attention(x)
    return lean_decoder_step(x, cache.k, cache.v, positions, low if low == high and not ring else -1, stop, weights,
                             norms, [k for k, _ in context.cross_kv], [v for _, v in context.cross_kv], cross_bias,
                             decoder.n_heads, by_columns, packed, span_start, ring, window, wide_weights,
                             wide_attention, products.lean_onednn_weights(x, weights),
                             tree_visible if tree_visible is not None else x.new_zeros(0, dtype=torch.bool))
