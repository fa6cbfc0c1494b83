"""A pretrained Hugging Face encoder-decoder with a blockwise head, behind the decoding protocol.

:class:`HFSeq2SeqBlockwise` wraps a transformers ``AutoModelForSeq2SeqLM`` (Marian, BART, mBART, T5) and a
blockwise head (:class:`~lightning_bpd.nn.blockwise_head.BlockwiseHead` or
:class:`~lightning_bpd.nn.chained_head.ChainedHead`) that reads the base's last decoder hidden state (what its
LM head reads) and projects through the base's own LM head, so p_1 is the base's own distribution and exact
blockwise decoding reproduces the base's greedy ``generate`` token for token.

Rows of a batch accept different numbers of tokens, so every row has its own decoder length. The HF decoders
compute positions from one cache length shared by the batch; :meth:`HFSeq2SeqBlockwise.decode_step` therefore
runs the decoder itself around the HF submodules: the HF token embedding, the HF position table read at each
row's own positions (T5: its relative position bias at each row's own positions), then each HF ``decoder_layer``
with a 4-D mask built from those positions (causal, slots past a row's length hidden) and a cache object
(:class:`StepCache`) through which the layers' self-attention writes its keys and values into our per-row
:class:`~lightning_bpd.nn.kv_cache.KVCache` and reads the cross-attention keys and values computed once per
source (:meth:`HFSeq2SeqBlockwise.encode`). Cropping rejected proposals is the KVCache's per-row crop. A tree of
candidates (:meth:`~HFSeq2SeqBlockwise.decode_tree`) runs the same way with the tree mask, each node at its own
position (the row's length + its depth; T5's bias at key minus query positions, a node's key at its position), and
the KVCache keeps the accepted path (``keep_path``); the lean step takes the tree mask as it is.
:meth:`~HFSeq2SeqBlockwise.decode_full` is the HF decoder's own uncached forward: the
reference.

The LM head's logits are p_1, and the base's generation config is handed over as the decoding core's rules on
it (:attr:`HFSeq2SeqBlockwise.generation_rules`, read by :mod:`lightning_bpd.hf.generation_rules`): forced
BOS/EOS, a list of EOS ids, suppressed and banned tokens and minimum lengths are applied wherever p_1 is read, so
exact decoding equals the checkpoint's own greedy ``generate``; history-dependent penalties are refused with one
line. Single-token ``bad_words_ids`` (Marian's pad ban) are also masked out of every head's logits, so that no
head proposes them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

import torch
from torch import Tensor, nn
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel

from lightning_bpd.decoding.generation_rules import GenerationRules
from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.hf.checkpoint_dir import load_weights, read_config
from lightning_bpd.hf.compat import attention_implementation, relative_position_buckets
from lightning_bpd.hf.generation_rules import ids, rules_from_config
from lightning_bpd.hf.lean_layers import LeanDecoder, LeanEncoderLayer
from lightning_bpd.hf.step_cache import HFContext, SelfAttentionCache, StepCache, as_mask, tree_positions
from lightning_bpd.nn.attention import tree_span
from lightning_bpd.nn.blockwise_head import BlockwiseHead
from lightning_bpd.nn.chained_head import ChainedHead, ChainSource
from lightning_bpd.nn.image_readout import NO_IMAGE, NoImage
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.products import FLOAT, Products, version
from lightning_bpd.nn.runtime_parts import RuntimeParts

HEAD_TYPES = ("paper", "chained", "chained_attn")
# Families whose decoders are: token embedding (+ scale), + a position table, [layernorm_embedding], BART-style
# decoder layers (self_attn / encoder_attn with k_proj, v_proj), [final layer_norm].
# T5: no position table but a relative position bias (computed per row here), pre-norm blocks, a final layer norm
# and, with tied embeddings, the decoder output scaled by d_model ** -0.5 before the LM head.
SUPPORTED = ("marian", "bart", "mbart", "t5")
ATTENTION = ("eager", "sdpa")  # implementations that take a 4-D mask


def keep_start_row_zero(base: nn.Module, start: int) -> bool:
    """Keep a Marian's decoder start row (``<pad>``'s embedding) at zero while it trains, where it is zero now.

    Marian starts its decoder from a zero vector: opus-mt checkpoints carry an all-zero ``<pad>`` row, and
    CTranslate2 converts them with ``start_from_zero_embedding`` (dropping the row). The row gets no gradient
    through the embedding (``padding_idx``) but does through the tied output projection, so a base trained
    here would drift from that contract and CTranslate2 would decode another model. A zero gradient on the row
    keeps it zero under Adam(W) (zero moments, zero decay of a zero weight); the pad logit it leaves is banned by
    the generation config anyway. A row that is not zero (a user's checkpoint trained otherwise) is left alone.
    Returns whether the row is kept."""
    weight = base.get_input_embeddings().weight
    if not weight.requires_grad or bool(weight[start].detach().ne(0).any()):
        return False

    def zero_start_row(grad: Tensor) -> Tensor:
        return grad.index_fill(0, torch.tensor([start], device=grad.device), 0.0)

    weight.register_hook(zero_start_row)
    return True


class HFSeq2SeqBlockwise(OptionalCapabilities, RuntimeParts, nn.Module):
    """A transformers seq2seq model (``base``) with k blockwise heads, implementing the decoding protocol
    (:class:`~lightning_bpd.decoding.protocol.BlockwiseModel`).

    ``head_type``: ``paper`` (:class:`BlockwiseHead`, p_1 the base itself), ``chained`` or ``chained_attn``
    (:class:`ChainedHead`; the source-attending one reads the last decoder layer's cross-attention keys and
    values). ``head_hidden``: the head's hidden size (default d_model). ``frozen``: the base's parameters do not
    train. The head takes the base's dtype and device.

    Beside the protocol it offers what the runtime's proposer (:mod:`lightning_bpd.inference.fast_heads`) builds its
    fast proposals from, as :class:`~lightning_bpd.nn.model.BlockwiseTransformer` does: ``head``,
    :meth:`output_layer`, :meth:`embedding_table`, :meth:`chain_link` and ``products``; it has no intensity prior,
    no image read-out and no draft vocabulary of its own (a runtime's options may give one).
    """

    products: Products = FLOAT  # how the proposals' projections multiply (a runtime gives its snapshot its own)
    prior = None  # RuntimeParts: p_1 is a plain vocabulary projection, no intensity prior
    image: NoImage = NO_IMAGE  # RuntimeParts: a text model, no image read-out
    draft_vocab = None  # RuntimeParts: no stored draft ids (a runtime proposes from its options' list, if any)

    def __init__(self, base: PreTrainedModel, k: int = 1, head_type: str = "paper", head_hidden: int | None = None,
                 frozen: bool = True) -> None:
        super().__init__()
        config = getattr(base, "config", None)
        if not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be an integer >= 1 (1 = the base model alone), got {k!r}")
        if head_type not in HEAD_TYPES:
            raise ValueError(f"head_type must be one of {HEAD_TYPES}, got {head_type!r}")
        if config is None or not getattr(config, "is_encoder_decoder", False):
            name = getattr(config, "model_type", type(base).__name__)
            raise ValueError(f"{name} is a decoder-only checkpoint, not an encoder-decoder (seq2seq) one: use "
                             "HFCausalBlockwise (lightning_bpd.hf.load_causal)")
        if config.model_type not in SUPPORTED:
            raise ValueError(f"model type {config.model_type!r} is not supported yet (supported: {', '.join(SUPPORTED)})")
        implementation = attention_implementation(config)
        if implementation not in ATTENTION:
            raise ValueError(f"attention implementation {implementation!r} is not supported (use one of {ATTENTION})")
        self.base = base
        self.attention = implementation
        self.k, self.head_type = k, head_type
        self.pad_id = int(config.pad_token_id)
        start = config.decoder_start_token_id
        if start is None:
            raise ValueError(f"{config.model_type}: the config has no decoder_start_token_id (the decoder's first input)")
        self.bos_id = int(start)
        eos = ids(base.generation_config.eos_token_id) or ids(config.eos_token_id)
        self.eos_id = eos[0] if eos else None  # the first of the EOS ids: generation_rules has them all
        self.t5 = config.model_type == "t5"
        if self.t5:
            first = self.layers[0].layer[0].SelfAttention
            self.n_heads, self.head_dim = first.n_heads, first.key_value_proj_dim
            self.n_positions: int | None = None  # relative positions: no table
        else:
            first = self.layers[0].self_attn
            self.n_heads, self.head_dim = first.num_heads, first.head_dim
            table = self.decoder.embed_positions
            self.n_positions = table.weight.shape[0] - getattr(table, "offset", 0)
        self.n_layers = len(self.layers)
        if head_type == "chained_attn" and self.n_heads * self.head_dim != config.d_model:
            raise ValueError(f"chained_attn heads need n_heads * head_dim == d_model, got {self.n_heads} * "
                             f"{self.head_dim} != {config.d_model}")
        d, hidden = config.d_model, head_hidden or config.d_model
        self.head_hidden = hidden
        self.chained_heads = head_type != "paper"
        if self.chained_heads:
            self.head: BlockwiseHead | ChainedHead = ChainedHead(d, hidden, k, source_attention=head_type == "chained_attn")
        else:
            self.head = BlockwiseHead(d, hidden, k, identity_first=True)
        weight = base.get_output_embeddings().weight
        self.head.to(dtype=weight.dtype, device=weight.device)
        self.vocab_size = weight.shape[0]
        bad = getattr(base.generation_config, "bad_words_ids", None) or []
        single = [w[0] for w in bad if len(w) == 1 and w[0] not in eos]  # generate never bans [eos]
        self.register_buffer("banned", torch.tensor(single, dtype=torch.long, device=weight.device), persistent=False)
        self.ban_tokens = True  # False inside unbanned()
        self.lean = False  # a runtime's lean steps: decode_step through LeanDecoder (Marian, BART, mBART)
        self._lean: LeanDecoder | None = None
        self._output: tuple[tuple[int, ...], Tensor, Tensor | None] | None = None  # output_layer's, keyed
        self.frozen = frozen
        if frozen:
            base.requires_grad_(False)
        elif config.model_type == "marian":  # sinusoidal tables: fixed (save_pretrained leaves them out)
            for table in (self.decoder.embed_positions, base.get_encoder().embed_positions):
                table.requires_grad_(False)
            keep_start_row_zero(base, self.bos_id)

    @property
    def generation_rules(self) -> GenerationRules:  # type: ignore[override]
        """The base's generation config as rules on p_1 (read at every decode: a change to it counts), less the
        single-token bad words that p_1 itself bans (``banned``, masked in :meth:`project` and :meth:`output_layer`):
        they change nothing there, and a checkpoint that bans only those (Marian's pad) decodes rule-free."""
        rules = rules_from_config(self.base.generation_config, fallback_eos=self.base.config.eos_token_id)
        own = set(self.banned.tolist()) if self.ban_tokens else set()
        return replace(rules, bad_words=tuple(w for w in rules.bad_words if len(w) > 1 or w[0] not in own))

    @property
    def decoder(self) -> nn.Module:
        """The base's decoder (a property: not registered twice as a submodule)."""
        return self.base.get_decoder()

    @property
    def layers(self) -> nn.ModuleList:
        return self.decoder.block if self.t5 else self.decoder.layers

    # ---- encoder -----------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> HFContext:
        """Sources (B, S), padded with the pad id -> the encoder output and every decoder layer's cross K/V."""
        valid = src != self.pad_id
        encoder = self.base.get_encoder()
        if self.runs_lean():
            LeanEncoderLayer.install(encoder.layers, self.base.config.model_type == "mbart", self.attention)
        hidden = encoder(input_ids=src, attention_mask=valid.long()).last_hidden_state  # (B, S, D)
        b, s = valid.shape
        cross = []
        for layer in self.layers:
            if self.t5:
                attn = layer.layer[1].EncDecAttention
                k_proj, v_proj = attn.k, attn.v
            else:
                attn = layer.encoder_attn
                k_proj, v_proj = attn.k_proj, attn.v_proj
            shape = (b, s, -1, self.head_dim)
            cross.append((k_proj(hidden).view(shape).transpose(1, 2), v_proj(hidden).view(shape).transpose(1, 2)))
        mask = as_mask(valid[:, None, None, :], hidden.dtype, self.attention)  # (B, 1, 1, S)
        return HFContext(hidden, valid, mask, cross)

    # ---- decoder -----------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> KVCache:
        """A per-row KV cache of ``capacity`` positions and ``extra_slots`` more slots (a tree's nodes). Positions
        past the checkpoint's table (only proposals past ``max_len`` reach them) read its last entry; a capacity
        that would need more is refused."""
        if self.n_positions is not None and capacity > self.n_positions + 1 + self.k:
            raise ValueError(f"max_len too long: the checkpoint has {self.n_positions} decoder positions, "
                             f"a cache of {capacity} would need more")
        w = self.base.get_output_embeddings().weight
        return KVCache(self.n_layers, batch_size, capacity + extra_slots, self.n_heads, self.head_dim, dtype=w.dtype,
                       device=w.device)

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """Token embeddings as the decoder sees them, without positions: (...) -> (..., D)."""
        x = self.decoder.embed_tokens(tokens)  # BART and mBART scale inside the embedding, T5 does not scale
        if self.base.config.model_type == "marian":
            x = x * self.decoder.embed_scale
        return x

    def embed(self, tokens: Tensor, positions: Tensor) -> Tensor:
        """Decoder inputs (B, T) at absolute ``positions`` (B, T) -> the first layer's input (B, T, D)."""
        if self.t5:
            return self.decoder.dropout(self.embed_tokens(tokens))
        table = self.decoder.embed_positions
        at = positions.clamp(max=self.n_positions - 1) + getattr(table, "offset", 0)
        x = self.embed_tokens(tokens) + nn.functional.embedding(at, table.weight).to(self.decoder.embed_tokens.weight.dtype)
        norm = getattr(self.decoder, "layernorm_embedding", None)
        return norm(x) if norm is not None else x

    def decode_step(self, tokens: Tensor, context: HFContext, cache: KVCache) -> Tensor:
        """T >= 1 new decoder inputs per row (B, T) after what ``cache`` holds -> hidden (B, T, D)."""
        n_new = tokens.shape[1]
        cache.check_room(n_new)
        positions = cache.positions(n_new)  # (B, T)
        stop = cache.length_bounds()[1] + n_new
        slots = torch.arange(stop, device=tokens.device)
        allowed = slots[None, None, None, :] <= positions[:, None, :, None]  # (B, 1, T, S'): causal, own length
        relative = slots[None, None, :] - positions[:, :, None] if self.t5 else None  # (B, T, S')
        return self.run_decoder(tokens, positions, positions, stop, allowed, relative, context, cache)

    def decode_tree(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: HFContext,
                    cache: KVCache) -> Tensor:
        """The verify pass over a tree's N nodes per row (B, N): node i at position (the row's length +
        ``depths[i]``) (N,), its keys and values written at slot length + i, seeing the cached prefix and its
        ``ancestors`` (N, N) bool row (:func:`~lightning_bpd.nn.attention.tree_span`) -> hidden (B, N, D). T5's
        relative bias at key minus query positions, a node's key at its own position. Appends N slots
        (:meth:`KVCache.keep_path` keeps the accepted ones)."""
        n = tokens.shape[1]
        cache.check_room(n)
        slots = cache.positions(n)  # (B, N): where the nodes' keys and values go
        (_, stop), allowed = tree_span(slots, ancestors, cache)  # (B, 1, N, S')
        positions, keys = tree_positions(cache.lengths, depths, stop)  # (B, N), (B, S')
        relative = keys[:, None, :] - positions[:, :, None] if self.t5 else None  # (B, N, S')
        return self.run_decoder(tokens, positions, slots, stop, allowed, relative, context, cache)

    def run_decoder(self, tokens: Tensor, positions: Tensor, slots: Tensor, stop: int, allowed: Tensor,
                    relative: Tensor | None, context: HFContext, cache: KVCache) -> Tensor:
        """New decoder inputs (B, T) at ``positions`` (B, T), their keys and values written at cache ``slots``
        (B, T), attending to slots 0..stop-1 where ``allowed`` (B, 1, T, S'); T5: ``relative`` (B, T, S') key
        minus query positions -> the final norm's output (B, T, D). Advances the cache by T."""
        x = self.embed(tokens, positions)
        self_mask = as_mask(allowed, x.dtype, self.attention)
        if self.runs_lean():  # the same ops, fewer calls
            x = self.lean_decoder()(x, slots, stop, self_mask, cache, context.cross, context.cross_mask,
                                    self.products)
        else:  # the HF layers, through a cache object of ours
            step = StepCache(SelfAttentionCache(cache, slots, stop), context.cross)
            if self.t5:
                bias = self.relative_bias(relative)  # (B, H, T, S')
                for layer in self.layers:
                    x = layer(x, self_mask, bias, context.hidden, context.cross_mask, None, cache=step)[0]
            else:
                for layer in self.layers:
                    x = layer(x, self_mask, context.hidden, encoder_attention_mask=context.cross_mask, cache=step,
                              use_cache=True)
        cache.advance(tokens.shape[1])
        return self.final_norm(x)

    def runs_lean(self) -> bool:
        """Whether the encoder's layers and the decoder step run lean: a runtime's snapshot (``lean``) of a
        BART-family base, at inference; T5 and training keep the HF modules."""
        return self.lean and not self.t5 and not torch.is_grad_enabled()

    def lean_decoder(self) -> LeanDecoder:
        """The decoder layers as one :class:`~lightning_bpd.hf.lean_layers.LeanDecoder` (listed on first use: a
        runtime's snapshot, whose parameters do not change)."""
        if self._lean is None:
            self._lean = LeanDecoder(self.layers, self.base.config.model_type == "mbart", self.n_heads,
                                     self.head_dim, self.attention)
        return self._lean

    def relative_bias(self, relative: Tensor) -> Tensor:
        """T5: the decoder's relative position bias at key minus query positions (B, T, S') -> (B, H, T, S')."""
        attn = self.layers[0].layer[0].SelfAttention
        return attn.relative_attention_bias(relative_position_buckets(attn, relative)).permute(0, 3, 1, 2)

    def final_norm(self, x: Tensor) -> Tensor:
        if self.t5:
            return self.decoder.dropout(self.decoder.final_layer_norm(x))
        norm = getattr(self.decoder, "layer_norm", None)  # mBART's pre-norm decoder ends with one
        return norm(x) if norm is not None else x

    def decode_full(self, tgt_in: Tensor, context: HFContext) -> Tensor:
        """Uncached: the HF decoder's own forward over whole prefixes (B, T) starting with BOS -> (B, T, D)."""
        out = self.decoder(input_ids=tgt_in, encoder_hidden_states=context.hidden,
                           encoder_attention_mask=context.valid.long(), use_cache=False)
        return out.last_hidden_state

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Training: sources (B, S) and teacher-forced decoder inputs (B, T) -> last decoder states (B, T, D)."""
        return self.decode_full(tgt_in, self.encode(src))

    # ---- heads -------------------------------------------------------------------------------------
    def project(self, h: Tensor) -> Tensor:
        """The base's LM head (and final logits bias): (..., D) -> (..., V); banned tokens at -inf."""
        if self.t5 and self.base.config.scale_decoder_outputs:
            h = h * (self.base.model_dim ** -0.5)
        logits = self.base.get_output_embeddings()(h)
        bias = getattr(self.base, "final_logits_bias", None)
        if bias is not None:
            logits = logits + bias
        if self.ban_tokens and self.banned.numel():
            logits = logits.index_fill(-1, self.banned, float("-inf"))
        return logits

    @contextmanager
    def unbanned(self) -> Iterator[None]:
        """Banned tokens keep their logits (the training loss: a -inf logit makes a label-smoothed loss inf)."""
        before, self.ban_tokens = self.ban_tokens, False
        try:
            yield
        finally:
            self.ban_tokens = before

    def logits_first(self, h: Tensor) -> Tensor:
        """p_1, the base's own logits: (..., D) -> (..., V)."""
        return self.project(h)

    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None, prev_tokens: Tensor | None = None,
                     source: ChainSource | None = None) -> Tensor:
        """Logits of the listed heads (all k by default): (..., D) -> (..., len(heads), V). Chained heads also
        take the tokens proposed for heads 1..m (..., m) and, source-attending ones, the ``source``."""
        heads = list(range(self.k) if heads is None else heads)
        if self.chained_heads:
            states = self.head.select(h, heads, prev_tokens, self.embed_tokens, source)  # type: ignore[call-arg]
        else:
            states = self.head.select(h, heads)  # type: ignore[call-arg]
        return self.project(states)

    def chain_step(self, z: Tensor, token: Tensor, i: int, source: ChainSource | None = None) -> tuple[Tensor, Tensor]:
        """Chained heads: head ``i``'s state (b, D) and logits (b, V) from head i-1's state z and its token (b,)."""
        z = self.head.step(z, self.embed_tokens(token), i, source)  # type: ignore[union-attr,operator]
        return z, self.project(z)

    # ---- what the runtime's proposer reads -------------------------------------------------------------
    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """:meth:`project` as one affine map for proposals: weight (V, D) (T5 with scaled outputs: the LM head
        times d_model ** -0.5) and bias (V,) (the final logits bias, banned tokens at -inf; None without either).
        Made once and kept while the tensors it reads are unchanged (a product's copy is keyed by them)."""
        weight = self.base.get_output_embeddings().weight
        final = getattr(self.base, "final_logits_bias", None)
        key = (id(weight), id(final), version(weight), version(final), self.banned.numel())
        if self._output is None or self._output[0] != key:
            with torch.no_grad():
                scaled = weight
                if self.t5 and self.base.config.scale_decoder_outputs:
                    scaled = weight * (self.base.model_dim ** -0.5)
                bias = None if final is None else final.reshape(-1).to(weight.dtype).clone()
                if self.banned.numel():
                    bias = torch.zeros(weight.shape[0], dtype=weight.dtype, device=weight.device) if bias is None else bias
                    bias.index_fill_(0, self.banned, float("-inf"))
            self._output = (key, scaled, bias)
        return self._output[1], self._output[2]

    def embedding_table(self) -> Tensor:
        """Every token's decoder input as :meth:`embed_tokens` gives it (V, D): the fused chain's token terms."""
        table = self.decoder.embed_tokens
        return self.embed_tokens(torch.arange(table.num_embeddings, device=table.weight.device))

    def chain_link(self, step: Callable[[Tensor], Tensor], z: Tensor, i: int, dtype: torch.dtype | None = None,
                   token: Tensor | None = None, nearest: bool = False) -> tuple[Tensor, Tensor]:
        """Link ``i`` from head i-1's state z (b, D): ``step`` maps it (in ``dtype``, default z's) to head i's
        state -> (that state, that state as the output layer reads it: the same, no image read-out here)."""
        z = step(z if dtype is None else z.to(dtype))
        return z, z

    def use_lean_steps(self, on: bool) -> None:
        """A runtime's snapshot of a BART-family base runs its encoder layers and decoder step lean (T5 never)."""
        self.lean = on

    def chain_source(self, context: HFContext) -> ChainSource | None:  # type: ignore[override]
        """Source-attending chained heads read the last decoder layer's cross-attention K/V (B, S, H, Dh)."""
        if self.head_type != "chained_attn":
            return None
        keys, values = context.cross[-1]
        return ChainSource(keys.transpose(1, 2), values.transpose(1, 2), context.valid)


def load_base(path_or_model: str | os.PathLike | PreTrainedModel, k: int = 1, head_type: str = "paper",
              head_hidden: int | None = None, frozen: bool = True) -> HFSeq2SeqBlockwise:
    """A local checkpoint directory (never downloaded) or a loaded model -> :class:`HFSeq2SeqBlockwise`."""
    if isinstance(path_or_model, (str, os.PathLike)):
        read_config(path_or_model, seq2seq=True)
        model = load_weights(path_or_model, AutoModelForSeq2SeqLM, "seq2seq")
    else:
        model = path_or_model
    return HFSeq2SeqBlockwise(model.eval(), k=k, head_type=head_type, head_hidden=head_hidden, frozen=frozen)
