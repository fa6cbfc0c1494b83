"""The fast deterministic proposals and greedy's fast argmax of a runtime, built once. Torch only.

The model (:class:`~lightning_bpd.nn.model.BlockwiseTransformer`) is the reference: its heads' logits
(``logits_heads``) and chain links (``chain_step``) are what these must reproduce. A :class:`FastHeads` is built
by :func:`~lightning_bpd.inference.build_runtime` from the runtime's snapshot of the model and its options, and
makes everything it needs there, once:

- a copy of the heads and the output projection in the proposal precision (``proposal_precision``; int8: a
  float32 copy whose chain links and projection multiply in int8, :class:`ProposalPath`);
- the fused chain links (:class:`~lightning_bpd.inference.fused_chain.FusedChain`, ``fused_chain``), and for own-centre
  Gaussian image heads the whole chain in the same TorchScript call (:func:`~lightning_bpd.inference.fused_chain.chain_links`);
- the int8 screen of the vocabulary for greedy's argmax (``screened_argmax``,
  :mod:`~lightning_bpd.inference.screened_argmax`).

Proposals go over the runtime's draft vocabulary when it has one (``draft``,
:class:`~lightning_bpd.inference.draft_vocab.DraftVocabulary`: the runtime makes it, the proposer reads it).

Its methods are the decoding protocol's optional capabilities (:mod:`lightning_bpd.decoding.protocol`):
``draft_tokens``, ``chain_draft``, ``chain_drafts`` and ``argmax_first``, and for trees of candidates each head's
n best tokens through the same paths, ``draft_ranks`` and ``chain_ranks``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lightning_bpd.inference.draft_vocab import DraftVocabulary
from lightning_bpd.inference.fused_chain import FusedChain
from lightning_bpd.inference.precision import parse_precision
from lightning_bpd.inference.screened_argmax import ScreenedArgmax
from lightning_bpd.kernels.int8 import available as int8_available
from lightning_bpd.kernels.int8 import int8_linear, pack_int8
from lightning_bpd.nn.argmax import argmax, top_ranks
from lightning_bpd.nn.chained_head import ChainSource


@dataclass
class ProposalPath:
    """A copy of the heads and the output projection (weight (V, D), bias) in ``dtype`` for proposals; with
    ``int8`` a float32 copy whose chain links and projection multiply in int8 (``packed``: the projection's rows,
    of the draft vocabulary when there is one, and their number)."""

    head: nn.Module
    weight: Tensor
    bias: Tensor | None
    dtype: torch.dtype
    int8: bool = False
    packed: tuple[object, int] | None = None
    cast: tuple[Tensor, ChainSource] | None = None  # the last source cast, keyed by its keys tensor

    def int8_logits(self, states: Tensor) -> Tensor:
        """int8 logits (..., N) of proposal states (..., D) over the draft vocabulary (or every token)."""
        return int8_linear(states, *self.packed)  # type: ignore[misc]

    def source_in_dtype(self, source: ChainSource) -> ChainSource:
        """``source`` with keys and values in ``dtype``, cast once per source tensor (every link of every
        iteration reads the same one); holding the key tensor keeps its identity from being reused."""
        if self.cast is None or self.cast[0] is not source.keys or self.cast[1].valid is not source.valid:
            self.cast = (source.keys, ChainSource(source.keys.to(self.dtype), source.values.to(self.dtype),
                                                  source.valid))
        return self.cast[1]


def proposal_path(model: nn.Module, precision: str | None, draft: DraftVocabulary | None = None) -> ProposalPath | None:
    """The proposal copy of ``model``'s heads and output projection in ``precision`` (None, or the model's own
    dtype: no copy, the model's own are used); int8 packs the rows of the draft vocabulary ``draft`` when given."""
    weight, bias = model.output_layer()
    if precision is None:
        return None
    with torch.no_grad():
        if precision.lower() == "int8":
            if not int8_available() or weight.dtype != torch.float32:
                raise ValueError("--proposal-precision int8 needs a float32 model and torch's fbgemm/x86 quantized "
                                 f"engine (CPU); got {weight.dtype}, engines {torch.backends.quantized.supported_engines}")
            path = ProposalPath(copy.deepcopy(model.head).eval(), weight.detach().clone(),
                                None if bias is None else bias.detach().clone(), torch.float32, int8=True)
            rows, row_bias = (path.weight, path.bias) if draft is None else draft.rows(path.weight, path.bias)
            path.packed = (pack_int8(rows, row_bias), rows.shape[0])
            return path
        dtype = parse_precision(precision)
        if dtype == weight.dtype:
            return None
        return ProposalPath(copy.deepcopy(model.head).to(dtype).eval(), weight.detach().to(dtype),
                            None if bias is None else bias.detach().to(dtype), dtype)


