"""Bookkeeping for batched decode loops whose rows accept different numbers of tokens. Torch only."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import DecodeResult


class RowBook:
    """Bookkeeping of a batched decode loop whose rows finish at different times.

    Holds the output buffer of every original row and maps the live (compacted) batch rows back to
    them. Rows that finish are dropped from the live batch so no work is spent on them.
    :meth:`settle` is the loop's one device-to-host read per iteration: it brings back how many
    tokens each live row kept and which rows finished, and keeps a host copy of the live rows'
    lengths (so the KV cache can be sized without reading the device again).
    """

    def __init__(self, batch_size: int, max_len: int, spare: int, pad_id: int, device: torch.device) -> None:
        self.max_len = max_len
        self.tokens = torch.full((batch_size, max_len + spare), pad_id, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.iterations = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.blocks = torch.zeros(batch_size, max_len, dtype=torch.long, device=device)
        self.live = torch.arange(batch_size, device=device)  # original index of each live row
        self.live_lengths = [0] * batch_size  # host copy: tokens committed by each live row
        self.step = 0

    def commit(self, block: Tensor, n: Tensor, eos_id: int | None) -> tuple[Tensor, Tensor]:
        """Append the first ``n`` (b,) tokens of ``block`` (b, T) to the live rows.

        The block is cut after an EOS and at ``max_len``. Returns the numbers kept (b,) and a mask
        of rows that are now finished (b,), both on the device.
        """
        arange = torch.arange(block.shape[1], device=block.device)
        if eos_id is not None:
            is_eos = (block == eos_id) & (arange < n[:, None])
            first_eos = torch.where(is_eos, arange, block.shape[1]).min(dim=1).values  # (b,)
            n = torch.minimum(n, first_eos + 1)
        else:
            is_eos = torch.zeros_like(block, dtype=torch.bool)
        start = self.lengths[self.live]
        n = torch.minimum(n, self.max_len - start)
        keep = arange < n[:, None]  # (b, T)
        pos = start[:, None] + arange  # (b, T)
        rows = self.live[:, None].expand_as(pos)
        self.tokens[rows[keep], pos[keep]] = block[keep]
        self.lengths[self.live] = start + n
        self.iterations[self.live] += 1
        self.blocks[self.live, self.step] = n
        self.step += 1
        done = (is_eos & keep).any(dim=1) | (start + n >= self.max_len)
        return n, done

    def settle(self, n: Tensor, done: Tensor) -> list[int] | None:
        """Read ``n`` and ``done`` (b,) from :meth:`commit` (one device-to-host copy), update the host
        lengths and drop finished rows; return the live positions kept, or None when all are kept."""
        kept, finished = torch.stack([n, done.long()]).tolist()
        self.live_lengths = [length + m for length, m in zip(self.live_lengths, kept)]
        if not any(finished):
            return None
        keep = [i for i, f in enumerate(finished) if not f]
        self.live = self.live[torch.tensor(keep, dtype=torch.long, device=self.live.device)]
        self.live_lengths = [self.live_lengths[i] for i in keep]
        return keep

    def length_bounds(self, offset: int = 0) -> tuple[int, int]:
        """(shortest, longest) committed length of the live rows, plus ``offset`` (host ints)."""
        return min(self.live_lengths) + offset, max(self.live_lengths) + offset

    def result(self, model_calls: int) -> DecodeResult:
        width = max(1, int(self.lengths.max()))
        blocks = [row[:n].tolist() for row, n in zip(self.blocks, self.iterations.tolist())]
        return DecodeResult(self.tokens[:, :width].clone(), self.lengths, self.iterations, model_calls, blocks)
