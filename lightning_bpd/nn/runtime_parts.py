"""What an inference runtime builds its fast paths from, beside the decoding protocol. Torch only.

The decoding core reads a model through :class:`~lightning_bpd.decoding.protocol.BlockwiseModel`. An inference
runtime (:mod:`lightning_bpd.inference`) does more with the models that offer it: it proposes from a packed, int8
or reduced-precision copy of the heads and the output layer, fuses chained links, screens p_1's argmax, restricts
proposals to a draft vocabulary (:mod:`lightning_bpd.inference.draft_vocab`), runs lean steps.
:class:`RuntimeParts` declares what that takes; a model offers it by inheriting the class (our
:class:`~lightning_bpd.nn.model.BlockwiseTransformer`, the Hugging Face adapter), and a runtime asks
``isinstance(model, RuntimeParts)``, never for single members. A model that does not inherit it (a stub, a draft
model of another kind) is decoded through the protocol alone.

Members (an image model's own, or what a text model has instead: the runtime reads them the same way):

- ``head``: the blockwise head (:class:`~lightning_bpd.nn.blockwise_head.BlockwiseHead` or a chained one);
- ``prior``: the intensity prior of an image model, None where p_1 is a plain vocabulary projection;
- ``image``: the image read-out (:class:`~lightning_bpd.nn.image_readout.ImageReadout`), or ``NO_IMAGE``;
- ``draft_vocab``: the draft token ids the model stores (a module with an ``ids`` buffer, increasing), or None: a
  runtime proposes from them unless its options name others, and holds what it makes of them itself;
- ``products``: how its projections multiply (:mod:`lightning_bpd.nn.products`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class RuntimeParts(ABC):
    """The parts a runtime's fast paths are built from (see the module docstring). Declares, holds nothing."""

    head: Any
    prior: Any
    image: Any
    draft_vocab: Any
    products: Any

    @abstractmethod
    def output_layer(self) -> tuple[Tensor, Tensor | None]:
        """p_1's projection as one affine map: weight (V, D) and bias (V,) or None."""

    @abstractmethod
    def embedding_table(self) -> Tensor:
        """Every token's decoder input (V, D), as :meth:`embed_tokens` gives it (the fused chain's token terms)."""

    @abstractmethod
    def embed_tokens(self, tokens: Tensor) -> Tensor:
        """Token embeddings as the decoder and the chained heads see them: (...) -> (..., D)."""

    @abstractmethod
    def chain_link(self, step: Callable[[Tensor], Tensor], z: Tensor, i: int, dtype: torch.dtype | None = None,
                   token: Tensor | None = None, nearest: bool = False) -> tuple[Tensor, Tensor]:
        """Chained link ``i`` from head i-1's state z through ``step``: (head i's state, the state the output layer
        reads)."""

    @abstractmethod
    def use_lean_steps(self, on: bool) -> None:
        """Run the encoder and the cached decoder step through their lean paths (same outputs as the modules)."""
