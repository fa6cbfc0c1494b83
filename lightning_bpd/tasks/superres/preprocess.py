"""Tensor2Tensor ``img2img_celeba`` preprocessing: aligned CelebA face -> (8x8 input, 32x32 target).

Following T2T's ``Img2imgCeleba.preprocess_example``, the 138x138 box at top 40, left 20 of an aligned 178x218
(W x H) face is cropped (rows 40..177, columns 20..157), then area-resized to 8x8 (model input) and 32x32 (target).

Differences from T2T worth knowing: the area resize here is ``torch.nn.functional.interpolate(mode="area")``
(= adaptive average pooling). For ratios that are not integers (138/8, 138/32) its windows are whole pixels with
floor/ceil bounds, while TF's AREA weights fractional border pixels, so values can differ by a few intensity levels.
Results are rounded to the nearest integer (T2T truncates with ``to_int64``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["CROP_LEFT", "CROP_SIZE", "CROP_TOP", "HIGH_SIZE", "LOW_SIZE", "area_resize", "crop_face", "preprocess"]

CROP_TOP = 40
CROP_LEFT = 20
CROP_SIZE = 138
LOW_SIZE = 8
HIGH_SIZE = 32


def crop_face(img: torch.Tensor) -> torch.Tensor:
    """Crop the T2T face box from ``(..., H, W, 3)`` images -> ``(..., 138, 138, 3)``.

    Raises ValueError if the image is smaller than the box (needs H >= 178, W >= 158).
    """
    if img.dim() < 3 or img.shape[-1] != 3:
        raise ValueError(f"expected an RGB image of shape (..., H, W, 3), got {tuple(img.shape)}")
    height, width = img.shape[-3], img.shape[-2]
    need_h, need_w = CROP_TOP + CROP_SIZE, CROP_LEFT + CROP_SIZE
    if height < need_h or width < need_w:
        raise ValueError(
            f"image of size {height}x{width} (HxW) is smaller than the crop box: rows {CROP_TOP}..{need_h - 1}, "
            f"columns {CROP_LEFT}..{need_w - 1} need at least {need_h}x{need_w} (aligned CelebA is 218x178)"
        )
    return img[..., CROP_TOP:need_h, CROP_LEFT:need_w, :]


def area_resize(img: torch.Tensor, size: int) -> torch.Tensor:
    """Area-resize uint8 ``(..., H, W, 3)`` images to ``(..., size, size, 3)`` uint8 (float average, rounded)."""
    lead = img.shape[:-3]
    x = img.reshape(-1, *img.shape[-3:]).permute(0, 3, 1, 2).float()  # (B, 3, H, W)
    y = F.interpolate(x, size=(size, size), mode="area")  # (B, 3, size, size)
    y = y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)  # (B, size, size, 3)
    return y.reshape(*lead, size, size, 3).contiguous()


def preprocess(img: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Aligned face uint8 ``(H, W, 3)`` -> ``(low (8, 8, 3), high (32, 32, 3))`` uint8.

    Leading batch dimensions are also accepted: ``(N, H, W, 3)`` -> ``((N, 8, 8, 3), (N, 32, 32, 3))``.
    """
    if img.dtype != torch.uint8:
        raise TypeError(f"preprocess expects a uint8 image, got {img.dtype}")
    face = crop_face(img)  # (..., 138, 138, 3)
    return area_resize(face, LOW_SIZE), area_resize(face, HIGH_SIZE)
