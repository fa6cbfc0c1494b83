"""Torch-only data utilities for the translation task: a token-pair dataset, collation and a token-budget sampler.

Token id conventions: pad=0, bos=1, eos=2, unk=3. Both sides get EOS appended at collation time, so the padded
width of an example is ``len(ids) + 1`` on each side.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator, Sequence
from itertools import chain
from typing import Any

import torch
from torch.utils.data import Dataset, Sampler

from lightning_bpd.tasks.eval_sampler import process_group
from lightning_bpd.tasks.resumable import check_layout

__all__ = ["TokenBatchSampler", "TokenPairDataset", "collate_pairs"]

logger = logging.getLogger("lightning_bpd")


def _flatten(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack variable-length int sequences into one flat int32 tensor plus int64 offsets (len(seqs) + 1)."""
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)
    offsets = torch.zeros(len(seqs) + 1, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    flat = torch.tensor(list(chain.from_iterable(seqs)), dtype=torch.int32)
    return flat, offsets


class TokenPairDataset(Dataset):
    """Pre-encoded (source ids, target ids) pairs stored compactly; item ``i`` is ``(src_ids, tgt_ids, i)``.

    Ids are returned as 1-D ``torch.long`` tensors without BOS/EOS. Storage is two flat int32 tensors, which
    avoids millions of Python int objects and is shared cheaply with forked dataloader workers.
    """

    def __init__(self, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]) -> None:
        if len(src) != len(tgt):
            raise ValueError(f"src and tgt must have the same number of examples, got {len(src)} and {len(tgt)}")
        self._src, self._src_off = _flatten(src)
        self._tgt, self._tgt_off = _flatten(tgt)

    def __len__(self) -> int:
        return self._src_off.numel() - 1

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"index {index} out of range for dataset of size {n}")
        src = self._src[self._src_off[index] : self._src_off[index + 1]].long()
        tgt = self._tgt[self._tgt_off[index] : self._tgt_off[index + 1]].long()
        return src, tgt, index

    @property
    def src_lengths(self) -> torch.Tensor:
        """Source lengths (tokens, without EOS), shape (N,)."""
        return self._src_off[1:] - self._src_off[:-1]

    def target_counts(self, vocab_size: int) -> torch.Tensor:
        """How often each token id occurs on the target side, (vocab_size,) (EOS, added at collation, not counted)."""
        return torch.bincount(self._tgt.long(), minlength=vocab_size)

    @property
    def tgt_lengths(self) -> torch.Tensor:
        """Target lengths (tokens, without EOS), shape (N,)."""
        return self._tgt_off[1:] - self._tgt_off[:-1]


def _pad_with_eos(seqs: Sequence[Sequence[int] | torch.Tensor], pad_id: int, eos_id: int) -> torch.Tensor:
    width = max(len(s) for s in seqs) + 1
    out = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    for row, s in enumerate(seqs):
        n = len(s)
        if n:
            out[row, :n] = torch.as_tensor(s, dtype=torch.long)
        out[row, n] = eos_id
    return out


def collate_pairs(
    batch: Sequence[tuple[Sequence[int] | torch.Tensor, Sequence[int] | torch.Tensor, int]],
    pad_id: int = 0,
    eos_id: int = 2,
) -> dict[str, torch.Tensor]:
    """Collate ``(src_ids, tgt_ids, index)`` items into padded tensors.

    Returns ``{"src": (B, S), "tgt": (B, T), "index": (B,)}`` (all long): ``src``/``tgt`` are the ids followed by
    EOS, right-padded with ``pad_id``; ``index`` holds the dataset indices (to de-duplicate distributed eval).
    """
    if len(batch) == 0:
        raise ValueError("collate_pairs got an empty batch")
    src, tgt, index = zip(*batch)
    return {
        "src": _pad_with_eos(src, pad_id, eos_id),
        "tgt": _pad_with_eos(tgt, pad_id, eos_id),
        "index": torch.tensor([int(i) for i in index], dtype=torch.long),
    }


