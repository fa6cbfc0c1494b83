"""The DFlash block drafter (arXiv 2602.06036): a few Qwen3-style decoder layers that propose a whole block in one
pass, conditioned on the target model's hidden states.

The target's selected layer outputs (``target_layer_ids``, z-lab convention: the OUTPUT of decoder layer L) are
concatenated per token, ``(.., A*H)``, fused to the context ``g = hidden_norm(fc(features))`` ``(.., H)`` and, in every
draft layer, projected by that layer's own ``k_proj``/``v_proj`` (``k_norm`` and RoPE at the token's own position on
the keys) into extra keys/values placed before the block's. The context is never a query and has no residual or MLP.
Block queries see every valid context position strictly before the block and all tokens of their own block
(bidirectional). The drafter has no embedding and no LM head: callers embed the block with the target's embedding
(slot 0 = the last committed token, slots 1.. = ``mask_token_id``) and apply the target's LM head to the output, whose
slot j predicts the token AT position ``start + j``.

Two ways to run it:

* inference: :meth:`DFlashDrafter.extend` appends the fused context of newly committed tokens to a
  :class:`DrafterCache` (ragged rows, each at its own length), :meth:`DFlashDrafter.draft` runs one block per row
  against the cache without writing the block;
* training: :meth:`DFlashDrafter.train_forward` runs M blocks per sequence in one pass; block m sees the context
  positions ``t < anchors[n, m]`` and its own tokens, equal (up to rounding) to ``extend`` of features
  ``[0, anchor)`` then ``draft``.

Module names match the speculators / z-lab weights, so a state_dict exports without renames.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_bpd.drafters.common.cache import DrafterCache
from lightning_bpd.drafters.common.config import DrafterConfig
from lightning_bpd.drafters.common.layers import RMSNorm, SwiGLU, rope


def default_target_layers(n_target_layers: int, n_draft_layers: int) -> list[int]:
    """z-lab's default target layers (their outputs are the context): ``[n // 2]`` for one draft layer, otherwise
    ``round(1 + i * (n - 4) / (d - 1))`` for ``i < d``, spread from 1 to ``n - 3``."""
    if n_target_layers < 1 or n_draft_layers < 1:
        raise ValueError(f"need n_target_layers >= 1 and n_draft_layers >= 1, got {n_target_layers}, {n_draft_layers}")
    if n_draft_layers == 1:
        return [n_target_layers // 2]
    step = (n_target_layers - 4) / (n_draft_layers - 1)
    return [round(1 + i * step) for i in range(n_draft_layers)]


@dataclass
class DFlashConfig(DrafterConfig):
    """Shapes of a DFlash drafter. ``hidden_size`` must equal the target's hidden size (``fc`` maps ``A*H -> H``,
    ``A = len(target_layer_ids)``)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    num_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    block_size: int = 8

    def __post_init__(self) -> None:
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)

    @property
    def num_target_features(self) -> int:
        """A: how many target layers are concatenated per token."""
        return len(self.target_layer_ids)

    def validate(self) -> DFlashConfig:
        """Raise ValueError with a one-line message on the first inconsistent field; return self."""
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "num_layers"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"DFlashConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"DFlashConfig.num_heads ({self.num_heads}) is not divisible by "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"DFlashConfig.head_dim must be even for RoPE, got {self.head_dim}")
        if not self.target_layer_ids:
            raise ValueError("DFlashConfig.target_layer_ids is empty: name at least one target layer")
        if min(self.target_layer_ids) < 0:
            raise ValueError(f"DFlashConfig.target_layer_ids must be >= 0, got {list(self.target_layer_ids)}")
        if self.block_size < 2:
            raise ValueError(f"DFlashConfig.block_size must be >= 2, got {self.block_size}")
        if self.mask_token_id < 0:
            raise ValueError(f"DFlashConfig.mask_token_id must be >= 0, got {self.mask_token_id}")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0):
            raise ValueError(f"DFlashConfig needs rms_norm_eps > 0 and rope_theta > 0, "
                             f"got {self.rms_norm_eps}, {self.rope_theta}")
        return self


class DFlashAttention(nn.Module):
    """Qwen3 attention whose keys/values are [projected context | block]; queries are the block tokens only."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim, self.theta = c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def keys_values(self, h: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """h: (..., P, H), positions: (..., P) -> keys (..., P, nKV, hd) (k_norm, then RoPE), values (..., P, nKV, hd)."""
        k = self.k_proj(h).unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = self.v_proj(h).unflatten(-1, (self.num_kv_heads, self.head_dim))
        return rope(self.k_norm(k), positions, self.theta), v

    def context_kv(self, context: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Fused context (B, n, H) at positions (B, n) -> this layer's context keys, values (B, nKV, n, hd)."""
        k, v = self.keys_values(context, positions)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(self, x: Tensor, positions: Tensor, ctx_k: Tensor, ctx_v: Tensor, ctx_mask: Tensor) -> Tensor:
        """x: (B, M, Bk, H) normed block tokens, positions (B, M, Bk); ctx_k/ctx_v (B, nKV, C, hd); ctx_mask (B, M, C)
        bool, True where block m may see context slot c. Block m attends to the context slots its mask allows and to
        its own Bk tokens (bidirectionally). Returns (B, M, Bk, H)."""
        b, m, bk, _ = x.shape
        rep = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))  # (B, M, Bk, nH, hd)
        q = rope(self.q_norm(q), positions, self.theta)
        k, v = self.keys_values(x, positions)  # (B, M, Bk, nKV, hd)
        acc = torch.promote_types(x.dtype, torch.float32)
        # query head i uses kv head i // rep (the order of repeating each kv head rep times)
        q = q.unflatten(3, (self.num_kv_heads, rep)).permute(0, 3, 4, 1, 2, 5).to(acc)  # (B, nKV, rep, M, Bk, hd)
        k, v = k.permute(0, 3, 1, 2, 4).to(acc), v.permute(0, 3, 1, 2, 4).to(acc)  # (B, nKV, M, Bk, hd)
        scale = self.head_dim ** -0.5
        s_ctx = torch.einsum("bgrmqd,bgcd->bgrmqc", q, ctx_k.to(acc)) * scale  # (B, nKV, rep, M, Bk, C)
        s_ctx = s_ctx.masked_fill(~ctx_mask[:, None, None, :, None, :], float("-inf"))
        s_blk = torch.einsum("bgrmqd,bgmkd->bgrmqk", q, k) * scale  # (B, nKV, rep, M, Bk, Bk)
        p = torch.softmax(torch.cat([s_ctx, s_blk], dim=-1), dim=-1)
        p_ctx, p_blk = p.split([s_ctx.shape[-1], bk], dim=-1)
        out = torch.einsum("bgrmqc,bgcd->bgrmqd", p_ctx, ctx_v.to(acc))
        out = out + torch.einsum("bgrmqk,bgmkd->bgrmqd", p_blk, v)  # (B, nKV, rep, M, Bk, hd)
        out = out.permute(0, 3, 4, 1, 2, 5).reshape(b, m, bk, self.num_heads * self.head_dim)
        return self.o_proj(out.to(x.dtype))


