"""What an exact mid-epoch resume needs: the data position and the random streams, both kept in the checkpoint.

Lightning (2.6) keeps ``state_dict()`` of every training loader that has ``state_dict``/``load_state_dict`` in the
checkpoint (``FitLoop.on_save_checkpoint`` -> ``CombinedLoader._state_dicts``, called on every rank, the file
written by rank 0) and hands it back to ``load_state_dict`` on resume, before it iterates the loader
(``FitLoop.setup_data`` -> ``_load_combined_loader_states``). A plain ``DataLoader`` has neither, so a resumed run
used to replay its epoch from the first batch.

:class:`ResumableLoader` counts the batches it has yielded in the current epoch (as they leave the loader: what
workers prefetch does not count; Lightning's own fetcher does not prefetch a loader with a length) and its next
pass leaves them out, skipping their indices without loading them. Its sampler (:class:`ResumableSampler`) draws
a fixed order from a seed and the epoch and says in ``state_dict`` what that order depends on, so a mid-epoch
position saved under another layout (devices, batch budget, data) is refused with one message. Under DDP the ranks
step in lockstep (each has as many batches per epoch), so the position rank 0 saves is every rank's position in
its own share of the batches.

Lightning does not save torch's global RNG, which dropout draws from: the loader's state also holds every rank's
global random states (:func:`rng_states`), and a resumed pass restores them just before its first batch. The
loaders draw from their own generators, never from the global RNG, so the model's draws are the only ones.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_bpd.tasks.eval_sampler import process_group

logger = logging.getLogger("lightning_bpd")


@runtime_checkable
class ResumableSampler(Protocol):
    """A sampler whose order is fixed by its layout and epoch; ``skip`` items are left out of its next pass."""

    epoch: int
    skip: int

    def set_epoch(self, epoch: int) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def check_layout(saved: dict[str, Any], current: dict[str, Any], what: str) -> None:
    """Raise one ``ValueError`` naming every field of ``current`` that ``saved`` does not match."""
    differ = [key for key in current if saved.get(key) != current[key]]
    if differ:
        was = ", ".join(f"{key}={saved.get(key)}" for key in differ)
        now = ", ".join(f"{key}={current[key]}" for key in differ)
        raise ValueError(f"cannot resume the {what} mid-epoch: the checkpoint's position counts batches made with "
                         f"{was}, this run makes them with {now}. Resume with the same data settings and number "
                         "of devices, or from a checkpoint saved at the end of an epoch")


class ShuffledSampler(DistributedSampler):
    """Training order of ``length`` examples: a permutation per epoch from ``seed + epoch``, DDP-aware.

    Rank ``r`` of ``R`` takes examples ``r, r + R, ...`` of the permutation (padded with repeats to equal counts:
    torch's ``DistributedSampler``, which Lightning leaves in place and calls ``set_epoch`` on).
    """

    def __init__(self, length: int, seed: int = 0, num_replicas: int | None = None, rank: int | None = None) -> None:
        world, group_rank = process_group()
        num_replicas = world if num_replicas is None else num_replicas
        rank = group_rank if rank is None else rank
        super().__init__(range(length), num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.skip = 0  # examples of this rank the next pass leaves out (a resumed epoch)

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        skip, self.skip = self.skip, 0
        return iter(indices[skip:])

    def state_dict(self) -> dict[str, Any]:
        """The epoch and what this rank's order depends on (not the rank: every rank loads rank 0's)."""
        return {"epoch": self.epoch, "examples": len(self.dataset), "num_replicas": self.num_replicas,
                "seed": self.seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the epoch of ``state``; ``ValueError`` naming what differs if its order was made differently."""
        current = self.state_dict()
        check_layout(state, {k: v for k, v in current.items() if k != "epoch"}, "training data")
        self.set_epoch(state["epoch"])


