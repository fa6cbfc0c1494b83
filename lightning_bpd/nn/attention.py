"""Multi-head attention with explicit masks: encoder self-attention, cross-attention, and decoder
self-attention that is causal, optionally local (a window of the last ``window`` positions), and
takes T >= 1 new queries against a per-row KV cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.products import FLOAT, Products


def causal_mask(q_pos: Tensor, k_pos: Tensor, window: int | None = None) -> Tensor:
    """Boolean mask (B, 1, T, S): query at ``q_pos`` (B, T) may see key at ``k_pos`` (S,) or (B, S).

    A key is visible when it is not in the future and, with a ``window``, when it is one of the
    ``window`` most recent positions (the query's own position included).
    """
    q = q_pos[:, None, :, None]  # (B, 1, T, 1)
    k = k_pos[None, None, None, :] if k_pos.dim() == 1 else k_pos[:, None, None, :]  # (1 or B, 1, 1, S)
    mask = k <= q
    if window is not None:
        mask = mask & (k > q - window)
    return mask


def additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A boolean mask as the additive one SDPA turns it into (0 where visible, -inf elsewhere), in ``dtype``.

    Converted once per decoder call instead of once per attention call (SDPA converts boolean masks
    itself, three ops each time); the attention output is bitwise the same.
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def padding_mask(key_valid: Tensor) -> Tensor:
    """Boolean mask (B, 1, 1, S) from ``key_valid`` (B, S), True for real (non-pad) keys."""
    return key_valid[:, None, None, :]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention over ``n_heads`` heads with separate Q, K, V, O projections."""

    products: Products = FLOAT  # how it multiplies (:mod:`~lightning_bpd.nn.products`)

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, *, self_attention: bool = True) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.self_attention = self_attention
        if self_attention:  # one fused projection for Q, K and V of the same input
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:  # queries from the decoder, keys and values from the encoder memory (computed once)
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.o_proj = nn.Linear(d_model, d_model)

    def split(self, x: Tensor) -> Tensor:
        """(B, T, n * D) -> (B, T, n * H, Dh)."""
        return x.view(*x.shape[:2], -1, self.head_dim)

    def qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Self-attention: Q, K, V of ``x`` (B, T, D), each (B, T, H, Dh)."""
        return self.split(self.products.linear(x, self.qkv_proj.weight, self.qkv_proj.bias)).chunk(3, dim=2)

    def query(self, x: Tensor) -> Tensor:
        """Cross-attention queries (B, T, H, Dh)."""
        return self.split(self.products.linear(x, self.q_proj.weight, self.q_proj.bias))

    def key_value(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Cross-attention keys and values of ``memory`` (B, S, D), each (B, S, H, Dh)."""
        k, v = self.split(self.products.linear(memory, self.kv_proj.weight, self.kv_proj.bias)).chunk(2, dim=2)
        return k, v

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q (B, T, H, Dh), k/v (B, S, H, Dh), mask broadcastable to (B, H, T, S) -> (B, T, D)."""
        out = self.products.attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
        )  # (B, H, T, Dh)
        out = out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)  # (B, T, D)
        return self.products.linear(out, self.o_proj.weight, self.o_proj.bias)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """Uncached self-attention of ``x`` (B, T, D) under ``mask``."""
        return self.attend(*self.qkv(x), mask)

    def forward_local(self, x: Tensor, window: int) -> Tensor:
        """Uncached causal sliding-window self-attention of ``x`` (B, T, D) in O(T * window)."""
        q, k, v = self.qkv(x)
        out = local_attention(q, k, v, window, self.dropout if self.training else 0.0, self.products)
        return self.products.linear(out.reshape(x.shape), self.o_proj.weight, self.o_proj.bias)


def attend_cached(
    attn: MultiHeadAttention,
    x: Tensor,
    positions: Tensor,
    cache: KVCache,
    layer: int,
    span: tuple[int, int],
    mask: Tensor,
) -> Tensor:
    """Decoder self-attention of T new tokens ``x`` (B, T, D) at ``positions`` (B, T).

    Writes their keys/values into ``cache`` at those positions, then attends over the cached
    positions ``span = (start, stop)`` under ``mask`` (B, 1, T, stop - start). The decoder computes
    span and mask once per step for all layers (see :func:`cached_span`).
    """
    q, k_new, v_new = attn.qkv(x)
    cache.write(layer, positions, k_new, v_new)
    k, v = cache.view(layer, stop=span[1], start=span[0])  # (B, S', H, Dh)
    return attn.attend(q, k, v, mask)


def cached_span(positions: Tensor, window: int | None, cache: KVCache) -> tuple[tuple[int, int], Tensor]:
    """The cache slots that queries at ``positions`` (B, T) can see, and their mask (B, 1, T, S').

    Only the span that some query can see is read, so a local window keeps the cost bounded on
    long outputs; with a ring cache every slot is read and masked by the position it holds, and so
    with a static cache (:meth:`~lightning_bpd.nn.kv_cache.KVCache.make_static`).
    """
    if cache.ring:
        k_pos = cache.slot_positions(positions[:, -1])  # (B, R)
        return (0, cache.ring), causal_mask(positions, k_pos, window) & (k_pos >= 0)[:, None, None, :]
    if cache.static:  # fixed shapes: every slot, masked by position
        k_pos = torch.arange(cache.capacity, device=positions.device)
        return (0, cache.capacity), causal_mask(positions, k_pos, window)
    low, high = cache.length_bounds()  # the new positions are lengths .. lengths + T - 1 (no device read)
    stop = high + positions.shape[1]
    start = 0 if window is None else max(0, low - window + 1)
    k_pos = torch.arange(start, stop, device=positions.device)
    return (start, stop), causal_mask(positions, k_pos, window)


def tree_span(positions: Tensor, ancestors: Tensor, cache: KVCache) -> tuple[tuple[int, int], Tensor]:
    """The cache slots that a verify pass over a tree's N nodes at slots ``positions`` (B, N) (each row's length
    onwards, in node order) can see, and their mask (B, 1, N, S'): node i sees the row's committed prefix and
    the nodes j with ``ancestors[i, j]`` (N, N) bool, or (B, N, N) for a tree per row (its ancestors and itself). A
    plain cache only (no ring, not static); for the single path (``ancestors`` lower-triangular) it is
    :func:`cached_span`'s causal mask."""
    if cache.ring or cache.static:
        raise ValueError("tree verification needs a plain KV cache (not a ring of a local window, not static)")
    b, n = positions.shape
    stop = cache.length_bounds()[1] + n
    rel = torch.arange(stop, device=positions.device)[None, :] - cache.lengths[:, None]  # (B, S'): slot - length
    inside = (rel >= 0) & (rel < n)  # (B, S'): a node's slot
    per_row = ancestors.expand(b, n, n)  # (B, N, N)
    among = per_row.gather(2, rel.clamp(0, n - 1)[:, None, :].expand(b, n, -1))  # (B, N, S'): that slot's node seen
    return (0, stop), ((rel < 0)[:, None, :] | (inside[:, None, :] & among))[:, None]


def local_attention(q: Tensor, k: Tensor, v: Tensor, window: int, dropout_p: float = 0.0,
                    products: Products = FLOAT) -> Tensor:
    """Causal sliding-window attention over whole sequences in O(T * window), not O(T^2).

    q, k, v: (B, T, H, Dh) -> (B, T, H, Dh). Query t sees keys t - window + 1 .. t, exactly as
    ``causal_mask(..., window)``; the sequence is cut into blocks of ``window`` queries, each of which
    only needs its own block and the previous one as keys (2 * window).
    """
    b, t, h, d = q.shape
    w = window
    nb = -(-t // w)
    pad = nb * w - t

    def blocks(x: Tensor) -> Tensor:  # (B, T, H, Dh) -> (B, nb, H, w, Dh)
        x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.view(b, nb, w, h, d).transpose(2, 3)

    qb, kb, vb = blocks(q), blocks(k), blocks(v)
    prev = lambda x: F.pad(x, (0, 0, 0, 0, 0, 0, 1, 0))[:, :-1]
    k2 = torch.cat([prev(kb), kb], dim=3)  # (B, nb, H, 2w, Dh)
    v2 = torch.cat([prev(vb), vb], dim=3)
    a = torch.arange(w, device=q.device)[:, None]
    c = torch.arange(2 * w, device=q.device)[None, :]
    mask = ((c > a) & (c <= w + a)).expand(nb, w, 2 * w).clone()  # key (i-1)*w + c for query i*w + a
    mask[0, :, :w] = False  # nothing before the first block
    out = products.attention(qb, k2, v2, attn_mask=mask[None, :, None], dropout_p=dropout_p)
    return out.transpose(2, 3).reshape(b, nb * w, h, d)[:, :t]  # (B, T, H, Dh)
