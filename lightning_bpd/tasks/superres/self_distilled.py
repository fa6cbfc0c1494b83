"""Self-distilled image targets: a base model's own greedy super-resolutions of the training faces.

The accepted block measures agreement with the base's *own* greedy output, so heads trained on it
propose what verification accepts (on Multi30k, self-distilled targets took k=8 from 1.60 to 2.84
frozen). ``python -m lightning_bpd distill --ckpt <base.ckpt> --out <dir>`` on a super-resolution
checkpoint decodes the training split greedily, in shards written atomically to ``<dir>/shards/``
(a killed run resumes at the first missing shard), then merges them into ``<dir>/train_targets.pt``:
the 32x32 images (uint8), with a fingerprint of the 8x8 inputs they belong to. ``fit`` trains on
them with ``--data.init_args.distilled=<dir>``: the training split's targets are replaced, the inputs,
validation and test stay gold.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from lightning_bpd.decoding import greedy_decode
from lightning_bpd.tasks.superres.module import HIGH, TARGET_LEN
from lightning_bpd.tasks.superres.pixels import image_to_tokens, tokens_to_image

TARGETS = "train_targets.pt"


def fingerprint(low: Tensor) -> str:
    """A short hash of input images (N, 8, 8, 3) uint8: which faces, in which order."""
    return hashlib.sha1(low.contiguous().numpy().tobytes()).hexdigest()[:16]


def shard_file(out: Path, i: int) -> Path:
    return out / "shards" / f"train.{i:05d}.pt"


@torch.no_grad()
def greedy_images(model, low: Tensor, batch_size: int) -> Tensor:
    """Greedy super-resolutions (N, 32, 32, 3) uint8 of inputs ``low`` (N, 8, 8, 3) uint8."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, low.shape[0], batch_size):
        src = image_to_tokens(low[start : start + batch_size]).to(device)  # (b, 192)
        tokens = greedy_decode(model, src, TARGET_LEN).tokens.cpu()  # (b, 3072)
        out.append(tokens_to_image(tokens, HIGH[0], HIGH[1]))
    return torch.cat(out).to(torch.uint8)


def distill_images(model, low: Tensor, out: Path, batch_size: int, shard_size: int,
                   progress: Callable[[str], object] = lambda line: print(line, file=sys.stderr, flush=True)) -> Tensor:
    """Decode every unfinished shard of ``low`` (N, 8, 8, 3), then merge all shards into
    ``out/train_targets.pt``; returns the targets (N, 32, 32, 3) uint8."""
    (out / "shards").mkdir(parents=True, exist_ok=True)
    n_shards = -(-low.shape[0] // shard_size)
    start = time.perf_counter()
    for i in range(n_shards):
        path = shard_file(out, i)
        if path.is_file():
            continue
        chunk = low[i * shard_size : (i + 1) * shard_size]
        high = greedy_images(model, chunk, batch_size)
        tmp = path.with_suffix(".tmp")
        torch.save({"high": high, "inputs": fingerprint(chunk)}, tmp)
        os.replace(tmp, path)  # a shard exists only when it is complete
        done = min((i + 1) * shard_size, low.shape[0])
        progress(f"distill: shard {i + 1}/{n_shards} ({done}/{low.shape[0]} faces, "
                 f"{time.perf_counter() - start:.0f} s this run)")
    parts = []
    for i in range(n_shards):
        shard = torch.load(shard_file(out, i), weights_only=True)
        chunk = low[i * shard_size : (i + 1) * shard_size]
        if shard["inputs"] != fingerprint(chunk):
            raise ValueError(f"{shard_file(out, i)} was decoded from other faces (another split, limit or "
                             f"--shard-size): delete {out / 'shards'} and run again")
        parts.append(shard["high"])
    high = torch.cat(parts)
    torch.save({"high": high, "inputs": fingerprint(low)}, out / TARGETS)
    return high


def targets_file(folder: str | Path) -> Path:
    """``folder``'s merged targets file; one clear error if ``distill`` has not made it."""
    path = Path(folder) / TARGETS
    if not path.is_file():
        raise FileNotFoundError(f"data.distilled: no {path}; make it with python -m lightning_bpd distill "
                                f"--ckpt <base.ckpt> --out {folder}")
    return path


def load_targets(folder: str | Path, low: Tensor) -> Tensor:
    """The distilled targets (N, 32, 32, 3) uint8 in ``folder`` for the training inputs ``low`` (N, 8, 8, 3);
    one clear error if they are missing or belong to other faces."""
    path = targets_file(folder)
    saved = torch.load(path, weights_only=True)
    high = saved["high"]
    if high.shape[0] != low.shape[0] or saved["inputs"] != fingerprint(low):
        raise ValueError(f"data.distilled: {path} holds the greedy outputs of {high.shape[0]} other training faces "
                         f"than the {low.shape[0]} of this data (root, train split, limits and seed must be those "
                         f"it was distilled from)")
    return high
