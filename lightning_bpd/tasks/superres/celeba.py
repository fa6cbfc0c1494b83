"""CelebA loader for the 8x8 -> 32x32 super-resolution task.

Reads the aligned JPEGs (``img_align_celeba/``) and the official ``list_eval_partition.txt``, keeps the entries of
the requested split that are actually present in the folder (partial copies are fine), decodes them with PIL, applies
the T2T preprocessing of :mod:`.preprocess` and caches the resulting uint8 tensors as one ``.pt`` file.

``torchvision.datasets.CelebA`` is deliberately not used: it insists on the attribute, identity, bbox and landmark
files and on the full image set (integrity checks), none of which this task needs, so plain PIL is simpler.
"""

from __future__ import annotations

import hashlib
import logging
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from lightning_bpd.tasks.superres.preprocess import HIGH_SIZE, LOW_SIZE, preprocess

__all__ = ["IMAGE_DIR", "PARTITION_FILE", "SPLITS", "check_split", "find_celeba", "load_split", "read_partition"]

log = logging.getLogger(__name__)

IMAGE_DIR = "img_align_celeba"
PARTITION_FILE = "list_eval_partition.txt"
SPLITS = {"train": 0, "val": 1, "test": 2}
CACHE_VERSION = 1  # bump when preprocessing changes
_MAX_NAMES_IN_WARNING = 5


def find_celeba(root: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Locate ``(image_dir, partition_file)`` under ``root``.

    Accepts torchvision's layout (``root/celeba/img_align_celeba/`` + ``root/celeba/list_eval_partition.txt``) and
    the plain layout (``root/img_align_celeba/`` + ``root/list_eval_partition.txt``), in that order.
    """
    root = Path(root).expanduser()
    for base in (root / "celeba", root):
        image_dir, partition = base / IMAGE_DIR, base / PARTITION_FILE
        if image_dir.is_dir() and partition.is_file():
            return image_dir, partition
    if not root.is_dir():
        found = "that folder does not exist"
    else:
        present = [str(p) for base in (root / "celeba", root) for p in (base / IMAGE_DIR, base / PARTITION_FILE)
                   if p.exists()]
        found = f"found only {', '.join(present)}" if present else "neither is there"
    raise FileNotFoundError(
        f"CelebA not found under {root} ({found}): expected the torchvision layout "
        f"{root / 'celeba' / IMAGE_DIR}/ and {root / 'celeba' / PARTITION_FILE}, or the plain layout "
        f"{root / IMAGE_DIR}/ and {root / PARTITION_FILE}; check data.root"
    )


def check_split(root: str | os.PathLike[str], split: str) -> int:
    """Fail (one line: the folder, the partition file or the split's images missing) unless ``root`` holds CelebA
    images of ``split``; else the number of them. Decodes nothing."""
    image_dir, partition_file = find_celeba(root)
    return len(_split_files(image_dir, partition_file, split))


def read_partition(partition_file: str | os.PathLike[str]) -> dict[str, int]:
    """Parse ``list_eval_partition.txt`` (``NNNNNN.jpg <0|1|2>`` per line, LF or CRLF) into ``{name: partition}``."""
    entries: dict[str, int] = {}
    with open(partition_file, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 2 or parts[1] not in ("0", "1", "2"):
                raise ValueError(f"{partition_file}:{lineno}: expected '<file name> <0|1|2>', got {line.strip()!r}")
            entries[parts[0]] = int(parts[1])
    return entries


def _split_files(image_dir: Path, partition_file: Path, split: str) -> list[str]:
    """Names (partition order) of the split's entries present in ``image_dir``."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {sorted(SPLITS)}")
    present = set(os.listdir(image_dir))
    wanted = SPLITS[split]
    names = [name for name, part in read_partition(partition_file).items() if part == wanted and name in present]
    if not names:
        raise FileNotFoundError(
            f"no images of split {split!r} (partition {wanted}) from {partition_file} are present in {image_dir}"
        )
    return names


def _decode(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode one JPEG and preprocess it -> (low (8, 8, 3), high (32, 32, 3)); raises OSError/ValueError if bad."""
    with Image.open(path) as im:
        rgb = np.asarray(im.convert("RGB"), dtype=np.uint8)  # (H, W, 3)
    return preprocess(torch.from_numpy(rgb.copy()))


def _cache_path(cache_dir: Path, root: Path, split: str, limit: int | None, num_files: int) -> Path:
    key = f"v{CACHE_VERSION}|{root.resolve()}|{split}|{limit}|{num_files}"
    digest = hashlib.sha1(key.encode()).hexdigest()[:16]
    return cache_dir / f"celeba_{split}_{digest}.pt"


def load_split(
    root: str | os.PathLike[str],
    split: str,
    cache_dir: str | os.PathLike[str] | None,
    limit: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Load a CelebA split as ``(low (N, 8, 8, 3), high (N, 32, 32, 3), names)``, uint8.

    Images are taken in partition-file order; ``limit`` caps N at the first ``limit`` readable images. Unreadable
    images are skipped with one warning. With ``cache_dir`` set, results are cached there keyed by (resolved root,
    split, limit, number of present files), so later calls skip JPEG decoding; ``None`` disables caching.
    """
    if limit is not None and limit <= 0:
        raise ValueError(f"limit must be positive or None, got {limit}")
    root = Path(root).expanduser()
    image_dir, partition_file = find_celeba(root)
    names = _split_files(image_dir, partition_file, split)

    cache_file = None
    if cache_dir is not None:
        cache_file = _cache_path(Path(cache_dir), root, split, limit, len(names))
        if cache_file.is_file():
            data = torch.load(cache_file, map_location="cpu", weights_only=True)
            log.info("loaded CelebA %s split (%d images) from cache %s", split, len(data["names"]), cache_file)
            return data["low"], data["high"], list(data["names"])

    lows: list[torch.Tensor] = []
    highs: list[torch.Tensor] = []
    kept: list[str] = []
    bad: list[str] = []
    for name in names:
        if limit is not None and len(kept) >= limit:
            break
        try:
            low, high = _decode(image_dir / name)
        except (OSError, ValueError, Image.DecompressionBombError) as err:
            log.debug("skipping %s: %s", name, err)
            bad.append(name)
            continue
        lows.append(low)
        highs.append(high)
        kept.append(name)
    if bad:
        shown = ", ".join(bad[:_MAX_NAMES_IN_WARNING]) + (", ..." if len(bad) > _MAX_NAMES_IN_WARNING else "")
        msg = f"skipped {len(bad)} unreadable CelebA image(s) in {image_dir} ({split} split): {shown}"
        warnings.warn(msg, stacklevel=2)
    if not kept:
        raise ValueError(f"none of the {len(names)} images of split {split!r} in {image_dir} could be read")

    low_t = torch.stack(lows)  # (N, 8, 8, 3)
    high_t = torch.stack(highs)  # (N, 32, 32, 3)
    assert low_t.shape[1:] == (LOW_SIZE, LOW_SIZE, 3) and high_t.shape[1:] == (HIGH_SIZE, HIGH_SIZE, 3)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_name(f"{cache_file.name}.{os.getpid()}.tmp")
        torch.save({"low": low_t, "high": high_t, "names": kept}, tmp)
        os.replace(tmp, cache_file)
        log.info("cached CelebA %s split (%d images) at %s", split, len(kept), cache_file)
    return low_t, high_t, kept
