"""Fused chain links for decoding: a :class:`~lightning_bpd.nn.chained_head.ChainedHead` with its weights
rearranged so that one link is a few products instead of a dozen ops. Torch only; inference only.

A link of the chain (:class:`~lightning_bpd.nn.chained_head.ChainCell`) computes, for the state z and the
token y proposed for the position before it (e(y) its scaled embedding)::

    q = W_q (z + e(y)) + b_q                       (source-attending cells only)
    a = relu(W_z z + b_z + W_e e(y) + W_c attend(q, source))
    z' = z + W_o a + b_o

Here the token's terms are looked up, not multiplied: the table ``E W_e^T`` (V, H) (and ``E W_q^T``
(V, D)) holds them for every token, so e(y) is never formed; ``W_z`` and ``W_q`` are stacked into one
product of z; the products read weights stored input-major, which a one-row product streams fastest on
these CPUs; and the source's keys and values are laid out for ``bmm`` once per source. At batch 1 on the
Multi30k k = 8 model (hidden 512, source attention, 1 thread) the seven links of an iteration with their
draft-vocabulary argmaxes cost 2.05 ms instead of 3.11 (``python -m lightning_bpd.benchmarks.where_time_goes``,
``--unfused-chain`` for the reference). A link is bound by the bytes of its weights once they no longer fit
the cache, so what it saves is the ops around them.

The products are plain (never the float64 ones of :mod:`~lightning_bpd.kernels.invariant`): proposals only
decide what the verify pass checks, so rounding in them cannot change an exact decode's output, only
(rarely) which near-tie token is proposed. :meth:`ChainedHead.step` is the reference; the tests check
that both give the same states up to float rounding and that exact decoding still equals greedy.
Tables cost V * (H + D) numbers per link (Multi30k k = 8: 7 * 8000 * 768 floats = 172 MB); above
``table_budget`` bytes the token's terms are multiplied instead, in one stacked product.

With ``int8`` (``--proposal-precision int8``) the three products of z, the source read-out and the hidden
layer run in int8 (weights per output row, activations per call: fbgemm's dynamic product,
:mod:`~lightning_bpd.inference.screened_argmax`), which streams a quarter of the bytes; the token tables, the
attention over the source and the residual stay float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from lightning_bpd.kernels import int8
from lightning_bpd.kernels.int8 import int8_linear, pack_int8
from lightning_bpd.nn import argmax, pixel_neighbours
from lightning_bpd.nn.chained_head import ChainedHead, ChainSource
from lightning_bpd.nn.intensity_prior import RESERVED
from lightning_bpd.nn.lean_step import column_layouts, layout_linear, script

TABLE_BUDGET = 512 * 2**20  # bytes of token tables above which the token's terms are multiplied instead


def source_read(q: Tensor, keys_t: Tensor, values: Tensor, mask: Tensor, heads: int) -> Tensor:
    """One query per row q (b, D) over a laid-out source (:class:`LaidOutSource`) -> (b, D)."""
    b, d = q.shape[0], q.shape[1]
    dh = d // heads
    scores = torch.baddbmm(mask, q.reshape(b * heads, 1, dh), keys_t, alpha=dh**-0.5)  # (b * nh, 1, S)
    return torch.bmm(scores.softmax(dim=-1), values).reshape(b, d)


def pick(logits: Tensor, ids: Tensor | None) -> Tensor:
    """argmax token ids of proposal logits (b, N) (nn.argmax's rule), mapped through ``ids`` when given."""
    best = logits.max(dim=-1).indices if logits.numel() >= 4096 else logits.argmax(dim=-1)
    return best if ids is None else ids[best]


def image_link_input(z: Tensor, carried: Tensor, token: Tensor, i: int, k: int, n: int, slots: list[list[int]],
                     readers: list[Tensor], features: Tensor, offset: int, half: float) -> tuple[Tensor, Tensor]:
    """An own-centre image link's input, as :meth:`~lightning_bpd.nn.model.BlockwiseTransformer.chain_link` makes it:
    with pixel neighbours (``n`` > 0) the previous head's ``token`` (b,) fills its ``slots[i - 1]`` of ``carried``
    (b, k + 2 k n; value slots from coordinate k) and link i's reader (``readers[4 (i - 1) ..]``: w0, b0, w2, b2)
    shifts z (b, D); then z is tagged with head i's centre (``IntensityPrior.tag``). -> (z, carried)."""
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
    return z, carried


def chain_links(z: Tensor, token: Tensor, links: int, zq_t: list[Tensor], zq_b: list[Tensor], tables: list[Tensor],
                c_t: list[Tensor], out_t: list[Tensor], out_b: list[Tensor], hidden: int, keys_t: Tensor,
                values: Tensor, mask: Tensor, heads: int,
                packed: list[torch.classes.quantized.LinearPackedParamsBase],
                weight: Tensor, bias: Tensor | None, ids: Tensor | None, by_columns: list[bool],
                projection: list[torch.classes.quantized.LinearPackedParamsBase],
                carried: Tensor, k: int, n: int, slots: list[list[int]], readers: list[Tensor], features: Tensor,
                offset: int, half: float, adapt_w: Tensor, adapt_b: Tensor) -> Tensor:
    """``links`` fused links from head 1's state z (b, D) and its token (b,), each followed by its proposal, as
    :meth:`FusedChain.step` and the link-by-link proposals compute them: the tokens of heads 2..links+1 (b, links).
    The one whole-chain path; its variants are parameters:

    - the cell: ``zq_t`` / ``zq_b`` / ``tables`` / ``c_t`` / ``out_t`` / ``out_b`` (:class:`FusedLink`;
      ``keys_t`` empty without source attention); with ``packed`` (3 int8 weights per link: zq, c, out, biases
      inside) the cell's products are int8 instead;
    - the proposal: the argmax over the projection rows ``weight`` (N, D), ``bias``, token ids ``ids`` (None: the
      rows are the vocabulary) in the layout ``by_columns`` (:func:`~lightning_bpd.nn.lean_step.column_layouts`),
      or over the int8 ``projection`` (one packed weight) when given;
    - own-centre Gaussian image heads (``carried`` non-empty: what head 1's state carries, (b, k [+ 2 k n])):
      each link's input is made by :func:`image_link_input` and its token is the intensity nearest the Gaussian's
      mean (``adapt_w`` (2, D - 2), ``adapt_b``; ids from ``offset``, ``half`` = (levels - 1) / 2), no projection.
    """
    out: list[Tensor] = []
    image = carried.numel() > 0
    eight = len(packed) > 0
    for i in range(links):
        if image:
            z, carried = image_link_input(z, carried, token, i + 1, k, n, slots, readers, features, offset, half)
        if eight:
            zq = torch.ops.quantized.linear_dynamic(z, packed[3 * i], True) + tables[i].index_select(0, token)
        else:
            zq = torch.addmm(zq_b[i], z, zq_t[i]) + tables[i].index_select(0, token)  # (b, H [+ D])
        if keys_t.numel() == 0:
            a = zq.relu_()
        else:
            read = source_read(zq[:, hidden:], keys_t, values, mask, heads)
            if eight:
                a = (zq[:, :hidden] + torch.ops.quantized.linear_dynamic(read, packed[3 * i + 1], True)).relu_()
            else:
                a = torch.addmm(zq[:, :hidden], read, c_t[i]).relu_()
        if eight:
            z = z + torch.ops.quantized.linear_dynamic(a, packed[3 * i + 2], True)
        else:
            z = torch.addmm(z + out_b[i], a, out_t[i])  # (b, D)
        if image:  # IntensityPrior.nearest
            delta = F.linear(z[..., :-2], adapt_w.to(z.dtype), adapt_b.to(z.dtype))[..., 0]
            level = torch.ceil((carried[..., i + 1].to(z.dtype) + delta) * half + half - 0.5)
            token = level.clamp(0, 2 * half).long() + offset
        elif len(projection) > 0:
            token = pick(torch.ops.quantized.linear_dynamic(z, projection[0], True), ids)
        else:
            token = pick(layout_linear(z, weight, bias, by_columns), ids)  # logits (b, N)
        out.append(token)
    return torch.stack(out, dim=1)


assert argmax.SMALL == 4096, "pick spells lightning_bpd.nn.argmax's SMALL out"
assert pixel_neighbours.PENDING == 8.0 and pixel_neighbours.UNITS == 127.5 / 16 and RESERVED == 2, \
    "image_link_input spells PENDING, UNITS and RESERVED out"
chain_links_scripted = script(chain_links) if int8.available() else chain_links


@dataclass
class FusedLink:
    """One link's weights, laid out for one-row products (``*_t``: input-major, (in, out))."""

    zq_t: Tensor  # (D, H [+ D]): W_z (and W_q) stacked, transposed
    zq_b: Tensor  # (H [+ D],): b_z (and b_q)
    tok_table: Tensor | None  # (V, H [+ D]): the token's terms E W_e^T (and E W_q^T); None: multiply
    tok_t: Tensor | None  # (D, H [+ D]): W_e (and W_q) stacked, transposed, when there is no table
    c_t: Tensor | None  # (D, H): W_c transposed (source attention)
    out_t: Tensor  # (H, D)
    out_b: Tensor  # (D,)
    int8: dict[str, object] | None = None  # packed int8 weights of the zq, c and out products (int8 links)


@dataclass
class LaidOutSource:
    """A :class:`ChainSource` laid out for ``bmm``: keys (B * nh, dh, S), values (B * nh, S, dh), additive mask."""

    keys_t: Tensor
    values: Tensor
    mask: Tensor  # (B * nh, 1, S): 0 for real source tokens, -inf for padding
    heads: int


class FusedChain:
    """The links of ``head`` for decoding, from the scaled target embedding ``embed`` (V, D).

    Built from the weights as they are now (a snapshot, in their dtype): rebuild after they change.
    """

    def __init__(self, head: ChainedHead, embed: Tensor, table_budget: int = TABLE_BUDGET, int8: bool = False) -> None:
        self.int8 = int8
        self.hidden = head.cells[0].z_in.out_features if len(head.cells) else 0  # H (no cells: k = 1)
        self.source_attention = head.source_attention
        self.links: list[FusedLink] = []
        cells = list(head.cells)
        per_link = embed.shape[0] * (self.hidden + (embed.shape[1] if head.source_attention else 0))
        tables = per_link * len(cells) * embed.element_size() <= table_budget
        with torch.no_grad():
            for cell in cells:
                z_w, z_b, e_w = cell.z_in.weight, cell.z_in.bias, cell.e_in.weight  # (H, D), (H,), (H, D)
                if cell.source_attention:
                    z_w = torch.cat([z_w, cell.query.weight])  # (H + D, D): q reads z + e
                    z_b = torch.cat([z_b, cell.query.bias])
                    e_w = torch.cat([e_w, cell.query.weight])
                self.links.append(FusedLink(
                    zq_t=z_w.t().contiguous(), zq_b=z_b.clone(),
                    tok_table=(embed @ e_w.t()).contiguous() if tables else None,  # (V, H [+ D])
                    tok_t=None if tables else e_w.t().contiguous(),
                    c_t=cell.c_in.weight.t().contiguous() if cell.source_attention else None,
                    out_t=cell.out.weight.t().contiguous(), out_b=cell.out.bias.clone(),
                    int8=self.pack(cell, z_w, z_b, tables, e_w) if int8 else None))
        self.embed = embed.detach()
        self.laid_out: tuple[ChainSource, LaidOutSource] | None = None

    @staticmethod
    def pack(cell, z_w: Tensor, z_b: Tensor, tables: bool, e_w: Tensor) -> dict[str, object]:
        """A link's products as packed int8 weights (bias included where the product adds one)."""
        packed: dict[str, object] = {"zq": pack_int8(z_w, z_b), "out": pack_int8(cell.out.weight, cell.out.bias)}
        if cell.source_attention:
            packed["c"] = pack_int8(cell.c_in.weight)
        if not tables:
            packed["tok"] = pack_int8(e_w)
        return packed

    def lay_out(self, source: ChainSource) -> LaidOutSource:
        """``source`` for :meth:`step`, laid out once per source (every link of every iteration reads it)."""
        if self.laid_out is not None and self.laid_out[0].keys is source.keys and self.laid_out[0].valid is source.valid:
            return self.laid_out[1]  # (holding the source keeps its tensors' identities from being reused)
        b, s, nh, dh = source.keys.shape
        dtype = self.links[0].zq_t.dtype
        keys_t = source.keys.to(dtype).permute(0, 2, 3, 1).reshape(b * nh, dh, s)  # (B * nh, dh, S)
        values = source.values.to(dtype).permute(0, 2, 1, 3).reshape(b * nh, s, dh)  # (B * nh, S, dh)
        mask = torch.zeros(b, s, dtype=dtype, device=keys_t.device).masked_fill(~source.valid, float("-inf"))
        out = LaidOutSource(keys_t.contiguous(), values.contiguous(),
                            mask[:, None, None, :].expand(b, nh, 1, s).reshape(b * nh, 1, s), nh)
        self.laid_out = (source, out)
        return out

    def step(self, z: Tensor, token: Tensor, i: int, source: ChainSource | None = None) -> Tensor:
        """State of head ``i`` (0-based, >= 1) from head i-1's state z (b, D) and the token (b,) proposed
        for head i-1: (b, D), as :meth:`ChainedHead.step` with the token's scaled embedding."""
        link = self.links[i - 1]
        h, q8 = self.hidden, link.int8
        width = link.zq_t.shape[1]  # H [+ D]
        zq = int8_linear(z, q8["zq"], width) if q8 else torch.addmm(link.zq_b, z, link.zq_t)  # (b, H [+ D])
        if link.tok_table is not None:
            zq = zq + link.tok_table.index_select(0, token)
        elif q8:
            zq = zq + int8_linear(self.embed.index_select(0, token), q8["tok"], width)
        else:
            zq = torch.addmm(zq, self.embed.index_select(0, token), link.tok_t)
        if not self.source_attention:
            a = zq.relu_()
        else:
            c = self.read_source(zq[:, h:], source)  # (b, D)
            a = zq[:, :h] + int8_linear(c, q8["c"], h) if q8 else torch.addmm(zq[:, :h], c, link.c_t)
            a = a.relu_()  # (b, H)
        if q8:
            return z + int8_linear(a, q8["out"], z.shape[1])
        return torch.addmm(z + link.out_b, a, link.out_t)  # (b, D)

    def propose(self, z: Tensor, first: Tensor, k: int, source: ChainSource | None, weight: Tensor,
                bias: Tensor | None, ids: Tensor | None, projection: object = None) -> Tensor | None:
        """Heads 2..k's argmax tokens (b, k - 1) from head 1's state z (b, D) and token ``first`` (b,), over the
        projection rows ``weight`` (N, D) (token ids ``ids``, or the whole vocabulary; int8 links: the rows
        packed in int8, ``projection``), all links in one TorchScript call (:func:`chain_links`); None where it does not apply (no token tables, a dtype other than float32
        or float64): the caller goes link by link."""
        if k < 2 or self.links[0].tok_table is None or z.dtype not in (torch.float32, torch.float64):
            return None
        return self.run(z, first, k - 1, source, weight, bias, ids, [] if projection is None else [projection])

    def run(self, z: Tensor, first: Tensor, links: int, source: ChainSource | None, weight: Tensor,
            bias: Tensor | None, ids: Tensor | None, projection: list, image: tuple | None = None) -> Tensor:
        """:func:`chain_links` over the first ``links`` links (``image``: the own-centre image parameters
        ``(carried, k, n, slots, readers, features, offset, half, adapt_w, adapt_b)``)."""
        chosen = self.links[:links]
        keys_t, values, mask, heads = self.source_parts(source)
        packed = [w for x in chosen for w in (x.int8["zq"], x.int8.get("c", x.int8["zq"]), x.int8["out"])] \
            if self.int8 else []
        empty = z.new_zeros(0)
        carried, k, n, slots, readers, features, offset, half, adapt_w, adapt_b = image or (
            empty, 0, 0, [], [], empty, 0, 0.0, empty, empty)
        return chain_links_scripted(z, first, links, [x.zq_t for x in chosen], [x.zq_b for x in chosen],
                                    [x.tok_table for x in chosen],
                                    [x.c_t if x.c_t is not None else x.zq_t for x in chosen],
                                    [x.out_t for x in chosen], [x.out_b for x in chosen], self.hidden, keys_t, values,
                                    mask, heads, packed, weight, bias, ids, column_layouts(z), projection, carried, k,
                                    n, slots, readers, features, offset, half, adapt_w, adapt_b)

    def source_parts(self, source: ChainSource | None) -> tuple[Tensor, Tensor, Tensor, int]:
        """What the scripted chains read of the source: the laid-out keys, values, mask and head count; without
        source attention, empty tensors and 1 head."""
        if not self.source_attention:
            empty = self.links[0].zq_t.new_zeros(0)
            return empty, empty, empty, 1
        if source is None:
            raise ValueError("a source-attending chain needs the source (model.chain_source(context))")
        laid = self.lay_out(source)
        return laid.keys_t, laid.values, laid.mask, laid.heads

    def read_source(self, q: Tensor, source: ChainSource | None) -> Tensor:
        """Attention of one query per row q (b, D) over the laid-out source -> (b, D)."""
        if source is None:
            raise ValueError("a source-attending chain needs the source (model.chain_source(context))")
        laid = self.lay_out(source)
        return source_read(q, laid.keys_t, laid.values, laid.mask, laid.heads)
