"""The inference options of every command, in one frozen object. Torch only.

``decode``, ``bench``, ``where_time_goes``, the validation callback (``DecodeEval``) and ``human-eval`` read the
same :class:`InferenceOptions` and hand it to :func:`~lightning_bpd.inference.runtime.build_runtime`; nothing
else decides how a model multiplies at inference.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from lightning_bpd.inference.precision import (
    INT8,
    INVARIANT,
    PACKED,
    canonical_precision,
    model_dtype,
    parse_precision,
    precision_name,
)


@dataclass(frozen=True)
class InferenceOptions:
    """How a runtime decodes a model.

    precision: ``float32``, ``bfloat16``, ``float64``, ``float32-invariant`` (float32 with float64 products and
        attention: the verify pass and the greedy step round alike), ``float32-packed`` (float32 with oneDNN's
        packed weights, batch-invariant on these CPUs, and float64 attention), ``bfloat16-invariant`` (bfloat16 with
        float64 attention) or ``int8`` (float32 weights multiplied in int8 per weight row and activation row,
        float64 attention; CPU); None: the model's own dtype, plain products.
    proposal_precision: the heads propose from a copy in this precision (``bfloat16``, ``int8``, ...) while
        verification keeps ``precision``; None: the model's own.
    draft_vocab: token ids the heads may propose (None: every token, or the model's own draft vocabulary).
    screened_argmax: greedy's and exact verification's argmax of p_1 through an int8 screen with float64
        logits for its candidates (CPU, float32 translation models).
    lean_steps: the encoder and the cached decoder step as TorchScript functions (same outputs as the modules).
    fused_chain: chained heads propose through fused links (same tokens as the module links).
    stop_below: the confidence stop of deterministic proposals (None: off).
    fixed_shape: greedy and deterministic rules with fixed shapes (CUDA graphs on CUDA).
    """

    precision: str | None = None
    proposal_precision: str | None = None
    draft_vocab: tuple[int, ...] | None = None
    screened_argmax: bool = False
    lean_steps: bool = True
    fused_chain: bool = True
    stop_below: float | None = None
    fixed_shape: bool = False

    def __post_init__(self) -> None:
        if self.precision is not None:
            object.__setattr__(self, "precision", canonical_precision(self.precision))
        if self.proposal_precision is not None and str(self.proposal_precision).lower() != "int8":
            parse_precision(self.proposal_precision)  # an unknown name fails here, with the list of names
        if self.stop_below is not None and not 0.0 <= self.stop_below <= 1.0:
            raise ValueError(f"stop_below is a probability in [0, 1], got {self.stop_below}")
        if self.draft_vocab is not None:
            object.__setattr__(self, "draft_vocab", tuple(int(i) for i in self.draft_vocab))

    def precision_of(self, model: nn.Module) -> str:
        """The canonical name of the precision a runtime of ``model`` decodes in: ``precision``, or the model's own
        dtype's."""
        return self.precision or precision_name(model_dtype(model))

    @property
    def int8(self) -> bool:
        """Whether the products are int8."""
        return self.precision == INT8

    @property
    def packed(self) -> bool:
        """Whether the products are float32 with oneDNN-packed weights."""
        return self.precision == PACKED

    @property
    def invariant(self) -> bool:
        """Whether the products (or attention) are taken in float64: ``float32-invariant``, ``bfloat16-invariant``."""
        return self.precision in INVARIANT
