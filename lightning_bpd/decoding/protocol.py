"""What the decoding core needs from a model, and what it returns. Torch only.

The decoding core knows nothing about tokenizers, images, Lightning or tasks: a model is anything
with this small interface (:class:`~lightning_bpd.nn.model.BlockwiseTransformer` is one, the inference
:class:`~lightning_bpd.inference.runtime.Runtime` another; the tests use hand-written stubs).

The loop reads a model through the narrow :class:`~lightning_bpd.decoding.target.Target` (eight members: its
spec and rules, prefill, new_cache, verify a path or a tree, logits_first, argmax_first, embed_tokens), which
:func:`~lightning_bpd.decoding.target.target_of` offers over the wide members every base defines
(:class:`WideTarget`: what greedy, beam, the fixed-shape decoder and the references call). The model's own heads
are the :class:`HeadsNetwork` that only the heads' proposers read (a drafter that reads the last hidden state).
The optional capabilities (faster paths to what the required methods already give, and chained heads) are members
too, never probed for: a callable member that is None is not offered, and the core then takes the required path.
:class:`OptionalCapabilities` holds those defaults for a model or stub to inherit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from lightning_bpd.decoding.target import Cache, Context, Target, target_of
from lightning_bpd.nn.argmax import argmax

if TYPE_CHECKING:
    from lightning_bpd.decoding.generation_rules import GenerationRules


class Source(Protocol):
    """What source-attending chained heads read (``model.chain_source(context)``), one per source row."""

    def take(self, rows: Tensor) -> Source: ...


class WideTarget(Protocol):
    """The target's members as every base defines them: its ids, the prefill (:meth:`encode`, with the features of
    named layers: :attr:`encode_features`), a cache, the verify pass of a path (:meth:`decode_step`) or a tree
    (:attr:`decode_tree`), each with the features of named layers (:attr:`decode_step_features`,
    :attr:`decode_tree_features`), p_1 (:meth:`logits_first`, :attr:`argmax_first`), its generation rules and room.
    The loop reads them through :func:`~lightning_bpd.decoding.target.target_of` (the narrow
    :class:`~lightning_bpd.decoding.target.Target`); greedy, beam, the fixed-shape decoder and the references call
    them directly.

    The required members come first. The optional ones follow, each None (or False) when not offered:
    the decoding core then takes the required path to the same tokens.
    """

    pad_id: int
    bos_id: int
    eos_id: int | None

    def encode(self, src: Tensor) -> Context: ...

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> Cache:
        """A cache for ``capacity`` positions per row (BOS, the output, a block's proposals), and ``extra_slots``
        more slots that no position reaches (a tree's nodes beyond its depth: they sit at slots length + i)."""
        ...

    def decode_step(self, tokens: Tensor, context: Context, cache: Cache) -> Tensor:
        """(B, T) new inputs -> (B, T, D) hidden states; appends T positions to the cache."""
        ...

    def decode_full(self, tgt_in: Tensor, context: Context) -> Tensor:
        """Uncached: (B, T) whole prefixes starting with BOS -> (B, T, D)."""
        ...

    def logits_first(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., V): p_1."""
        ...

    # ---- optional: None (False) when not offered -------------------------------------------------------------
    vocab_size: int | None
    """The output vocabulary's size when known (a draft model's is checked against its target's)."""

    argmax_first: Callable[[Tensor], Tensor] | None
    """Greedy's token: h (..., D) -> the argmax of p_1 (...) long, ties to the lowest id; None: the argmax of
    :meth:`logits_first` (see :func:`first_argmax`)."""

    generation_rules: GenerationRules | None
    """The checkpoint's rules on p_1 (:mod:`lightning_bpd.decoding.generation_rules`: forced BOS/EOS, EOS ids, suppressed and
    banned tokens, minimum lengths) that its own greedy ``generate`` applies; every decoder applies them wherever
    p_1 is read. None: greedy decoding of p_1 as it is, ending at ``eos_id``."""

    rules_history: Callable[[Tensor, int], Tensor] | None
    """The tokens before the first generated token as the generation rules match banned words of several tokens
    against them: ``rules_history(src (B, S), window)`` -> (B, window) long, -1 where there is none (a causal LM:
    each prompt's last tokens as ``generate`` sees its left-padded input). None: the start token ``bos_id``, -1
    before it (an encoder-decoder's decoder input)."""

    decode_tree: Callable[[Tensor, Tensor, Tensor, Context, Cache], Tensor] | None
    """The verify pass of tree decoding (:mod:`lightning_bpd.decoding.proposers.tree`): ``decode_tree(tokens (B, N),
    depths (N,), ancestors (N, N) bool, context, cache)`` -> hidden (B, N, D), node i at the row's length +
    ``depths[i]`` and seeing the cached prefix and the nodes j with ``ancestors[i, j]``; appends N slots to the
    cache (:meth:`Cache.keep_path`). None: the model verifies single paths only."""

    decode_room: Callable[[Tensor], list[int]] | None
    """How many inputs after the start token each row's decoder positions hold: ``decode_room(src (B, S))`` -> B
    host ints (a causal LM: its context less the row's prompt). The decoders refuse a ``max_len`` above a row's room
    (:func:`check_decode_args`) and size every verify pass so that no live row feeds an input past it
    (:func:`~lightning_bpd.decoding.row_book.RowBook.block_width`); inputs nothing reads (a fixed-shape decoder's
    finished rows, a draft model's proposals past max_len) may still pass it, so the model must compute them
    without failing. None: no bound."""

    embed_tokens: Callable[[Tensor], Tensor]
    """The decoder's token embeddings: tokens (...) -> (..., D), what its first layer reads (chained heads are fed
    them; a block drafter embeds its block with them). Every model that offers :attr:`encode_features` offers it."""

    encode_features: Callable[..., tuple[Any, Tensor, Tensor, Tensor]] | None
    """Block drafters (DFlash): :meth:`encode` that also returns the target's hidden states at the outputs of its
    decoder layers ``layers``: ``encode_features(src (B, S), layers)`` -> (context, features (B, S, len(layers) * D)
    concatenated in that order, valid (B, S) bool: the source slots that hold a token, positions (B, S) long: each
    slot's position). None: not offered."""

    decode_step_features: Callable[..., tuple[Tensor, Tensor]] | None
    """Block drafters: :meth:`decode_step` that also returns the hidden states at the outputs of ``layers``:
    ``decode_step_features(tokens (B, T), context, cache, layers)`` -> (hidden (B, T, D), features
    (B, T, len(layers) * D)). None: not offered."""

    decode_tree_features: Callable[..., tuple[Tensor, Tensor]] | None
    """Tree drafters (EAGLE-3 trees): :attr:`decode_tree` that also returns the hidden states at the outputs of
    ``layers`` at every node: ``decode_tree_features(tokens (B, N), depths, ancestors, context, cache, layers)`` ->
    (hidden (B, N, D), features (B, N, len(layers) * D)). None: not offered."""


class HeadsNetwork(Protocol):
    """The model's own heads (the paper's block, chained heads, Medusa heads) as the heads' proposers read them
    (:class:`~lightning_bpd.decoding.proposers.Heads`, :class:`~lightning_bpd.decoding.proposers.HeadTree`,
    :class:`~lightning_bpd.decoding.proposers.DynamicHeadTree`): a drafter that reads the target's last hidden
    state; the loop's verify pass that checks a block also gives the state they read for the next one (one pass).
    ``k = 1``: no heads beyond p_1. Chained heads (``chained_heads = True``) need :meth:`chain_step` and the
    ``prev_tokens`` and ``source`` of :meth:`logits_heads`; the other members are optional (None: not offered)."""

    k: int

    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None, prev_tokens: Tensor | None = None,
                     source: Source | None = None) -> Tensor:
        """(..., D) -> (..., len(heads), V): p_1..p_k (all by default). Chained heads also take the earlier
        proposals ``prev_tokens`` (..., m) and the ``source`` of each leading row; other heads ignore both."""
        ...

    chained_heads: bool
    """Head i also sees the token proposed for head i-1: proposals run link by link (:meth:`chain_step`)."""

    draft_tokens: Callable[..., Any] | None
    """Paper heads, deterministic proposals: ``draft_tokens(h (b, D), heads, confidence=False)`` -> the listed
    heads' argmax tokens (b, len(heads)), and with ``confidence`` also their probabilities (b, len(heads)).
    None: the argmax of :meth:`logits_heads`."""

    draft_ranks: Callable[[Tensor, Sequence[int], int], Tensor] | None
    """Paper heads, a tree's proposals: ``draft_ranks(h (b, D), heads, n)`` -> each listed head's n best tokens
    (b, len(heads), n), best first, ties to the lowest id (rank 0: :attr:`draft_tokens`'), over the draft
    vocabulary. None: :func:`~lightning_bpd.nn.argmax.top_ranks` of :meth:`logits_heads`."""

    restrict_draft: Callable[[Tensor], Tensor] | None
    """Logits (..., V) of a proposing head as the model's draft vocabulary sees them (-inf outside it);
    None: no draft vocabulary (every token may be proposed)."""

    chain_source: Callable[[Context], Source | None] | None
    """What source-attending chained heads read for the sources of a context; None (or a None result):
    nothing."""

    chain_draft: Callable[..., tuple[Tensor, ...]] | None
    """Chained heads, deterministic proposals, one link: ``chain_draft(z (b, D), token (b,), i, source,
    confidence=False)`` -> head i's state (b, D), its argmax token (b,) and with ``confidence`` its
    probability (b,). None: :meth:`chain_step` and the argmax of its logits."""

    chain_drafts: Callable[[Tensor, Tensor, int, Source | None], Tensor | None] | None
    """Chained heads, deterministic proposals, the whole chain: ``chain_drafts(h (b, D), first (b,), k, source)``
    -> heads 2..k's tokens (b, k - 1), or None where that path does not apply. None: link by link."""

    chain_ranks: Callable[..., tuple[Tensor, Tensor]] | None
    """Chained heads, a tree's proposals, one link: ``chain_ranks(z (b, D), token (b,), i, source, n)`` -> head i's
    state (b, D) and its n best tokens (b, n), best first, ties to the lowest id (rank 0: :attr:`chain_draft`'s
    token). None: :meth:`chain_step` and :func:`~lightning_bpd.nn.argmax.top_ranks` of its logits."""

    def chain_step(self, z: Tensor, token: Tensor, i: int, source: Source | None = None) -> tuple[Tensor, Tensor]:
        """Chained heads only: head i's state (b, D) and logits (b, V) from head i-1's state z (b, D) and its
        token (b,)."""
        ...


class BlockwiseModel(WideTarget, HeadsNetwork, Protocol):
    """A model with k heads (``k = 1``: an ordinary autoregressive model): the :class:`WideTarget` the loop verifies
    with (through :func:`~lightning_bpd.decoding.target.target_of`), and the :class:`HeadsNetwork` its own heads
    propose with. Every model of the package is both."""


class OptionalCapabilities:
    """The optional members of :class:`BlockwiseModel`, none offered: a model or stub inherits this and
    defines the ones it offers (a method of the subclass replaces the None). A proxy that forwards to a
    model through ``__getattr__`` must not inherit it (these class attributes would hide the model's)."""

    chained_heads: bool = False
    vocab_size: int | None = None
    argmax_first: Callable[[Tensor], Tensor] | None = None
    draft_tokens: Callable[..., Any] | None = None
    draft_ranks: Callable[..., Tensor] | None = None
    restrict_draft: Callable[[Tensor], Tensor] | None = None
    generation_rules: GenerationRules | None = None
    rules_history: Callable[[Tensor, int], Tensor] | None = None
    chain_source: Callable[[Any], Any] | None = None
    chain_draft: Callable[..., tuple[Tensor, ...]] | None = None
    chain_drafts: Callable[..., Tensor | None] | None = None
    chain_ranks: Callable[..., tuple[Tensor, Tensor]] | None = None
    decode_tree: Callable[..., Tensor] | None = None
    decode_room: Callable[[Tensor], list[int]] | None = None
    encode_features: Callable[..., Any] | None = None
    decode_step_features: Callable[..., Any] | None = None
    decode_tree_features: Callable[..., Any] | None = None


@dataclass
class DecodeResult:
    """Output of a decoder. ``tokens`` (B, L) are padded with the pad id past ``lengths`` (B,);
    an EOS, when produced, is the last counted token of its row. ``iterations`` (B,) counts the
    decoding iterations of each row (one per token for greedy); ``model_calls`` counts batched
    decoder calls; ``block_sizes[b]`` lists the tokens row b accepted at each iteration."""

    tokens: Tensor
    lengths: Tensor
    iterations: Tensor
    model_calls: int
    block_sizes: list[list[int]] = field(default_factory=list)

    @property
    def mean_accepted_block_size(self) -> float:
        """Generated tokens per iteration over the whole batch (the paper's k-hat)."""
        return float(self.lengths.sum()) / max(1, int(self.iterations.sum()))

    def sequences(self) -> list[list[int]]:
        """Each row's tokens as a list, up to its length (EOS included when produced)."""
        return [row[:n].tolist() for row, n in zip(self.tokens, self.lengths.tolist())]


def first_argmax(model: BlockwiseModel, h: Tensor) -> Tensor:
    """Greedy's next tokens (...) at hidden states h (..., D): ``model.argmax_first`` when the model offers
    one (e.g. a screened argmax that needs no float32 logits), else the argmax of ``model.logits_first``."""
    own = model.argmax_first
    return own(h) if own is not None else argmax(model.logits_first(h))


def resolve_k(model: HeadsNetwork, k: int | None) -> int:
    """The block size to decode with: the model's own k, or fewer heads of it."""
    if k is None:
        return model.k
    if not isinstance(k, int) or not 1 <= k <= model.k:
        raise ValueError(f"k must be an integer in [1, {model.k}] (the model's number of heads), got {k!r}")
    return k


def chain_source(model: HeadsNetwork, context: Context) -> Source | None:
    """What source-attending chained heads read (``model.chain_source``, when offered), or None."""
    get = model.chain_source
    return get(context) if get is not None else None


def restricted(model: BlockwiseModel, logits: Tensor) -> Tensor:
    """A proposing head's logits (..., V) over the model's draft vocabulary (-inf outside it), when it has one."""
    return logits if model.restrict_draft is None else model.restrict_draft(logits)


def check_decode_args(model: Target | WideTarget, src: Tensor, max_len: int) -> None:
    """Raise ValueError, naming the argument and the allowed range, on unusable decode input (``model``: a
    :class:`~lightning_bpd.decoding.target.Target` or a base)."""
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")
    if src.dim() != 2 or src.shape[0] == 0 or src.shape[1] == 0:
        raise ValueError(f"src must be a non-empty (batch, length) tensor, got shape {tuple(src.shape)}")
    target = target_of(model)
    if not bool((src != target.spec.pad_id).any(dim=1).all()):
        raise ValueError("src: every row needs at least one non-pad token (got an empty source)")
    room = source_room(target, src)
    if room is not None and min(room) < max_len:
        row = room.index(min(room))
        raise ValueError(f"src row {row}: the model's context holds {room[row]} new tokens after it, fewer than "
                         f"max_len={max_len}")


def source_room(model: Target | WideTarget, src: Tensor) -> list[int] | None:
    """The decoder inputs each row of ``src`` (B, S) may feed after its start token (the target's ``rules.room``:
    a base's ``decode_room``), or None where the model sets no bound."""
    room = target_of(model).rules.room
    return None if room is None else room(src)


def valid_first(valid: Tensor) -> Tensor:
    """The slot order (B, S) that puts each row's valid slots (``valid`` (B, S) bool) first, in their order: gathering
    with it left-aligns a padded row's tokens."""
    return torch.sort((~valid).long(), dim=1, stable=True).indices


def pack_rows(rows: list[list[int]], pad_id: int, device: torch.device | None = None) -> Tensor:
    """Pad a list of token lists into a (B, L) long tensor (L >= 1)."""
    width = max(1, max((len(r) for r in rows), default=0))
    out = torch.full((len(rows), width), pad_id, dtype=torch.long, device=device)
    for i, r in enumerate(rows):
        out[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return out
