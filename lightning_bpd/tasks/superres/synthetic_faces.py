"""Procedurally drawn face-like images: the built-in default data of the super-resolution task.

This is **synthetic smoke data, not a benchmark**: cartoon faces (background gradient, clothes, neck, ears, head
ellipse in a range of skin tones, several hair styles and colours, eyes with whites and coloured irises, eyebrows,
nose shading, mouth, optional glasses and beard), rounded head shading, a directional lighting gradient and a little
pixel noise. Faces are drawn on an aligned-CelebA-sized 178x218 canvas with PIL and go through the same
:func:`~lightning_bpd.tasks.superres.preprocess.preprocess` as CelebA, so 8x8/32x32 pairs are produced identically.

Face ``i`` for seed ``s`` is drawn from ``numpy.random.default_rng([s, i])``, so outputs are deterministic and a
shorter run is a prefix of a longer one. Split ``k`` (train=0, val=1, test=2) uses seed ``3 * seed + k``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw

from lightning_bpd.tasks.superres.preprocess import preprocess

__all__ = ["CANVAS_H", "CANVAS_W", "GENERATOR_VERSION", "generate_faces", "synthetic_split"]

GENERATOR_VERSION = 1
CANVAS_W, CANVAS_H = 178, 218
SPLITS = {"train": 0, "val": 1, "test": 2}
_CHUNK = 256

SKIN = np.array(
    [(255, 224, 196), (241, 194, 167), (224, 172, 138), (198, 134, 103), (165, 114, 82), (125, 84, 58), (90, 60, 42)],
    dtype=np.float64,
)
HAIR = np.array(
    [
        (28, 24, 22),
        (55, 38, 28),
        (95, 64, 40),
        (130, 70, 38),
        (190, 150, 90),
        (225, 200, 140),
        (150, 148, 145),
        (215, 212, 205),
    ],
    dtype=np.float64,
)
HAIR_P = np.array([0.25, 0.22, 0.16, 0.08, 0.1, 0.07, 0.07, 0.05])
IRIS = np.array([(70, 45, 25), (40, 28, 20), (70, 110, 160), (80, 115, 70), (115, 90, 50)], dtype=np.float64)

_YY = np.arange(CANVAS_H, dtype=np.float32)[:, None]  # (218, 1)
_XX = np.arange(CANVAS_W, dtype=np.float32)[None, :]  # (1, 178)


def _rgb(c: np.ndarray) -> tuple[int, int, int]:
    c = np.clip(np.round(c), 0, 255).astype(int)
    return int(c[0]), int(c[1]), int(c[2])


def _background(rng: np.random.Generator) -> np.ndarray:
    """Solid, linear-gradient or radial background, float32 (H, W, 3)."""
    c0, c1 = rng.uniform(20, 235, 3), rng.uniform(20, 235, 3)
    kind = rng.integers(3)
    if kind == 0:
        return np.broadcast_to(c0.astype(np.float32), (CANVAS_H, CANVAS_W, 3))
    elif kind == 1:
        ang = rng.uniform(0, 2 * np.pi)
        t = float(np.cos(ang)) * _XX / CANVAS_W + float(np.sin(ang)) * _YY / CANVAS_H
        t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    else:
        t = np.hypot(_XX - CANVAS_W / 2, _YY - CANVAS_H / 2) / 140.0
    t = np.clip(t, 0, 1)[..., None]  # (218, 178, 1)
    return (c0.astype(np.float32) + (c1 - c0).astype(np.float32) * t).astype(np.float32)


def _draw_face(rng: np.random.Generator) -> np.ndarray:
    """Draw one face, uint8 (218, 178, 3)."""
    img = Image.fromarray(_background(rng).astype(np.uint8))
    d = ImageDraw.Draw(img)
    cx = CANVAS_W / 2 + rng.uniform(-6, 6)
    cy = 112 + rng.uniform(-5, 5)
    s = rng.uniform(0.92, 1.08)
    a, b = 45 * s * rng.uniform(0.93, 1.07), 59 * s * rng.uniform(0.96, 1.04)  # head semi-axes (canvas px)
    k = b / 50  # scale for small absolute sizes
    i = rng.uniform(0, len(SKIN) - 1)
    skin = SKIN[int(i)] + (SKIN[min(int(i) + 1, len(SKIN) - 1)] - SKIN[int(i)]) * (i % 1)
    skin_dark = skin * 0.8
    hair = HAIR[rng.choice(len(HAIR), p=HAIR_P)] * rng.uniform(0.85, 1.1)
    style = rng.integers(6)  # 0 short, 1 long, 2 bob, 3 bangs, 4 curly, 5 receding
    hairline = cy - b * rng.uniform(0.4, 0.55) + (10 if style == 3 else 0) - (8 if style == 5 else 0)

    # clothes, neck
    cloth = _rgb(rng.uniform(15, 230, 3))
    d.ellipse((cx - 80, cy + b + 18, cx + 80, cy + b + 120), fill=cloth)
    d.rectangle((cx - 0.45 * a, cy + 0.5 * b, cx + 0.45 * a, cy + b + 35), fill=_rgb(skin_dark))
    # hair behind the head
    if style in (1, 2):
        bottom = cy + b + (45 if style == 1 else 5)
        d.rounded_rectangle((cx - a - 10, cy - b - 8, cx + a + 10, bottom), radius=int(a), fill=_rgb(hair))
    elif style == 4:
        for _ in range(22):
            ang = rng.uniform(np.pi * 0.85, np.pi * 2.15)
            r = rng.uniform(8, 16)
            px, py = cx + (a + 2) * np.cos(ang), cy - b * 0.25 + (b * 0.85) * np.sin(ang)
            d.ellipse((px - r, py - r, px + r, py + r), fill=_rgb(hair * rng.uniform(0.85, 1.1)))
    # ears, head (darker rim + lighter core for some roundness)
    for side in (-1, 1):
        ex = cx + side * a * 0.97
        d.ellipse((ex - 7 * k, cy - 14 * k, ex + 7 * k, cy + 10 * k), fill=_rgb(skin_dark))
    d.ellipse((cx - a, cy - b, cx + a, cy + b), fill=_rgb(skin * 0.9))
    d.ellipse((cx - a * 0.85, cy - b * 0.9, cx + a * 0.85, cy + b * 0.85), fill=_rgb(skin))
    # hair cap over the top of the head, then a rounded forehead to shape the hairline
    if style != 5 or rng.random() < 0.6:
        vol = rng.uniform(3, 12) if style != 5 else 1
        top = cy - b - vol
        d.chord((cx - a - 4, top, cx + a + 4, 2 * hairline - top), 180, 360, fill=_rgb(hair))
        if style == 0 or style == 4:
            for side in (-1, 1):  # sideburns
                sx = cx + side * a * 0.86
                d.rectangle((sx - 3 * k, hairline, sx + 3 * k, cy - b * 0.15), fill=_rgb(hair))
        if style != 3:
            fw = a * rng.uniform(0.6, 0.8)
            d.ellipse((cx - fw, hairline - rng.uniform(4, 10), cx + fw, hairline + b), fill=_rgb(skin))
    else:
        d.ellipse((cx - a * 0.85, cy - b * 0.9, cx + a * 0.85, cy + b * 0.85), fill=_rgb(skin))

    # eyes, eyebrows
    ey = cy - b * 0.08 + rng.uniform(-3, 3)
    dx = a * rng.uniform(0.4, 0.47)
    ew, eh = a * rng.uniform(0.2, 0.25), k * rng.uniform(3.5, 5.0)
    iris = _rgb(IRIS[rng.integers(len(IRIS))])
    brow = _rgb(hair * 0.7 if hair.mean() < 150 else skin * 0.55)
    brow_w = int(rng.integers(3, 6))
    gaze = rng.uniform(-1.5, 1.5)
    for side in (-1, 1):
        ex = cx + side * dx
        d.ellipse((ex - ew, ey - eh, ex + ew, ey + eh), fill=(245, 245, 240))
        ir = eh * 0.95
        d.ellipse((ex + gaze - ir, ey - ir, ex + gaze + ir, ey + ir), fill=iris)
        d.ellipse((ex + gaze - ir * 0.45, ey - ir * 0.45, ex + gaze + ir * 0.45, ey + ir * 0.45), fill=(10, 10, 10))
        by = ey - eh - k * rng.uniform(4, 7)
        d.line(
            (ex - side * ew * 0.9, by + 1, ex + side * ew * 0.4, by - 2, ex + side * ew * 1.2, by + 2),
            fill=brow,
            width=brow_w,
            joint="curve",
        )
    if rng.random() < 0.1:  # glasses
        frame = _rgb(rng.uniform(10, 120, 3))
        for side in (-1, 1):
            ex = cx + side * dx
            d.rounded_rectangle((ex - ew - 5, ey - eh - 5, ex + ew + 5, ey + eh + 6), radius=5, outline=frame, width=2)
        d.line((cx - dx + ew + 5, ey - 1, cx + dx - ew - 5, ey - 1), fill=frame, width=2)

    # nose: shaded side, tip, nostrils
    ny = cy + b * rng.uniform(0.22, 0.3)
    nw = a * rng.uniform(0.14, 0.2)
    light = rng.choice((-1, 1))
    d.polygon(((cx, ey + 2), (cx + light * 3, ey + 2), (cx + light * nw, ny), (cx, ny + 2)), fill=_rgb(skin * 0.82))
    d.ellipse((cx - nw, ny - 4, cx + nw, ny + 5), fill=_rgb(skin * 0.9))
    for side in (-1, 1):
        d.ellipse((cx + side * nw * 0.55 - 2.5, ny + 1, cx + side * nw * 0.55 + 2.5, ny + 4), fill=_rgb(skin * 0.5))

    # mouth
    my = cy + b * rng.uniform(0.52, 0.6)
    mw = a * rng.uniform(0.3, 0.42)
    lip = _rgb(skin * np.array([0.85, 0.55, 0.55]) * rng.uniform(0.8, 1.0))
    if rng.random() < 0.4:  # open smile with teeth
        d.chord((cx - mw, my - 8, cx + mw, my + 9), 0, 180, fill=lip)
        d.chord((cx - mw * 0.8, my - 5, cx + mw * 0.8, my + 6), 0, 180, fill=(235, 230, 220))
    else:
        d.ellipse((cx - mw, my - 3.5, cx + mw, my + 4), fill=lip)
        d.line((cx - mw, my, cx + mw, my), fill=_rgb(skin * 0.4), width=1)
    if style in (0, 4, 5) and rng.random() < 0.3:  # beard
        d.chord((cx - a * 0.95, cy - b * 0.2, cx + a * 0.95, cy + b * 1.04), 20, 160, fill=_rgb(hair))
        d.ellipse((cx - mw - 1, my - 4.5, cx + mw + 1, my + 5), fill=lip)

    # rounded shading of the head, directional lighting, noise
    out = np.asarray(img, dtype=np.float32)  # (218, 178, 3)
    rho2 = ((_XX - cx) / a) ** 2 + ((_YY - cy) / b) ** 2
    shade = np.where(rho2 < 1.0, 1.0 - 0.22 * rho2 * rho2, 1.0).astype(np.float32)  # (218, 178)
    ang = rng.uniform(0, 2 * np.pi)
    strength = rng.uniform(0.1, 0.45)
    grad = 1.0 + strength * (float(np.cos(ang)) * (_XX - cx) / 90 + float(np.sin(ang)) * (_YY - cy) / 110)
    out = out * (shade * grad * rng.uniform(0.8, 1.15))[..., None]
    out += rng.standard_normal(out.shape, dtype=np.float32) * np.float32(rng.uniform(2, 8))
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)  # +0.5 then truncation = rounding (values >= 0 after clip)


def _faces(seed: int, start: int, stop: int) -> torch.Tensor:
    """Faces ``start..stop-1`` of seed ``seed``, uint8 (stop - start, 218, 178, 3)."""
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    arr = np.stack([_draw_face(np.random.default_rng([seed, i])) for i in range(start, stop)])
    return torch.from_numpy(arr)


def generate_faces(n: int, seed: int = 0) -> torch.Tensor:
    """Draw ``n`` synthetic aligned faces, uint8 ``(n, 218, 178, 3)``; deterministic in ``seed``."""
    if n < 0:
        raise ValueError(f"n must be non-negative, got {n}")
    if n == 0:
        return torch.zeros(0, CANVAS_H, CANVAS_W, 3, dtype=torch.uint8)
    return _faces(seed, 0, n)


def synthetic_split(
    split: str, n: int, seed: int = 0, cache_dir: str | os.PathLike[str] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Preprocessed synthetic split ``(low (n, 8, 8, 3), high (n, 32, 32, 3))`` uint8.

    Split ``split`` uses faces of seed ``3 * seed + SPLITS[split]``, so train/val/test never share a face.
    With ``cache_dir`` set, the result is cached there as a ``.pt`` file.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    if n <= 0:
        raise ValueError(f"n must be positive, got {n}")
    split_seed = 3 * seed + SPLITS[split]
    cache_file = None
    if cache_dir is not None:
        key = f"v{GENERATOR_VERSION}|{split}|{n}|{seed}"
        cache_file = Path(cache_dir) / f"synthetic_faces_{split}_{hashlib.sha1(key.encode()).hexdigest()[:16]}.pt"
        if cache_file.is_file():
            data = torch.load(cache_file, map_location="cpu", weights_only=True)
            return data["low"], data["high"]
    lows, highs = [], []
    for start in range(0, n, _CHUNK):
        low, high = preprocess(_faces(split_seed, start, min(n, start + _CHUNK)))
        lows.append(low)  # (chunk, 8, 8, 3)
        highs.append(high)  # (chunk, 32, 32, 3)
    low_t, high_t = torch.cat(lows), torch.cat(highs)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp")
        torch.save({"low": low_t, "high": high_t}, tmp)
        os.replace(tmp, cache_file)
    return low_t, high_t
