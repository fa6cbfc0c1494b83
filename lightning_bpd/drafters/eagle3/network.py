"""The EAGLE-3 drafter (arXiv 2503.01840), in the layout of speculators' ``eagle3`` models (0.9.0) and vLLM's.

Inputs per position ``p``: the token at ``p`` and a hidden state of position ``p - 1``: at first the target's
features there (the outputs of a low, a middle and a high layer, concatenated ``(.., A*H)`` and projected by
``fc`` to ``(.., H)``), later the drafter's own output state at ``p - 1``. One decoder layer, Llama's (or
Qwen3's, with per-head ``q_norm``/``k_norm``), whose q/k/v read ``[input_layernorm(embed(token)) ;
hidden_norm(state)]`` (2H); its residual is the state (``hidden_norm(state)`` under ``norm_before_residual``), then
the usual MLP block. Output: the layer's output ``h`` (pre-norm), the state fed back at ``p + 1`` (``norm(h)`` under
``norm_output``), and ``lm_head(norm(h))`` over the draft vocabulary, the distribution of the token at ``p + 1``.
Draft id ``d`` is target id ``d + d2t[d]``; ``t2d`` marks the target ids in the draft vocabulary (ascending order =
draft order). RoPE at the token's position.

Target layers: ``target_layer_ids`` count as everywhere in this package (layer i's OUTPUT, transformers'
``hidden_states[i + 1]``, what ``encode_features`` gives); speculators / vLLM / llama.cpp's
``eagle_aux_hidden_state_layer_ids`` count the residual stream ENTERING a layer, so theirs = ours + 1, and EAGLE-3's
default ``[2, L // 2, L - 3]`` is ours ``[1, L // 2 - 1, L - 4]`` (:func:`default_eagle3_layers`).

Two ways to run it:

* drafting: :meth:`Eagle3Drafter.extend` runs new positions against an :class:`Eagle3Cache` (ragged rows) and
  appends their keys/values; the same call takes target features (after verification) or the drafter's own states
  (drafting), and an optional visibility mask among the new positions (trees);
* training: :meth:`Eagle3Drafter.train_forward`, the training-time test: step 0 on the target's features, step s on
  the states of step s - 1 at the same slot, each step's queries seeing the step-0 keys causally and their own slot's
  keys of the earlier steps (speculators' mask), equal to :func:`train_forward_reference` (the cached path).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lightning_bpd.drafters.common.cache import DrafterCache
from lightning_bpd.drafters.common.config import DrafterConfig
from lightning_bpd.drafters.common.layers import RMSNorm, SwiGLU, rope

FAMILIES = ("llama", "qwen3")  # the decoder layer's family = transformer_layer_config.model_type


def default_eagle3_layers(n_target_layers: int) -> list[int]:
    """EAGLE-3's low, middle and high target layers ``[2, n // 2, n - 3]`` (ids of the stream entering a layer) as
    layer outputs, ours: ``[1, n // 2 - 1, n - 4]``; ValueError below 7 layers (they would not be distinct)."""
    if n_target_layers < 7:
        raise ValueError(f"EAGLE-3's default target layers need a target of >= 7 layers, it has {n_target_layers}: "
                         "give target_layer_ids")
    return [1, n_target_layers // 2 - 1, n_target_layers - 4]


@dataclass
class Eagle3Config(DrafterConfig):
    """Shapes of an EAGLE-3 drafter. ``hidden_size`` is the target's (``fc``: ``A*H -> H``); ``vocab_size`` the
    target's (``embed_tokens``, ``t2d``); ``draft_vocab_size`` <= it (``lm_head``, ``d2t``)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: tuple[int, ...]
    vocab_size: int
    draft_vocab_size: int
    family: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    norm_before_residual: bool = False
    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False

    def __post_init__(self) -> None:
        self.target_layer_ids = tuple(int(i) for i in self.target_layer_ids)

    @property
    def num_target_features(self) -> int:
        """A: how many target layers are concatenated per position."""
        return len(self.target_layer_ids)

    @property
    def uses_draft_vocab(self) -> bool:
        """Whether the drafter proposes from a smaller vocabulary (then it holds ``d2t`` and ``t2d``)."""
        return self.draft_vocab_size != self.vocab_size

    def validate(self) -> Eagle3Config:
        """Raise ValueError with a one-line message on the first inconsistent field; return self."""
        for name in ("hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size", "vocab_size",
                     "draft_vocab_size", "max_position_embeddings"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Eagle3Config.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"Eagle3Config.num_heads ({self.num_heads}) is not divisible by "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"Eagle3Config.head_dim must be even for RoPE, got {self.head_dim}")
        ids = self.target_layer_ids
        if len(ids) < 2 or min(ids) < 0 or len(set(ids)) != len(ids):
            raise ValueError(f"Eagle3Config.target_layer_ids must be >= 2 distinct layers >= 0 (EAGLE-3 fuses 3), "
                             f"got {list(ids)}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"Eagle3Config.draft_vocab_size {self.draft_vocab_size} exceeds the target's vocabulary "
                             f"{self.vocab_size}")
        if self.family not in FAMILIES:
            raise ValueError(f"Eagle3Config.family must be one of {', '.join(FAMILIES)}, got {self.family!r}")
        if self.norm_before_fc and self.fc_norm:
            raise ValueError("Eagle3Config: norm_before_fc and fc_norm exclude each other (as in speculators)")
        if not (self.rms_norm_eps > 0 and self.rope_theta > 0):
            raise ValueError(f"Eagle3Config needs rms_norm_eps > 0 and rope_theta > 0, "
                             f"got {self.rms_norm_eps}, {self.rope_theta}")
        return self

    @classmethod
    def from_target(cls, config: Any, draft_vocab_size: int | None = None,
                    target_layer_ids: list[int] | tuple[int, ...] | None = None, family: str = "llama",
                    **flags: Any) -> Eagle3Config:
        """The drafter of a Hugging Face causal config (its text config where it has one): the target's hidden size,
        heads, head dim, MLP width, norm eps, RoPE theta, positions and vocabulary; ``target_layer_ids`` default
        :func:`default_eagle3_layers`; ``draft_vocab_size`` default the whole vocabulary; ``family`` default "llama"
        for every target (EAGLE-3's own layer, the one vLLM's ``Eagle3LlamaForCausalLM`` and llama.cpp's ``eagle3``
        run; "qwen3" adds Qwen3's q/k norms, which only speculators' own class loads); ``flags``: the norm flags
        (``norm_before_residual``, ...)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        hidden, heads = int(text.hidden_size), int(text.num_attention_heads)
        theta = getattr(text, "rope_theta", None) or (getattr(text, "rope_parameters", None) or {}).get("rope_theta")
        vocab = int(text.vocab_size)
        layers = (list(target_layer_ids) if target_layer_ids is not None
                  else default_eagle3_layers(int(text.num_hidden_layers)))
        bad = [i for i in layers if not 0 <= int(i) < int(text.num_hidden_layers)]
        if bad:
            raise ValueError(f"target_layer_ids {layers}: {bad} not a layer of the {text.num_hidden_layers}-layer "
                             "target")
        unknown = sorted(set(flags) - {"norm_before_residual", "norm_before_fc", "fc_norm", "norm_output"})
        if unknown:
            raise ValueError(f"Eagle3Config.from_target: unknown flags {unknown}")
        return cls(hidden_size=hidden, num_heads=heads,
                   num_kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                   head_dim=int(getattr(text, "head_dim", None) or hidden // heads),
                   intermediate_size=int(getattr(text, "intermediate_size", None) or 4 * hidden),
                   target_layer_ids=tuple(int(i) for i in layers), vocab_size=vocab,
                   draft_vocab_size=int(draft_vocab_size or vocab), family=family,
                   rms_norm_eps=float(getattr(text, "rms_norm_eps", None) or 1e-6),
                   rope_theta=float(theta or 10000.0),
                   max_position_embeddings=int(getattr(text, "max_position_embeddings", None) or 2048),
                   **{k: bool(v) for k, v in flags.items()}).validate()


def vocab_mapping(token_counts: Tensor, draft_vocab: int) -> tuple[Tensor, Tensor]:
    """The ``draft_vocab`` most frequent target tokens of ``token_counts`` (V,) (ties: the lower id first, as
    speculators' ``build_vocab_mappings_from_distribution``), in increasing id order -> ``d2t`` (draft_vocab,) long
    (target id = draft id + d2t[draft id]) and ``t2d`` (V,) bool (True on the chosen target ids)."""
    if token_counts.dim() != 1:
        raise ValueError(f"token_counts must be 1-D over the target vocabulary, got shape {tuple(token_counts.shape)}")
    v = token_counts.numel()
    if not 1 <= draft_vocab <= v:
        raise ValueError(f"draft_vocab must lie in [1, {v}] (the target vocabulary), got {draft_vocab}")
    order = torch.sort(-token_counts.double(), stable=True).indices  # (V,) most frequent first, ties by id
    ids = order[:draft_vocab].sort().values.cpu()  # (Vd,)
    t2d = torch.zeros(v, dtype=torch.bool)
    t2d[ids] = True
    return ids - torch.arange(draft_vocab), t2d


class Eagle3Cache(DrafterCache):
    """The drafter's keys/values per row, ragged: row b holds ``lengths[b]`` positions (committed context, then
    any drafted ones) in slots ``[0, lengths[b])``; ``crop`` drops drafts, ``select`` keeps rows. One layer:
    ``k``/``v`` (1, B, nKV, capacity, hd) after RoPE."""


class Eagle3Attention(nn.Module):
    """Attention whose q/k/v read the 2H input; Qwen3's per-head ``q_norm``/``k_norm`` (before RoPE) for that family."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        c = config
        self.num_heads, self.num_kv_heads, self.head_dim, self.theta = c.num_heads, c.num_kv_heads, c.head_dim, c.rope_theta
        self.q_proj = nn.Linear(2 * c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        if c.family == "qwen3":
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None

    def project(self, x: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, n, 2H) at positions (B, n) -> q (B, nH, n, hd), k, v (B, nKV, n, hd), RoPE on q and k."""
        q = self.q_proj(x).unflatten(-1, (self.num_heads, self.head_dim))  # (B, n, nH, hd)
        k = self.k_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))  # (B, n, nKV, hd)
        v = self.v_proj(x).unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope(q, positions, self.theta), rope(k, positions, self.theta)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """q (B, nH, n, hd) over keys/values (B, nKV, S, hd) where ``mask`` (B, n, S) is True -> (B, n, H)."""
        out = F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=mask[:, None],
                                             enable_gqa=self.num_heads != self.num_kv_heads)  # (B, nH, n, hd)
        return self.o_proj(out.transpose(1, 2).flatten(2))