class DFlashLayer(nn.Module):
    """Pre-norm Qwen3 decoder layer over the block tokens, with the context as extra keys/values."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = DFlashAttention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size)

    def forward(self, x: Tensor, positions: Tensor, ctx_k: Tensor, ctx_v: Tensor, ctx_mask: Tensor) -> Tensor:
        """x: (B, M, Bk, H) -> (B, M, Bk, H); see :meth:`DFlashAttention.forward` for the other arguments."""
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, ctx_mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashDrafter(nn.Module):
    """fc (A*H -> H) + hidden_norm fuse the target features; ``layers`` run over the block; ``norm`` is final."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config.validate()
        h = config.hidden_size
        self.fc = nn.Linear(config.num_target_features * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(h, config.rms_norm_eps)

    def fuse(self, features: Tensor) -> Tensor:
        """(..., A*H) concatenated target-layer outputs -> (..., H) context ``hidden_norm(fc(features))``."""
        return self.hidden_norm(self.fc(features))

    def new_cache(self, batch_size: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, check: bool = False) -> DrafterCache:
        """An empty cache sized for this drafter (dtype/device default to the parameters'; ``check``: refuse bad
        counts and overflows, reading the host)."""
        p = self.fc.weight
        c = self.config
        return DrafterCache(c.num_layers, batch_size, capacity, c.num_kv_heads, c.head_dim,
                           dtype=dtype or p.dtype, device=device or p.device, check=check)

    def extend(self, cache: DrafterCache, features: Tensor, positions: Tensor, counts: Tensor | None = None) -> None:
        """Append newly committed tokens' context to each row: features (B, n, A*H) at token positions (B, n); only
        row b's first ``counts[b]`` (default all n) are valid and written, at the row's own length."""
        if counts is None:
            counts = torch.full((features.shape[0],), features.shape[1], dtype=torch.long, device=features.device)
        g = self.fuse(features)  # (B, n, H)
        kv = [layer.self_attn.context_kv(g, positions) for layer in self.layers]
        cache.append([k for k, _ in kv], [v for _, v in kv], positions, counts)

    def draft(self, cache: DrafterCache, block_embeds: Tensor, positions: Tensor) -> Tensor:
        """One block per row: block_embeds (B, Bk, H) at positions (B, Bk) attend to row b's cached context and the
        whole block; the cache is not written. Returns the final-normed hidden states (B, Bk, H)."""
        x = block_embeds[:, None]  # (B, 1, Bk, H)
        for i, layer in enumerate(self.layers):
            ctx_k, ctx_v, valid = cache.view(i)
            x = layer(x, positions[:, None], ctx_k, ctx_v, valid[:, None])
        return self.norm(x)[:, 0]

    def train_forward(self, features: Tensor, block_embeds: Tensor, anchors: Tensor, block_positions: Tensor,
                      anchor_valid: Tensor | None = None) -> Tensor:
        """Many blocks per sequence in one pass. features (N, T, A*H) (feature t at RoPE position t), block_embeds
        (N, M, Bk, H), anchors (N, M), block_positions (N, M, Bk), anchor_valid (N, M) bool. Block m of sequence n
        sees context t < anchors[n, m] of its own sequence and its own Bk tokens. Returns (N, M, Bk, H); blocks with
        ``anchor_valid`` False see no context and are returned as zeros."""
        n, t = features.shape[:2]
        if anchor_valid is None:
            anchor_valid = torch.ones(anchors.shape, dtype=torch.bool, device=anchors.device)
        g = self.fuse(features)  # (N, T, H)
        ctx_pos = torch.arange(t, device=features.device).expand(n, t)  # (N, T)
        ctx_mask = (ctx_pos[:, None, :] < anchors[:, :, None]) & anchor_valid[:, :, None]  # (N, M, T)
        x = block_embeds
        for layer in self.layers:
            ctx_k, ctx_v = layer.self_attn.context_kv(g, ctx_pos)  # (N, nKV, T, hd)
            x = layer(x, block_positions, ctx_k, ctx_v, ctx_mask)
        out = self.norm(x)
        return torch.where(anchor_valid[:, :, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
