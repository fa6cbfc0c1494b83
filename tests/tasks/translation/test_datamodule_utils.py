"""Tests for TokenPairDataset, collate_pairs and TokenBatchSampler."""

from __future__ import annotations

import random

import pytest
import torch
from torch.utils.data import DataLoader

from lightning_bpd.tasks.translation.datamodule_utils import TokenBatchSampler, TokenPairDataset, collate_pairs


def _pairs(n: int = 200, seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    src = [[rng.randint(4, 99) for _ in range(rng.randint(0, 30))] for _ in range(n)]
    tgt = [[rng.randint(4, 99) for _ in range(rng.randint(1, 30))] for _ in range(n)]
    return src, tgt


def test_dataset_items_and_lengths() -> None:
    src, tgt = _pairs(20)
    ds = TokenPairDataset(src, tgt)
    assert len(ds) == 20
    for i in (0, 7, 19):
        s, t, idx = ds[i]
        assert s.tolist() == src[i] and t.tolist() == tgt[i] and idx == i and s.dtype == torch.long
    assert ds[-1][2] == 19
    assert ds.src_lengths.tolist() == [len(s) for s in src]
    assert ds.tgt_lengths.tolist() == [len(t) for t in tgt]
    with pytest.raises(IndexError):
        ds[20]
    with pytest.raises(ValueError):
        TokenPairDataset(src, tgt[:-1])


def test_collate_shapes_padding_eos() -> None:
    batch = [([5, 6, 7], [8], 4), ([], [9, 10, 11, 12], 9), (torch.tensor([13]), torch.tensor([14, 15]), 1)]
    out = collate_pairs(batch, pad_id=0, eos_id=2)
    assert set(out) == {"src", "tgt", "index"}
    assert out["src"].tolist() == [[5, 6, 7, 2], [2, 0, 0, 0], [13, 2, 0, 0]]
    assert out["tgt"].tolist() == [[8, 2, 0, 0, 0], [9, 10, 11, 12, 2], [14, 15, 2, 0, 0]]
    assert out["index"].tolist() == [4, 9, 1]
    assert all(v.dtype == torch.long for v in out.values())
    custom = collate_pairs(batch[:1], pad_id=7, eos_id=9)
    assert custom["src"].tolist() == [[5, 6, 7, 9]]


def _cost(src: list[list[int]], tgt: list[list[int]], i: int) -> int:
    return max(len(src[i]), len(tgt[i])) + 1


@pytest.mark.parametrize("shuffle", [True, False])
def test_sampler_budget_and_coverage(shuffle: bool) -> None:
    src, tgt = _pairs(300)
    ds = TokenPairDataset(src, tgt)
    sampler = TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, max_tokens=128, shuffle=shuffle, seed=1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        flat = [i for b in batches for i in b]
        assert sorted(flat) == list(range(300))
        for b in batches:
            assert max(_cost(src, tgt, i) for i in b) * len(b) <= 128
            # The spec's looser bound also holds.
            assert max(max(len(src[i]), len(tgt[i]) + 1) for i in b) * len(b) <= 128


def test_sampler_through_dataloader_respects_tensor_sizes() -> None:
    src, tgt = _pairs(100)
    ds = TokenPairDataset(src, tgt)
    sampler = TokenBatchSampler(ds.src_lengths, ds.tgt_lengths, max_tokens=96, seed=0)
    seen = []
    for batch in DataLoader(ds, batch_sampler=sampler, collate_fn=collate_pairs):
        assert batch["src"].numel() <= 96 and batch["tgt"].numel() <= 96
        seen += batch["index"].tolist()
    assert sorted(seen) == list(range(100))


def test_sampler_deterministic_per_seed_and_epoch() -> None:
    src, tgt = _pairs(300)
    lens = ([len(s) for s in src], [len(t) for t in tgt])

    def run(seed: int, epoch: int) -> list[list[int]]:
        s = TokenBatchSampler(*lens, max_tokens=100, seed=seed)
        s.set_epoch(epoch)
        return list(s)

    assert run(0, 0) == run(0, 0)
    assert run(0, 1) == run(0, 1)
    assert run(0, 0) != run(0, 1)
    assert run(0, 0) != run(1, 0)


def test_sampler_no_shuffle_fixed_order() -> None:
    src, tgt = _pairs(100)
    lens = ([len(s) for s in src], [len(t) for t in tgt])
    s = TokenBatchSampler(*lens, max_tokens=100, shuffle=False)
    first = list(s)
    s.set_epoch(5)
    assert list(s) == first
    costs = [_cost(src, tgt, i) for b in first for i in b]
    assert costs == sorted(costs)
    plain = TokenBatchSampler(*lens, max_tokens=100, shuffle=False, sort_by_length=False)
    assert [i for b in plain for i in b] == list(range(100))


def test_sampler_max_batch_size_and_oversize() -> None:
    s = TokenBatchSampler([1] * 10 + [50], [1] * 10 + [1], max_tokens=20, shuffle=False, max_batch_size=4)
    batches = list(s)
    assert all(len(b) <= 4 for b in batches)
    assert [10] in batches
    assert sorted(i for b in batches for i in b) == list(range(11))


@pytest.mark.parametrize("num_replicas", [2, 3, 4])
def test_sampler_ddp_disjoint_and_padded(num_replicas: int) -> None:
    src, tgt = _pairs(250)
    lens = ([len(s) for s in src], [len(t) for t in tgt])
    single = TokenBatchSampler(*lens, max_tokens=80, seed=2, num_replicas=1, rank=0)
    n_batches = len(single)

    # drop_uneven=True: disjoint ranks, equal counts, only whole batches missing.
    ranks = [
        list(TokenBatchSampler(*lens, max_tokens=80, seed=2, num_replicas=num_replicas, rank=r, drop_uneven=True))
        for r in range(num_replicas)
    ]
    assert len({len(b) for b in ranks}) == 1 and len(ranks[0]) == n_batches // num_replicas
    per_rank = [{i for b in batches for i in b} for batches in ranks]
    for a in range(num_replicas):
        for b in range(a + 1, num_replicas):
            assert not per_rank[a] & per_rank[b]

    # drop_uneven=False: equal counts, every index seen, duplicates only from padding batches.
    ranks = [
        list(TokenBatchSampler(*lens, max_tokens=80, seed=2, num_replicas=num_replicas, rank=r))
        for r in range(num_replicas)
    ]
    expected = -(-n_batches // num_replicas)
    assert all(len(b) == expected for b in ranks)
    flat = [i for batches in ranks for b in batches for i in b]
    assert set(flat) == set(range(250))
    if n_batches % num_replicas == 0:
        assert len(flat) == 250
    all_batches = list(single)
    rank_union = sorted(tuple(b) for batches in ranks for b in batches)
    assert set(rank_union) == {tuple(b) for b in all_batches}


def test_sampler_more_replicas_than_batches() -> None:
    s = [TokenBatchSampler([1, 1], [1, 1], max_tokens=100, num_replicas=4, rank=r, shuffle=False) for r in range(4)]
    assert [list(x) for x in s] == [[[0, 1]]] * 4
    assert [len(x) for x in s] == [1] * 4
    dropped = TokenBatchSampler([1, 1], [1, 1], max_tokens=100, num_replicas=4, rank=0, drop_uneven=True)
    assert len(dropped) == 0 and list(dropped) == []


def test_sampler_validation() -> None:
    with pytest.raises(ValueError):
        TokenBatchSampler([1, 2], [1], max_tokens=10)
    with pytest.raises(ValueError):
        TokenBatchSampler([1], [1], max_tokens=10, num_replicas=2, rank=2)


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_sampler_split_examples_sees_each_example_exactly_once(num_replicas: int) -> None:
    src, tgt = _pairs(101)
    lens = ([len(s) for s in src], [len(t) for t in tgt])
    ranks = [
        TokenBatchSampler(*lens, max_tokens=80, shuffle=False, num_replicas=num_replicas, rank=r, split_examples=True)
        for r in range(num_replicas)
    ]
    flat = [i for s in ranks for b in s for i in b]
    assert sorted(flat) == list(range(101))  # no repeats, nothing dropped
    assert all(len(s) == len(list(s)) for s in ranks)
    sizes = [sum(len(b) for b in s) for s in ranks]
    assert max(sizes) - min(sizes) <= 1  # nearly equal work
    costs = [max(len(a), len(b)) + 1 for a, b in zip(src, tgt)]
    assert all(max(costs[i] for i in b) * len(b) <= 80 for s in ranks for b in s)
    with pytest.raises(ValueError, match="cannot be split over 3 processes"):
        TokenBatchSampler([1, 2], [1, 2], max_tokens=10, num_replicas=3, rank=0, split_examples=True)


def test_unrepeated_sampler_splits_in_order() -> None:
    from lightning_bpd.tasks.eval_sampler import UnrepeatedSampler

    sampler = UnrepeatedSampler(7)  # no process group: one rank sees everything
    assert list(sampler) == list(range(7)) and len(sampler) == 7
    sampler.num_replicas, sampler.rank = 3, 2
    assert list(sampler) == [2, 5] and len(sampler) == 2


def test_sampler_skip_leaves_out_the_first_batches_of_the_next_pass_only() -> None:
    src, tgt = _pairs(200)
    lens = ([len(s) for s in src], [len(t) for t in tgt])
    for kwargs in ({"num_replicas": 2, "rank": 1}, {"shuffle": False, "split_examples": True}):
        s = TokenBatchSampler(*lens, max_tokens=100, seed=3, **kwargs)
        full = list(s)
        s.skip = 3
        assert list(s) == full[3:]
        assert list(s) == full


def test_sampler_state_round_trip() -> None:
    src, tgt = _pairs(200)
    lens = ([len(s) for s in src], [len(t) for t in tgt])
    s = TokenBatchSampler(*lens, max_tokens=100, seed=3, num_replicas=2, rank=0)
    s.set_epoch(4)
    state = s.state_dict()
    other_rank = TokenBatchSampler(*lens, max_tokens=100, seed=3, num_replicas=2, rank=1)
    other_rank.load_state_dict(state)  # every rank loads rank 0's state
    assert other_rank.epoch == 4
    same = TokenBatchSampler(*lens, max_tokens=100, seed=3, num_replicas=2, rank=0)
    same.load_state_dict(state)
    assert same.epoch == 4 and list(same) == list(s)


@pytest.mark.parametrize(("change", "differs"), [
    ({"num_replicas": 1}, "num_replicas=2, this run makes them with num_replicas=1"),
    ({"max_tokens": 120}, "max_tokens=100, this run makes them with max_tokens=120"),
    ({"seed": 4}, "seed=3, this run makes them with seed=4"),
    ({"data": 1}, "example_lengths_crc32="),
])
def test_sampler_state_of_another_layout_names_what_differs(change: dict, differs: str) -> None:
    src, tgt = _pairs(200)
    saved = TokenBatchSampler([len(s) for s in src], [len(t) for t in tgt], max_tokens=100, seed=3, num_replicas=2,
                              rank=0).state_dict()
    kwargs = {"max_tokens": 100, "seed": 3, "num_replicas": 2, "rank": 0}
    kwargs.update({k: v for k, v in change.items() if k != "data"})
    if "data" in change:
        src, tgt = _pairs(200, seed=change["data"])
    s = TokenBatchSampler([len(s) for s in src], [len(t) for t in tgt], **kwargs)
    with pytest.raises(ValueError, match="cannot resume the training batches mid-epoch") as err:
        s.load_state_dict(saved)
    assert differs in str(err.value)