class FastHeads:
    """Deterministic proposals and greedy's argmax for the runtime's snapshot ``model`` (a
    :class:`~lightning_bpd.nn.model.BlockwiseTransformer`, or a Hugging Face base with heads,
    :class:`~lightning_bpd.hf.base.HFSeq2SeqBlockwise`), with the copies its options ask for made now; the heads
    propose over the runtime's draft vocabulary ``draft`` (None: every token)."""

    def __init__(self, model: nn.Module, proposal_precision: str | None = None, fused: bool = True,
                 screened: bool = False, draft: DraftVocabulary | None = None) -> None:
        self.model = model
        self.draft = draft
        self.proposal = proposal_path(model, proposal_precision, draft)
        head, weight, _ = self.parts()
        self.int8 = self.proposal is not None and self.proposal.int8
        self.fused: FusedChain | None = None
        if fused and model.chained_heads:
            embed = model.embedding_table().detach().to(weight.dtype)  # (V, D): as embed_tokens
            self.fused = FusedChain(head, embed, int8=self.int8)  # type: ignore[arg-type]
        self.screen: ScreenedArgmax | None = None
        if screened:
            if model.prior is not None:
                raise ValueError("the screened argmax takes models whose p_1 is a plain vocabulary projection; "
                                 "this one has an intensity prior (an image model): decode without it")
            self.screen = ScreenedArgmax(*model.output_layer())

    def parts(self) -> tuple[nn.Module, Tensor, Tensor | None]:
        """The head and output projection (weight (V, D), bias) that proposals use: the copy, or the model's."""
        if self.proposal is None:
            return self.model.head, *self.model.output_layer()
        return self.proposal.head, self.proposal.weight, self.proposal.bias

    # ---- greedy's token ---------------------------------------------------------------------------------------
    def argmax_first(self, h: Tensor) -> Tensor:
        """Greedy's token: the argmax of p_1 at h (..., D) -> (...) long, ties to the lowest id. With the screen
        (float32 on CPU) the float64 logits' argmax through it; otherwise the argmax of ``logits_first``."""
        model = self.model
        if self.screen is None or not (h.dtype == torch.float32 and h.device.type == "cpu"):
            return argmax(model.logits_first(h))
        return self.screen(h if model.chained_heads else model.head.first(h))

    # ---- the paper's heads ------------------------------------------------------------------------------------
    def draft_tokens(self, h: Tensor, heads: list[int] | range,
                     confidence: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Each listed head's argmax at h (b, D) over the draft vocabulary (every token without one) -> (b, n)
        token ids; with ``confidence`` also each head's probability of its token (b, n)."""
        _, weight, bias = self.parts()
        return self.argmax_states(self.head_states(h, heads), weight, bias, confidence)

    def draft_ranks(self, h: Tensor, heads: list[int] | range, n: int) -> Tensor:
        """Each listed head's n best tokens at h (b, D), best first, ties to the lowest id, over the draft vocabulary
        (every token without one) -> (b, len(heads), n); rank 0 is :meth:`draft_tokens`'."""
        _, weight, bias = self.parts()
        return self.rank_states(self.head_states(h, heads), weight, bias, n)

    def head_states(self, h: Tensor, heads: list[int] | range) -> Tensor:
        """The listed heads' states (b, len(heads), D) at h (b, D), as the output projection reads them."""
        model = self.model
        head, weight, _ = self.parts()
        h, centres = model.image.split_centres(h)
        states = head.select(h.to(weight.dtype), heads)  # (b, n, D)
        return model.image.readout(states, None if centres is None else centres[..., list(heads)], list(heads))

    def proposal_logits(self, states: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """The proposing logits (..., N or V) of states (..., D): int8, or over the draft vocabulary's N tokens
        (in the order of their ids) when there is one."""
        draft = self.draft
        if self.int8:
            return self.proposal.int8_logits(states)  # type: ignore[union-attr]  # (..., N or V)
        if draft is None:
            return self.model.products.linear(states, weight, bias)  # (..., V)
        return draft.logits(states, weight, bias)  # (..., N)

    def rank_states(self, states: Tensor, weight: Tensor, bias: Tensor | None, n: int) -> Tensor:
        """The n best token ids (..., n) of proposal states (..., D): :func:`top_ranks` of :meth:`proposal_logits`
        (the draft vocabulary's ids are increasing, so ties still go to the lowest id)."""
        draft = self.draft
        top = top_ranks(self.proposal_logits(states, weight, bias), n)
        return top if draft is None else draft.ids[top]

    def argmax_states(self, states: Tensor, weight: Tensor, bias: Tensor | None,
                      confidence: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """Argmax token ids (...) of proposal states (..., D), over the draft vocabulary when there is one; with
        ``confidence`` also the proposing distribution's probability of that token (...)."""
        draft = self.draft
        logits = self.proposal_logits(states, weight, bias)
        best = argmax(logits)
        token = best if draft is None else draft.ids[best]
        if not confidence:
            return token
        top = logits.gather(-1, best[..., None])[..., 0]
        return token, (top - logits.logsumexp(dim=-1)).float().exp()

    # ---- chained heads ----------------------------------------------------------------------------------------
    def proposes_nearest(self, bias: Tensor | None) -> bool:
        """Whether chain links propose the intensity nearest their Gaussian's mean without the projection: own-centre
        Gaussian heads, no output bias, no draft vocabulary, no int8 proposals."""
        model = self.model
        return bool(model.image.own_centres and model.prior.gaussian and bias is None and self.draft is None
                    and not self.int8)

    def chain_draft(self, z: Tensor, token: Tensor, i: int, source: ChainSource | None = None,
                    confidence: bool = False) -> tuple[Tensor, ...]:
        """Head ``i``'s state (b, D) and its argmax token (b,) from head i-1's state z and its token (b,); with
        ``confidence`` also head i's probability of that token (b,). Through the fused links when built, else
        the (proposal copy's) module links; ``model.chain_step`` is the reference."""
        _, weight, bias = self.parts()
        nearest = self.proposes_nearest(bias) and not confidence  # a Gaussian image head: no projection
        z, state = self.link(z, token, i, source, nearest)
        if nearest:
            return z, state
        out = self.argmax_states(state, weight, bias, confidence)
        return (z, *out) if confidence else (z, out)

    def chain_ranks(self, z: Tensor, token: Tensor, i: int, source: ChainSource | None = None,
                    n: int = 1) -> tuple[Tensor, Tensor]:
        """Head ``i``'s state (b, D) and its n best tokens (b, n), best first, ties to the lowest id, from head i-1's
        state z and its token (b,): the link of :meth:`chain_draft` (rank 0 is its token), projected."""
        _, weight, bias = self.parts()
        z, state = self.link(z, token, i, source, nearest=False)
        return z, self.rank_states(state, weight, bias, n)

    def link(self, z: Tensor, token: Tensor, i: int, source: ChainSource | None,
             nearest: bool) -> tuple[Tensor, Tensor]:
        """Chain link ``i`` from head i-1's state z (b, D) and its token (b,): (head i's state, that state as the
        projection reads it, or with ``nearest`` the proposed intensity), through the fused links when built, else
        the (proposal copy's) module links."""
        model = self.model
        head, weight, _ = self.parts()
        if self.fused is not None:
            fused = self.fused
            return model.chain_link(lambda x: fused.step(x, token, i, source), z, i, weight.dtype, token, nearest)
        if source is not None and self.proposal is not None:
            source = self.proposal.source_in_dtype(source)
        e = model.embed_tokens(token).to(weight.dtype)
        return model.chain_link(lambda x: head.step(x, e, i, source), z, i, weight.dtype, token, nearest)

    def chain_drafts(self, h: Tensor, first: Tensor, k: int, source: ChainSource | None = None) -> Tensor | None:
        """The argmax tokens (b, k - 1) of heads 2..k from the state h (b, D) and greedy's token ``first`` (b,), as
        k - 1 calls of :meth:`chain_draft` give them, in one call. None without fused links (the caller goes link
        by link)."""
        if self.fused is None:
            return None
        model = self.model
        if model.image.own_centres:
            return self.image_chain_drafts(h, first, k, source)
        _, weight, bias = self.parts()
        draft = self.draft
        rows, row_bias = (weight, bias) if draft is None else draft.rows(weight, bias)
        packed = self.proposal.packed[0] if self.int8 else None  # type: ignore[union-attr]
        tokens = self.fused.propose(h.to(weight.dtype), first, k, source, rows, row_bias,  # all links in one call
                                    None if draft is None else draft.ids, packed)
        if tokens is not None:
            return tokens
        if self.int8:  # link by link (no token tables, or a dtype the scripted chains do not take)
            project = lambda z: int8_linear(z, packed, rows.shape[0])
        else:
            project = lambda z: model.products.linear(z, rows, row_bias)
        z, token, out = h.to(weight.dtype), first, []
        for i in range(1, k):
            z = self.fused.step(z, token, i, source)
            token = argmax(project(z))
            out.append(token if draft is None else draft.ids[token])
            token = out[-1]
        return torch.stack(out, dim=1)  # (b, k - 1)

    def image_chain_drafts(self, h: Tensor, first: Tensor, k: int, source: ChainSource | None = None) -> Tensor | None:
        """Own-centre Gaussian image heads: :meth:`chain_drafts`'s tokens (b, k - 1) from the decoder state h
        (b, D + carried) in one TorchScript call, bitwise the link-by-link :meth:`chain_draft`; None where that
        path does not apply (a categorical output, int8 or reduced-precision proposals, no token tables)."""
        model = self.model
        _, weight, bias = self.parts()
        fused = self.fused
        if k < 2 or fused is None or not self.proposes_nearest(bias) or weight.dtype not in (torch.float32,
                                                                                             torch.float64):
            return None
        if fused.links[0].tok_table is None:
            return None
        z, carried = model.image.split_centres(h)
        reader = model.image.neighbours
        readers = [] if reader is None else [t for link in reader.links[: k - 1]
                                             for t in (link[0].weight, link[0].bias, link[2].weight, link[2].bias)]
        prior = model.prior
        shift = model.image.head_shift() or (prior.adapt.weight, prior.adapt.bias)
        image = (carried, model.k, 0 if reader is None else reader.n,
                 [] if reader is None else [list(s) for s in reader.slots], readers, prior.features, prior.offset,
                 prior.half, *shift)
        return fused.run(z.to(weight.dtype), first, k - 1, source, weight, None, None, [], image)
