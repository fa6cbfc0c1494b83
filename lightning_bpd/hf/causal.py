"""A pretrained Hugging Face decoder-only language model with a blockwise head, behind the decoding protocol.

:class:`HFCausalBlockwise` wraps a transformers ``AutoModelForCausalLM`` (Llama, Qwen2/Qwen3, Mistral, GPT-2, ...)
and a blockwise head that reads the base's last hidden state and projects through the base's own LM head, so p_1
is the base's own distribution and exact blockwise decoding reproduces the base's greedy ``generate``.

The decoding loop encodes a source and then decodes from a start token. Here the source is a batch of prompts
(B, P), padded with ``pad_id`` on either side (row b's prompt is its non-pad tokens, in order). :meth:`encode` is
the prefill: it runs every prompt *but its last token* through the base and keeps each layer's keys and values
(:class:`CausalContext`). The loop's start token is a placeholder: wherever a row's input sits at slot 0 of the
decode cache, :meth:`decode_step` feeds that row's own last prompt token instead, at its own position (prompt
length - 1). So the decode cache holds the last prompt token and the generated ones (the loop's ``1 + max_len + k``
fits as it is), each row at its own positions, and per-row rollback is the KV cache's crop.

Every step is the base model's own forward (``model.base_model``: its embeddings, rotary or absolute positions,
layers, final norm) with ``position_ids`` at each row's own positions, a 4-D mask (causal, a row's own length, its
prompt's pads hidden, sliding windows where the config has them) and a cache object of ours
(:class:`PromptStepCache`) through which every attention layer writes its keys and values into our per-row
:class:`~lightning_bpd.nn.kv_cache.KVCache` (as many heads as the layers' keys: grouped- or multi-query
attention as the layers do it) and reads them back behind the prompt's: the first step writes the prompt's keys and
values into the cache's prompt region (:meth:`~lightning_bpd.nn.kv_cache.KVCache.put_prefix`), ahead of the decoded
positions, so every step reads one view of one buffer. Nothing here is family-specific, so a family whose attention
layers call ``cache.update`` and whose base model takes ``position_ids`` and a 4-D mask is exact without new code.
A runtime's snapshot of a Llama-family base (Llama, Qwen2/3, Mistral) runs the same step through
:class:`~lightning_bpd.hf.lean_causal.LeanCausal` instead: the same ops from the layers' weights, bitwise the same.
:meth:`HFCausalBlockwise.decode_full` is the reference: the base's own uncached forward over each row alone, its
prompt followed by its decoder inputs, no padding.

The generation config's rules on p_1 (:mod:`lightning_bpd.hf.generation_rules`) count the padded prompt width as
``generate``'s ``start`` (``prompt_start``): several EOS ids, ``min_length`` / ``min_new_tokens``, suppressed
tokens, bad words of one or several tokens (matched against each prompt's tail as ``generate`` does:
:meth:`HFCausalBlockwise.rules_history`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AutoModelForCausalLM, PreTrainedModel

from lightning_bpd.decoding.generation_rules import GenerationRules
from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.hf.base import ATTENTION, as_mask
from lightning_bpd.hf.causal_heads import CausalHeads
from lightning_bpd.hf.checkpoint_dir import load_weights, read_config
from lightning_bpd.hf.generation_rules import ids, rules_from_config
from lightning_bpd.hf.gguf_target import resolve_pretrained
from lightning_bpd.hf.lean_causal import LeanCausal, lean_family
from lightning_bpd.nn.blockwise_head import BlockwiseHead
from lightning_bpd.nn.causal_model import checked_layers
from lightning_bpd.nn.chained_head import ChainedHead
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.medusa_head import MedusaHead

HEAD_TYPES = ("paper", "chained", "medusa")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclass
class CausalContext:
    """Prefilled prompts (B, P): ``prompts`` as given, ``valid`` (B, P) their non-pad slots, ``attend`` (B, P) the
    slots a decoded token attends to (every prompt token but the row's last, which the first step feeds again),
    ``key_positions`` (B, P) each slot's position, ``last`` (B,) each row's last prompt token, ``start`` (B,) its
    position (prompt length - 1), ``kv`` every layer's prompt keys and values (B, Hkv, P, Dh) and ``longest`` the
    longest prompt (a host int, a bound after :meth:`select`)."""

    prompts: Tensor
    valid: Tensor
    attend: Tensor
    key_positions: Tensor
    last: Tensor
    start: Tensor
    kv: list[tuple[Tensor, Tensor]]
    longest: int

    def select(self, rows: Tensor) -> CausalContext:
        return CausalContext(self.prompts[rows], self.valid[rows], self.attend[rows], self.key_positions[rows],
                             self.last[rows], self.start[rows], [(k[rows], v[rows]) for k, v in self.kv],
                             self.longest)


class PrefillCache:
    """What the attention layers call during the prefill: ``update`` keeps each layer's keys and values
    (B, Hkv, P, Dh) and returns them (the prompt attends to itself)."""

    def __init__(self) -> None:
        self.kv: dict[int, tuple[Tensor, Tensor]] = {}

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self.kv[layer_idx] = (key_states, value_states)
        return key_states, value_states


class PromptStepCache:
    """What the attention layers call during a decode step: ``update`` writes the new keys and values
    (B, Hkv, T, Dh) at each row's own cache ``slots`` (B, T) and returns the cache's prompt region followed by its
    slots 0..stop-1 (B, Hkv, P + stop, Dh): one view of the buffer the prompt was written into once."""

    def __init__(self, kv: KVCache, slots: Tensor, stop: int) -> None:
        self.cache, self.slots, self.stop = kv, slots, stop

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs) -> tuple[Tensor, Tensor]:
        self.cache.write(layer_idx, self.slots, key_states.transpose(1, 2), value_states.transpose(1, 2))
        keys, values = self.cache.view_with_prefix(layer_idx, self.stop)  # (B, P + S', Hkv, Dh)
        return keys.transpose(1, 2), values.transpose(1, 2)


def windows(config) -> dict[str, int | None]:
    """Each layer type's sliding window (None: full attention); one entry keyed '' for configs without types."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if not types:
        return {"": window}
    unknown = sorted(set(types) - set(LAYER_TYPES))
    if unknown:
        raise ValueError(f"{config.model_type}: layer types {unknown} are not supported (supported: {LAYER_TYPES})")
    return {t: window if t == "sliding_attention" else None for t in sorted(set(types))}


def allowed_keys(q_pos: Tensor, k_pos: Tensor, k_ok: Tensor, window: int | None) -> Tensor:
    """(B, T, S) True where a query at q_pos (B, T) sees a key at k_pos (B, S) that exists (``k_ok`` (B, S) or
    (B, T, S)): causal, and within the sliding window as transformers counts it (q - k < window)."""
    seen = (k_pos[:, None, :] <= q_pos[:, :, None]) & k_ok
    if window is not None:
        seen &= q_pos[:, :, None] - k_pos[:, None, :] < window
    return seen


class HFCausalBlockwise(CausalHeads, OptionalCapabilities, nn.Module):
    """A transformers causal LM (``base``) with k blockwise heads, implementing the decoding protocol
    (:class:`~lightning_bpd.decoding.protocol.BlockwiseModel`); sources are prompts, outputs their continuations.

    ``head_type``: ``paper`` (:class:`BlockwiseHead`, p_1 the base itself), ``chained`` (:class:`ChainedHead`) or
    ``medusa`` (:class:`MedusaHead`, ``medusa_layers`` residual blocks per head). ``head_hidden``: the paper or
    chained head's hidden size (default the base's). ``frozen``: the base does not train. ``pad_id``:
    the id that pads prompts (default the config's pad id, else its first EOS id); prompts must not contain it.
    """

    def __init__(self, base: PreTrainedModel, k: int = 1, head_type: str = "paper", head_hidden: int | None = None,
                 frozen: bool = True, pad_id: int | None = None, medusa_layers: int = 1) -> None:
        super().__init__()
        config = getattr(base, "config", None)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1 (1 = the base model alone), got {k!r}")
        if head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES} on a causal LM, got {head_type!r}")
        if config is None or getattr(config, "is_encoder_decoder", False):
            name = getattr(config, "model_type", type(base).__name__)
            raise ValueError(f"{name} is an encoder-decoder checkpoint: use HFSeq2SeqBlockwise "
                             "(lightning_bpd.hf.load_base)")
        implementation = config._attn_implementation or "eager"
        if implementation not in ATTENTION:
            raise ValueError(f"attention implementation {implementation!r} is not supported (use one of {ATTENTION})")
        self.base, self.attention = base, implementation
        self.windows = windows(config)
        self.k, self.head_type = k, head_type
        eos = ids(base.generation_config.eos_token_id) or ids(config.eos_token_id)
        self.eos_id = eos[0] if eos else None  # the first of the EOS ids: generation_rules has them all
        pad = pad_id if pad_id is not None else config.pad_token_id
        pad = pad if pad is not None else base.generation_config.pad_token_id
        pad = pad if pad is not None else self.eos_id
        if pad is None:
            raise ValueError(f"{config.model_type}: the config has no pad or EOS id: pass pad_id")
        self.pad_id = int(pad)
        self.bos_id = self.pad_id  # a placeholder: the first step feeds each row's last prompt token in its place
        self.n_layers = config.num_hidden_layers
        self._kv_shape: tuple[int, int] | None = None  # (KV heads, head dim): read off the layers' own keys
        self.n_positions: int | None = getattr(config, "max_position_embeddings", None)
        d, hidden = config.hidden_size, head_hidden or config.hidden_size
        self.head_hidden = hidden
        self.chained_heads = head_type == "chained"
        if self.chained_heads:
            self.head: BlockwiseHead | ChainedHead | MedusaHead = ChainedHead(d, hidden, k)
        elif head_type == "medusa":
            self.head = MedusaHead(d, k, medusa_layers)
        else:
            self.head = BlockwiseHead(d, hidden, k, identity_first=True)
        weight = base.get_output_embeddings().weight
        self.head.to(dtype=weight.dtype, device=weight.device)
        self.vocab_size = weight.shape[0]
        self.frozen = frozen
        self.lean = False  # a runtime's lean steps: decode steps through LeanCausal (the Llama family)
        self._lean: LeanCausal | None = None
        if frozen:
            base.requires_grad_(False)

    @property
    def generation_rules(self) -> GenerationRules:  # type: ignore[override]
        """The base's generation config as rules on p_1, ``start`` the padded prompt width of each decode."""
        return rules_from_config(self.base.generation_config, fallback_eos=self.base.config.eos_token_id,
                                 prompt_start=True)

    def rules_history(self, src: Tensor, window: int) -> Tensor:  # type: ignore[override]
        """What ``generate`` matches banned words of several tokens against before the first new token: the last
        ``window`` columns of the prompts ``src`` (B, S) left-padded (pad ids included), -1 before them."""
        valid = src != self.pad_id
        order = torch.argsort(valid.long(), dim=1, stable=True)  # (B, S): pads first, then the prompt in order
        left = src.gather(1, order)  # (B, S) left-padded
        before = torch.full((src.shape[0], max(0, window - src.shape[1])), -1, dtype=torch.long, device=src.device)
        return torch.cat([before, left], dim=1)[:, -window:]

    @property
    def trunk(self) -> nn.Module:
        """The base's decoder stack (embeddings, layers, final norm): what the LM head reads."""
        return self.base.base_model

    # ---- prefill ------------------------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> CausalContext:
        """Prompts (B, P), padded with ``pad_id`` on either side -> every layer's keys and values of each prompt
        but its last token (the first decode step feeds that one)."""
        return self.prefilled(src)[0]

    def encode_features(self, src: Tensor, layers: Sequence[int]) -> tuple[CausalContext, Tensor, Tensor, Tensor]:
        """:meth:`encode`, and the outputs of the decoder layers ``layers`` at every prompt slot, concatenated
        (B, P, len(layers) * D), with the slots that hold a token (B, P) and their positions (B, P) (a block drafter's
        context; the row's last token included, seeing the tokens before it)."""
        context, features = self.prefilled(src, self.checked_layers(layers))
        return context, features, context.valid, context.key_positions

    def full_features(self, tokens: Tensor, layers: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Uncached, the base's own forward: whole sequences (B, T) -> the last hidden states (B, T, D) and the outputs
        of ``layers`` (B, T, len(layers) * D) (``hidden_states[i + 1]``; what a block drafter trains on)."""
        layers = self.checked_layers(layers)
        out = self.trunk(input_ids=tokens, output_hidden_states=True, use_cache=False)
        return out.last_hidden_state, torch.cat([out.hidden_states[i + 1] for i in layers], dim=-1)

    def checked_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        return checked_layers(layers, self.n_layers)

    def prefilled(self, src: Tensor, layers: tuple[int, ...] = ()) -> tuple[CausalContext, Tensor | None]:
        """:meth:`encode`'s context and, for ``layers``, the prompt slots' features (B, P, len(layers) * D)."""
        valid = src != self.pad_id  # (B, P)
        n = valid.sum(dim=1)  # (B,)
        longest = int(n.max())
        self.check_prompt(longest)
        positions = (valid.long().cumsum(dim=1) - 1).clamp(min=0)  # (B, P): generate's position ids
        slots = torch.arange(src.shape[1], device=src.device)
        last_slot = torch.where(valid, slots, -1).argmax(dim=1)  # (B,): each row's last prompt token
        rows = torch.arange(src.shape[0], device=src.device)
        attend = valid.clone()
        attend[rows, last_slot] = False
        # the prefill: slot j sees the prompt slots before it, and itself (a pad slot must see something)
        itself = torch.eye(src.shape[1], dtype=torch.bool, device=src.device)  # (P, P)
        seen = {t: allowed_keys(positions, positions, attend[:, None, :], w) | itself for t, w in self.windows.items()}
        kv, features = self.prefill(src, positions, seen, layers)
        return CausalContext(src, valid, attend, positions, src[rows, last_slot], n - 1, kv, longest), features

    def prefill(self, tokens: Tensor, positions: Tensor, seen: dict[str, Tensor],
                layers: tuple[int, ...] = ()) -> tuple[list[tuple[Tensor, Tensor]], Tensor | None]:
        """Every layer's keys and values (B, Hkv, P, Dh) of ``tokens`` (B, P) at ``positions``, queries seeing
        ``seen`` (B, P, P) by layer type, and the outputs of ``layers`` (B, P, len(layers) * D) or None; one clear
        line where the layers' keys are not one shape."""
        cache = PrefillCache()
        _, features = self.run_features(tokens, positions, seen, cache, layers)
        shapes = {(k.shape[1], k.shape[3]) for k, _ in cache.kv.values()}
        if sorted(cache.kv) != list(range(self.n_layers)) or len(shapes) != 1:
            raise ValueError(f"{self.base.config.model_type}: its attention layers cache keys of shapes "
                             f"{sorted(shapes)} in layers {sorted(cache.kv)}, not one shape in all {self.n_layers} "
                             "layers: not supported")
        return [cache.kv[i] for i in range(self.n_layers)], features

    @property
    def kv_shape(self) -> tuple[int, int]:
        """(KV heads, head dim) of the layers' keys, read once off a one-token prefill (configs name them
        differently: grouped- and multi-query attention as the layers do it)."""
        if self._kv_shape is None:
            device = self.base.get_output_embeddings().weight.device
            one = torch.full((1, 1), self.pad_id, dtype=torch.long, device=device)
            seen = {t: torch.ones(1, 1, 1, dtype=torch.bool, device=device) for t in self.windows}
            with torch.no_grad():
                keys = self.prefill(one, torch.zeros_like(one), seen)[0][0][0]  # (1, Hkv, 1, Dh)
            self._kv_shape = (keys.shape[1], keys.shape[3])
        return self._kv_shape

    def run(self, tokens: Tensor, positions: Tensor, seen: dict[str, Tensor], cache: object) -> Tensor:
        """The base's own forward over ``tokens`` (B, T) at ``positions`` (B, T), each layer type's queries seeing
        the keys ``seen[type]`` (B, T, S), through ``cache`` -> the last hidden states (B, T, D)."""
        return self.run_features(tokens, positions, seen, cache)[0]

    def run_features(self, tokens: Tensor, positions: Tensor, seen: dict[str, Tensor], cache: object,
                     layers: tuple[int, ...] = ()) -> tuple[Tensor, Tensor | None]:
        """:meth:`run`, and the outputs of the decoder layers ``layers`` (B, T, len(layers) * D), or None for none
        (transformers' ``hidden_states[i + 1]``: layer i's output; the last layer's after the final norm)."""
        masks = self.masks(seen)
        mask = masks if len(masks) > 1 else next(iter(masks.values()))
        try:
            out = self.trunk(input_ids=tokens, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True,
                             output_hidden_states=bool(layers))
        except AttributeError as err:
            if type(cache).__name__ not in str(err):
                raise
            raise ValueError(f"{self.base.config.model_type}: its model asks the cache for more than update() "
                             f"({err}): not supported (positions or ALiBi biases derived from the cache)") from None
        features = torch.cat([out.hidden_states[i + 1] for i in layers], dim=-1) if layers else None
        return out.last_hidden_state, features

    def masks(self, seen: dict[str, Tensor]) -> dict[str, Tensor]:
        """Each layer type's boolean ``seen`` (B, T, S) as the attention implementation takes it (B, 1, T, S)."""
        dtype = self.base.get_output_embeddings().weight.dtype
        return {t: as_mask(s[:, None], dtype, self.attention) for t, s in seen.items()}

    # ---- decoder ------------------------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> KVCache:
        """A per-row KV cache of the decoded positions (the last prompt token and what follows it), and
        ``extra_slots`` more (a tree's nodes past its depth)."""
        w = self.base.get_output_embeddings().weight
        heads, dim = self.kv_shape
        return KVCache(self.n_layers, batch_size, capacity + extra_slots, heads, dim, dtype=w.dtype, device=w.device)

    def decode_step(self, tokens: Tensor, context: CausalContext, cache: KVCache) -> Tensor:
        """T >= 1 new inputs per row (B, T) after what ``cache`` holds -> hidden (B, T, D); an input at cache slot 0
        (the loop's start token) is the row's last prompt token."""
        return self.stepped(tokens, context, cache)

    def decode_step_features(self, tokens: Tensor, context: CausalContext, cache: KVCache,
                             layers: Sequence[int]) -> tuple[Tensor, Tensor]:
        """:meth:`decode_step`, and the outputs of the decoder layers ``layers`` (B, T, len(layers) * D) (a runtime's
        lean step gives them too, bitwise the modules' features)."""
        return self.stepped(tokens, context, cache, self.checked_layers(layers))

    def stepped(self, tokens: Tensor, context: CausalContext, cache: KVCache, layers: tuple[int, ...] = ()) -> Any:
        """:meth:`decode_step` (``layers`` empty) or :meth:`decode_step_features`."""
        n_new = tokens.shape[1]
        slots, stop = self.room(n_new, context, cache)  # (B, T)
        tokens = torch.where(slots == 0, context.last[:, None], tokens)
        k_pos = context.start[:, None] + torch.arange(stop, device=tokens.device)  # (B, S') cache slots' positions
        return self.step(tokens, slots, context.start[:, None] + slots, k_pos, k_pos >= 0, stop, context, cache,
                         layers)

    def decode_tree(self, tokens: Tensor, depths: Tensor, ancestors: Tensor,  # type: ignore[override]
                    context: CausalContext, cache: KVCache) -> Tensor:
        """The verify pass over a tree's N nodes per row (B, N): node i at the row's position + ``depths[i]`` (N,),
        seeing the prompt, the cached prefix and the nodes j with ``ancestors[i, j]`` (N, N) -> hidden (B, N, D) (a
        tree per row: depths (B, N), ancestors (B, N, N));
        appends N slots to the cache (:meth:`KVCache.keep_path` keeps the accepted ones)."""
        return self.tree_step(tokens, depths, ancestors, context, cache)

    def decode_tree_features(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: CausalContext,
                             cache: KVCache, layers: Sequence[int]) -> tuple[Tensor, Tensor]:
        """:meth:`decode_tree`, and the outputs of the decoder layers ``layers`` at every node (B, N, len(layers) * D)."""
        return self.tree_step(tokens, depths, ancestors, context, cache, self.checked_layers(layers))

    def tree_step(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: CausalContext, cache: KVCache,
                  layers: tuple[int, ...] = ()) -> Any:
        """:meth:`decode_tree` (``layers`` empty) or :meth:`decode_tree_features`."""
        b, n = tokens.shape
        depths, ancestors = depths.expand(b, n), ancestors.expand(b, n, n)  # a tree per row: (B, N), (B, N, N)
        slots, stop = self.room(n, context, cache)  # (B, N)
        held = torch.arange(stop, device=tokens.device)  # (S',)
        rel = held[None, :] - cache.lengths[:, None]  # (B, S'): the node in each slot of the tree, < 0 in the prefix
        node = rel.clamp(0, n - 1)
        among = ancestors.gather(2, node[:, None, :].expand(b, n, -1))  # (B, N, S')
        visible = (rel < 0)[:, None, :] | ((rel < n)[:, None, :] & among)  # (B, N, S')
        k_pos = context.start[:, None] + torch.where(rel < 0, held[None, :],
                                                     cache.lengths[:, None] + depths.gather(1, node))
        q_pos = context.start[:, None] + cache.lengths[:, None] + depths  # (B, N)
        return self.step(tokens, slots, q_pos, k_pos, visible, stop, context, cache, layers)

    def room(self, n_new: int, context: CausalContext, cache: KVCache) -> tuple[Tensor, int]:
        """The cache slots (B, n_new) the next inputs take and the slots a query may read (a host int); raises
        where the cache has no room for them (the model's context: :meth:`room_after`, which the decoders keep)."""
        cache.check_room(n_new)
        if not cache.prefix:  # the first step: the prompt's keys and values go into the cache's prompt region, once
            cache.put_prefix([k.transpose(1, 2) for k, _ in context.kv], [v.transpose(1, 2) for _, v in context.kv])
        stop = min(cache.length_bounds()[1] + n_new, cache.capacity)  # a static cache: every slot
        return cache.positions(n_new), stop

    @property
    def decode_room(self) -> Callable[[Tensor], list[int]] | None:  # type: ignore[override]
        """The decoder inputs each prompt row leaves after its last token before the model's positions run out
        (:attr:`~lightning_bpd.decoding.protocol.BlockwiseModel.decode_room`); None for a base without a position
        limit."""
        return None if self.n_positions is None else self.room_after

    def room_after(self, src: Tensor) -> list[int]:
        """Prompts (B, P) padded with ``pad_id`` -> the new tokens each fits in the context (host ints): input i after
        the start token sits at position prompt length - 1 + i."""
        lengths = (src != self.pad_id).sum(dim=1).tolist()
        self.check_prompt(max(lengths))
        return [self.n_positions - n for n in lengths]

    def check_prompt(self, longest: int) -> None:
        """One line where the longest prompt (tokens) does not fit the model's context."""
        if self.n_positions is not None and longest > self.n_positions:
            raise ValueError(f"a prompt of {longest} tokens is longer than the model's context "
                             f"({self.n_positions} positions)")

    def fed_positions(self, q_pos: Tensor) -> Tensor:
        """The position ids (B, T) the base reads for inputs at ``q_pos`` (B, T): as they are, but capped at the last
        of the model's positions. Only inputs that nothing reads pass it (the decoders keep every live row within
        :meth:`room_after`: a fixed-shape decoder's finished rows, proposals past max_len); the masks keep their
        true positions, so no other input sees them."""
        return q_pos if self.n_positions is None else q_pos.clamp(max=self.n_positions - 1)

    def step(self, tokens: Tensor, slots: Tensor, q_pos: Tensor, k_pos: Tensor, visible: Tensor, stop: int,
             context: CausalContext, cache: KVCache, layers: tuple[int, ...] = ()) -> Any:
        """Inputs (B, T) written at cache ``slots`` (B, T), at positions ``q_pos`` (B, T), seeing the prompt and
        the cache slots 0..stop-1 at positions ``k_pos`` (B, S') where ``visible`` ((B, S') or (B, T, S')) ->
        hidden (B, T, D); with ``layers``, (hidden, their outputs (B, T, len(layers) * D))."""
        vis = visible if visible.dim() == 3 else visible[:, None, :]
        seen = {t: torch.cat([allowed_keys(q_pos, context.key_positions, context.attend[:, None, :], w),
                              allowed_keys(q_pos, k_pos, vis, w)], dim=2) for t, w in self.windows.items()}
        fed = self.fed_positions(q_pos)  # (B, T)
        if self.runs_lean():  # the same ops, fewer calls
            h = self.lean_trunk()(tokens, fed, self.masks(seen), cache, slots, stop, self.products, layers)
        elif layers:
            h = self.run_features(tokens, fed, seen, PromptStepCache(cache, slots, stop), layers)
        else:
            h = self.run(tokens, fed, seen, PromptStepCache(cache, slots, stop))  # seen: (B, T, P + S')
        cache.advance(tokens.shape[1])
        return h

    def use_lean_steps(self, on: bool) -> None:
        """A runtime's snapshot of a Llama-family base runs its decode steps lean
        (:class:`~lightning_bpd.hf.lean_causal.LeanCausal`); other families keep the modules."""
        self.lean = on and lean_family(self.base)

    def runs_lean(self) -> bool:
        """Whether a decode step runs lean: a runtime's snapshot (``lean``), inference, no gradients."""
        return self.lean and not torch.is_grad_enabled() and not self.base.training

    def lean_trunk(self) -> LeanCausal:
        """The base's layers as one :class:`~lightning_bpd.hf.lean_causal.LeanCausal` (listed on first use: a
        runtime's snapshot, whose parameters do not change; listed again where a copy of the snapshot holds other
        parameters)."""
        if self._lean is None or not self._lean.lists(self.trunk):
            self._lean = LeanCausal(self.trunk, self.attention, typed="" not in self.windows)
        return self._lean

    def decode_full(self, tgt_in: Tensor, context: CausalContext) -> Tensor:
        """Uncached, the reference: the base's own forward over each row alone (no padding), its prompt followed by
        ``tgt_in`` (B, T) after the start token -> hidden (B, T, D) at the last prompt token and the inputs after it."""
        out = []
        for prompt, ok, tgt in zip(context.prompts, context.valid, tgt_in):
            seq = torch.cat([prompt[ok], tgt[1:]])[None]  # (1, L + T - 1)
            h = self.trunk(input_ids=seq, use_cache=False).last_hidden_state  # (1, L + T - 1, D)
            out.append(h[0, -tgt_in.shape[1]:])
        return torch.stack(out)

    def forward(self, tokens: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Training: token sequences (B, T) (and their 0/1 mask) -> the last hidden states (B, T, D)."""
        return self.trunk(input_ids=tokens, attention_mask=attention_mask, use_cache=False).last_hidden_state


def load_causal(path_or_model: str | os.PathLike | PreTrainedModel, k: int = 1, head_type: str = "paper",
                head_hidden: int | None = None, frozen: bool = True, pad_id: int | None = None) -> HFCausalBlockwise:
    """A local checkpoint directory (never downloaded), a ``.gguf`` file (dequantized once into a cached folder:
    :func:`~lightning_bpd.hf.gguf_target.resolve_pretrained`) or a loaded model -> :class:`HFCausalBlockwise`."""
    if isinstance(path_or_model, (str, os.PathLike)):
        path_or_model = resolve_pretrained(path_or_model)
        read_config(path_or_model, seq2seq=False)
        model = load_weights(path_or_model, AutoModelForCausalLM, "causal LM")
    else:
        model = path_or_model
    return HFCausalBlockwise(model.eval(), k=k, head_type=head_type, head_hidden=head_hidden, frozen=frozen,
                             pad_id=pad_id)
