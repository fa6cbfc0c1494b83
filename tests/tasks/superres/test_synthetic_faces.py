"""Tests for the procedurally drawn synthetic faces."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_bpd.tasks.superres import synthetic_faces
from lightning_bpd.tasks.superres.preprocess import preprocess
from lightning_bpd.tasks.superres.synthetic_faces import generate_faces, synthetic_split


def test_shape_and_determinism() -> None:
    a = generate_faces(4, seed=3)
    assert a.shape == (4, 218, 178, 3) and a.dtype == torch.uint8
    assert torch.equal(a, generate_faces(4, seed=3))
    assert torch.equal(a[:2], generate_faces(2, seed=3))  # shorter run is a prefix
    b = generate_faces(4, seed=4)
    assert not torch.equal(a, b)
    assert all(not torch.equal(a[i], a[j]) for i in range(4) for j in range(i + 1, 4))
    assert generate_faces(0).shape == (0, 218, 178, 3)


def test_plausible_faces() -> None:
    _, high = preprocess(generate_faces(8, seed=0))  # (8, 32, 32, 3)
    x = high.float()
    assert x.std(dim=(1, 2, 3)).min() > 10  # not constant
    center = x[:, 12:20, 12:20].mean(dim=(1, 2))  # (8, 3)
    corners = torch.stack([x[:, :4, :4], x[:, :4, -4:], x[:, -4:, :4], x[:, -4:, -4:]], 1).mean(dim=(2, 3))
    diff = (center[:, None] - corners).abs().sum(-1)  # (8, 4) color distance of the face center to each corner
    assert (diff.mean(dim=1) > 15).float().mean() >= 0.75
    # the face center is skin: red channel at least as bright as blue
    assert (center[:, 0] >= center[:, 2]).float().mean() >= 0.75


def test_synthetic_split(tmp_path: Path, monkeypatch) -> None:
    low, high = synthetic_split("val", 3, seed=1, cache_dir=tmp_path)
    assert low.shape == (3, 8, 8, 3) and high.shape == (3, 32, 32, 3)
    ref_low, ref_high = preprocess(generate_faces(3, seed=3 * 1 + 1))
    assert torch.equal(low, ref_low) and torch.equal(high, ref_high)
    train_low, _ = synthetic_split("train", 3, seed=1)
    test_low, _ = synthetic_split("test", 3, seed=1)
    assert not torch.equal(train_low, low) and not torch.equal(test_low, low)

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("regenerated despite the cache")

    monkeypatch.setattr(synthetic_faces, "_faces", fail)
    low2, high2 = synthetic_split("val", 3, seed=1, cache_dir=tmp_path)
    assert torch.equal(low, low2) and torch.equal(high, high2)
