"""A preallocated decoder self-attention KV cache with a length per batch row.

Rows of a batch advance at different speeds under blockwise parallel decoding (each row accepts
its own number of proposed tokens), so every row keeps its own length.

With ``ring=R`` (for local attention of window w) the buffers hold only R slots and position p lives
in slot p % R. That is enough when R >= w + T_max, T_max being the most tokens one call writes:
every position a query can see (its last w) is still in place, and the positions a crop rejected
lie inside the range the next call rewrites (a blockwise call writes k tokens after the committed
prefix, and at most k - 1 were rejected). Appending T >= 1 tokens
writes them at ``lengths[b] .. lengths[b] + T - 1`` of row b; rejecting proposals is a crop that
only moves ``lengths`` back (stale entries past a row's length are never attended to, because
attention masks every key position greater than the query position).

The cache also keeps host-side bounds (lowest, highest) of ``lengths`` as Python ints, exact after
appends and loose after a ``select``, so that sizing a step (room left, the span of slots a query can
see) needs no device-to-host copy; a crop that is not told the new bounds forgets them, and they are
read back from the device the next time they are needed.

A cache may hold a fixed *prefix* ahead of its positions (:meth:`KVCache.put_prefix`: a decoder-only model's
prompt, written once): slots ``0 .. prefix - 1`` of every row hold it, position p lives in slot ``prefix + p``,
and :meth:`KVCache.view_with_prefix` reads the prefix and the positions as one span (no per-step concatenation).
Lengths, crops and rollback count positions only; the prefix never moves.

A *static* cache (:meth:`KVCache.make_static`, for fixed-shape decoding and CUDA graphs) has no
host-side bounds at all: every call reads all slots under a mask built from ``lengths`` on the device,
crops update ``lengths`` in place, and the decode loop, not the cache, guarantees the room.
"""

from __future__ import annotations

import torch
from torch import Tensor


