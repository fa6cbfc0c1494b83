"""A runtime's draft vocabulary: proposals restricted to the listed tokens, from their projection rows. Torch only.

Proposals only need an argmax, and verification (p_1 over the whole vocabulary) decides what is accepted, so
restricting the proposals to N frequent target tokens keeps exact decoding exact: a token outside the list is never
proposed, and a proposal that should have been such a token is rejected as any wrong proposal is. What it saves is
the vocabulary projection of every proposal. On CPU a one-row projection streams the whole V x D matrix (8000 x 256:
~0.8 ms on these cores, ~0.1 ms for 2000 rows), and chained heads make k - 1 of them one after the other. The idea
follows the frequency-ranked draft vocabularies of speculative decoding (e.g. FR-Spec, 2025).

:func:`~lightning_bpd.inference.build_runtime` builds one :class:`DraftVocabulary` for its snapshot, from the token
list of ``InferenceOptions.draft_vocab`` or else from the ids the trained model stores
(:mod:`lightning_bpd.nn.draft_ids`), with the runtime's products; its proposer proposes through it and the runtime's
``restrict_draft`` masks with it. The trained model is not changed.
"""

from __future__ import annotations

from torch import Tensor

from lightning_bpd.nn.argmax import argmax
from lightning_bpd.nn.draft_ids import restrict
from lightning_bpd.nn.products import FLOAT, Products, version


class DraftVocabulary:
    """Argmaxes restricted to the token ids ``ids`` (1-D, distinct, increasing: held as given, so a model's ids
    buffer is read as it is), multiplying through ``products``."""

    def __init__(self, ids: Tensor, products: Products = FLOAT) -> None:
        self.ids = ids
        self.products = products
        self._rows: tuple[tuple[int, ...], Tensor, Tensor | None] | None = None

    def rows(self, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor | None]:
        """The projection's rows (and bias) of the draft tokens, cached until either changes."""
        key = (version(weight), version(self.ids), weight.data_ptr(), version(bias),
               -1 if bias is None else bias.data_ptr())
        if self._rows is None or self._rows[0] != key:
            self._rows = (key, weight[self.ids], None if bias is None else bias[self.ids])
        return self._rows[1], self._rows[2]

    def logits(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """Logits (..., N) of the draft tokens only, for states h (..., D) under ``weight`` (V, D)."""
        return self.products.linear(h, *self.rows(weight, bias))

    def argmax(self, h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        """Token ids (...) of the most likely draft token of states h (..., D) under ``weight`` (V, D)."""
        return self.ids[argmax(self.logits(h, weight, bias))]

    def restrict(self, logits: Tensor) -> Tensor:
        """Full-vocabulary logits (..., V) with every token outside the list at -inf (the reference's view)."""
        return restrict(logits, self.ids)

    def __repr__(self) -> str:
        return f"DraftVocabulary({self.ids.numel()} tokens, {self.products!r})"
