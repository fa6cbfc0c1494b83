"""Tests for the image token conventions."""

from __future__ import annotations

import math

import torch

from lightning_bpd.tasks.superres import pixels


def test_constants() -> None:
    assert (pixels.PAD_ID, pixels.BOS_ID, pixels.EOS_ID, pixels.OFFSET) == (0, 1, 2, 3)
    assert pixels.VOCAB_SIZE == 259


def test_round_trip_and_layout() -> None:
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (2, 4, 5, 3), generator=g, dtype=torch.uint8)  # (B, H, W, 3)
    tokens = pixels.image_to_tokens(img)
    assert tokens.shape == (2, 4 * 5 * 3) and tokens.dtype == torch.long
    assert int(tokens.min()) >= pixels.OFFSET and int(tokens.max()) < pixels.VOCAB_SIZE
    height, width = 4, 5
    for r, c, ch in [(0, 0, 0), (1, 3, 2), (3, 4, 1), (2, 0, 2)]:
        assert tokens[1, (r * width + c) * 3 + ch] == int(img[1, r, c, ch]) + pixels.OFFSET
    assert torch.equal(pixels.tokens_to_image(tokens, height, width), img)
    # no batch dim
    assert torch.equal(pixels.tokens_to_image(pixels.image_to_tokens(img[0]), height, width), img[0])


def test_tokens_to_image_clamps_specials() -> None:
    tokens = torch.tensor([pixels.PAD_ID, pixels.BOS_ID, pixels.EOS_ID, pixels.OFFSET + 7, 1000, pixels.VOCAB_SIZE - 1])
    img = pixels.tokens_to_image(tokens, 1, 2)
    assert img.dtype == torch.uint8 and img.shape == (1, 2, 3)
    assert img.reshape(-1).tolist() == [0, 0, 0, 7, 255, 255]


def test_intensity_values() -> None:
    values = pixels.intensity_values()
    assert values.shape == (259,) and values.dtype == torch.float64
    assert all(math.isnan(v) for v in values[: pixels.OFFSET].tolist())
    assert torch.equal(values[pixels.OFFSET :], torch.arange(256, dtype=torch.float64))
    img = torch.tensor([[[10, 200, 255]]], dtype=torch.uint8)
    assert values[pixels.image_to_tokens(img)].tolist() == [10.0, 200.0, 255.0]
