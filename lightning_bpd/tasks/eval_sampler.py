"""An evaluation sampler that splits examples over DDP ranks without repeating any."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import DistributedSampler


def process_group() -> tuple[int, int]:
    """``(world_size, rank)`` of the initialised ``torch.distributed`` group, else ``(1, 0)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


class UnrepeatedSampler(DistributedSampler):
    """Rank ``r`` of ``R`` takes examples ``r, r + R, ...`` in order: each example exactly once.

    torch's ``DistributedSampler`` pads the last round with repeats so every rank gets equally many,
    which would count those examples twice in validation metrics. Being a ``DistributedSampler``,
    Lightning leaves it in place instead of wrapping it in another one.
    """

    def __init__(self, length: int) -> None:
        world, rank = process_group()
        if world > 1 and length < world:
            raise ValueError(f"{length} example(s) cannot be split over {world} processes: "
                             "use fewer devices or a larger evaluation set")
        self.length = length
        super().__init__(range(length), num_replicas=world, rank=rank, shuffle=False, drop_last=False)

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.rank, self.length, self.num_replicas))

    def __len__(self) -> int:
        return len(range(self.rank, self.length, self.num_replicas))
