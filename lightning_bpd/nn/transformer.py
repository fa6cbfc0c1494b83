"""Pre-LN encoder and decoder stacks that return hidden states (no embeddings, heads or sampling).

The decoder runs two ways that must agree: :meth:`Decoder.forward` over a whole target prefix
(training, and the slow reference for decoding), and :meth:`Decoder.step`, which takes T >= 1 new
tokens per row against a :class:`~lightning_bpd.nn.kv_cache.KVCache` (greedy steps, and the
verify pass of blockwise decoding).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_bpd.nn.attention import (
    MultiHeadAttention,
    additive,
    attend_cached,
    cached_span,
    causal_mask,
    padding_mask,
    tree_span,
)
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.products import FLOAT, Products

# Slots a ring cache keeps beyond the window: the most tokens one cached call may write (k <= 16).
RING_MARGIN = 32


@dataclass
class EncoderContext:
    """What the decoder needs from one encoded source batch; computed once per source.

    memory: (B, S, D); src_valid: (B, S) True for real tokens; cross_kv: per decoder layer, the
    cross-attention keys and values (B, S, H, Dh); cond: (B, T, D) per target position, the input vector
    that the model adds to its decoder input there (direct conditioning), or None; prior: (B, T) the
    centre of the intensity prior at each target position (:mod:`~lightning_bpd.nn.intensity_prior`), or None.
    """

    memory: Tensor
    src_valid: Tensor
    cross_kv: list[tuple[Tensor, Tensor]]
    cond: Tensor | None = None
    prior: Tensor | None = None

    @property
    def batch_size(self) -> int:
        return self.memory.shape[0]

    def select(self, rows: Tensor) -> EncoderContext:
        """The context of batch ``rows`` only (1-D index tensor)."""
        return EncoderContext(
            memory=self.memory.index_select(0, rows),
            src_valid=self.src_valid.index_select(0, rows),
            cross_kv=[(k.index_select(0, rows), v.index_select(0, rows)) for k, v in self.cross_kv],
            cond=None if self.cond is None else self.cond.index_select(0, rows),
            prior=None if self.prior is None else self.prior.index_select(0, rows),
        )


def lean_applies(stack: nn.Module, x: Tensor, invariant_ok: bool = False) -> bool:
    """Whether an encoder or decoder may run ``x`` through its lean path (``stack.lean``: a runtime installs
    :mod:`~lightning_bpd.nn.lean_step`'s, none otherwise): inference
    (eval mode, no gradients), with products the lean encoder takes unless ``invariant_ok`` (the decoder step
    takes float64 ones too), and that apply to ``x`` (int8: float32 on CPU)."""
    products = stack.products
    return (stack.lean is not None and not stack.training and not torch.is_grad_enabled()
            and (invariant_ok or products.lean_encoder) and products.applies(x))


class FeedForward(nn.Module):
    products: Products = FLOAT  # how it multiplies (:mod:`~lightning_bpd.nn.products`)

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_model, d_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))

    def forward(self, x: Tensor) -> Tensor:
        first, _, drop, second = self.net  # Dropout is the identity in eval mode
        linear = self.products.linear
        return linear(drop(torch.relu(linear(x, first.weight, first.bias))), second.weight, second.bias)


class EncoderLayer(nn.Module):
    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.norm1(x)
        x = x + self.drop(self.attn(h, mask))
        return x + self.drop(self.ff(self.norm2(x)))


class Encoder(nn.Module):
    """(B, S, D) embedded source, (B, S) validity -> (B, S, D) memory."""

    products: Products = FLOAT  # what the lean path multiplies with (its layers hold their own)

    def __init__(self, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(d_model, n_heads, d_ff, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        # a runtime's snapshot: the encoder as one TorchScript function (nn.lean_step.encode); None: the modules
        self.lean: Callable[..., Tensor] | None = None

    def forward(self, x: Tensor, src_valid: Tensor) -> Tensor:
        mask = padding_mask(src_valid)
        if self.layers and lean_applies(self, x):  # the same ops as one TorchScript function
            return self.lean(self, x, mask)  # type: ignore[misc]
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """Self-attention, cross-attention over the encoder memory (none with ``cross_attention=False``: a decoder-only
    model's layer) and a feed-forward block, each pre-LN and residual."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float, cross_attention: bool = True) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model) if cross_attention else None
        self.norm3 = nn.LayerNorm(d_model)
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout, self_attention=False) if cross_attention else None
        self.ff = FeedForward(d_model, d_ff, dropout)
        self.drop = nn.Dropout(dropout)

    def cross_and_ff(self, x: Tensor, cross_kv: tuple[Tensor, Tensor], cross_mask: Tensor) -> Tensor:
        q = self.cross_attn.query(self.norm2(x))  # type: ignore[union-attr]
        x = x + self.drop(self.cross_attn.attend(q, *cross_kv, cross_mask))  # type: ignore[union-attr]
        return self.feed_forward(x)

    def feed_forward(self, x: Tensor) -> Tensor:
        """The residual feed-forward block: (B, T, D) -> (B, T, D)."""
        return x + self.drop(self.ff(self.norm3(x)))


class Decoder(nn.Module):
    """Embedded target inputs (B, T, D) + encoder context -> hidden states (B, T, D)."""

    products: Products = FLOAT  # what the lean step multiplies with (its layers hold their own)

    def __init__(
        self, n_layers: int, d_model: int, n_heads: int, d_ff: int, dropout: float, window: int | None = None,
        cross_attention: bool = True,
    ) -> None:
        super().__init__()
        if window is not None and window < 1:
            raise ValueError(f"window must be >= 1 (or None for full attention), got {window}")
        self.layers = nn.ModuleList(DecoderLayer(d_model, n_heads, d_ff, dropout, cross_attention)
                                    for _ in range(n_layers))
        self.cross_attention = cross_attention  # False: a decoder-only model's stack (nn.causal_model runs it)
        self.norm = nn.LayerNorm(d_model)
        self.window = window
        # a runtime's snapshot: cached steps as one TorchScript function (nn.lean_step.step); None: the modules
        self.lean: Callable[..., Tensor] | None = None
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads

    def cross_kv(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Cross-attention keys/values of every layer, computed once per source."""
        return [layer.cross_attn.key_value(memory) for layer in self.layers]

    def forward(self, x: Tensor, context: EncoderContext, blocked: bool | None = None) -> Tensor:
        """Uncached pass over whole prefixes ``x`` (B, T, D) at positions 0..T-1.

        With a local window and T > 2 * window the sliding-window attention is computed block by
        block in O(T * window) (``blocked``, the default then); otherwise with a full (T, T) mask.
        """
        t = x.shape[1]
        if blocked is None:
            blocked = self.window is not None and t > 2 * self.window
        if not blocked:
            pos = torch.arange(t, device=x.device)
            self_mask = causal_mask(pos.expand(x.shape[0], -1), pos, self.window)  # (B, 1, T, T)
        cross_mask = padding_mask(context.src_valid)
        for layer, kv in zip(self.layers, context.cross_kv):
            h = layer.norm1(x)
            attn = layer.self_attn.forward_local(h, self.window) if blocked else layer.self_attn(h, self_mask)
            x = x + layer.drop(attn)
            x = layer.cross_and_ff(x, kv, cross_mask)
        return self.norm(x)

    def step(self, x: Tensor, context: EncoderContext, cache: KVCache, ancestors: Tensor | None = None) -> Tensor:
        """Cached pass over T new inputs per row ``x`` (B, T, D); appends them to ``cache``. At inference
        without a static cache, in a runtime's snapshot, the same ops run as one TorchScript function (``lean``:
        :mod:`~lightning_bpd.nn.lean_step`'s, installed by the runtime). ``ancestors`` (T, T) bool: the inputs are a tree's nodes, node i seeing
        the cached prefix and the nodes j with ``ancestors[i, j]`` (:func:`~lightning_bpd.nn.attention.tree_span`);
        x then carries each node's own position already."""
        n_new = x.shape[1]
        cache.check_room(n_new)
        if cache.ring and n_new > RING_MARGIN:
            raise ValueError(f"a ring KV cache takes at most {RING_MARGIN} new tokens per call, got {n_new}")
        positions = cache.positions(n_new)  # (B, T): the slots written
        span, tree_visible = tree_span(positions, ancestors, cache) if ancestors is not None else (None, None)
        if self.lean_applies(x, cache):
            cross_bias = additive(padding_mask(context.src_valid), x.dtype)  # (B, 1, 1, S)
            out = self.lean(self, x, context, cache, positions, cache.length_bounds()[1] + n_new,  # type: ignore[misc]
                            cross_bias, tree_visible)
            cache.advance(n_new)
            return out
        if span is not None:
            return self.step_masked(x, context, cache, positions, span, tree_visible)
        return self.step_masked(x, context, cache, positions, *cached_span(positions, self.window, cache))

    def step_masked(self, x: Tensor, context: EncoderContext, cache: KVCache, positions: Tensor,
                    span: tuple[int, int], self_mask: Tensor) -> Tensor:
        """:meth:`step` through the modules: new inputs x (B, T, D) written at slots ``positions`` (B, T), their
        queries seeing the cache slots ``span`` under the boolean ``self_mask`` (B, 1, T, S')."""
        n_new = x.shape[1]
        self_mask = additive(self_mask, x.dtype)  # (B, 1, T, S'): converted once for all layers
        cross_mask = additive(padding_mask(context.src_valid), x.dtype)  # (B, 1, 1, S)
        for i, (layer, kv) in enumerate(zip(self.layers, context.cross_kv)):
            x = x + layer.drop(attend_cached(layer.self_attn, layer.norm1(x), positions, cache, i, span, self_mask))
            x = layer.cross_and_ff(x, kv, cross_mask)
        cache.advance(n_new)
        return self.norm(x)

    def lean_applies(self, x: Tensor, cache: KVCache) -> bool:
        """Whether :meth:`step` may run as :func:`~lightning_bpd.nn.lean_step.lean_decoder_step` (local windows,
        ring caches and the float64 products of float32-invariant included; not static caches)."""
        return not cache.static and cache.k.dtype == x.dtype and lean_applies(self, x, invariant_ok=True)

    def new_cache(self, batch_size: int, capacity: int, *, dtype: torch.dtype, device: torch.device) -> KVCache:
        """A cache for ``capacity`` positions; with a local window, a ring of window + RING_MARGIN slots."""
        ring = self.window + RING_MARGIN if self.window is not None else None
        return KVCache(len(self.layers), batch_size, capacity, self.n_heads, self.head_dim, ring=ring, dtype=dtype,
                       device=device)