class ResumableLoader(DataLoader):
    """A training ``DataLoader`` that Lightning saves and restores mid-epoch (see the module docstring).

    Its epochs are its passes over the data: each pass goes on where the previous one stopped, and a new epoch
    begins once all the batches of the last one were yielded. These are Lightning's epochs, except where Lightning
    cuts one short: it counts the epoch of a run stopped by ``max_steps`` or ``max_time`` as finished, and resumed,
    runs the rest of it under the next number (and after a stop at an epoch's last batch, only one batch of the
    next epoch under that number). The data then go on exactly as if nothing had stopped. The loader sets its
    sampler's epoch at the start of each pass; a new loader starts at the epoch its sampler has (0, or what
    Lightning set).

    Its sampler is ``batch_sampler`` when that yields whole batches (``batch_size=None``), else ``sampler``, whose
    examples the loader groups ``batch_size`` at a time (``drop_last`` keeps the groups aligned after a skip).
    Without a ``generator`` the loader gets a seeded one, so that iterating it does not draw from torch's global RNG.
    A sampler that is not a :class:`ResumableSampler` (Lightning's ``overfit_batches`` puts in a sequential one)
    makes it a plain ``DataLoader`` whose state is empty.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("generator", torch.Generator().manual_seed(0))
        super().__init__(*args, **kwargs)
        self.epoch = 0  # the sampler's epoch in the current pass
        self.batches = 0  # batches of that epoch yielded
        self.passes = 0
        self.resumed: tuple[int, int, Any] | None = None  # (epoch, batches, rng) of a loaded state: the next pass

    def resumable(self) -> tuple[ResumableSampler | None, int]:
        """The epoch-aware sampler (None if it is not one) and how many of its items make one batch."""
        sampler, per_batch = (self.batch_sampler, 1) if self.batch_size is None else (self.sampler, self.batch_size)
        return (sampler if isinstance(sampler, ResumableSampler) else None), per_batch

    def __iter__(self) -> Iterator[Any]:
        # A generator: nothing runs before the first batch is asked for.
        sampler, per_batch = self.resumable()
        if sampler is None:
            yield from super().__iter__()
            return
        if self.resumed is not None:
            (epoch, batches, rng), self.resumed = self.resumed, None
            if rng is not None:
                set_rng_states(rng)
        elif self.passes == 0:
            epoch, batches = sampler.epoch, 0
        else:
            epoch, batches = self.epoch, self.batches
        if batches >= len(self):
            epoch, batches = epoch + 1, 0
        self.epoch, self.batches, self.passes = epoch, batches, self.passes + 1
        sampler.set_epoch(epoch)
        sampler.skip = batches * per_batch
        for batch in super().__iter__():
            self.batches += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        """Batches yielded in the current epoch, the sampler's state and every rank's random states."""
        sampler, per_batch = self.resumable()
        if sampler is None:
            return {}
        epoch, batches = self.resumed[:2] if self.resumed is not None else (self.epoch, self.batches)
        return {"batches": batches, "length": len(self), "batch_size": per_batch,
                "sampler": {**sampler.state_dict(), "epoch": epoch}, "rng": rng_states()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at ``state``: its epoch goes on after its batches (refused if they were made differently);
        a finished epoch is followed by the next one, from its first batch, whatever the layout."""
        sampler, per_batch = self.resumable()
        if sampler is None or not state:
            return
        if not {"batches", "length", "batch_size", "sampler"} <= set(state) or "epoch" not in state["sampler"]:
            raise ValueError("the training data position in the checkpoint is not a ResumableLoader state "
                             f"(keys {sorted(state)})")
        batches, epoch = int(state["batches"]), int(state["sampler"]["epoch"])
        if batches >= state["length"]:
            epoch, batches = epoch + 1, 0
        if batches > 0:  # mid-epoch: the position must index the same batches
            check_layout(state, {"batch_size": per_batch}, "training data")
            sampler.load_state_dict(state["sampler"])
        self.resumed = (epoch, batches, state.get("rng"))


def rng_states() -> list[dict[str, Any]]:
    """The global random states (torch, CUDA of the current device, Python, NumPy) of every rank, by rank.

    Under DDP this is a collective: every rank must call it (Lightning's ``save_checkpoint`` runs on all ranks).
    """
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    # plain types and tensors only: Lightning may load checkpoints with ``weights_only=True``
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    world, _ = process_group()
    if world == 1:
        return [state]
    states: list[Any] = [None] * world
    torch.distributed.all_gather_object(states, state)
    return states


def set_rng_states(states: list[dict[str, Any]]) -> None:
    """Restore this rank's entry of :func:`rng_states` (with a warning instead when the number of ranks changed)."""
    world, rank = process_group()
    if len(states) != world:
        logger.warning("the checkpoint's random states are of %d rank(s), this run has %d: not restored",
                       len(states), world)
        return
    state = states[rank]
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
