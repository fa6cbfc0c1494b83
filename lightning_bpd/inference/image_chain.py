"""A whole chain of image links in one TorchScript call: heads 2..k's proposals for own-centre Gaussian image heads
(with or without pixel neighbours). Torch only; inference only.

Link by link (:meth:`~lightning_bpd.nn.model.BlockwiseTransformer.chain_draft`), an image link is a few dozen small
ops from Python: split off what the state carries, fill the pixel neighbours the previous token is
(:meth:`~lightning_bpd.nn.pixel_neighbours.PixelNeighbours.fill`), the neighbour reader's MLP, the own-centre tag
(:meth:`~lightning_bpd.nn.intensity_prior.IntensityPrior.tag`), the fused cell (:mod:`~lightning_bpd.inference.fused_chain`),
the Gaussian's nearest intensity (:meth:`~lightning_bpd.nn.intensity_prior.IntensityPrior.nearest`), and the
carried values put back. At batch 1 a CelebA link costs ~0.3-0.4 ms that way, mostly the code around its small
products. :func:`image_chain_links` runs the same ops in the same order for all k - 1 links from TorchScript's
interpreter, so its tokens are the link-by-link path's bit for bit (tested); the link-by-link path stays the
reference (and takes the cases this does not: int8 or reduced-precision proposals, a confidence stop,
categorical outputs, unfused links).

One check is left to the reference: :meth:`PixelNeighbours.features` refuses a neighbour still pending (one host read
per link). The fill order here is the reference's, so a neighbour is pending at a link only where it would be
pending there too, and the reference path raises.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.inference.fused_chain import source_read
from lightning_bpd.nn import pixel_neighbours
from lightning_bpd.nn.intensity_prior import RESERVED
from lightning_bpd.nn.lean_step import script

assert pixel_neighbours.PENDING == 8.0 and pixel_neighbours.UNITS == 127.5 / 16 and RESERVED == 2, \
    "image_chain_links spells PENDING, UNITS and RESERVED out"


def image_chain_links(z: Tensor, carried: Tensor, token: Tensor, links: int, k: int, zq_t: list[Tensor],
                      zq_b: list[Tensor], tables: list[Tensor], c_t: list[Tensor], out_t: list[Tensor],
                      out_b: list[Tensor], hidden: int, keys_t: Tensor, values: Tensor, mask: Tensor, heads: int,
                      n: int, slots: list[list[int]], readers: list[Tensor], features: Tensor, offset: int,
                      half: float, adapt_w: Tensor, adapt_b: Tensor) -> Tensor:
    """``links`` image links from head 1's state z (b, D), what it carries (b, k [+ 2 k n]) and its token (b,) ->
    the proposed tokens of heads 2..links+1 (b, links).

    Per link i as :meth:`~lightning_bpd.nn.model.BlockwiseTransformer.chain_link` computes it with ``nearest``:
    with pixel neighbours (``n`` > 0) the previous token fills its ``slots[i - 1]`` (value slots from coordinate k)
    and link i's reader (``readers[4 (i - 1) ..]``: w0, b0, w2, b2) shifts z; z is tagged with head i's centre;
    the fused cell (``zq_t``, ``zq_b``, ``tables``, ``c_t``, ``out_t``, ``out_b`` as :func:`~lightning_bpd.nn.
    fused_chain.chain_links`; ``keys_t`` empty without source attention) gives head i's state; its token is the
    intensity nearest the Gaussian's mean (``adapt_w`` (2, D - 2), ``adapt_b``; ids from ``offset``, ``half`` =
    (levels - 1) / 2); ``features`` is the prior's feature buffer (the dtype of its centres)."""
    out: list[Tensor] = []
    for i in range(1, links + 1):
        if n > 0:
            slots_i = slots[i - 1]
            if len(slots_i) > 0:  # PixelNeighbours.fill of the previous head's token
                token_u = ((token - offset).to(features.dtype) - half) / half
                new = token_u[..., None].to(carried.dtype).clamp(-1, 1)
                carried = carried.clone()
                for slot in slots_i:
                    column = carried[..., k + slot : k + slot + 1]
                    column.copy_(torch.where(column == 8.0, new, column))
            c = carried[..., k:]  # PixelNeighbours.shift (its features without the pending check)
            rest = k * n
            value, under = c[..., i * n : (i + 1) * n], c[..., rest + i * n : rest + (i + 1) * n]
            own = carried[..., i][..., None].to(value.dtype)
            units = 127.5 / 16
            feats = torch.cat([(value - under) * units, (under - own) * units, own], dim=-1)
            r = 4 * (i - 1)
            h = torch.relu(F.linear(feats, readers[r], readers[r + 1]))
            z = z + F.linear(h, readers[r + 2], readers[r + 3]).to(z.dtype)
        centre = carried[..., i].to(z.dtype)  # IntensityPrior.tag
        z = torch.cat([z[..., :-2], torch.stack([centre, torch.full_like(centre, -0.5)], dim=-1)], dim=-1)
        zq = torch.addmm(zq_b[i - 1], z, zq_t[i - 1]) + tables[i - 1].index_select(0, token)  # the fused cell
        if keys_t.numel() == 0:
            a = zq.relu_()
        else:
            read = source_read(zq[:, hidden:], keys_t, values, mask, heads)
            a = torch.addmm(zq[:, :hidden], read, c_t[i - 1]).relu_()
        z = torch.addmm(z + out_b[i - 1], a, out_t[i - 1])  # (b, D)
        delta = F.linear(z[..., :-2], adapt_w.to(z.dtype), adapt_b.to(z.dtype))[..., 0]  # IntensityPrior.nearest
        level = torch.ceil((carried[..., i].to(z.dtype) + delta) * half + half - 0.5)
        token = level.clamp(0, 2 * half).long() + offset
        out.append(token)
    return torch.stack(out, dim=1)


image_chain_links_scripted = script(image_chain_links)
