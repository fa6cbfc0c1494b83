"""A Gaussian prior over output intensities, centred on the input's intensity under each target pixel.

Autoregressive image models decode greedily into blobs: once a wrong saturated value appears, the last
few tokens say "more of the same" louder than the low-resolution input says "skin", and the model
copies its own mistake forward. The prior puts the input into every output distribution with a weight
the network cannot forget:

    logit(v) = learned(v) - precision / 2 * (u(v) - u(c))^2 (+ a constant per position)

where u maps intensities to [-1, 1] and c is the input intensity that direct conditioning adds at that
target position (nearest or bilinear). The square expands into a dot product, so it rides through the
model as two *reserved coordinates* of the decoder's output state, ``(u(c), -1/2)``, and two fixed
columns of the output layer, ``precision * (u(v), u(v)^2)``. Every consumer of the hidden state (p_1,
the blockwise heads, verification, the agreement measure) therefore sees the prior without knowing of
it, and the decoding core stays task-agnostic. Ids that are not intensities get ``u = 0, u^2 = 4``:
farther than any intensity. ``precision`` is learned (its logarithm), starting at ``(127.5 / sigma)^2``.

``gaussian=True`` makes the prior the whole output distribution: a discretized Gaussian per intensity
whose centre ``u(c) + delta`` and width ``sigma * exp(rho)`` the network predicts (``delta, rho`` from a
zero-initialized linear map of the other coordinates), with no categorical part. Its mode is its mean,
so greedy decoding writes the model's estimate of the conditional mean, the intensity that minimizes
the expected squared error, instead of the most likely of 256 values (which in flat regions is "the same
as the last one", and greedy images go flat).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_bpd.nn.products import FLOAT, Products

RESERVED = 2  # hidden coordinates (the last ones) that carry the prior's coefficients
MAX_LOG_WIDTH = 2.0  # |rho|: the predicted width stays within exp(+-2) of the prior's
OUTSIDE = 4.0  # u^2 of ids that are no intensity (u^2 <= 1 for every intensity)


class IntensityPrior(nn.Module):
    """The prior's learned precision and fixed intensity features for a vocabulary of ``vocab_size`` ids,
    of which ``levels`` intensities start at id ``offset``; ``sigma``: its initial width in intensity levels."""

    products: Products = FLOAT  # how it multiplies (:mod:`~lightning_bpd.nn.products`)

    def __init__(self, vocab_size: int, offset: int, levels: int, sigma: float, d_model: int | None = None,
                 gaussian: bool = False) -> None:
        super().__init__()
        if sigma <= 0:
            raise ValueError(f"the intensity prior's sigma must be > 0 intensity levels, got {sigma}")
        if offset < 0 or levels < 2 or offset + levels > vocab_size:
            raise ValueError(f"intensities {offset}..{offset + levels - 1} do not fit a vocabulary of {vocab_size}")
        self.offset, self.half = offset, (levels - 1) / 2
        u = torch.zeros(vocab_size)
        u[offset : offset + levels] = (torch.arange(levels) - self.half) / self.half  # [-1, 1]
        square = torch.full((vocab_size,), OUTSIDE)
        square[offset : offset + levels] = u[offset : offset + levels] ** 2
        self.register_buffer("features", torch.stack([u, square], dim=-1), persistent=False)  # (V, 2)
        self.log_precision = nn.Parameter(torch.tensor(2 * math.log(self.half / sigma)))
        self.gaussian = gaussian
        if gaussian:
            if d_model is None or d_model <= RESERVED:
                raise ValueError(f"a gaussian intensity output needs d_model > {RESERVED}, got {d_model}")
            self.adapt = nn.Linear(d_model - RESERVED, 2)  # (delta, rho) per position
            nn.init.zeros_(self.adapt.weight)
            nn.init.zeros_(self.adapt.bias)

    @property
    def sigma(self) -> float:
        """The prior's current width in intensity levels."""
        return float(self.half * torch.exp(-0.5 * self.log_precision.detach()))

    def centres(self, ids: Tensor) -> Tensor:
        """Intensity ids (B, T) -> their u in [-1, 1] (B, T), the prior's centre at each target position."""
        return ((ids - self.offset).to(self.features.dtype) - self.half) / self.half

    def mark(self, hidden: Tensor, centre: Tensor, shift: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Decoder output (B, T, D) -> the same with its last two coordinates set to (centre, -1/2);
        ``centre`` (B, T) from :meth:`centres`. Gaussian: (centre + delta, -1/2) * exp(-2 rho), with (delta, rho)
        from the layer ``shift`` = (weight (2, D - 2), bias (2,)) (default: the prior's own ``adapt``; the heads'
        under an own or residual head prior)."""
        if not self.gaussian:
            return self.tag(hidden, centre)
        weight, bias = (self.adapt.weight, self.adapt.bias) if shift is None else shift
        rest = hidden[..., :-RESERVED]  # (B, T, D - 2)
        centre = centre.to(hidden.dtype)
        delta, rho = self.products.linear(rest, weight, bias).unbind(-1)  # (B, T) each
        scale = torch.exp(-2 * rho.clamp(-MAX_LOG_WIDTH, MAX_LOG_WIDTH))  # precision relative to the prior's
        return torch.cat([rest, torch.stack([(centre + delta) * scale, -0.5 * scale], dim=-1)], dim=-1)

    def nearest(self, hidden: Tensor, centre: Tensor, shift: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Gaussian output without a categorical part: the argmax id (...) of the distribution that :meth:`mark`
        makes of ``hidden`` (..., D) and ``centre`` (...), the intensity nearest its mean (a tie to the lower one),
        without the vocabulary projection: the logit of intensity v is -precision * scale / 2 * (u(v) - mean)^2 plus
        a constant, and no other id can beat the nearest intensity (u = 0, u^2 = 4). Products in the hidden
        state's precision (a proposal's shortcut: near a half level it may round the other way than the full
        projection does)."""
        weight, bias = (self.adapt.weight, self.adapt.bias) if shift is None else shift  # (mark's ``shift``)
        delta = F.linear(hidden[..., :-RESERVED], weight.to(hidden.dtype), bias.to(hidden.dtype))[..., 0]  # (...)
        level = torch.ceil((centre.to(hidden.dtype) + delta) * self.half + self.half - 0.5)
        return level.clamp(0, 2 * self.half).long() + self.offset

    def tag(self, hidden: Tensor, centre: Tensor) -> Tensor:
        """The reserved coordinates of ``hidden`` (..., D) set to (centre, -1/2) (..., D): a state that
        says which input intensity lies under the pixel it is about (a head's input; no width, no shift)."""
        centre = centre.to(hidden.dtype)
        return torch.cat([hidden[..., :-RESERVED], torch.stack([centre, torch.full_like(centre, -0.5)], dim=-1)], dim=-1)

    def columns(self) -> Tensor:
        """The output layer's last two columns (V, 2): precision * (u(v), u(v)^2)."""
        return self.features * self.log_precision.exp()

    def output_weight(self, weight: Tensor) -> Tensor:
        """An output layer's weight (V, D) with its last two columns replaced by :meth:`columns` (gaussian:
        and the others zero, so that the Gaussian is the whole distribution)."""
        rest = torch.zeros_like(weight[:, :-RESERVED]) if self.gaussian else weight[:, :-RESERVED]
        return torch.cat([rest, self.columns().to(weight.dtype)], dim=-1)
