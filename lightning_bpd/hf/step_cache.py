"""What the HF decoder layers are handed by :class:`~lightning_bpd.hf.base.HFSeq2SeqBlockwise`: the encoded
sources (:class:`HFContext`), a cache object through which their self-attention writes into our per-row
:class:`~lightning_bpd.nn.kv_cache.KVCache` (:class:`StepCache`), masks as the attention implementation takes
them (:func:`as_mask`), and the key and query positions of a tree's verify pass (:func:`tree_positions`)."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import Tensor
from transformers import EncoderDecoderCache

from lightning_bpd.nn.kv_cache import KVCache


@dataclass
class HFContext:
    """The encoded sources: encoder output ``hidden`` (B, S, D), ``valid`` (B, S) True for real tokens,
    the cross-attention mask as the layers take it (B, 1, 1, S) and every decoder layer's cross-attention
    keys and values (B, H, S, Dh)."""

    hidden: Tensor
    valid: Tensor
    cross_mask: Tensor
    cross: list[tuple[Tensor, Tensor]]

    def select(self, rows: Tensor) -> HFContext:
        return HFContext(self.hidden[rows], self.valid[rows], self.cross_mask[rows],
                         [(k[rows], v[rows]) for k, v in self.cross])


class SelfAttentionCache:
    """What an HF attention layer calls on its self-attention cache: ``update`` writes the new keys and values
    (B, H, T, Dh) at each row's own ``positions`` (B, T) of the KVCache and returns those of slots 0..stop-1."""

    def __init__(self, kv: KVCache, positions: Tensor, stop: int) -> None:
        self.kv, self.positions, self.stop = kv, positions, stop

    def get_seq_length(self, layer_idx: int = 0) -> int:  # T5 asks before it reads the bias it is handed
        return 0

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self.kv.write(layer_idx, self.positions, key_states.transpose(1, 2), value_states.transpose(1, 2))
        keys, values = self.kv.view(layer_idx, self.stop)  # (B, S', H, Dh)
        return keys.transpose(1, 2), values.transpose(1, 2)


class StepCache(EncoderDecoderCache):
    """The cache one :meth:`HFSeq2SeqBlockwise.decode_step` hands every decoder layer: the HF attention sees an
    ``EncoderDecoderCache`` whose cross-attention part is already filled (``is_updated``) with the context's keys
    and values, and whose self-attention part is a :class:`SelfAttentionCache`. Only the members the attention
    layers read are set (the base class's constructor is not run)."""

    def __init__(self, self_attention: SelfAttentionCache, cross: list[tuple[Tensor, Tensor]]) -> None:
        self.self_attention_cache = self_attention  # type: ignore[assignment]
        self.cross_attention_cache = SimpleNamespace(layers=[SimpleNamespace(keys=k, values=v) for k, v in cross])
        self.is_updated = dict.fromkeys(range(len(cross)), True)


def as_mask(allowed: Tensor, dtype: torch.dtype, implementation: str) -> Tensor:
    """A boolean mask (True: attend) as the attention implementation takes it: sdpa the booleans, eager an
    additive float mask (0, or the dtype's minimum), as transformers' own mask functions build them."""
    if implementation == "sdpa":
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(~allowed, torch.finfo(dtype).min)


def tree_positions(lengths: Tensor, depths: Tensor, stop: int) -> tuple[Tensor, Tensor]:
    """A tree's verify pass over N nodes written at slots ``lengths[b] ..`` of each row (node order): the position
    (B, N) of each node (the row's length + its depth) and the position (B, stop) of each cache slot 0..stop-1 as a
    key (a prefix slot its own index, a node's slot that node's position; slots past the nodes: their index, never
    seen). ``depths`` (N,), or (B, N) for a tree per row. T5's relative bias reads key minus query positions."""
    n = depths.shape[-1]
    depths = depths.expand(lengths.shape[0], n)  # (B, N)
    queries = lengths[:, None] + depths  # (B, N)
    slots = torch.arange(stop, device=lengths.device)[None, :]  # (1, S')
    rel = slots - lengths[:, None]  # (B, S'): a node's index in its slot
    node = (rel >= 0) & (rel < n)
    keys = torch.where(node, lengths[:, None] + depths.gather(1, rel.clamp(0, n - 1)), slots)  # (B, S')
    return queries, keys
