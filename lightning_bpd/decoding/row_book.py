"""Bookkeeping for batched decode loops whose rows accept different numbers of tokens. Torch only."""

from __future__ import annotations

import torch
from torch import Tensor

from lightning_bpd.decoding.protocol import DecodeResult


def ends_row(tokens: Tensor, eos: int | Tensor) -> Tensor:
    """Where ``tokens`` (...) end a row: equal to the EOS id ``eos``, or to any of a tensor of them (...) bool."""
    return torch.isin(tokens, eos) if isinstance(eos, Tensor) else tokens == eos


class RowBook:
    """Bookkeeping of a batched decode loop whose rows finish at different times.

    Holds the output buffer of every original row and maps the live (compacted) batch rows back to
    them. Rows that finish are dropped from the live batch so no work is spent on them.
    :meth:`settle` is the loop's one device-to-host read per iteration: it brings back how many
    tokens each live row kept and which rows finished; the block sizes, iteration counts and
    lengths of the live rows are then kept on the host (so the KV cache can be sized without
    reading the device again).
    """

    def __init__(self, batch_size: int, max_len: int, spare: int, pad_id: int, device: torch.device) -> None:
        self.max_len, self.pad_id = max_len, pad_id
        # a whole block is written at each row's length; what lies past the accepted tokens is
        # overwritten by the next block or masked by result()
        self.tokens = torch.full((batch_size, max_len + spare), pad_id, dtype=torch.long, device=device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)
        self.arange = torch.arange(max(spare, 1), device=device)
        self.live = torch.arange(batch_size, device=device)  # original index of each live row
        self.live_rows = list(range(batch_size))  # host copies: original index,
        self.live_lengths = [0] * batch_size  # tokens committed,
        self.blocks: list[list[int]] = [[] for _ in range(batch_size)]  # and accepted sizes of every row

    def commit(self, block: Tensor, n: Tensor, eos: int | Tensor | None) -> tuple[Tensor, Tensor]:
        """Append the first ``n`` (b,) tokens of ``block`` (b, T) to the live rows.

        The block is cut after an EOS (``eos``: an id, a tensor of ids any of which ends a row, or None) and at
        ``max_len``. Returns the numbers kept (b,) and a mask of rows that are now finished (b,), on the device.
        """
        width = block.shape[1]
        arange = self.arange[:width]
        start = self.lengths[self.live]  # (b,)
        first_eos = None
        if eos is not None:
            first_eos = torch.where(ends_row(block, eos), arange, width).amin(dim=1)  # (b,): width when none
            n = torch.minimum(n, first_eos + 1)
        n = torch.minimum(n, self.max_len - start)
        self.tokens[self.live[:, None], start[:, None] + arange] = block
        end = start + n
        self.lengths[self.live] = end
        done = end >= self.max_len
        return n, done | (first_eos < n) if first_eos is not None else done

    def settle(self, n: Tensor, done: Tensor) -> list[int] | None:
        """Read ``n`` and ``done`` (b,) from :meth:`commit` (one device-to-host copy), update the host
        copies and drop finished rows; return the live positions kept, or None when all are kept."""
        kept, finished = torch.stack([n, done.long()]).tolist()
        for row, m in zip(self.live_rows, kept):
            self.blocks[row].append(m)
        self.live_lengths = [length + m for length, m in zip(self.live_lengths, kept)]
        if not any(finished):
            return None
        keep = [i for i, f in enumerate(finished) if not f]
        self.live = self.live[torch.tensor(keep, dtype=torch.long, device=self.live.device)]
        self.live_rows = [self.live_rows[i] for i in keep]
        self.live_lengths = [self.live_lengths[i] for i in keep]
        return keep

    def tail(self, window: int, bos_id: int, start: Tensor | None = None) -> Tensor:
        """The last ``window`` decoder inputs of each live row (b, window): the start token ``bos_id`` and the
        committed tokens, -1 before the start token; with ``start`` (B, window), what comes before each original
        row's committed tokens instead (:func:`~lightning_bpd.decoding.generation_rules.start_tail`)."""
        at = self.committed()[:, None] - window + torch.arange(window, device=self.tokens.device)  # (b, window); -1: the start
        got = self.tokens[self.live[:, None], at.clamp(min=0)]  # (b, window)
        if start is not None:
            return torch.where(at >= 0, got, start[self.live].gather(1, (at + window).clamp(0, window - 1)))
        return torch.where(at >= 0, got, torch.where(at == -1, bos_id, -1))

    def block_width(self, k: int, room: list[int] | None) -> int:
        """Inputs the next verify pass may hold: ``k``, or fewer where a live row's room (``room``: each original
        row's, :func:`~lightning_bpd.decoding.protocol.source_room`) runs out first; at least 1."""
        if room is None:
            return k
        return max(1, min(k, *(room[row] - n for row, n in zip(self.live_rows, self.live_lengths))))

    def committed(self) -> Tensor:
        """Tokens committed by each live row (b,), on the device."""
        return self.lengths[self.live]

    def length_bounds(self, offset: int = 0) -> tuple[int, int]:
        """(shortest, longest) committed length of the live rows, plus ``offset`` (host ints)."""
        return min(self.live_lengths) + offset, max(self.live_lengths) + offset

    def result(self, model_calls: int) -> DecodeResult:
        lengths = self.lengths
        width = max(1, int(lengths.max()))
        past = torch.arange(width, device=lengths.device) >= lengths[:, None]  # (B, width)
        tokens = self.tokens[:, :width].masked_fill(past, self.pad_id)
        iterations = torch.tensor([len(b) for b in self.blocks], dtype=torch.long, device=lengths.device)
        return DecodeResult(tokens, lengths, iterations, model_calls, [list(b) for b in self.blocks])
