"""The encoder-decoder Transformer with a blockwise head: the one model class of both tasks.

Translation maps source subwords to target subwords; super-resolution maps 8x8x3 intensity tokens
to 32x32x3 intensity tokens with a local decoder window and image positions. Decoding talks to it
through the small protocol in :mod:`lightning_bpd.decoding.protocol`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from lightning_bpd.nn.blockwise_head import BlockwiseHead
from lightning_bpd.nn.chained_head import ChainedHead, ChainSource
from lightning_bpd.nn.conditioning import source_taps
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.draft_ids import DraftIds, restrict
from lightning_bpd.nn.image_readout import ImageReadout
from lightning_bpd.nn.intensity_prior import IntensityPrior
from lightning_bpd.nn.kv_cache import KVCache
from lightning_bpd.nn.positions import ImageGrid, build_positions
from lightning_bpd.nn.products import FLOAT, Products
from lightning_bpd.nn.runtime_parts import RuntimeParts
from lightning_bpd.nn.transformer import Decoder, Encoder, EncoderContext

__all__ = ["BlockwiseTransformer", "ModelConfig"]


class BlockwiseTransformer(RuntimeParts, nn.Module):
    """Encoder + decoder + :class:`BlockwiseHead`, with the vocabulary projection tied to the target
    embedding (or its own layer). Embeddings are N(0, d^-1/2) and scaled by sqrt(d) on input.

    A :class:`~lightning_bpd.decoding.protocol.BlockwiseModel` that offers every optional member."""

    products: Products = FLOAT  # how the vocabulary projection multiplies (:mod:`~lightning_bpd.nn.products`)
    # The decoding protocol's fast paths: the model offers none (its heads and links are the reference); a runtime
    # offers them (:mod:`lightning_bpd.inference.fast_heads`).
    argmax_first = draft_tokens = draft_ranks = chain_draft = chain_drafts = chain_ranks = None
    generation_rules = None  # greedy decoding of p_1 as it is, ending at eos_id (a user may set rules)
    rules_history = None  # the rules' history before the first token: the start token (bos_id)
    decode_room = None  # sinusoidal positions: no bound on the decoder's inputs
    # target features for a drafter (DFlash, EAGLE-3): decoder-only bases only
    encode_features = decode_step_features = decode_tree_features = None
    decoder_only = False  # ModelConfig.decoder_only: the subclass CausalTransformer (nn.causal_model)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        c = self.config = config
        if c.decoder_only != self.decoder_only:
            raise ValueError("a decoder_only config builds a CausalTransformer (lightning_bpd.nn.causal_model), "
                             "an encoder-decoder one a BlockwiseTransformer")
        self.k, self.pad_id, self.bos_id, self.eos_id = c.k, c.pad_id, c.bos_id, c.eos_id
        shared = c.share_embeddings or c.decoder_only  # a decoder-only model reads its prompts with the one table
        self.tgt_embed = nn.Embedding(c.tgt_vocab_size, c.d_model)
        self.src_embed = self.tgt_embed if shared else nn.Embedding(c.src_vocab_size, c.d_model)
        for emb in [self.tgt_embed] if shared else [self.tgt_embed, self.src_embed]:
            nn.init.normal_(emb.weight, std=c.d_model**-0.5)
        img = c.image
        shapes = (None, None) if img is None else (img.src_image_shape, img.tgt_image_shape)
        pos_scale = math.sqrt(c.d_model / 3) if img is not None and img.scale_positions else 1.0  # 3 tables -> RMS 1
        grid = ImageGrid(c.d_model, *shapes[1]) if c.tgt_positions == "grid" else None
        self.src_pos = build_positions(c.src_positions, c.d_model, shapes[0], pos_scale, grid)
        self.tgt_pos = build_positions(c.tgt_positions, c.d_model, shapes[1], pos_scale, grid)
        if not (c.tie_output or c.tie_output_to_source):
            self.out_proj = nn.Linear(c.d_model, c.tgt_vocab_size)
            nn.init.normal_(self.out_proj.weight, std=c.d_model**-0.5)
            nn.init.zeros_(self.out_proj.bias)
        self.direct_conditioning = img is not None and img.direct_conditioning
        if self.direct_conditioning:
            index, weight = source_taps(*shapes, img.conditioning)  # type: ignore[union-attr]  # (T, n) each
            self.register_buffer("cond_index", index, persistent=False)
            self.register_buffer("cond_weight", weight, persistent=False)
        self.prior = None
        if img is not None and img.intensity_prior > 0:
            self.prior = IntensityPrior(c.tgt_vocab_size, img.intensity_offset, c.tgt_vocab_size - img.intensity_offset,
                                        img.intensity_prior, c.d_model, gaussian=img.intensity_output == "gaussian")
        self.encoder = None if c.decoder_only else Encoder(c.n_encoder_layers, c.d_model, c.n_heads, c.d_ff, c.dropout)
        self.decoder = Decoder(c.n_decoder_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.window,
                               cross_attention=not c.decoder_only)
        self.chained_heads = c.head_type in ("chained", "chained_attn") and c.k > 1
        if self.chained_heads:
            self.head: BlockwiseHead | ChainedHead = ChainedHead(c.d_model, c.head_hidden or c.d_ff, c.k,
                                                                 dropout=c.dropout,
                                                                 source_attention=c.head_type == "chained_attn")
        else:
            self.head = BlockwiseHead(
                c.d_model, c.head_hidden or c.d_ff, c.k, identity_first=c.identity_first, dropout=c.dropout
            )
        # the token ids the heads may propose (state only, saved as draft_vocab.ids; set from the training targets)
        self.draft_vocab = DraftIds(c.tgt_vocab_size, c.draft_vocab) if c.draft_vocab else None
        # The intensity prior's read-out: a plain object that attaches the heads' image parts (head.neighbours,
        # head.prior_adapt) and reads the model's own parameters (:mod:`~lightning_bpd.nn.image_readout`).
        self.image = ImageReadout(self)
        self.drop = nn.Dropout(c.dropout)
        self.scale = math.sqrt(c.d_model)

    def readout_parameters(self) -> dict[str, nn.Parameter]:
        """The base's parameters that act only after the decoder states, by name: a Gaussian output's shift-and-width
        layer and precision (``prior.*``) when the heads carry their own centres, so that the states (and a frozen
        base's cache of them) do not depend on them; else none. ``train_readout`` trains these beside a frozen base."""
        if self.prior is None or not self.prior.gaussian or not self.image.own_centres:
            return {}
        return {f"prior.{name}": param for name, param in self.prior.named_parameters()}

    def after_base_loaded(self, fresh: list[str]) -> None:
        """After a warm start left ``fresh`` keys as initialized: an own head prior starts as the base's layer (a
        residual one stays at zero)."""
        own = getattr(self.head, "prior_adapt", None)
        if own is not None and self.config.image.head_prior == "own" and "head.prior_adapt.weight" in fresh:
            with torch.no_grad():
                own.load_state_dict(self.prior.adapt.state_dict())  # type: ignore[union-attr]

    @property
    def vocab_size(self) -> int:
        """The output vocabulary's size (the decoding protocol's ``vocab_size``)."""
        return self.config.tgt_vocab_size

    # ---- encoder -------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> EncoderContext:
        """Source tokens (B, S), padded with ``pad_id`` -> context, computed once per source."""
        if src.dim() != 2 or src.shape[1] == 0:
            raise ValueError(f"src must be a non-empty (batch, length) tensor of token ids, got shape {tuple(src.shape)}")
        src_valid = src != self.pad_id  # (B, S)
        if not bool(src_valid.any(dim=1).all()):
            raise ValueError("src: every row needs at least one non-pad token (got an empty source)")
        pos = torch.arange(src.shape[1], device=src.device).expand_as(src)
        x = self.drop(self.src_embed(src) * self.scale + self.src_pos(pos, src.shape[1]).to(self.src_embed.weight.dtype))
        memory = self.encoder(x, src_valid)  # (B, S, D)
        ids = self.image.conditioning_ids(src) if self.direct_conditioning else None  # (B, T)
        cond = None if ids is None else self.src_embed(ids) * self.scale  # (B, T, D)
        prior = None if self.prior is None else self.prior.centres(ids)  # (B, T)
        return EncoderContext(memory, src_valid, self.decoder.cross_kv(memory), cond, prior)

    # ---- decoder -------------------------------------------------------------------------------
    def embed_tgt(self, tokens: Tensor, positions: Tensor, context: EncoderContext | None = None,
                  limit: int | None = None) -> Tensor:
        """Decoder inputs (B, T) at absolute ``positions`` (B, T) -> (B, T, D); with direct conditioning
        the ``context`` adds the input intensity of each target position (:meth:`ImageReadout.conditioning_ids`).
        ``limit``: a host-side bound (exclusive) on ``positions``, so that no device value is read."""
        x = self.tgt_embed(tokens) * self.scale + self.tgt_pos(positions, limit).to(self.tgt_embed.weight.dtype)
        if self.direct_conditioning:
            if context is None or context.cond is None:
                raise ValueError("direct_conditioning: embed_tgt needs the encoder context of the sources")
            at = positions.clamp(max=self.cond_index.shape[0] - 1)  # (B, T) target positions
            x = x + context.cond.gather(1, at[..., None].expand(*at.shape, x.shape[-1]))
        return self.drop(x)  # (B, T, D)

    def decode_full(self, tgt_in: Tensor, context: EncoderContext) -> Tensor:
        """Uncached decoder over whole prefixes (B, T) starting with BOS -> hidden (B, T, D)."""
        pos = torch.arange(tgt_in.shape[1], device=tgt_in.device).expand_as(tgt_in)
        return self.image.mark_prior(self.decoder(self.embed_tgt(tgt_in, pos, context), context), pos, context, tgt_in)

    def decode_step(self, tokens: Tensor, context: EncoderContext, cache: KVCache) -> Tensor:
        """T >= 1 new decoder inputs per row (B, T) after what ``cache`` holds -> hidden (B, T, D)."""
        n_new = tokens.shape[1]
        limit = cache.length_bounds()[1] + n_new  # host-side: no device read once the cache knows its bounds
        pos = cache.positions(n_new)  # (B, T)
        decoded = None
        if self.image.neighbours is not None:
            decoded = cache.keep_tokens()  # (B, capacity): every decoder input so far
            decoded.scatter_(1, pos, tokens)
        return self.image.mark_prior(self.decoder.step(self.embed_tgt(tokens, pos, context, limit), context, cache), pos,
                               context, decoded)

    @property
    def decode_tree(self) -> Callable[..., Tensor] | None:
        """The tree verify pass (:meth:`tree_pass`); None for a decoder with a local window (its ring cache cannot
        keep a path) or heads that read their own pixel neighbours (a node's neighbours are not its path's): those
        verify single paths only, and tree decoding says so in one line."""
        if self.decoder.window is not None or self.image.neighbours is not None:
            return None
        return self.tree_pass

    def tree_pass(self, tokens: Tensor, depths: Tensor, ancestors: Tensor, context: EncoderContext,
                  cache: KVCache) -> Tensor:
        """The verify pass over a tree's N nodes per row (B, N), node i at position (the row's length + ``depths[i]``)
        (N,) and seeing the cached prefix and its ``ancestors`` (N, N) bool row -> hidden (B, N, D); appends N
        slots to the cache (:meth:`KVCache.keep_path` keeps the accepted ones)."""
        pos = cache.lengths[:, None] + depths  # (B, N): each node's own position
        limit = cache.length_bounds()[1] + tokens.shape[1]  # host-side: a node's depth is below N
        x = self.embed_tgt(tokens, pos, context, limit)  # (B, N, D)
        return self.image.mark_prior(self.decoder.step(x, context, cache, ancestors), pos, context)

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> KVCache:
        w = self.tgt_embed.weight
        return self.decoder.new_cache(batch_size, capacity + extra_slots, dtype=w.dtype, device=w.device)

    # ---- heads ---------------------------------------------------------------------------------
    def project(self, h: Tensor) -> Tensor:
        """Vocabulary projection (:meth:`output_layer`): (..., D) -> (..., V)."""
        return self.products.linear(h, *self.output_layer())

    def logits_first(self, h: Tensor) -> Tensor:
        """p_1 logits, the scoring model: (..., D) -> (..., V)."""
        h, centres = self.image.split_centres(h)
        state = h if self.chained_heads else self.head.first(h)
        return self.project(self.image.readout(state, None if centres is None else centres[..., 0]))

    def logits_heads(self, h: Tensor, heads: list[int] | range | None = None, prev_tokens: Tensor | None = None,
                     source: ChainSource | None = None) -> Tensor:
        """Logits of the listed heads (all k by default): (..., D) -> (..., len(heads), V).

        Chained heads also take ``prev_tokens`` (..., m): the token proposed for (or, in training, the
        target at) heads 1..m, m >= the highest listed head (0-based); source-attending ones also the
        ``source`` of each leading row of h (:meth:`chain_source`). The paper's head ignores both.
        """
        heads = list(range(self.k) if heads is None else heads)
        h, centres = self.image.split_centres(h)
        if self.chained_heads:
            if prev_tokens is not None and max(heads) > 0:
                centres = self.image.fill_neighbours(centres, prev_tokens[..., : max(heads)])
            states = self.head.select(h, heads, prev_tokens, self.embed_tokens, source,  # type: ignore[call-arg]
                                      self.image.chain_input(centres))
        else:
            states = self.head.select(h, heads)  # type: ignore[call-arg]  # (..., n, D)
        return self.project(self.image.readout(states, None if centres is None else centres[..., heads], heads))

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """Token embeddings as the decoder sees them, without positions: (...) -> (..., D)."""
        return self.tgt_embed(tokens) * self.scale

    def embedding_table(self) -> Tensor:
        """Every target token's embedding as :meth:`embed_tokens` gives it (V, D)."""
        return self.tgt_embed.weight * self.scale

    def chain_source(self, context: EncoderContext) -> ChainSource | None:
        """What source-attending chained heads read for the sources of ``context`` (None: nothing)."""
        if not getattr(self.head, "source_attention", False):
            return None
        keys, values = context.cross_kv[-1]  # the last decoder layer's cross-attention, (B, S, nh, dh) each
        return ChainSource(keys, values, context.src_valid)

    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """Weight (V, D) and bias of the vocabulary projection: the target embedding (``tie_output``),
        the source embedding (``tie_output_to_source``) or a layer of its own."""
        if self.config.tie_output:
            weight, bias = self.tgt_embed.weight, None
        elif self.config.tie_output_to_source:
            weight, bias = self.src_embed.weight, None
        else:
            weight, bias = self.out_proj.weight, self.out_proj.bias
        return (weight, bias) if self.prior is None else (self.prior.output_weight(weight), bias)

    def use_lean_steps(self, on: bool) -> None:
        """The encoder and the cached decoder step through the TorchScript lean functions
        (:mod:`lightning_bpd.nn.lean_step`), or through the modules (a model as built)."""
        from lightning_bpd.nn.lean_step import encode, step  # imported when a runtime asks for them

        self.encoder.lean, self.decoder.lean = (encode, step) if on else (None, None)

    def set_draft_ids(self, ids: Tensor) -> None:
        """Hold these token ids as the model's draft vocabulary (:mod:`lightning_bpd.nn.draft_ids`): the tokens its
        heads propose when decoded (training set-up does it, from the training targets)."""
        if self.draft_vocab is None or self.draft_vocab.ids.numel() != len(ids):
            self.draft_vocab = DraftIds(self.config.tgt_vocab_size, len(ids)).to(self.tgt_embed.weight.device)
            self.config.draft_vocab = len(ids)
        self.draft_vocab.set_ids(ids)

    def restrict_draft(self, logits: Tensor) -> Tensor:
        """Logits (..., V) of a proposing head as the draft vocabulary sees them (-inf outside it)."""
        return logits if self.draft_vocab is None else restrict(logits, self.draft_vocab.ids)

    def chain_step(self, z: Tensor, token: Tensor, i: int, source: ChainSource | None = None) -> tuple[Tensor, Tensor]:
        """Chained heads, decoding: head ``i`` (0-based, >= 1) from head i-1's state z (b, D) and the
        token (b,) proposed for head i-1 -> (its state (b, D), its logits (b, V)). With own centres the
        states carry the centres too (b, D + k), as the decoder output does."""
        e = self.embed_tokens(token)
        z, state = self.chain_link(lambda x: self.head.step(x, e, i, source), z, i, token=token)  # type: ignore[operator]
        return z, self.project(state)

    def chain_link(self, step: Callable[[Tensor], Tensor], z: Tensor, i: int, dtype: torch.dtype | None = None,
                   token: Tensor | None = None, nearest: bool = False) -> tuple[Tensor, Tensor]:
        """Link ``i`` from head i-1's state z (b, D [+ k]): ``step`` maps the state the link reads (b, D) to head
        i's state -> (head i's state, carrying the centres like z; head i's state as the output layer reads it
        (b, D), :meth:`ImageReadout.readout`). ``dtype``: the link's precision (default z's). ``token`` (b,): the one proposed
        for head i-1 (pixel neighbours read it). ``nearest`` (own centres, Gaussian output): instead of the state,
        head i's argmax token (b,) (:meth:`IntensityPrior.nearest`)."""
        z, centres = self.image.split_centres(z)
        z = z if dtype is None else z.to(dtype)
        if centres is not None:
            if self.image.neighbours is not None:
                if token is None:
                    raise ValueError("head_neighbours: a chain link needs the token proposed for the head before it")
                centres = self.image.fill_neighbours(centres, token[..., None], i - 1)
            z = self.image.link_input(z, centres, i)  # type: ignore[arg-type]
        z = step(z)
        if nearest:
            state = self.prior.nearest(z, centres[..., i], self.image.head_shift())  # type: ignore[union-attr,index]
        else:
            state = self.image.readout(z, None if centres is None else centres[..., i], i)
        return (z if centres is None else torch.cat([z, centres.to(z.dtype)], dim=-1)), state

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced decoder hidden states (B, T, D); heads are applied by the caller."""
        return self.decode_full(tgt_in, self.encode(src))
