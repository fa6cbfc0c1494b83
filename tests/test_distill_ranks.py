"""``distill``'s rank dispatch (one process, or one rank of torchrun's) and its check that every shard is there."""

from __future__ import annotations

import argparse

import pytest

from lightning_bpd.commands.distill import check_shards, run_ranks


@pytest.mark.parametrize(("env", "merges", "ranks"), [({}, True, [(0, 1)]),
                                                      ({"WORLD_SIZE": "3", "RANK": "0"}, True, [(0, 3)]),
                                                      ({"WORLD_SIZE": "3", "RANK": "2"}, False, [(2, 3)])])
def test_each_rank_runs_its_part_and_rank_0_merges(monkeypatch, env, merges, ranks):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    seen = []
    assert run_ranks(lambda rank, world, args, work: seen.append((rank, world)), argparse.Namespace(devices=1),
                     []) is merges
    assert seen == ranks


def test_a_missing_shard_is_one_line(tmp_path):
    (tmp_path / "0").touch()
    check_shards(1, lambda i: tmp_path / str(i))
    with pytest.raises(SystemExit, match=r"shards \[1\] are not finished yet"):
        check_shards(2, lambda i: tmp_path / str(i))