class Eagle3Layer(nn.Module):
    """The one decoder layer: ``input_layernorm`` on the token embedding, ``hidden_norm`` on the state, attention
    over their concatenation, residual = the state (``hidden_norm(state)`` under ``norm_before_residual``), then
    ``post_attention_layernorm`` and the SwiGLU MLP with its residual."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.norm_before_residual = config.norm_before_residual
        self.input_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(h, config.rms_norm_eps)
        self.self_attn = Eagle3Attention(config)
        self.post_attention_layernorm = RMSNorm(h, config.rms_norm_eps)
        self.mlp = SwiGLU(h, config.intermediate_size)

    def inputs(self, embeds: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        """embeds, state (B, n, H) -> the attention input (B, n, 2H) and the residual (B, n, H)."""
        g = self.hidden_norm(state)
        return torch.cat([self.input_layernorm(embeds), g], dim=-1), g if self.norm_before_residual else state

    def finish(self, attended: Tensor, residual: Tensor) -> Tensor:
        """Attention output and residual (B, n, H) -> the layer's output (B, n, H)."""
        x = residual + attended
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Drafter(nn.Module):
    """``embed_tokens`` (the target's, frozen), [``input_norm`` | ``fc_norm``], ``fc``, ``layers.0``, ``norm``,
    ``lm_head`` and the buffers ``d2t``/``t2d`` (a draft vocabulary only): speculators' names, so a state_dict
    exports as it is."""

    def __init__(self, config: Eagle3Config) -> None:
        super().__init__()
        self.config = c = config.validate()
        h, a = c.hidden_size, c.num_target_features
        self.embed_tokens = nn.Embedding(c.vocab_size, h)
        self.embed_tokens.weight.requires_grad_(False)
        self.input_norm = RMSNorm(a * h, c.rms_norm_eps) if c.norm_before_fc else None
        self.fc_norm = nn.ModuleList(RMSNorm(h, c.rms_norm_eps) for _ in range(a)) if c.fc_norm else None
        self.fc = nn.Linear(a * h, h, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(c)])
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.lm_head = nn.Linear(h, c.draft_vocab_size, bias=False)
        d2t = t2d = None
        if c.uses_draft_vocab:  # the first draft_vocab_size target ids until set_vocab_mapping
            d2t = torch.zeros(c.draft_vocab_size, dtype=torch.long)
            t2d = torch.arange(c.vocab_size) < c.draft_vocab_size
        self.register_buffer("d2t", d2t)
        self.register_buffer("t2d", t2d)

    # ---- vocabulary ---------------------------------------------------------------------------------------------
    def set_embeddings(self, weight: Tensor) -> None:
        """Copy the target's input embeddings (V, H) into ``embed_tokens`` (kept frozen)."""
        if tuple(weight.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(f"target embeddings of shape {tuple(weight.shape)}, the drafter's are "
                             f"{tuple(self.embed_tokens.weight.shape)}")
        with torch.no_grad():
            self.embed_tokens.weight.copy_(weight)

    def set_vocab_mapping(self, d2t: Tensor, t2d: Tensor) -> None:
        """Hold a draft vocabulary (:func:`vocab_mapping`'s pair); ValueError (one line) when they disagree."""
        c = self.config
        if not c.uses_draft_vocab:
            raise ValueError(f"this drafter proposes over the whole vocabulary ({c.vocab_size}): no d2t/t2d to set")
        if tuple(d2t.shape) != (c.draft_vocab_size,) or tuple(t2d.shape) != (c.vocab_size,):
            raise ValueError(f"d2t {tuple(d2t.shape)} and t2d {tuple(t2d.shape)} must be ({c.draft_vocab_size},) and "
                             f"({c.vocab_size},)")
        ids = d2t.long().cpu() + torch.arange(c.draft_vocab_size)
        if not torch.equal(ids, t2d.bool().cpu().nonzero().flatten()):
            raise ValueError("d2t and t2d disagree: draft id d must be the d-th target id that t2d marks "
                             "(d + d2t[d], increasing)")
        self.d2t.copy_(d2t)
        self.t2d.copy_(t2d)

    def draft_to_target(self, ids: Tensor) -> Tensor:
        """Draft-vocabulary ids (...) -> target ids (...)."""
        return ids if self.d2t is None else ids + self.d2t[ids]

    def draft_targets(self, target_logits: Tensor) -> Tensor:
        """The target's logits (..., V) restricted to the draft vocabulary, in draft order (..., Vd): what the
        drafter's logits are trained against."""
        return target_logits if self.t2d is None else target_logits[..., self.t2d]

    # ---- the pieces -----------------------------------------------------------------------------------------
    def fuse(self, features: Tensor) -> Tensor:
        """Target features (..., A*H) -> the first state (..., H): ``fc`` after ``input_norm`` / ``fc_norm``."""
        if self.input_norm is not None:
            features = self.input_norm(features)
        elif self.fc_norm is not None:
            chunks = features.chunk(len(self.fc_norm), dim=-1)
            features = torch.cat([norm(x) for norm, x in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(features)

    def state(self, inputs: Tensor) -> Tensor:
        """Target features (..., A*H) fused, or the drafter's own states (..., H) as they are."""
        c = self.config
        width = inputs.shape[-1]
        if width == c.num_target_features * c.hidden_size:
            return self.fuse(inputs)
        if width == c.hidden_size:
            return inputs
        raise ValueError(f"Eagle3Drafter: inputs of width {width}: give target features (A*H = "
                         f"{c.num_target_features * c.hidden_size}) or the drafter's own states (H = {c.hidden_size})")

    def head(self, out: Tensor) -> tuple[Tensor, Tensor]:
        """The layer's output (..., H) -> (the state fed back (..., H): pre-norm, ``norm(out)`` under
        ``norm_output``; the draft logits (..., Vd) ``lm_head(norm(out))``)."""
        normed = self.norm(out)
        return (normed if self.config.norm_output else out), self.lm_head(normed)

    # ---- drafting -------------------------------------------------------------------------------------------
    def new_cache(self, batch_size: int, capacity: int, *, dtype: torch.dtype | None = None,
                  device: torch.device | str | None = None, check: bool = False) -> Eagle3Cache:
        """An empty cache sized for this drafter (dtype/device default to the parameters'; ``check``: refuse bad
        counts and overflows, reading the host)."""
        p = self.fc.weight
        c = self.config
        return Eagle3Cache(1, batch_size, capacity, c.num_kv_heads, c.head_dim, dtype=dtype or p.dtype,
                           device=device or p.device, check=check)

    def extend(self, cache: Eagle3Cache, inputs: Tensor, tokens: Tensor, positions: Tensor,
               counts: Tensor | None = None, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Run n new positions per row against ``cache`` and append them. ``inputs`` (B, n, A*H) target features or
        (B, n, H) the drafter's own states, each of the position before its token's: input j pairs that state with
        ``tokens[:, j]`` (B, n) at ``positions[:, j]`` (B, n). New position j sees the row's cached slots and new
        positions <= j, or where given ``mask`` (B, n, C + n) (C = the longest row's length before the call: slots
        past a row's length are never seen, and j always sees itself). Row b's first ``counts[b]`` (default all n)
        are written at its own length. Returns (the states to feed back (B, n, H), the draft logits (B, n, Vd))."""
        b, n = tokens.shape
        if inputs.shape[:2] != (b, n) or positions.shape != (b, n):
            raise ValueError(f"extend: inputs {tuple(inputs.shape[:2])}, tokens {(b, n)} and positions "
                             f"{tuple(positions.shape)} must share (B, n)")
        if counts is None:
            counts = torch.full((b,), n, dtype=torch.long, device=tokens.device)
        layer = self.layers[0]
        x, residual = layer.inputs(self.embed_tokens(tokens), self.state(inputs))  # (B, n, 2H), (B, n, H)
        q, k, v = layer.self_attn.project(x, positions)  # (B, nH, n, hd), (B, nKV, n, hd)
        old_k, old_v, valid = cache.view(0)  # (B, nKV, C, hd), (B, C)
        c = valid.shape[1]
        itself = torch.eye(n, dtype=torch.bool, device=tokens.device)
        if mask is None:
            new = torch.ones(n, n, dtype=torch.bool, device=tokens.device).tril().expand(b, n, n)
            seen = torch.cat([valid[:, None, :].expand(b, n, c), new], dim=-1)  # (B, n, C + n)
        else:
            if mask.shape != (b, n, c + n):
                raise ValueError(f"extend: mask of shape {tuple(mask.shape)}, expected (B, n, C + n) = {(b, n, c + n)}")
            seen = mask.bool() & torch.cat([valid[:, None, :].expand(b, n, c), torch.ones_like(mask[..., c:])], -1)
            seen[..., c:] |= itself
        attended = layer.self_attn.attend(q, torch.cat([old_k, k], dim=2), torch.cat([old_v, v], dim=2), seen)
        cache.append([k], [v], positions, counts)
        return self.head(layer.finish(attended, residual))

    # ---- training ---------------------------------------------------------------------------------------------
    def train_forward(self, features: Tensor, tokens: Tensor, steps: int) -> Tensor:
        """The training-time test over right-padded rows: features (B, T, A*H) of the target at positions 0..T-1,
        tokens (B, T) the tokens there. Slot t holds position t + 1 + s at step s: token ``tokens[:, t + 1 + s]``
        (0 past the end) with, at step 0, the target's features at t, later the state of step s - 1 at slot t;
        queries see the step-0 slots <= t and slot t of the steps before. Returns logits (B, steps, T, Vd):
        ``[:, s, t]`` drafts the token at t + 2 + s (the target's logits at t + 1 + s); valid where t + 1 + s < the
        row's length (:meth:`ttt_valid`)."""
        b, t = tokens.shape
        if features.shape[:2] != (b, t):
            raise ValueError(f"train_forward: features {tuple(features.shape[:2])} and tokens {(b, t)} must share "
                             "(B, T)")
        if not 1 <= steps < t:
            raise ValueError(f"train_forward: steps must lie in [1, T - 1] = [1, {t - 1}], got {steps}")
        layer = self.layers[0]
        state = self.state(features)  # (B, T, H)
        positions = torch.arange(1, t + 1, device=tokens.device).expand(b, t)  # (B, T)
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        diagonal = torch.eye(t, dtype=torch.bool, device=tokens.device)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        out = []
        for s in range(steps):
            shifted = F.pad(tokens[:, 1 + s:], (0, 1 + s))  # (B, T): the token at t + 1 + s, 0 past the end
            x, residual = layer.inputs(self.embed_tokens(shifted), state)
            q, k, v = layer.self_attn.project(x, positions + s)
            keys.append(k)
            values.append(v)
            seen = torch.cat([causal] + [diagonal] * s, dim=-1).expand(b, t, (s + 1) * t)  # (B, T, (s+1) T)
            attended = layer.self_attn.attend(q, torch.cat(keys, dim=2), torch.cat(values, dim=2), seen)
            state, logits = self.head(layer.finish(attended, residual))
            out.append(logits)
        return torch.stack(out, dim=1)

    @staticmethod
    def ttt_valid(lengths: Tensor, t: int, steps: int) -> Tensor:
        """Which of :meth:`train_forward`'s logits (B, steps, T) have a target: t + 1 + s < lengths[b]."""
        slot = torch.arange(t, device=lengths.device)[None, :] + torch.arange(steps, device=lengths.device)[:, None]
        return slot[None] + 1 < lengths[:, None, None]


def train_forward_reference(drafter: Eagle3Drafter, features: Tensor, tokens: Tensor, steps: int) -> Tensor:
    """:meth:`Eagle3Drafter.train_forward` the slow, obvious way: for each row and slot t, a fresh cache takes the
    target's features at 0..t one position at a time, then the chain of ``steps - 1`` drafts from its own states,
    each token the next of ``tokens`` (0 past the end). Returns logits (B, steps, T, Vd)."""
    b, t = tokens.shape

    def token(row: int, pos: int) -> Tensor:
        return tokens[row, pos:pos + 1] if pos < t else torch.zeros(1, dtype=tokens.dtype, device=tokens.device)

    rows = []
    for r in range(b):
        per_slot = []
        for slot in range(t):
            cache = drafter.new_cache(1, slot + steps)
            for j in range(slot + 1):  # position j + 1: the token there with the target's features at j
                state, logits = drafter.extend(cache, features[r:r + 1, j:j + 1], token(r, j + 1)[None],
                                               torch.tensor([[j + 1]], device=tokens.device))
            chain = [logits[0, 0]]
            for s in range(1, steps):
                pos = slot + 1 + s
                state, logits = drafter.extend(cache, state, token(r, pos)[None],
                                               torch.tensor([[pos]], device=tokens.device))
                chain.append(logits[0, 0])
            per_slot.append(torch.stack(chain))  # (steps, Vd)
        rows.append(torch.stack(per_slot, dim=1))  # (steps, T, Vd)
    return torch.stack(rows)
