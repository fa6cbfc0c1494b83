"""A model prepared for decoding once, from :class:`~lightning_bpd.inference.options.InferenceOptions`. Torch only.

:func:`build_runtime` takes a snapshot of the model (its own module objects in eval mode on the model's own weights,
:mod:`~lightning_bpd.inference.shared_copy`; weights are copied only where the precision's dtype is not theirs),
gives every module of the snapshot the products of the precision (:mod:`lightning_bpd.inference.product_kinds`: the
packed int8 or float64 copies of its weights are made here, once), and sets the snapshot's fast paths (lean
steps, fused chain links, the proposal copy, the screened argmax) and its own draft vocabulary
(:mod:`lightning_bpd.inference.draft_vocab`: the options' token list, or else the ids the model stores). The
model's modules are not touched: it keeps training, or decodes in its own dtype through the reference products, and
two runtimes of one model in two precisions decode side by side in one process. A runtime reads the model's weights
as they are (a float32 runtime of a float32 model copies none), but the copies its products made when it was built
stay as they were: after the weights change, build another.

:class:`Runtime` implements the decoding protocol (:mod:`lightning_bpd.decoding.protocol`) by handing each call
to its snapshot, without gradients: torch's grad mode decides the arithmetic of the fast paths (with gradients on,
every product kind multiplies as plain float does), so each call runs under ``torch.no_grad()`` and a runtime
decodes the same bits under ``torch.enable_grad()`` as under ``torch.no_grad()``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_bpd.inference.draft_vocab import DraftVocabulary
from lightning_bpd.inference.fast_heads import FastHeads
from lightning_bpd.inference.options import InferenceOptions
from lightning_bpd.inference.precision import parse_precision
from lightning_bpd.inference.product_kinds import Int8Products, PackedProducts, WideProducts
from lightning_bpd.inference.product_swap import use_products
from lightning_bpd.inference.shared_copy import cast_copy, shared_copy
from lightning_bpd.nn.draft_ids import checked_ids
from lightning_bpd.nn.products import FLOAT, Products
from lightning_bpd.nn.runtime_parts import RuntimeParts


def make_products(options: InferenceOptions, model: nn.Module) -> Products:
    """The products of ``options.precision`` for ``model`` (the runtime's snapshot), built now."""
    if options.int8:
        return Int8Products().prepare(model)
    if options.invariant:
        return WideProducts().prepare(model)
    if options.packed:
        return PackedProducts().prepare(model)
    return FLOAT


def snapshot(model: nn.Module, options: InferenceOptions) -> nn.Module:
    """``model``'s modules for a runtime (:func:`~lightning_bpd.inference.shared_copy.shared_copy`: its own module
    objects, in eval mode, on the model's own weights), with copies only of the weights that are not in the dtype of
    ``options.precision``."""
    made = shared_copy(model).eval()
    if options.precision is not None:
        cast_copy(made, parse_precision(options.precision))
    return made


def draft_vocabulary(model: nn.Module, options: InferenceOptions, products: Products) -> DraftVocabulary | None:
    """The draft vocabulary of a runtime of ``model`` (its snapshot, a :class:`RuntimeParts`): the token ids of
    ``options.draft_vocab``, or else the ids the model stores (read as they are), multiplying through ``products``;
    None where there are neither."""
    if options.draft_vocab is not None:
        weight = model.output_layer()[0]
        ids = checked_ids(options.draft_vocab, model.vocab_size).to(weight.device)
    elif model.draft_vocab is not None:
        ids = model.draft_vocab.ids
    else:
        return None
    return DraftVocabulary(ids, products)


def grad_free(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` called under ``torch.no_grad()`` when gradients are on; as it is when they are off (the decoders'
    own case: entering a no-grad context costs about 2 us a call, checking the mode a tenth of that)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        with torch.no_grad():
            return fn(*args, **kwargs)

    return call


def without_grad(fn: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """``fn`` called without gradients (:func:`grad_free`; None stays None)."""
    return None if fn is None else grad_free(fn)


class Runtime:
    """A model's snapshot with the products and fast paths of ``options``; the decoders take it as a model.

    Attributes: ``model`` (the snapshot), ``options``, ``products``, ``proposer``, ``draft_vocab`` (the proposer's
    :class:`~lightning_bpd.inference.draft_vocab.DraftVocabulary`, or None), ``precision`` (the canonical name of what
    it decodes in), ``measurements`` (what a run measures on it once and reuses: ``--tree-nodes auto``'s cost curve).
    Every member of the decoding protocol is its own (the optional ones are the proposer's, ``restrict_draft`` the
    draft vocabulary's, the others the snapshot's, or None where it offers none); other attributes of the model (its
    ``config``, ...) read through to the snapshot.
    """

    def __init__(self, model: nn.Module, options: InferenceOptions, products: Products,
                 proposer: FastHeads | None = None) -> None:
        self.model = model
        self.options = options
        self.products = products
        self.proposer = proposer  # the fast proposals and argmax (None: a model without them, e.g. a stub)
        self.draft_vocab: DraftVocabulary | None = None if proposer is None else proposer.draft
        self.precision = options.precision_of(model)
        self.k: int = model.k
        self.pad_id: int = model.pad_id
        self.bos_id: int = model.bos_id
        self.eos_id: int | None = model.eos_id
        self.chained_heads: bool = bool(model.chained_heads)
        self.measurements: dict[Any, Any] = {}  # what a run measured on this runtime once (a tree cost curve)

    # ---- the decoding protocol, each call without gradients ------------------------------------------------------
    @grad_free
    def encode(self, src: Tensor) -> Any:
        return self.model.encode(src)

    def new_cache(self, batch_size: int, capacity: int, extra_slots: int = 0) -> Any:
        return self.model.new_cache(batch_size, capacity, extra_slots)

    @grad_free
    def decode_step(self, tokens: Tensor, context: Any, cache: Any) -> Tensor:
        return self.model.decode_step(tokens, context, cache)

    @grad_free
    def decode_full(self, tgt_in: Tensor, context: Any) -> Tensor:
        return self.model.decode_full(tgt_in, context)

    @grad_free
    def logits_first(self, h: Tensor) -> Tensor:
        return self.model.logits_first(h)

    @grad_free
    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None, *args: Any, **kwargs: Any) -> Tensor:
        return self.model.logits_heads(h, heads, *args, **kwargs)

    @grad_free
    def chain_step(self, z: Tensor, token: Tensor, i: int, source: Any = None) -> tuple[Tensor, Tensor]:
        return self.model.chain_step(z, token, i, source)

    # ---- the protocol's optional members: the proposer's fast paths and the snapshot's own, None where not offered;
    # made once (the snapshot's do not change after build_runtime), each call without gradients
    @functools.cached_property
    def vocab_size(self) -> int | None:
        return self.model.vocab_size

    @property
    def generation_rules(self) -> Any:
        return self.model.generation_rules

    @property
    def rules_history(self) -> Callable[[Tensor, int], Tensor] | None:
        return self.model.rules_history

    @property
    def decode_room(self) -> Callable[[Tensor], list[int]] | None:
        return self.model.decode_room

    @functools.cached_property
    def restrict_draft(self) -> Callable[[Tensor], Tensor] | None:
        if self.draft_vocab is not None:  # the runtime's own, which its proposer proposes from
            return without_grad(self.draft_vocab.restrict)
        return without_grad(self.model.restrict_draft)

    @functools.cached_property
    def chain_source(self) -> Callable[[Any], Any] | None:
        return without_grad(self.model.chain_source)

    @functools.cached_property
    def decode_tree(self) -> Callable[..., Tensor] | None:
        return without_grad(self.model.decode_tree)

    @grad_free
    def embed_tokens(self, tokens: Tensor) -> Tensor:
        return self.model.embed_tokens(tokens)

    @functools.cached_property
    def encode_features(self) -> Callable[..., Any] | None:
        return without_grad(self.model.encode_features)

    @functools.cached_property
    def decode_step_features(self) -> Callable[..., Any] | None:
        return without_grad(self.model.decode_step_features)

    @property
    def decode_tree_features(self) -> Callable[..., Any] | None:
        return without_grad(self.model.decode_tree_features)

    @functools.cached_property
    def argmax_first(self) -> Callable[[Tensor], Tensor] | None:
        return None if self.proposer is None else without_grad(self.proposer.argmax_first)

    @functools.cached_property
    def draft_tokens(self) -> Callable[..., Any] | None:
        return None if self.proposer is None or self.chained_heads else without_grad(self.proposer.draft_tokens)

    @functools.cached_property
    def draft_ranks(self) -> Callable[..., Tensor] | None:
        return None if self.proposer is None or self.chained_heads else without_grad(self.proposer.draft_ranks)

    @functools.cached_property
    def chain_ranks(self) -> Callable[..., tuple[Tensor, Tensor]] | None:
        return None if self.proposer is None or not self.chained_heads else without_grad(self.proposer.chain_ranks)

    @functools.cached_property
    def chain_draft(self) -> Callable[..., tuple[Tensor, ...]] | None:
        return None if self.proposer is None or not self.chained_heads else without_grad(self.proposer.chain_draft)

    @functools.cached_property
    def chain_drafts(self) -> Callable[..., Tensor | None] | None:
        return None if self.proposer is None or not self.chained_heads else without_grad(self.proposer.chain_drafts)

    def __getattr__(self, name: str) -> Any:
        """Everything else the snapshot has (its ``config``, ...)."""
        if name == "model":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def __repr__(self) -> str:
        return f"Runtime({type(self.model).__name__}, {self.options})"


def build_runtime(model: nn.Module | Runtime, options: InferenceOptions | None = None) -> Runtime:
    """``model`` prepared for decoding with ``options`` (default: its own dtype, plain products, fast paths on).

    Raises ValueError on options the model cannot take (int8 off the CPU, a screened argmax of an image model,
    a proposal precision without a proposal path)."""
    options = options or InferenceOptions()
    if isinstance(model, Runtime):
        model = model.model
    made = snapshot(model, options)
    products = make_products(options, made)
    use_products(made, products)
    if not isinstance(made, RuntimeParts):  # the protocol alone (a stub): nothing to build fast paths from
        if options.draft_vocab is not None:
            raise ValueError(f"{type(made).__name__} cannot take a draft vocabulary (it declares no RuntimeParts)")
        if options.proposal_precision is not None or options.screened_argmax:
            raise ValueError(f"{type(made).__name__} has no proposal path for a proposal precision or a screened "
                             "argmax")
        return Runtime(made, options, products)
    made.use_lean_steps(options.lean_steps)
    draft = draft_vocabulary(made, options, products)
    proposer = FastHeads(made, options.proposal_precision, options.fused_chain, options.screened_argmax, draft)
    return Runtime(made, options, products, proposer)
