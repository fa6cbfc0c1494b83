"""Tests for the CelebA loader on a tiny fake dataset (never the real one)."""

from __future__ import annotations

import warnings
from pathlib import Path

import PIL.Image
import pytest
import torch

from lightning_bpd.tasks.superres.celeba import check_split, find_celeba, load_split

COLORS = {"000001.jpg": (200, 40, 40), "000002.jpg": (30, 160, 60), "000003.jpg": (20, 40, 220)}
PARTITION = {
    "000001.jpg": 0,
    "000002.jpg": 0,
    "000003.jpg": 1,
    "000004.jpg": 0,  # corrupt file
    "000005.jpg": 0,  # absent
    "000006.jpg": 2,  # absent: no test image exists
    "000007.jpg": 1,  # absent
}


def make_celeba(base: Path) -> Path:
    """Write a fake aligned-CelebA folder under ``base`` and return ``base``."""
    image_dir = base / "img_align_celeba"
    image_dir.mkdir(parents=True)
    for name, color in COLORS.items():
        PIL.Image.new("RGB", (178, 218), color).save(image_dir / name, quality=95)
    (image_dir / "000004.jpg").write_bytes(b"\xff\xd8 definitely not a jpeg")
    (base / "list_eval_partition.txt").write_text("".join(f"{k} {v}\n" for k, v in PARTITION.items()))
    return base


def test_load_counts_warning_and_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_celeba(tmp_path / "data")
    cache = tmp_path / "cache"
    with pytest.warns(UserWarning) as record:
        low, high, names = load_split(root, "train", cache)
    msgs = [str(w.message) for w in record]
    assert len(msgs) == 1 and "skipped 1 " in msgs[0] and "000004.jpg" in msgs[0]
    assert names == ["000001.jpg", "000002.jpg"]
    assert low.shape == (2, 8, 8, 3) and high.shape == (2, 32, 32, 3)
    assert low.dtype == high.dtype == torch.uint8
    expected = torch.tensor(COLORS["000001.jpg"], dtype=torch.float32)
    assert (high[0].float() - expected).abs().max() <= 4  # uniform color survives JPEG + resize
    assert len(list(cache.glob("*.pt"))) == 1

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("JPEG decoded despite the cache")

    monkeypatch.setattr(PIL.Image, "open", fail)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low2, high2, names2 = load_split(root, "train", cache)
    assert torch.equal(low, low2) and torch.equal(high, high2) and names2 == names
    with pytest.raises(AssertionError, match="despite the cache"):
        load_split(root, "train", cache, limit=1)  # different key -> decodes again


def test_val_limit_and_no_cache(tmp_path: Path) -> None:
    root = make_celeba(tmp_path)
    low, _, names = load_split(root, "val", None)
    assert names == ["000003.jpg"] and low.shape == (1, 8, 8, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stops before reaching the corrupt file
        _, high1, names1 = load_split(root, "train", tmp_path / "c", limit=1)
    assert names1 == ["000001.jpg"] and high1.shape == (1, 32, 32, 3)
    with pytest.warns(UserWarning, match="skipped 1"):
        _, _, names3 = load_split(root, "train", tmp_path / "c", limit=3)
    assert names3 == ["000001.jpg", "000002.jpg"]


def test_torchvision_layout(tmp_path: Path) -> None:
    make_celeba(tmp_path / "celeba")
    image_dir, partition = find_celeba(tmp_path)
    assert image_dir == tmp_path / "celeba" / "img_align_celeba"
    assert partition == tmp_path / "celeba" / "list_eval_partition.txt"
    _, _, names = load_split(tmp_path, "val", tmp_path / "cache")
    assert names == ["000003.jpg"]


def test_plain_layout(tmp_path: Path) -> None:
    make_celeba(tmp_path)
    assert find_celeba(tmp_path) == (tmp_path / "img_align_celeba", tmp_path / "list_eval_partition.txt")


def test_missing_folder_message(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        find_celeba(tmp_path / "nowhere")
    msg = str(info.value)
    assert "torchvision layout" in msg and "plain layout" in msg
    assert str(tmp_path / "nowhere" / "celeba" / "img_align_celeba") in msg
    assert str(tmp_path / "nowhere" / "list_eval_partition.txt") in msg
    assert "\n" not in msg and "that folder does not exist" in msg
    (tmp_path / "img_align_celeba").mkdir()  # folder without partition file
    with pytest.raises(FileNotFoundError, match="plain layout") as info:
        load_split(tmp_path, "train", None)
    assert f"found only {tmp_path / 'img_align_celeba'}" in str(info.value)
    with pytest.raises(FileNotFoundError, match="plain layout"):
        check_split(tmp_path, "train")


def test_split_without_images_and_bad_split(tmp_path: Path) -> None:
    root = make_celeba(tmp_path)
    with pytest.raises(FileNotFoundError, match="'test'") as info:
        load_split(root, "test", None)
    assert "img_align_celeba" in str(info.value)
    with pytest.raises(ValueError, match="unknown split"):
        load_split(root, "validation", None)
    assert check_split(root, "train") == 3  # present in the folder (one of them corrupt: not decoded here)
    with pytest.raises(FileNotFoundError, match="'test'"):
        check_split(root, "test")