class KVCache:
    """K/V buffers for every decoder layer, laid out ``[L, B, S, H, Dh]``, plus ``lengths`` (B,)."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        capacity: int,
        n_heads: int,
        head_dim: int,
        *,
        ring: int | None = None,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if ring is not None and ring < 1:
            raise ValueError(f"ring must be >= 1 (or None), got {ring}")
        self.max_positions = capacity  # absolute positions a row may reach
        self.ring = ring if ring is not None and ring < capacity else None
        slots = self.ring or capacity
        shape = (n_layers, batch_size, slots, n_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, S, H, Dh)
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, S, H, Dh)
        self._lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,)
        self._no_index = torch.zeros(0, dtype=torch.long, device=device)  # write_place's rows and slots for a slice
        self.bounds: tuple[int, int] | None = (0, 0)  # host-side (min, max) of lengths; None: unknown
        self.static = False  # fixed shapes: every slot read, lengths only changed in place
        self.tokens: Tensor | None = None  # (B, capacity) decoder inputs by position, for models that read them
        self.prefix = 0  # slots before position 0 holding a fixed prefix (put_prefix)

    @property
    def lengths(self) -> Tensor:
        """Positions held by each row (B,)."""
        return self._lengths

    @lengths.setter
    def lengths(self, value: Tensor) -> None:  # set from outside: the host-side bounds are unknown
        if self.static:
            self._lengths.copy_(value)
            return
        self._lengths = value
        self.bounds = None

    def make_static(self) -> None:
        """Fixed shapes from now on: :meth:`length_bounds` is (0, capacity) without a device read, every
        slot is read, :meth:`check_room` is the caller's job and lengths change in place only (the
        tensors a CUDA graph recorded stay the ones it replays on)."""
        self.static = True
        self.bounds = (0, self.max_positions)

    def keep_tokens(self) -> Tensor:
        """The decoder inputs by absolute position (B, capacity), kept for a model that reads its own decoded
        tokens (image heads' pixel neighbours); the model writes them. Like the K/V slots, positions past a
        row's length are stale and rewritten by the next call."""
        if self.tokens is None:
            self.tokens = torch.zeros(self.batch_size, self.max_positions, dtype=torch.long, device=self.k.device)
        return self.tokens

    @property
    def capacity(self) -> int:
        """Absolute positions a row may reach (the slots are fewer with a ring)."""
        return self.max_positions

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def positions(self, n_new: int) -> Tensor:
        """Absolute positions (B, T) that the next ``n_new`` tokens of each row will take."""
        return self.lengths[:, None] + torch.arange(n_new, device=self.lengths.device)

    def length_bounds(self) -> tuple[int, int]:
        """(lowest, highest) row length, or bounds on them, as Python ints (read from the device only
        when unknown)."""
        if self.static:
            return 0, self.max_positions
        if self.bounds is None:
            self.bounds = (int(self.lengths.min()), int(self.lengths.max()))
        return self.bounds

    def check_room(self, n_new: int) -> None:
        """Raise if some row cannot take ``n_new`` more tokens (static caches: the caller's job)."""
        if self.static:
            return
        longest = self.length_bounds()[1] + n_new
        if longest > self.capacity:
            raise RuntimeError(f"KV cache overflow: a row needs {longest} positions, capacity is {self.capacity}")

    def put_prefix(self, keys: list[Tensor], values: list[Tensor]) -> None:
        """Hold ``keys`` / ``values`` (per layer (B, P, H, Dh)) as every row's fixed prefix, ahead of position 0:
        the buffers grow by P slots once (positions already written keep their place after it). Once per cache;
        not with a ring."""
        if self.prefix:
            raise RuntimeError("this KV cache already holds a prefix")
        if self.ring:
            raise ValueError("a ring KV cache (a local window) holds no prefix")
        width = keys[0].shape[1]
        shape = (self.k.shape[0], self.k.shape[1], width + self.k.shape[2], *self.k.shape[3:])
        k, v = self.k.new_empty(shape), self.v.new_empty(shape)  # (L, B, P + S, H, Dh)
        k[:, :, width:], v[:, :, width:] = self.k, self.v
        for layer, (pk, pv) in enumerate(zip(keys, values)):
            k[layer, :, :width], v[layer, :, :width] = pk, pv
        self.k, self.v, self.prefix = k, v, width

    def write(self, layer: int, positions: Tensor, k: Tensor, v: Tensor) -> None:
        """Store new keys/values ``(B, T, H, Dh)`` of ``layer`` at ``positions`` (B, T)."""
        start, rows, slots = self.write_place(positions)
        if start >= 0:
            self.k[layer, :, start : start + k.shape[1]] = k
            self.v[layer, :, start : start + k.shape[1]] = v
            return
        self.k[layer, rows, slots] = k
        self.v[layer, rows, slots] = v

    def write_place(self, positions: Tensor) -> tuple[int, Tensor, Tensor]:
        """Where :meth:`write` puts the keys of ``positions`` (B, T) in the buffers (L, B, S, H, Dh): (the first slot,
        when every row holds as many positions and the new ones are one slice, else -1; the rows (B, 1) and slots
        (B, T) to index otherwise)."""
        if self.ring is None and not self.static and self.bounds is not None and self.bounds[0] == self.bounds[1]:
            return self.prefix + self.bounds[0], self._no_index, self._no_index
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]  # (B, 1)
        return -1, rows, positions % self.ring if self.ring else positions + self.prefix

    def slot_positions(self, newest: Tensor) -> Tensor:
        """Ring mode: the absolute position (B, R) held by each slot when ``newest`` (B,) is the
        highest position written; negative for slots not written yet."""
        slots = torch.arange(self.ring, device=newest.device)
        return newest[:, None] - (newest[:, None] - slots) % self.ring

    def view(self, layer: int, stop: int, start: int = 0) -> tuple[Tensor, Tensor]:
        """Keys and values of ``layer`` for positions ``start .. stop - 1``: (B, S', H, Dh) each."""
        first, last = self.prefix + start, self.prefix + stop
        return self.k[layer, :, first:last], self.v[layer, :, first:last]

    def view_with_prefix(self, layer: int, stop: int) -> tuple[Tensor, Tensor]:
        """Keys and values of ``layer`` for the prefix and positions ``0 .. stop - 1``: (B, prefix + stop, H, Dh)."""
        return self.k[layer, :, : self.prefix + stop], self.v[layer, :, : self.prefix + stop]

    def advance(self, n_new: int) -> None:
        """Commit ``n_new`` written positions in every row (after all layers wrote them)."""
        self._lengths += n_new
        if self.bounds is not None and not self.static:
            self.bounds = (self.bounds[0] + n_new, self.bounds[1] + n_new)

    def crop(self, lengths: Tensor, bounds: tuple[int, int] | None = None, check: bool = True) -> None:
        """Cut every row back to ``lengths`` (B,); a row can never grow through a crop.

        ``bounds``: (min, max) of the new lengths (or bounds on them) when the caller knows them;
        ``check=False`` skips the range check (a decode loop that computed the lengths itself).
        """
        if lengths.shape != self.lengths.shape:
            raise ValueError(f"crop lengths must have shape {tuple(self.lengths.shape)}, got {tuple(lengths.shape)}")
        if check and (bool((lengths > self.lengths).any()) or bool((lengths < 0).any())):
            raise ValueError("crop lengths must lie in [0, current length] for every row")
        if self.static:
            self._lengths.copy_(lengths)
            return
        self._lengths = lengths.to(self._lengths)
        self.bounds = bounds

    def keep_path(self, nodes: Tensor, kept: Tensor, width: int, bounds: tuple[int, int] | None = None) -> None:
        """After a verify pass over a tree: the last ``width`` positions of every row hold the tree's nodes in node
        order; keep row b's accepted path ``nodes[b, :kept[b]]`` (nodes (B, m) long, ascending along the path, so
        that node j never lies before slot j) at consecutive positions after the row's prefix, and drop the rest.
        ``bounds`` as for :meth:`crop`. A plain cache only (no ring, not static)."""
        if self.ring or self.static:
            raise ValueError("keep_path takes a plain KV cache (not a ring of a local window, not static)")
        start = self.lengths - width  # (B,): each row's committed positions
        rows = torch.arange(nodes.shape[0], device=nodes.device)[:, None]  # (B, 1)
        dst = self.prefix + start[:, None] + torch.arange(nodes.shape[1], device=nodes.device)  # (B, m) slots
        src = self.prefix + start[:, None] + nodes  # (B, m) slots
        self.k[:, rows, dst] = self.k[:, rows, src]  # (L, B, m, H, Dh): read in full before written
        self.v[:, rows, dst] = self.v[:, rows, src]
        self.crop(start + kept, bounds, check=False)

    def select(self, rows: Tensor) -> None:
        """Keep only batch ``rows`` (a 1-D index tensor), in that order (for finished rows and beams).
        The host-side bounds stay valid as bounds."""
        if self.static:
            raise RuntimeError("a static KV cache keeps its batch: finished rows stay (fixed-shape decoding)")
        self.k = self.k.index_select(1, rows)
        self.v = self.v.index_select(1, rows)
        if self.tokens is not None:
            self.tokens = self.tokens.index_select(0, rows)
        self._lengths = self._lengths.index_select(0, rows)
