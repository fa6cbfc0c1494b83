"""The head side of :class:`~lightning_bpd.hf.causal.HFCausalBlockwise`: p_1 and the heads through the base's own LM
head, and what the runtime's proposer (:mod:`lightning_bpd.inference.fast_heads`) builds its fast proposals from
(``head``, :meth:`CausalHeads.output_layer`, :meth:`CausalHeads.embedding_table`, :meth:`CausalHeads.chain_link`,
``products``), as the seq2seq adapter offers them. Torch only; the base is any module with
``get_input_embeddings`` / ``get_output_embeddings``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from lightning_bpd.nn.image_readout import NO_IMAGE, NoImage
from lightning_bpd.nn.products import FLOAT, Products
from lightning_bpd.nn.runtime_parts import RuntimeParts


class CausalHeads(RuntimeParts):
    """Mixed into an ``nn.Module`` with ``base``, ``head``, ``k``, ``chained_heads`` and ``vocab_size``: the
    :class:`~lightning_bpd.nn.runtime_parts.RuntimeParts` of a causal base (the lean step is the
    adapter's: :meth:`HFCausalBlockwise.use_lean_steps`)."""

    products: Products = FLOAT  # how p_1 and the proposals multiply (a runtime gives its snapshot its own)
    prior = None  # RuntimeParts: p_1 is a plain vocabulary projection, no intensity prior
    image: NoImage = NO_IMAGE  # RuntimeParts: a text model, no image read-out
    draft_vocab = None  # RuntimeParts: no stored draft ids (a runtime proposes from its options' list, if any)
    base: nn.Module
    head: nn.Module
    k: int
    chained_heads: bool
    vocab_size: int

    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """The base's token embeddings (...) -> (..., D): what chained heads are fed."""
        return self.base.get_input_embeddings()(tokens)

    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """The base's LM head as weight (V, D) and bias (V,) or None."""
        lm_head = self.base.get_output_embeddings()
        return lm_head.weight, getattr(lm_head, "bias", None)

    def project(self, h: Tensor) -> Tensor:
        """The base's LM head: (..., D) -> (..., V) (a logit scale or soft cap after it changes no argmax)."""
        return self.products.linear(h, *self.output_layer())

    def logits_first(self, h: Tensor) -> Tensor:
        """p_1, the base's own logits: (..., D) -> (..., V)."""
        return self.project(h)

    def logits_heads(self, h: Tensor, heads: Sequence[int] | None = None, prev_tokens: Tensor | None = None,
                     source: object = None) -> Tensor:
        """Logits of the listed heads (all k by default): (..., D) -> (..., len(heads), V). Chained heads also
        take the tokens proposed for heads 1..m (..., m)."""
        heads = list(range(self.k) if heads is None else heads)
        if self.chained_heads:
            states = self.head.select(h, heads, prev_tokens, self.embed_tokens)
        else:
            states = self.head.select(h, heads)
        return self.project(states)

    def chain_step(self, z: Tensor, token: Tensor, i: int, source: object = None) -> tuple[Tensor, Tensor]:
        """Chained heads: head ``i``'s state (b, D) and logits (b, V) from head i-1's state z and its token (b,)."""
        z = self.head.step(z, self.embed_tokens(token), i)
        return z, self.project(z)

    def embedding_table(self) -> Tensor:
        """Every token's embedding as :meth:`embed_tokens` gives it (V, D): the fused chain's token terms."""
        table = self.base.get_input_embeddings()
        return self.embed_tokens(torch.arange(table.num_embeddings, device=table.weight.device))

    def chain_link(self, step: Callable[[Tensor], Tensor], z: Tensor, i: int, dtype: torch.dtype | None = None,
                   token: Tensor | None = None, nearest: bool = False) -> tuple[Tensor, Tensor]:
        """Link ``i`` from head i-1's state z (b, D): ``step`` maps it (in ``dtype``, default z's) to head i's
        state -> (that state, that state as the output layer reads it: the same)."""
        z = step(z if dtype is None else z.to(dtype))
        return z, z
