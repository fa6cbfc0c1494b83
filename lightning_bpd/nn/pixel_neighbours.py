"""What each chained image head knows of the pixels around the one it predicts. Torch only.

A chain link for head i predicts intensity q = t + i of the raster (R, G, B interleaved, row by row)
from the decoder state at t. The base predicted intensity q from the state at q itself, which had
attended to the intensities just decoded around it: the same channel one pixel to the left (q - C),
and above-left, above and above-right (q - WC - C, q - WC, q - WC + C). The link has none of them
unless the state at t happened to encode them, and head agreement with greedy saturates (issue 27).
Here every link reads those intensities directly:

* above-row neighbours are always decoded already (k < W C), so they come from the decoded history;
* the left neighbour q - C lies inside the block for i >= C: it is the token the chain proposed for
  head i - C (in training, that head's teacher-forced target), filled in as the chain goes.

Each neighbour enters as two numbers in units of 16 levels: its decoded intensity minus the input
intensity under it (the detail the base added there), and that input intensity minus the one under
q (the input's gradient), plus q's own input intensity; a neighbour outside the image (first row,
first or last column) gives zeros. A small per-link MLP (zero-initialized output) maps them into the
link's state before the link runs, so a fresh link proposes what it proposed without them.

The values ride along with the decoder output like the own centres (:meth:`~lightning_bpd.nn.image_readout.ImageReadout.mark_prior`):
k * n more coordinates of decoded-or-pending intensities, k * n of input intensities under the
neighbours (u in [-1, 1]), where ``PENDING`` marks a neighbour the chain has not proposed yet. The
decoding core passes hidden states along unchanged; only the model looks inside.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

PENDING = 8.0  # u of a neighbour still to be proposed by the chain (every intensity has |u| <= 1)
UNITS = 127.5 / 16  # u differences -> units of 16 intensity levels


def neighbour_offsets(shape: tuple[int, int, int]) -> tuple[tuple[int, int, int], ...]:
    """(raster offset, row step, column step) of left, above-left, above and above-right for an
    (H, W, C) raster."""
    _, w, c = shape
    return ((-c, 0, -1), (-w * c - c, -1, -1), (-w * c, -1, 0), (-w * c + c, -1, 1))


class PixelNeighbours(nn.Module):
    """Neighbour intensities of every head's pixel (the values carried with the decoder output) and
    the per-link MLPs that read them. ``shape``: the target raster (H, W, C); ``k``: heads."""

    def __init__(self, shape: tuple[int, int, int], k: int, d_model: int, d_hidden: int) -> None:
        super().__init__()
        h, w, c = shape
        if k > w * c:
            raise ValueError(f"pixel neighbours need k <= {w * c} (one raster row), got k={k}")
        self.k, self.length = k, h * w * c
        offsets = neighbour_offsets(shape)
        self.n = len(offsets)
        q = torch.arange(self.length)
        row, col = q // (w * c), (q % (w * c)) // c
        delta = torch.tensor([o for o, _, _ in offsets])  # (n,)
        inside = torch.stack([(row + dr >= 0) & (row + dr < h) & (col + dc >= 0) & (col + dc < w)
                              for _, dr, dc in offsets], dim=-1)  # (L, n)
        self.register_buffer("delta", delta, persistent=False)
        # the value slots (head h, neighbour a) -> h * n + a that head j's token is, for j = 0..k-1
        self.slots = tuple(tuple(h * self.n + a for h in range(k) for a, (o, _, _) in enumerate(offsets) if h + o == j)
                           for j in range(k))
        self.register_buffer("inside", inside, persistent=False)
        n_in = 2 * self.n + 1
        self.links = nn.ModuleList(nn.Sequential(nn.Linear(n_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_model))
                                   for _ in range(k - 1))
        for link in self.links:
            nn.init.zeros_(link[2].weight)
            nn.init.zeros_(link[2].bias)

    @property
    def width(self) -> int:
        """Coordinates carried per position: k * n decoded values and k * n input values."""
        return 2 * self.k * self.n

    def carried(self, decoded: Tensor, positions: Tensor, inputs: Tensor, decode_u) -> Tensor:
        """The coordinates (B, T, 2 k n) at decoder ``positions`` (B, T): ``decoded`` (B, L') token ids
        with decoded[:, j + 1] the intensity decoded at raster index j (the decoder inputs: BOS first),
        holding at least every index below each position; ``inputs`` (B, L) the input intensities (u)
        under every raster index; ``decode_u`` maps token ids to u. A neighbour outside the image reads
        the head's own input intensity for both values (so its features are zero)."""
        b, t = positions.shape
        last = self.length - 1
        q = (positions[..., None] + torch.arange(self.k, device=positions.device)).clamp(max=last)  # (B, T, k)
        at = q[..., None] + self.delta  # (B, T, k, n) raster index of each neighbour
        inside = self.inside[q]  # (B, T, k, n)
        own = inputs.gather(1, q.reshape(b, -1)).reshape(b, t, self.k, 1).expand(-1, -1, -1, self.n)
        safe = torch.where(inside, at, 0)
        flat = safe.reshape(b, -1)
        under = torch.where(inside, inputs.gather(1, flat).reshape(safe.shape).to(own.dtype), own)
        known = at < positions[..., None, None]  # decoded before this position
        ids = decoded.gather(1, (torch.where(known, safe, -1) + 1).clamp(max=decoded.shape[1] - 1).reshape(b, -1))
        value = decode_u(ids).reshape(safe.shape).to(own.dtype).clamp(-1, 1)
        value = torch.where(known, value, torch.full_like(value, PENDING))
        value = torch.where(inside, value, own)
        return torch.cat([value.reshape(b, t, -1), under.reshape(b, t, -1)], dim=-1)  # (B, T, 2 k n)

    def split(self, carried: Tensor) -> tuple[Tensor, Tensor]:
        """(..., 2 k n) -> decoded-or-pending values (..., k, n), input values (..., k, n)."""
        value, under = carried.unflatten(-1, (2, self.k, self.n)).unbind(-3)
        return value, under

    def fill(self, carried: Tensor, token_u: Tensor, j: int, start: int = 0) -> Tensor:
        """The chain proposed (or training feeds) u ``token_u`` (...) for head j (0-based, the raster index
        t + j): every pending neighbour at t + j takes it. ``carried`` (..., start + 2 k n): the values from
        coordinate ``start`` on -> a filled copy."""
        slots = self.slots[j]
        if not slots:
            return carried
        new = token_u[..., None].to(carried.dtype).clamp(-1, 1)  # (..., 1)
        carried = carried.clone()
        for slot in slots:  # pending, or the own input of a neighbour outside the image (kept)
            column = carried[..., start + slot : start + slot + 1]
            column.copy_(torch.where(column == PENDING, new, column))
        return carried

    def features(self, carried: Tensor, i: int, own: Tensor) -> Tensor:
        """Head ``i``'s neighbour features (..., 2 n + 1) from the carried values and its own input u ``own`` (...)."""
        n, rest = self.n, self.k * self.n
        value, under = carried[..., i * n : (i + 1) * n], carried[..., rest + i * n : rest + (i + 1) * n]  # (..., n)
        if bool((value == PENDING).any()):
            raise RuntimeError(f"head {i}: a neighbour the chain has not proposed yet (fill it before the link)")
        own = own[..., None].to(value.dtype)
        return torch.cat([(value - under) * UNITS, (under - own) * UNITS, own], dim=-1)

    def shift(self, carried: Tensor, i: int, own: Tensor) -> Tensor:
        """What link ``i`` (1..k-1) adds to the state it reads: (..., D)."""
        link = self.links[i - 1]
        hidden = torch.relu(F.linear(self.features(carried, i, own), link[0].weight, link[0].bias))
        return F.linear(hidden, link[2].weight, link[2].bias)  # a proposal: plain products (no float64 widening)