class TokenBatchSampler(Sampler[list[int]]):
    """Length-bucketed batches under a token budget, shuffled deterministically per epoch, DDP-aware.

    Each example costs ``max(src_len + 1, tgt_len + 1)`` padded positions (EOS is appended to both sides), and a
    batch satisfies ``max_cost_in_batch * batch_size <= max_tokens`` (and ``batch_size <= max_batch_size`` when
    given). An example whose own cost exceeds ``max_tokens`` is put alone in a batch (with a warning) rather than
    silently dropped.

    Examples are sorted by cost and packed greedily. With ``shuffle=True`` examples of equal cost are permuted and
    the batch order is shuffled with a generator seeded by ``seed + epoch`` (call :meth:`set_epoch`); the number of
    batches does not depend on the epoch. With ``shuffle=False`` the batches and their order are fixed (ascending
    cost, ties in dataset order). ``sort_by_length=False`` packs examples in dataset order (or a random order
    when shuffling) without bucketing; only then can the number of batches change from one epoch to the next.

    Distributed: all ranks build the same batch list (same seed) and rank ``r`` takes batches ``r, r + R, ...``
    (``R = num_replicas``), so ranks see disjoint examples. When the batch count is not divisible by ``R``:
    ``drop_uneven=False`` (default) pads the list by repeating batches from its beginning, so every rank gets the
    same number of batches and every example is seen (a few twice; de-duplicate eval with ``index``);
    ``drop_uneven=True`` drops the trailing ``len % R`` batches instead (nothing duplicated, a few examples skipped
    that epoch). ``num_replicas``/``rank`` default to the initialised ``torch.distributed`` group, else 1/0.

    ``split_examples=True`` (for evaluation) splits examples instead of batches: rank ``r`` takes examples
    ``r, r + R, ...`` of the cost-sorted order and packs its own batches, so every example is seen exactly
    once (no padding, nothing dropped) and ranks get nearly equal work; batch counts may differ by rank.

    Resuming (:class:`~lightning_bpd.tasks.resumable.ResumableLoader`): the next pass leaves out its first ``skip``
    batches; ``state_dict`` holds the epoch and what the batch list depends on, and ``load_state_dict`` refuses a
    state whose batches were made differently (devices, budget, seed, data).
    """

    def __init__(
        self,
        src_lengths: Sequence[int] | torch.Tensor,
        tgt_lengths: Sequence[int] | torch.Tensor,
        max_tokens: int,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int | None = None,
        rank: int | None = None,
        drop_uneven: bool = False,
        max_batch_size: int | None = None,
        sort_by_length: bool = True,
        split_examples: bool = False,
    ) -> None:
        src_len = torch.as_tensor(src_lengths, dtype=torch.long).reshape(-1)
        tgt_len = torch.as_tensor(tgt_lengths, dtype=torch.long).reshape(-1)
        if src_len.shape != tgt_len.shape:
            raise ValueError(f"src_lengths ({src_len.numel()}) and tgt_lengths ({tgt_len.numel()}) differ in size")
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        if num_replicas is None or rank is None:
            world, group_rank = process_group()
            num_replicas = world if num_replicas is None else num_replicas
            rank = group_rank if rank is None else rank
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"invalid rank {rank} for num_replicas={num_replicas}")

        self.max_tokens = int(max_tokens)
        self.max_batch_size = max_batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.num_replicas = int(num_replicas)
        self.rank = int(rank)
        self.drop_uneven = drop_uneven
        self.sort_by_length = sort_by_length
        self.split_examples = split_examples
        self.epoch = 0
        self.skip = 0  # batches of this rank the next pass leaves out (a resumed epoch)
        self.costs = torch.maximum(src_len, tgt_len) + 1
        self.costs_crc32 = zlib.crc32(self.costs.numpy().tobytes())  # the data, as far as batching sees it
        if split_examples and self.num_replicas > 1 and self.costs.numel() < self.num_replicas:
            raise ValueError(f"{self.costs.numel()} example(s) cannot be split over {self.num_replicas} processes: "
                             "use fewer devices or a larger evaluation set")

        self._cache: tuple[int, list[list[int]]] | None = None
        oversize = int((self.costs > self.max_tokens).sum())
        if oversize:
            logger.warning(
                "TokenBatchSampler: %d example(s) need more than max_tokens=%d padded positions on their own; "
                "they get single-example batches",
                oversize,
                self.max_tokens,
            )

    def _pack(self, costs: list[int]) -> list[int]:
        """Greedy packing of costs (in order) into batch sizes."""
        sizes: list[int] = []
        count, cur_max = 0, 0
        for c in costs:
            new_max = max(cur_max, c)
            full = self.max_batch_size is not None and count >= self.max_batch_size
            if count and (full or new_max * (count + 1) > self.max_tokens):
                sizes.append(count)
                count, new_max = 0, c
            count += 1
            cur_max = new_max
        if count:
            sizes.append(count)
        return sizes

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch used (with ``seed``) to shuffle; call before each epoch for a new order."""
        self.epoch = int(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The epoch and what this rank's batch list depends on (not the rank: every rank loads rank 0's)."""
        return {"epoch": self.epoch, "examples": self.costs.numel(), "example_lengths_crc32": self.costs_crc32,
                "max_tokens": self.max_tokens, "max_batch_size": self.max_batch_size, "seed": self.seed,
                "shuffle": self.shuffle, "num_replicas": self.num_replicas, "drop_uneven": self.drop_uneven,
                "sort_by_length": self.sort_by_length, "split_examples": self.split_examples}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the epoch of ``state``; ``ValueError`` naming what differs if its batches were made differently."""
        current = self.state_dict()
        check_layout(state, {k: v for k, v in current.items() if k != "epoch"}, "training batches")
        self.set_epoch(state["epoch"])

    def _all_batches(self) -> list[list[int]]:
        """All batches of the current epoch (identical on every rank), before the per-rank split."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        n = self.costs.numel()
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        if self.sort_by_length:
            # Random tie order among equal costs; the sorted cost sequence (hence the batch count) is fixed.
            perm = torch.randperm(n, generator=gen) if self.shuffle else torch.arange(n)
            order = perm[torch.sort(self.costs[perm], stable=True).indices]
        else:
            order = torch.randperm(n, generator=gen) if self.shuffle else torch.arange(n)
        if self.split_examples:
            order = order[self.rank :: self.num_replicas]  # this rank's examples only
        flat = order.tolist()
        batches: list[list[int]] = []
        start = 0
        for size in self._pack(self.costs[order].tolist()):
            batches.append(flat[start : start + size])
            start += size
        if self.shuffle:
            batches = [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]
        self._cache = (self.epoch, batches)
        return batches

    def _num_batches_total(self) -> int:
        n, r = len(self._all_batches()), self.num_replicas
        if self.split_examples:
            return n
        if n % r == 0:
            return n
        return (n // r) * r if self.drop_uneven else (n // r + 1) * r

    def __iter__(self) -> Iterator[list[int]]:
        skip, self.skip = self.skip, 0
        batches = self._all_batches()
        if self.split_examples:
            yield from batches[skip:]
            return
        total = self._num_batches_total()
        if total > len(batches):
            extra = total - len(batches)
            batches = batches + (batches * (extra // len(batches) + 1))[:extra]
        else:
            batches = batches[:total]
        yield from batches[self.rank : total : self.num_replicas][skip:]

    def __len__(self) -> int:
        if self.split_examples:
            return len(self._all_batches())
        return self._num_batches_total() // self.num_replicas
