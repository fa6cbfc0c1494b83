"""ResumableLoader: a state taken after any batch resumes at the next one (both samplers, DDP ranks, workers),
refuses a mid-epoch position of another layout, and carries the global random states."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest
import torch

from lightning_bpd.tasks.resumable import ResumableLoader, ShuffledSampler, rng_states, set_rng_states
from lightning_bpd.tasks.translation.datamodule_utils import TokenBatchSampler, TokenPairDataset, collate_pairs

DATA = TokenPairDataset(*[[[5] * (i % 9) for i in range(90)]] * 2)  # lengths 0..8: several batches per epoch


def tokens(num_replicas: int = 1, rank: int = 0, max_tokens: int = 60, **kwargs) -> ResumableLoader:
    """The translation training loader: batches from the token budget."""
    sampler = TokenBatchSampler(DATA.src_lengths, DATA.tgt_lengths, max_tokens, seed=1, num_replicas=num_replicas,
                                rank=rank)
    return ResumableLoader(DATA, batch_sampler=sampler, collate_fn=collate_pairs, **kwargs)


def images(num_replicas: int = 1, rank: int = 0, batch_size: int = 4, **kwargs) -> ResumableLoader:
    """The super-resolution training loader: a shuffled example order, ``batch_size`` a batch."""
    sampler = ShuffledSampler(len(DATA), seed=1, num_replicas=num_replicas, rank=rank)
    return ResumableLoader(DATA, batch_size=batch_size, sampler=sampler, drop_last=True, collate_fn=collate_pairs,
                           **kwargs)


LOADERS = {"tokens": tokens, "images": images}


def take(loader: ResumableLoader, n: int) -> list[list[int]]:
    """The next ``n`` batches (indices), starting a new pass whenever one ends, as Lightning does each epoch;
    a pass left before its end (Lightning's max_steps) is left with a suspended iterator."""
    out: list[list[int]] = []
    while len(out) < n:
        for batch in loader:
            out.append(batch["index"].tolist())
            if len(out) == n:
                break
    return out


def saved(loader: ResumableLoader) -> dict:
    """The loader's state after a round trip through a checkpoint file loaded with ``weights_only=True``."""
    buffer = io.BytesIO()
    torch.save(loader.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize("kind", LOADERS)
def test_a_state_after_any_batch_resumes_at_the_next_one(kind):
    make = LOADERS[kind]
    epoch = len(make())
    reference = take(make(), 2 * epoch + 3)
    assert reference[epoch : 2 * epoch] != reference[:epoch]  # every epoch has an order of its own
    # 0: fresh; mid-epoch; the epoch's last batch; the next epoch's first; mid-way through the next epoch
    for k in (0, 3, epoch - 1, epoch, epoch + 1, epoch + 4):
        first = make()
        done = take(first, k)
        state = saved(first)
        resumed = make()
        resumed.load_state_dict(state)
        assert done + take(resumed, len(reference) - k) == reference, k


@pytest.mark.parametrize("kind", LOADERS)
def test_rank_zero_state_resumes_every_rank(kind):
    make = LOADERS[kind]
    per_rank = [take(make(num_replicas=2, rank=r), 2 * len(make(num_replicas=2))) for r in (0, 1)]
    assert not {i for b in per_rank[0][:3] for i in b} & {i for b in per_rank[1][:3] for i in b}
    k = 3  # every rank has trained 3 batches: Lightning saves rank 0's loader state
    first = make(num_replicas=2, rank=0)
    take(first, k)
    state = saved(first)
    for rank in (0, 1):
        resumed = make(num_replicas=2, rank=rank)
        resumed.load_state_dict(state)
        assert per_rank[rank][:k] + take(resumed, len(per_rank[rank]) - k) == per_rank[rank]


@pytest.mark.parametrize(("kind", "saved_with", "resumed_with", "message"), [
    ("tokens", {"num_replicas": 2}, {}, "num_replicas=2, this run makes them with num_replicas=1"),
    ("tokens", {"max_tokens": 60}, {"max_tokens": 80}, "max_tokens=60, this run makes them with max_tokens=80"),
    ("images", {}, {"num_replicas": 3}, "num_replicas=1, this run makes them with num_replicas=3"),
    ("images", {"batch_size": 4}, {"batch_size": 5}, "batch_size=4, this run makes them with batch_size=5"),
])
def test_a_mid_epoch_state_of_another_layout_is_one_clear_error(kind, saved_with, resumed_with, message):
    first = LOADERS[kind](**saved_with)
    take(first, 2)
    other = LOADERS[kind](**resumed_with)
    with pytest.raises(ValueError, match="cannot resume the training (data|batches) mid-epoch") as err:
        other.load_state_dict(saved(first))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_end_of_epoch_state_resumes_any_layout_at_the_next_epoch():
    first = tokens(max_tokens=60)
    take(first, len(first))  # all of epoch 0
    resumed = tokens(max_tokens=80)
    resumed.load_state_dict(saved(first))
    fresh = tokens(max_tokens=80)
    assert take(resumed, 2) == take(fresh, len(fresh) + 2)[-2:]  # epoch 1 of the new layout, from its start


@pytest.mark.parametrize("kind", LOADERS)
def test_prefetching_workers_do_not_count(kind):
    make = LOADERS[kind]
    epoch = len(make())
    first = make(num_workers=2, prefetch_factor=4, persistent_workers=True)  # as the datamodules make them
    done = take(first, epoch + 3)  # a second pass of the same workers; they have fetched further ahead
    state = saved(first)
    assert state["batches"] == 3
    resumed = make()
    resumed.load_state_dict(state)
    assert done + take(resumed, 4) == take(make(), epoch + 7)


def test_loaders_draw_nothing_from_the_global_rng():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    take(tokens(), 20)
    take(images(), 20)
    assert torch.equal(torch.get_rng_state(), before)


def test_the_resumed_pass_restores_the_random_states_before_its_first_batch():
    first = tokens()
    take(first, 2)
    state = saved(first)
    expected = (torch.rand(4), random.random(), np.random.rand())
    resumed = tokens()
    resumed.load_state_dict(state)
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    next(iter(resumed))
    assert torch.equal(torch.rand(4), expected[0]) and (random.random(), np.random.rand()) == expected[1:]


def test_rng_states_round_trip():
    states = rng_states()
    assert len(states) == 1  # one rank
    expected = (torch.rand(3), random.random(), np.random.rand(2))
    set_rng_states(states)
    assert torch.equal(torch.rand(3), expected[0]) and random.random() == expected[1]
    assert np.array_equal(np.random.rand(2), expected[2])


def test_a_plain_sampler_makes_a_plain_loader():
    loader = ResumableLoader(DATA, batch_size=10, collate_fn=collate_pairs)  # e.g. Lightning's overfit_batches
    assert loader.state_dict() == {}
    loader.load_state_dict({})
    assert [b["index"].tolist() for b in loader][1] == list(range(10, 20))


def test_a_foreign_state_is_one_clear_error():
    with pytest.raises(ValueError, match="not a ResumableLoader state"):
        tokens().load_state_dict({"batches": 3})
