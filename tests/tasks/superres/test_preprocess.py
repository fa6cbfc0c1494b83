"""Tests for the T2T CelebA crop + area resize."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.tasks.superres.preprocess import area_resize, crop_face, preprocess


def test_crop_box_coordinates() -> None:
    img = torch.zeros(218, 178, 3, dtype=torch.uint8)
    img[:] = torch.tensor([255, 0, 0], dtype=torch.uint8)  # outside color
    img[40:178, 20:158] = torch.tensor([10, 120, 230], dtype=torch.uint8)  # inside the 138x138 box
    crop = crop_face(img)
    assert crop.shape == (138, 138, 3)
    low, high = preprocess(img)
    assert low.shape == (8, 8, 3) and high.shape == (32, 32, 3)
    assert low.dtype == high.dtype == torch.uint8
    for out in (low, high):
        assert torch.equal(out.reshape(-1, 3).unique(dim=0), torch.tensor([[10, 120, 230]], dtype=torch.uint8))


def test_crop_box_edges_are_included() -> None:
    img = torch.zeros(218, 178, 3, dtype=torch.uint8)
    img[40, 20] = 255  # first pixel of the box
    img[177, 157] = 200  # last pixel of the box
    img[39, 20] = img[40, 19] = img[178, 157] = img[177, 158] = 99  # just outside
    crop = crop_face(img)
    assert int(crop[0, 0, 0]) == 255 and int(crop[-1, -1, 0]) == 200
    assert int((crop == 99).sum()) == 0


def test_area_resize_is_block_mean() -> None:
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (2, 16, 16, 3), generator=g, dtype=torch.uint8)
    out = area_resize(img, 4)  # (2, 4, 4, 3)
    mean = img.float().reshape(2, 4, 4, 4, 4, 3).mean(dim=(2, 4))  # blocks of 4x4
    assert torch.equal(out, mean.round().to(torch.uint8))


def test_batched_matches_single() -> None:
    g = torch.Generator().manual_seed(1)
    imgs = torch.randint(0, 256, (3, 218, 178, 3), generator=g, dtype=torch.uint8)
    low, high = preprocess(imgs)
    assert low.shape == (3, 8, 8, 3) and high.shape == (3, 32, 32, 3)
    low1, high1 = preprocess(imgs[1])
    assert torch.equal(low[1], low1) and torch.equal(high[1], high1)


def test_too_small_raises() -> None:
    with pytest.raises(ValueError, match="smaller than the crop box"):
        preprocess(torch.zeros(177, 178, 3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="smaller than the crop box"):
        preprocess(torch.zeros(218, 157, 3, dtype=torch.uint8))
    low, _ = preprocess(torch.zeros(178, 158, 3, dtype=torch.uint8))  # exactly the box extent is fine
    assert low.shape == (8, 8, 3)
