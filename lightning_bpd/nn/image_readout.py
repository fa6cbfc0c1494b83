"""The image read-out of a :class:`~lightning_bpd.nn.model.BlockwiseTransformer`: what the intensity prior adds.

With direct conditioning the decoder input at every target position adds the input intensity under it
(:meth:`ImageReadout.conditioning_ids`); with an intensity prior (:mod:`~lightning_bpd.nn.intensity_prior`) the
decoder output carries the prior's centre (:meth:`ImageReadout.mark_prior`), with own centres the centres of all k
heads and, with pixel neighbours (:mod:`~lightning_bpd.nn.pixel_neighbours`), the decoded intensities around each
head's pixel; every head is read out marked with its own centre (:meth:`ImageReadout.readout`). A translation model
has none of it, and every method leaves its states unchanged.

:class:`ImageReadout` is a plain object, not a module: it reads the model's own parameters (``prior.*``,
``head.neighbours.*``, ``head.prior_adapt.*``), which keep their names in the model's state dict.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from lightning_bpd.nn.intensity_prior import IntensityPrior
from lightning_bpd.nn.pixel_neighbours import PixelNeighbours
from lightning_bpd.nn.transformer import EncoderContext


class ImageReadout:
    """The intensity prior's read-out of ``model``'s decoder states; builds the heads' image parts on ``model.head``.

    Own centres (``head_centres="own"``, k > 1, a prior): the decoder output carries k more coordinates, the prior's
    centres at t..t+k-1 (:meth:`mark_prior`); every head is marked with its own one when it is read out. Pixel
    neighbours: the chain also reads the decoded intensities around each head's pixel (``head.neighbours``). Own head
    prior: heads 2..k read out through a copy of the prior's shift-and-width layer (``head.prior_adapt``); residual:
    through the prior's layer, detached, plus ``head.prior_adapt`` (starting at zero)."""

    def __init__(self, model: Any) -> None:  # the BlockwiseTransformer that holds it (which imports this module)
        c, img = model.config, model.config.image
        self.model = model
        self.k = c.k
        self.own_centres = model.prior is not None and c.k > 1 and img.head_centres == "own"  # type: ignore[union-attr]
        if img is not None and img.head_neighbours and c.k > 1:  # a base (k = 1) has no chain to read them
            model.head.neighbours = PixelNeighbours(img.tgt_image_shape, c.k, c.d_model, c.head_hidden or c.d_ff)
        if self.own_centres and img.head_prior != "shared":  # type: ignore[union-attr]
            model.head.prior_adapt = copy.deepcopy(model.prior.adapt)  # type: ignore[union-attr]
            if img.head_prior == "residual":  # type: ignore[union-attr]
                nn.init.zeros_(model.head.prior_adapt.weight)
                nn.init.zeros_(model.head.prior_adapt.bias)
        # What the decoder output carries after its D coordinates: k centres, then the neighbours' values.
        self.carried = (c.k + (self.neighbours.width if self.neighbours is not None else 0)) if self.own_centres else 0

    @property
    def prior(self) -> IntensityPrior | None:
        """The model's intensity prior (``prior.*``), or None."""
        return self.model.prior

    @property
    def neighbours(self) -> PixelNeighbours | None:
        """The chain's reader of pixel neighbours (``head.neighbours``, ``head_neighbours``), or None."""
        return getattr(self.model.head, "neighbours", None)

    def head_shift(self) -> tuple[Tensor, Tensor] | None:
        """The (weight (2, D - 2), bias (2,)) through which heads 2..k read their Gaussian's shift and width: their
        own layer (``head_prior: own``), the prior's detached plus their correction (``residual``), or None (the
        prior's own layer, ``shared``)."""
        own = getattr(self.model.head, "prior_adapt", None)
        if own is None:
            return None
        if self.model.config.image.head_prior == "residual":  # type: ignore[union-attr]
            base = self.prior.adapt  # type: ignore[union-attr]
            return base.weight.detach() + own.weight, base.bias.detach() + own.bias
        return own.weight, own.bias

    def conditioning_ids(self, src: Tensor) -> Tensor:
        """Source intensities (B, S) -> the input intensity id that direct conditioning adds at every
        target position (B, T): the one under the pixel, or the taps' weighted mean rounded half up and clipped to
        the intensities (bicubic overshoots). The sum is taken in float64, where it is exact for the weights of
        :func:`~lightning_bpd.nn.conditioning.bilinear_taps` (multiples of 1/64) and
        :func:`~lightning_bpd.nn.conditioning.bicubic_taps` (dyadic), so rounding is the same everywhere and in
        every model precision."""
        model = self.model
        taps = src[:, model.cond_index]  # (B, T, n)
        if taps.shape[-1] == 1:
            return taps[..., 0]
        mean = (taps.double() * model.cond_weight.double()).sum(-1)  # (B, T)
        low, high = model.config.image.intensity_offset, model.config.tgt_vocab_size - 1  # type: ignore[union-attr]
        return (mean + 0.5).floor().clamp(low, high).long()  # ties up

    def mark_prior(self, hidden: Tensor, positions: Tensor, context: EncoderContext,
                   decoded: Tensor | None = None) -> Tensor:
        """With ``intensity_prior``: the decoder output (B, T, D) carries the prior's centre at each of
        ``positions`` (B, T) in its reserved coordinates (:meth:`IntensityPrior.mark`); else unchanged.

        With own centres (``head_centres="own"``) the output is (B, T, D + k): the state tagged with the
        centre at t (:meth:`IntensityPrior.tag`, what the heads read), then the centres at t..t+k-1 (the
        last positions clamped), with which :meth:`readout` marks head i. With pixel neighbours, then the
        neighbours' values (:meth:`PixelNeighbours.carried`) from ``decoded`` (B, >= T) decoder inputs. Only
        the model's own methods look inside a hidden state, so the decoding core passes it along unchanged."""
        prior = self.prior
        if prior is None:
            return hidden
        if context.prior is None:
            raise ValueError("intensity_prior: the decoder needs the encoder context of the sources")
        last = context.prior.shape[1] - 1
        if not self.own_centres:
            return prior.mark(hidden, context.prior.gather(1, positions.clamp(max=last)))
        b, t = positions.shape
        at = (positions[..., None] + torch.arange(self.k, device=positions.device)).clamp(max=last)  # (B, T, k)
        centres = context.prior.gather(1, at.reshape(b, t * self.k)).reshape(b, t, self.k).to(hidden.dtype)
        parts = [prior.tag(hidden, centres[..., 0]), centres]
        if self.neighbours is not None:
            if decoded is None:
                raise ValueError("head_neighbours: mark_prior needs the decoded intensities (the decoder inputs)")
            parts.append(self.neighbours.carried(decoded, positions, context.prior, prior.centres).to(hidden.dtype))
        return torch.cat(parts, dim=-1)  # (B, T, D + k [+ 2 k n])

    def split_centres(self, h: Tensor) -> tuple[Tensor, Tensor | None]:
        """A hidden state (..., D [+ k [+ 2 k n]]) -> (the state (..., D), what it carries (..., k [+ 2 k n]) or
        None): the centres at t..t+k-1 first, then the pixel neighbours' values."""
        if not self.own_centres:
            return h, None
        return h[..., : -self.carried], h[..., -self.carried :]

    def readout(self, states: Tensor, centres: Tensor | None, heads: int | list[int] = 0) -> Tensor:
        """Head states (..., D) as the output layer reads them: with own centres, marked with the prior's
        centre of the position each one predicts (``centres`` (...)); else unchanged. ``heads``: the head
        (0-based) of every state, one for all or one per slot of dim -2 (states (..., n, D)); with an own or
        residual head prior, heads 1.. are marked through :meth:`head_shift`. The mark is taken in the prior's
        precision and the result returned in the states'."""
        if centres is None:
            return states
        prior, own = self.prior, self.head_shift()
        dtype = prior.log_precision.dtype  # type: ignore[union-attr]
        s, c = states.to(dtype), centres.to(dtype)
        later = [h > 0 for h in (heads if isinstance(heads, list) else [heads])]
        if own is None or not any(later):
            return prior.mark(s, c).to(states.dtype)  # type: ignore[union-attr]
        if all(later):
            return prior.mark(s, c, own).to(states.dtype)  # type: ignore[union-attr]
        mask = torch.tensor(later, device=s.device)[:, None]  # (n, 1): which slots are heads 2..k
        return torch.where(mask, prior.mark(s, c, own), prior.mark(s, c)).to(states.dtype)  # type: ignore[union-attr]

    def chain_input(self, centres: Tensor | None) -> Callable[[Tensor, int], Tensor] | None:
        """Own centres: what chain link i reads of head i-1's state (:meth:`link_input`, from what the hidden
        state carries, ``centres`` (..., k [+ 2 k n])); None otherwise."""
        if centres is None:
            return None
        return lambda z, i: self.link_input(z, centres, i)

    def link_input(self, z: Tensor, carried: Tensor, i: int) -> Tensor:
        """What chain link ``i`` reads of head i-1's state z (..., D), from what the hidden state carries
        (..., k + 2 k n, every neighbour of head i filled): with pixel neighbours, z shifted by link i's reading of
        them; tagged with head i's own centre."""
        if self.neighbours is not None:
            shift = self.neighbours.shift(carried[..., self.k :], i, carried[..., i])
            z = z + shift.to(z.dtype)
        return self.prior.tag(z, carried[..., i])  # type: ignore[union-attr]

    def fill_neighbours(self, carried: Tensor | None, tokens: Tensor, first: int = 0) -> Tensor | None:
        """Pixel neighbours: ``tokens`` (..., m), proposed (or teacher-forced) for heads first..first+m-1, fill the
        neighbours they are (``carried`` (..., k + 2 k n)); unchanged otherwise."""
        if carried is None or self.neighbours is None:
            return carried
        for j in range(tokens.shape[-1]):
            carried = self.neighbours.fill(carried, self.prior.centres(tokens[..., j]), first + j, self.k)  # type: ignore[union-attr]
        return carried


class NoImage:
    """The read-out of a model without an intensity prior (a Hugging Face base): every state is read as it is."""

    own_centres = False
    neighbours = None
    carried = 0

    def split_centres(self, h: Tensor) -> tuple[Tensor, None]:
        return h, None

    def readout(self, states: Tensor, centres: Tensor | None, heads: int | list[int] = 0) -> Tensor:
        return states


NO_IMAGE = NoImage()
