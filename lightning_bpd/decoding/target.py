"""The target as the one loop calls it: a protocol of eight members, and the view that offers it over any base.
Torch only.

The loop (:mod:`~lightning_bpd.decoding.loop`), the candidates' verify passes, the verdicts, the generation rules'
book and a proposer's :class:`~lightning_bpd.decoding.state.Readout` read a model through :class:`Target` alone::

    spec, rules                                 # ids, vocabulary, what it verifies; p_1's rules and each row's room
    context, features = prefill(src, layers)    # the prompts' pass (features: the hidden states of ``layers``)
    cache = new_cache(batch, capacity, extra)
    hidden, feats = verify(tokens, context, cache, tree, layers)  # a path (tree None) or a tree (depths, ancestors)
    logits_first(h), argmax_first(h), embed_tokens(tokens)        # the cheap projections

Every base of the package, the inference runtime and the tests' stubs define the wide protocol
(:class:`~lightning_bpd.decoding.protocol.WideTarget`: ``encode``, ``decode_step``, ``decode_tree`` and their
``*_features`` twins, the optional members); :func:`target_of` makes the :class:`TargetView` over one once per decode
(a model that already is a :class:`Target` is its own). Greedy, beam, the fixed-shape decoder and the references keep
calling the wide members.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch import Tensor

from lightning_bpd.nn.argmax import argmax


class Context(Protocol):
    """Per-source state computed once (encoder output, cross-attention K/V)."""

    def select(self, rows: Tensor) -> Context: ...


class Cache(Protocol):
    """Decoder KV cache with a length per row (see :class:`~lightning_bpd.nn.kv_cache.KVCache`)."""

    lengths: Tensor

    def crop(self, lengths: Tensor, bounds: tuple[int, int] | None = None, check: bool = True) -> None: ...

    def select(self, rows: Tensor) -> None: ...

    def keep_path(self, nodes: Tensor, kept: Tensor, width: int, bounds: tuple[int, int] | None = None) -> None:
        """Tree decoding only: the last ``width`` positions of each row were a tree's nodes; keep row b's accepted
        path ``nodes[b, :kept[b]]`` (B, m) at consecutive positions after its prefix and drop the rest."""
        ...

    def make_static(self) -> None:
        """Fixed shapes from now on (:class:`~lightning_bpd.decoding.static.StaticDecoder`)."""
        ...


Layers = tuple[int, ...]  # target layer ids whose hidden states a pass also returns
TreeShape = tuple[Tensor, Tensor]  # a tree's depths (N,) or (b, N) and ancestor mask (N, N) or (b, N, N) bool


@dataclass(frozen=True)
class TargetSpec:
    """A target's ids and what it verifies: ``vocab_size`` (None: not known), ``trees`` (it verifies a tree),
    ``layers`` (its prefill and a path's verify pass return the hidden states of named layers), ``tree_layers``
    (a tree's verify pass does too)."""

    pad_id: int
    bos_id: int
    eos_id: int | None
    vocab_size: int | None = None
    trees: bool = False
    layers: bool = False
    tree_layers: bool = False


@dataclass(frozen=True)
class TargetRules:
    """What p_1's generation rules and the room clamp read of a target (each None where it has none):
    ``generation`` (:class:`~lightning_bpd.decoding.generation_rules.GenerationRules`, the checkpoint's rules on p_1),
    ``history(src (B, S), window)`` -> (B, window) long (the tokens before the first generated one as the rules
    match banned words; None: the start token, -1 before it) and ``room(src (B, S))`` -> B host ints (the inputs
    each row may feed after its start token; None: no bound)."""

    generation: Any = None  # a GenerationRules (generation_rules.py imports this module: not named here)
    history: Callable[[Tensor, int], Tensor] | None = None
    room: Callable[[Tensor], list[int]] | None = None


@dataclass
class Features:
    """What the target computed that a proposer reads, as the loop hands it over (None: not asked for, or not at
    this call).

    - :meth:`~lightning_bpd.decoding.proposers.base.Proposer.start` gets the prefill's: ``layers`` (B, S, A * D) the
      outputs of the declared layers at every source slot (concatenated in the declared order), ``valid`` (B, S) bool
      the slots that hold a token and ``positions`` (B, S) long each slot's position;
    - :meth:`~lightning_bpd.decoding.proposers.base.Proposer.propose` gets each live row's tip: ``last`` (b, D) the
      last hidden state at its last accepted position (what heads read, and what p_1 is projected from) and ``first``
      (b,) the verdict's next token there (greedy's for deterministic rules; for sampling -1 where p_1 must draw it;
      None at the first proposal, where the proposer reads p_1 at ``last`` itself);
    - :meth:`~lightning_bpd.decoding.proposers.base.Proposer.advance` gets the verify pass's ``layers`` (b, N, A * D)
      at each of its inputs (a path's positions or a tree's nodes), the live rows only.
    """

    last: Tensor | None = None
    first: Tensor | None = None
    layers: Tensor | None = None
    valid: Tensor | None = None
    positions: Tensor | None = None

    def select(self, rows: Tensor) -> Features:
        """The live rows ``rows`` (b',) of these features."""
        def take(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[rows]
        return Features(take(self.last), take(self.first), take(self.layers), take(self.valid), take(self.positions))


class Target(Protocol):
    """The target of the one loop: it prefills, verifies a path or a tree (with the hidden states of named layers
    when asked), keeps a cache (:class:`Cache`: crop, keep a tree's path) and
    projects p_1. Eight members; :func:`target_of` offers them over any base."""

    spec: TargetSpec
    rules: TargetRules

    def prefill(self, src: Tensor, layers: Layers = ()) -> tuple[Context, Features | None]:
        """The prompts' pass over ``src`` (B, S): the context and, for ``layers`` (needs ``spec.layers``), the
        prefill's :class:`Features` (layers (B, S, A * D), valid, positions); None without layers."""
        ...

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> Cache:
        """A cache for ``capacity`` positions per row (BOS, the output, a block's proposals), and ``extra_slots``
        more slots that no position reaches (a tree's nodes beyond its depth: they sit at slots length + i)."""
        ...

    def verify(self, tokens: Tensor, context: Context, cache: Cache, tree: TreeShape | None = None,
               layers: Layers = ()) -> tuple[Tensor, Tensor | None]:
        """One pass over ``tokens`` (B, N): a path (``tree`` None: position t at the row's length + t) or a tree
        (``tree`` = (depths, ancestors): node i at the row's length + depths[i], seeing the cached prefix and the
        nodes j with ancestors[i, j]; needs ``spec.trees``). Appends N slots to the cache. Returns hidden (B, N, D)
        and, for ``layers``, their hidden states (B, N, A * D) (needs ``spec.layers`` / ``spec.tree_layers``), else
        None."""
        ...

    def logits_first(self, h: Tensor) -> Tensor:
        """(..., D) -> (..., V): p_1."""
        ...

    def argmax_first(self, h: Tensor) -> Tensor:
        """(..., D) -> (...) long: greedy's token, the argmax of p_1, ties to the lowest id."""
        ...

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """Tokens (...) -> the decoder's input embeddings (..., D) (a block drafter embeds its block with them)."""
        ...


class TargetView:
    """:class:`Target` over a model of the wide protocol (``model``: a base, a runtime, a stub). Its members read
    the model's when first used, so a view made once per decode costs a call per pass and nothing more. The ids,
    rules and p_1 are read as the protocol declares them (a model lacking one fails loudly); a verify pass the model
    lacks altogether is not offered (``spec``: as an optional member that is None), and a proposer needing it says
    so in its check."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @functools.cached_property
    def spec(self) -> TargetSpec:
        m = self.model

        def offered(*names: str) -> bool:
            return all(getattr(m, name, None) is not None for name in names)

        return TargetSpec(m.pad_id, m.bos_id, m.eos_id, m.vocab_size, offered("decode_tree"),
                          offered("encode_features", "decode_step_features"),
                          offered("encode_features", "decode_tree_features"))

    @functools.cached_property
    def rules(self) -> TargetRules:
        m = self.model
        return TargetRules(m.generation_rules, m.rules_history, m.decode_room)

    def prefill(self, src: Tensor, layers: Layers = ()) -> tuple[Any, Features | None]:
        if not layers:
            return self.model.encode(src), None
        if not self.spec.layers:
            raise ValueError(f"{type(self.model).__name__} offers no hidden states of its layers (encode_features)")
        context, features, valid, positions = self.model.encode_features(src, layers)  # (B, S, A * D), (B, S) x 2
        return context, Features(layers=features, valid=valid, positions=positions)

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> Any:
        return self.model.new_cache(batch_size, capacity, extra_slots)

    def verify(self, tokens: Tensor, context: Any, cache: Any, tree: TreeShape | None = None,
               layers: Layers = ()) -> tuple[Tensor, Tensor | None]:
        m = self.model
        if tree is None:
            if not layers:
                return m.decode_step(tokens, context, cache), None  # (B, T, D)
            return m.decode_step_features(tokens, context, cache, layers)  # (B, T, D), (B, T, A * D)
        depths, ancestors = tree
        if not layers:
            if not self.spec.trees:
                raise ValueError(f"{type(m).__name__} has no tree verify pass (decode_tree)")
            return m.decode_tree(tokens, depths, ancestors, context, cache), None  # (B, N, D)
        return m.decode_tree_features(tokens, depths, ancestors, context, cache, layers)  # (B, N, D), (B, N, A * D)

    def logits_first(self, h: Tensor) -> Tensor:
        return self.model.logits_first(h)

    def argmax_first(self, h: Tensor) -> Tensor:
        own = self._own_argmax
        return own(h) if own is not None else argmax(self.model.logits_first(h))

    @functools.cached_property
    def _own_argmax(self) -> Callable[[Tensor], Tensor] | None:
        return self.model.argmax_first

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.model.embed_tokens(tokens)

    def __repr__(self) -> str:
        return f"TargetView({type(self.model).__name__})"


def target_of(model: Any) -> Target:
    """``model`` as a :class:`Target`: itself where it is one (its ``spec`` is a :class:`TargetSpec`), else the
    :class:`TargetView` over its wide members."""
    return model if isinstance(getattr(model, "spec", None), TargetSpec) else TargetView(model)
