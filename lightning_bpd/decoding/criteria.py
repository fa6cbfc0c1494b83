"""Acceptance rules for blockwise parallel decoding (Stern et al., 2018, sections 3 and 5). Torch only.

Every iteration proposes k tokens ``y_1..y_k``; y_1 always comes from the scoring model p_1 at a
verified position, so it is always accepted. Token y_{i+1} (i >= 1) is checked against p_1 at the
position after y_i (``verify_logits[:, i - 1]``), and the accepted block is the longest prefix
whose checks all pass:

- :class:`Exact`: y_{i+1} is the argmax of p_1 (reproduces greedy decoding exactly);
- :class:`TopK`: y_{i+1} is among the n most likely tokens of p_1;
- :class:`Distance`: |value(y_{i+1}) - value(argmax p_1)| <= eps (pixel intensities);
- :class:`MinBlock`: accept at least l tokens per iteration, whatever an inner rule says.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import Tensor


class Criterion(ABC):
    """Decides how many of the k proposed tokens each row accepts."""

    def validate(self, k: int) -> None:
        """Raise ValueError if this rule cannot run with block size ``k``."""

    def propose(self, logits: Tensor) -> Tensor:
        """Proposals from the heads' logits (B, k, V) -> tokens (B, k): the argmax of each head."""
        return logits.argmax(dim=-1)

    @abstractmethod
    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        """Per-position checks: proposals (B, m), verify_logits (B, m, V) -> bool (B, m)."""

    def accept(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        """Accepted block sizes (B,) in [1, k] for proposals (B, k) and p_1 logits (B, k-1, V)."""
        ok = self.matches(proposals[:, 1:], verify_logits)  # (B, k-1)
        return 1 + ok.long().cumprod(dim=-1).sum(dim=-1)

    @property
    def name(self) -> str:
        return type(self).__name__.lower()


class Exact(Criterion):
    """Accept while the proposal equals the argmax of p_1: the output equals greedy decoding."""

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        return proposals == verify_logits.argmax(dim=-1)

    @property
    def name(self) -> str:
        return "exact"


class TopK(Criterion):
    """Accept while the proposal is among the ``n`` highest-scoring tokens of p_1 (section 5.1)."""

    def __init__(self, n: int) -> None:
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"TopK n must be an integer >= 1, got {n!r}")
        self.n = n

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        n = min(self.n, verify_logits.shape[-1])
        top = verify_logits.topk(n, dim=-1).indices  # (B, m, n)
        return (top == proposals.unsqueeze(-1)).any(dim=-1)

    @property
    def name(self) -> str:
        return f"top{self.n}"


class Distance(Criterion):
    """Accept while |value(proposal) - value(argmax p_1)| <= eps (section 5.2).

    ``values`` (V,) maps token ids to the quantity compared (e.g. pixel intensity); by default a
    token's value is its id. Give special tokens a value far from every other (or NaN) so they
    are only ever accepted on an exact match.
    """

    def __init__(self, eps: float, values: Tensor | None = None) -> None:
        if eps < 0:
            raise ValueError(f"Distance eps must be >= 0, got {eps}")
        self.eps = eps
        self.values = values

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        best = verify_logits.argmax(dim=-1)  # (B, m)
        if self.values is None:
            u, v = proposals.to(torch.float64), best.to(torch.float64)
        else:
            values = self.values.to(device=proposals.device, dtype=torch.float64)
            u, v = values[proposals], values[best]
        return (proposals == best) | ((u - v).abs() <= self.eps)

    @property
    def name(self) -> str:
        return f"eps{self.eps:g}"


class MinBlock(Criterion):
    """Accept at least ``l`` tokens per iteration, more when ``inner`` accepts more (section 5.3)."""

    def __init__(self, l: int, inner: Criterion | None = None) -> None:
        if not isinstance(l, int) or l < 1:
            raise ValueError(f"MinBlock l must be an integer >= 1, got {l!r}")
        self.l = l
        self.inner = inner if inner is not None else Exact()

    def validate(self, k: int) -> None:
        if self.l > k:
            raise ValueError(f"MinBlock l must lie in [1, k] = [1, {k}], got l={self.l}")
        self.inner.validate(k)

    def propose(self, logits: Tensor) -> Tensor:
        return self.inner.propose(logits)

    def matches(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        return self.inner.matches(proposals, verify_logits)

    def accept(self, proposals: Tensor, verify_logits: Tensor) -> Tensor:
        return self.inner.accept(proposals, verify_logits).clamp(min=min(self.l, proposals.shape[1]))

    @property
    def name(self) -> str:
        return f"min{self.l}_{self.inner.name}"


def parse_criterion(spec: str, values: Tensor | None = None) -> Criterion:
    """Build a criterion from a short name: ``exact``, ``top3``, ``eps2``, ``min2`` or ``min2_top3``."""
    s = spec.strip().lower()
    try:
        if s == "exact":
            return Exact()
        if s.startswith("top"):
            return TopK(int(s[3:]))
        if s.startswith("eps"):
            return Distance(float(s[3:]), values)
        if s.startswith("min"):
            head, _, rest = s.partition("_")
            return MinBlock(int(head[3:]), parse_criterion(rest, values) if rest else Exact())
    except ValueError as err:
        if "must" in str(err):
            raise
    raise ValueError(f"unknown criterion {spec!r}: use exact, topN (e.g. top2), epsX (e.g. eps2), minL or minL_<rule>")
