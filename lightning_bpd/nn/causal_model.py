"""Our own decoder-only Transformer: the encoder-decoder's decoder layers without cross-attention (``ModelConfig(...,
decoder_only=True)``), behind the decoding protocol as the Hugging Face causal adapter (:mod:`lightning_bpd.hf.causal`)
puts a causal LM there.

Sources are prompts (B, P), padded with ``pad_id`` on either side (row b's prompt is its non-pad tokens, in order), and
every token sits at its index in its own row (sinusoidal positions; pads take none). :meth:`CausalTransformer.encode` is
the prefill: every layer's keys and values of each prompt (:class:`PromptContext`), of which a decoded token sees all
*but the last* prompt token's. The loop's start token is a placeholder: wherever a row's input sits at slot 0 of the
decode cache, :meth:`CausalTransformer.decode_step` feeds that row's own last prompt token, at its own position (prompt
length - 1). The decode cache thus holds the last prompt token and the generated ones (the loop's ``1 + max_len + k``
fits as it is) and per-row rollback is its crop. The first step writes the prompt's keys and values into the cache's
prompt region (:meth:`~lightning_bpd.nn.kv_cache.KVCache.put_prefix`), so each cached layer attends over one view of the
cache: the prompt, then the decoded positions. :meth:`CausalTransformer.decode_full` is the reference: the uncached
stack over each row alone, its prompt followed by its decoder inputs, no padding. Torch only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lightning_bpd.nn.attention import additive, cached_span, tree_span
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.model import BlockwiseTransformer

# What a layer attends over: (layer index, the new keys, values (B, T, H, Dh)) -> all its keys, values (B, S, H, Dh).
KeysOf = Callable[[int, Tensor, Tensor], tuple[Tensor, Tensor]]


def checked_layers(layers: Sequence[int], n_layers: int) -> tuple[int, ...]:
    """``layers`` as a tuple of decoder layer indices of a stack of ``n_layers`` (a drafter's target layers); one
    clear line where there is none or one is out of range."""
    layers = tuple(int(i) for i in layers)
    bad = [i for i in layers if not 0 <= i < n_layers]
    if not layers or bad:
        raise ValueError(f"target layers {list(layers)}: each must be a decoder layer in [0, {n_layers - 1}]")
    return layers


@dataclass
class PromptContext:
    """Prefilled prompts (B, P): ``prompts`` as given, ``valid`` (B, P) their non-pad slots, ``attend`` (B, P) the slots
    a decoded token attends to (every prompt token but the row's last, which the first step feeds again), ``last``
    (B,) each row's last prompt token, ``start`` (B,) its position (prompt length - 1), ``kv`` every layer's prompt
    keys and values (B, P, H, Dh) and ``longest`` the longest prompt (a host int, a bound after :meth:`select`)."""

    prompts: Tensor
    valid: Tensor
    attend: Tensor
    last: Tensor
    start: Tensor
    kv: list[tuple[Tensor, Tensor]]
    longest: int

    def select(self, rows: Tensor) -> PromptContext:
        return PromptContext(self.prompts[rows], self.valid[rows], self.attend[rows], self.last[rows],
                             self.start[rows], [(k[rows], v[rows]) for k, v in self.kv], self.longest)


class CausalTransformer(BlockwiseTransformer):
    """A decoder-only :class:`BlockwiseTransformer` (no encoder, no cross-attention) with k blockwise heads: sources
    are prompts, outputs their continuations (see the module docstring). Embeddings, positions, heads, the output
    layer and what a runtime builds its fast paths from are the encoder-decoder's own; there is no lean step."""

    decoder_only = True
    n_positions: int | None = None  # sinusoidal positions: no context limit

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.bos_id = config.pad_id  # a placeholder: the first step feeds each row's last prompt token in its place

    def use_lean_steps(self, on: bool) -> None:
        """No lean step for the decoder-only stack: its modules run either way."""

    def rules_history(self, src: Tensor, window: int) -> Tensor:  # type: ignore[override]
        """What generation rules match banned words of several tokens against before the first new token: each
        prompt's last ``window`` tokens of ``src`` (B, P), -1 before them (B, window)."""
        valid = src != self.pad_id
        order = torch.argsort(valid.long(), dim=1, stable=True)  # (B, P): pads first, then the prompt in order
        left = torch.where(valid.gather(1, order), src.gather(1, order), -1)
        before = torch.full((src.shape[0], max(0, window - src.shape[1])), -1, dtype=torch.long, device=src.device)
        return torch.cat([before, left], dim=1)[:, -window:]

    # ---- the stack ----------------------------------------------------------------------------------------------
    def layers_pass(self, x: Tensor, seen: Tensor, keys_of: KeysOf) -> Tensor:
        """The decoder's layers (self-attention and feed-forward) over embedded inputs x (B, T, D), query t seeing key
        s where ``seen`` (B or 1, T, S) is True, each layer's keys from ``keys_of`` -> hidden (B, T, D)."""
        return self.layers_features(x, seen, keys_of)[0]

    def layers_features(self, x: Tensor, seen: Tensor, keys_of: KeysOf,
                        layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """:meth:`layers_pass`, and the outputs of the decoder layers ``layers`` (B, T, len(layers) * D) in that order
        (each layer's residual stream, before the final norm), or None for none."""
        bias = additive(seen[:, None], x.dtype)  # (B, 1, T, S): converted once for all layers
        taps: dict[int, Tensor] = {}
        for i, layer in enumerate(self.decoder.layers):
            q, k, v = layer.self_attn.qkv(layer.norm1(x))  # (B, T, H, Dh) each
            k, v = keys_of(i, k, v)
            x = layer.feed_forward(x + layer.drop(layer.self_attn.attend(q, k, v, bias)))
            if i in layers:
                taps[i] = x
        return self.decoder.norm(x), (torch.cat([taps[i] for i in layers], dim=-1) if layers else None)

    # ---- a block drafter's target features (DFlash) ---------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.decoder.layers)

    def checked_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        return checked_layers(layers, self.n_layers)

    def full_features(self, tokens: Tensor, layers: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Uncached, as :meth:`causal_pass`: whole sequences (B, T) -> the last hidden states (B, T, D) and the
        outputs of ``layers`` (B, T, len(layers) * D) (what a block drafter trains on)."""
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.embed_tgt(tokens, pos.expand_as(tokens), limit=t)
        h, features = self.layers_features(x, (pos[None, :] <= pos[:, None])[None], lambda i, k, v: (k, v),
                                           self.checked_layers(layers))
        return h, features  # type: ignore[return-value]

    def causal_pass(self, tokens: Tensor) -> Tensor:
        """Uncached: whole sequences (B, T) at positions 0..T-1 -> hidden (B, T, D)."""
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.embed_tgt(tokens, pos.expand_as(tokens), limit=t)
        return self.layers_pass(x, (pos[None, :] <= pos[:, None])[None], lambda i, k, v: (k, v))

    def forward(self, tokens: Tensor) -> Tensor:  # type: ignore[override]
        """Training: token sequences (B, T) -> the last hidden states (B, T, D)."""
        return self.causal_pass(tokens)

    # ---- prefill ------------------------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> PromptContext:
        """Prompts (B, P), padded with ``pad_id`` on either side -> every layer's keys and values of each prompt."""
        return self.prefilled(src)[0]

    def encode_features(self, src: Tensor, layers: Sequence[int]) -> tuple[PromptContext, Tensor, Tensor, Tensor]:
        """:meth:`encode`, and the outputs of the decoder layers ``layers`` at every prompt slot (B, P, len(layers) *
        D), with the slots that hold a token (B, P) and their positions (B, P) (a block drafter's context; the row's
        last token included, seeing the tokens before it)."""
        context, features = self.prefilled(src, self.checked_layers(layers))
        positions = (context.valid.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, P)
        return context, features, context.valid, positions  # type: ignore[return-value]

    def prefilled(self, src: Tensor, layers: tuple[int, ...] = ()) -> tuple[PromptContext, Tensor | None]:
        """:meth:`encode`'s context and, for ``layers``, the prompt slots' features (B, P, len(layers) * D)."""
        if src.dim() != 2 or src.shape[1] == 0:
            raise ValueError(f"src must be a non-empty (batch, length) tensor of prompts, got shape {tuple(src.shape)}")
        valid = src != self.pad_id  # (B, P)
        if not bool(valid.any(dim=1).all()):
            raise ValueError("src: every row needs at least one non-pad token (got an empty prompt)")
        n = valid.sum(dim=1)  # (B,)
        longest = int(n.max())
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, P): each token's index in its own row
        slots = torch.arange(src.shape[1], device=src.device)
        last_slot = torch.where(valid, slots, -1).argmax(dim=1)  # (B,)
        rows = torch.arange(src.shape[0], device=src.device)
        attend = valid.clone()
        attend[rows, last_slot] = False
        # slot j sees the prompt's earlier tokens and itself (a pad slot must see something; no token sees a pad)
        seen = ((positions[:, None, :] <= positions[:, :, None]) & valid[:, None, :]) | torch.eye(
            src.shape[1], dtype=torch.bool, device=src.device)  # (B, P, P)
        kv: list[tuple[Tensor, Tensor]] = []

        def keep(i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            kv.append((k, v))
            return k, v

        _, features = self.layers_features(self.embed_tgt(src, positions, limit=longest), seen, keep, layers)
        return PromptContext(src, valid, attend, src[rows, last_slot], n - 1, kv, longest), features

    # ---- decoder ------------------------------------------------------------------------------------------------
    def decode_step(self, tokens: Tensor, context: PromptContext, cache: KVCache) -> Tensor:  # type: ignore[override]
        """T >= 1 new inputs per row (B, T) after what ``cache`` holds -> hidden (B, T, D); an input at cache slot 0
        (the loop's start token) is the row's last prompt token."""
        return self.stepped(tokens, context, cache)[0]

    def decode_step_features(self, tokens: Tensor, context: PromptContext, cache: KVCache,
                             layers: Sequence[int]) -> tuple[Tensor, Tensor]:
        """:meth:`decode_step`, and the outputs of the decoder layers ``layers`` (B, T, len(layers) * D)."""
        return self.stepped(tokens, context, cache, self.checked_layers(layers))  # type: ignore[return-value]

    def stepped(self, tokens: Tensor, context: PromptContext, cache: KVCache,
                layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """:meth:`decode_step` and, for ``layers``, the new inputs' features."""
        cache.check_room(tokens.shape[1])
        slots = cache.positions(tokens.shape[1])  # (B, T)
        tokens = torch.where(slots == 0, context.last[:, None], tokens)
        (_, stop), seen = cached_span(slots, None, cache)  # seen (B, 1, T, S'): causal over the cache's slots
        return self.step_features(tokens, context.start[:, None] + slots, slots, stop, seen[:, 0], context, cache,
                                  layers)

    def tree_pass(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: PromptContext,  # type: ignore[override]
                  cache: KVCache) -> Tensor:
        """The verify pass over a tree's N nodes per row (B, N): node i at the row's position + ``depths[i]`` (N,),
        seeing the prompt, the cached prefix and the nodes j with ``ancestors[i, j]`` (N, N) -> hidden (B, N, D);
        appends N slots to the cache (:meth:`KVCache.keep_path` keeps the accepted ones)."""
        return self.tree_features(tokens, depths, ancestors, context, cache)[0]

    def decode_tree_features(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: PromptContext,
                             cache: KVCache, layers: Sequence[int]) -> tuple[Tensor, Tensor]:
        """:meth:`tree_pass`, and the outputs of the decoder layers ``layers`` at every node (B, N, len(layers) * D)."""
        return self.tree_features(tokens, depths, ancestors, context, cache,  # type: ignore[return-value]
                                  self.checked_layers(layers))

    def tree_features(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: PromptContext,
                      cache: KVCache, layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """:meth:`tree_pass` and, for ``layers``, the nodes' features."""
        cache.check_room(tokens.shape[1])
        slots = cache.positions(tokens.shape[1])  # (B, N)
        (_, stop), seen = tree_span(slots, ancestors, cache)  # seen (B, 1, N, S')
        q_pos = context.start[:, None] + cache.lengths[:, None] + depths  # (B, N)
        return self.step_features(tokens, q_pos, slots, stop, seen[:, 0], context, cache, layers)

    def step(self, tokens: Tensor, q_pos: Tensor, slots: Tensor, stop: int, seen: Tensor, context: PromptContext,
             cache: KVCache) -> Tensor:
        """Inputs (B, T) at positions ``q_pos`` (B, T), written at cache ``slots`` (B, T), seeing the prompt and the
        cache slots 0..stop-1 where ``seen`` (B, T, S') -> hidden (B, T, D); appends T positions to the cache."""
        return self.step_features(tokens, q_pos, slots, stop, seen, context, cache)[0]

    def step_features(self, tokens: Tensor, q_pos: Tensor, slots: Tensor, stop: int, seen: Tensor,
                      context: PromptContext, cache: KVCache,
                      layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """:meth:`step`, and the outputs of ``layers`` (B, T, len(layers) * D) or None."""
        x = self.embed_tgt(tokens, q_pos, limit=context.longest - 1 + stop)
        prompt = context.attend[:, None, :].expand(-1, tokens.shape[1], -1)  # (B, T, P)
        if not cache.prefix:  # the first step: the prompt's keys and values go into the cache's prompt region, once
            cache.put_prefix([k for k, _ in context.kv], [v for _, v in context.kv])

        def keys_of(i: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
            cache.write(i, slots, k, v)
            return cache.view_with_prefix(i, stop)  # (B, P + S', H, Dh): the prompt, then the decoded positions

        out = self.layers_features(x, torch.cat([prompt, seen], dim=2), keys_of, layers)
        cache.advance(tokens.shape[1])
        return out

    def decode_full(self, tgt_in: Tensor, context: PromptContext) -> Tensor:  # type: ignore[override]
        """Uncached, the reference: the stack over each row alone (no padding), its prompt followed by ``tgt_in``
        (B, T) after the start token -> hidden (B, T, D) at the last prompt token and the inputs after it."""
        out = []
        for prompt, ok, tgt in zip(context.prompts, context.valid, tgt_in):
            seq = torch.cat([prompt[ok], tgt[1:]])[None]  # (1, L + T - 1)
            out.append(self.causal_pass(seq)[0, -tgt_in.shape[1]:])
        return torch.stack(out)
