"""A model prepared for decoding once, from :class:`~lightning_bpd.inference.options.InferenceOptions`. Torch only.

:func:`build_runtime` takes a snapshot of the model (a deep copy in eval mode, cast to the precision's dtype),
gives every module of the snapshot the products of the precision (:mod:`lightning_bpd.inference.products`: the
packed int8 or float64 copies of its weights are made here, once), and sets the snapshot's fast paths (lean
steps, fused chain links, the proposal copy, the screened argmax, a draft vocabulary). The model itself is not
touched: it keeps training, or decodes in its own dtype through the reference products, and two runtimes of one
model in two precisions decode side by side in one process. A runtime built before the model's weights change
does not see the change: build another.

:class:`Runtime` implements the decoding protocol (:mod:`lightning_bpd.decoding.protocol`) by handing each call
to its snapshot.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from lightning_bpd.inference.options import InferenceOptions
from lightning_bpd.inference.precision import parse_precision
from lightning_bpd.inference.products import Int8Products, PackedProducts, WideProducts
from lightning_bpd.inference.proposer import Proposer
from lightning_bpd.nn.products import FLOAT, Products, use_products


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
    """A deep copy of ``model`` in eval mode without gradients, in the dtype of ``options.precision``."""
    made = copy.deepcopy(model).eval().requires_grad_(False)
    if options.precision is not None:
        made.to(parse_precision(options.precision))
    return made


class Runtime:
    """A model's snapshot with the products and fast paths of ``options``; the decoders take it as a model.

    Attributes: ``model`` (the snapshot), ``options``, ``products``, ``precision`` (the canonical name of what it
    decodes in). Every member of the decoding protocol is its own (the optional ones are the snapshot's, or None
    where it offers none); other attributes of the model (its ``config``, ...) read through to the snapshot.
    """

    def __init__(self, model: nn.Module, options: InferenceOptions, products: Products,
                 proposer: Proposer | None = None) -> None:
        self.model = model
        self.options = options
        self.products = products
        self.proposer = proposer  # the fast proposals and argmax (None: a model without them, e.g. a stub)
        self.precision = options.precision_of(model)
        self.k: int = model.k
        self.pad_id: int = model.pad_id
        self.bos_id: int = model.bos_id
        self.eos_id: int | None = model.eos_id
        self.chained_heads: bool = bool(offered(model, "chained_heads"))

    # ---- the decoding protocol ----------------------------------------------------------------------------------
    def encode(self, src: Tensor) -> Any:
        return self.model.encode(src)

    def new_cache(self, batch_size: int, capacity: int) -> Any:
        return self.model.new_cache(batch_size, capacity)

    def decode_step(self, tokens: Tensor, context: Any, cache: Any) -> Tensor:
        return self.model.decode_step(tokens, context, cache)

    def decode_full(self, tgt_in: Tensor, context: Any) -> Tensor:
        return self.model.decode_full(tgt_in, context)

    def logits_first(self, h: Tensor) -> Tensor:
        return self.model.logits_first(h)

    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None, *args: Any, **kwargs: Any) -> Tensor:
        return self.model.logits_heads(h, heads, *args, **kwargs)

    def chain_step(self, z: Tensor, token: Tensor, i: int, source: Any = None) -> tuple[Tensor, Tensor]:
        return self.model.chain_step(z, token, i, source)

    # ---- the protocol's optional members: the proposer's fast paths and the snapshot's own, None where not offered
    @property
    def vocab_size(self) -> int | None:
        return offered(self.model, "vocab_size")

    @property
    def generation_rules(self) -> Any:
        return offered(self.model, "generation_rules")

    @property
    def rules_history(self) -> Callable[[Tensor, int], Tensor] | None:
        return offered(self.model, "rules_history")

    @property
    def restrict_draft(self) -> Callable[[Tensor], Tensor] | None:
        return offered(self.model, "restrict_draft")

    @property
    def chain_source(self) -> Callable[[Any], Any] | None:
        return offered(self.model, "chain_source")

    @property
    def decode_tree(self) -> Callable[..., Tensor] | None:
        return offered(self.model, "decode_tree")

    @property
    def argmax_first(self) -> Callable[[Tensor], Tensor] | None:
        return None if self.proposer is None else self.proposer.argmax_first

    @property
    def draft_tokens(self) -> Callable[..., Any] | None:
        return None if self.proposer is None or self.chained_heads else self.proposer.draft_tokens

    @property
    def chain_draft(self) -> Callable[..., tuple[Tensor, ...]] | None:
        return None if self.proposer is None or not self.chained_heads else self.proposer.chain_draft

    @property
    def chain_drafts(self) -> Callable[..., Tensor | None] | None:
        return None if self.proposer is None or not self.chained_heads else self.proposer.chain_drafts

    def __getattr__(self, name: str) -> Any:
        """Everything else the snapshot has (its ``config``, ...)."""
        if name == "model":  # not set yet (copying, unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def __repr__(self) -> str:
        return f"Runtime({type(self.model).__name__}, {self.options})"


def offered(model: nn.Module, member: str) -> Any:
    """The snapshot's optional protocol ``member``, or None where it has none (a model of another kind)."""
    return getattr(model, member, None)


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
    for part in (made, getattr(made, "encoder", None), getattr(made, "decoder", None)):
        if part is not None and hasattr(part, "lean"):  # our encoder and decoder, an HF base
            part.lean = options.lean_steps
    if options.draft_vocab is not None:
        need(made, "use_draft_vocab", "a draft vocabulary")(torch.tensor(options.draft_vocab, dtype=torch.long))
    proposer = None
    if hasattr(made, "head") and hasattr(made, "output_layer"):  # heads and an output layer (ours, an HF base)
        proposer = Proposer(made, options.proposal_precision, options.fused_chain, options.screened_argmax)
    elif options.proposal_precision is not None or options.screened_argmax:
        raise ValueError(f"{type(made).__name__} has no proposal path for a proposal precision or a screened argmax")
    return Runtime(made, options, products, proposer)


def need(model: nn.Module, method: str, what: str) -> Any:
    """``model``'s ``method``, or one clear error naming what the model cannot take."""
    found = getattr(model, method, None)
    if found is None:
        raise ValueError(f"{type(model).__name__} cannot take {what} ({method})")
    return found
