"""A folder of UTF-8 text or source files -> the texts of each split. Lightning- and tokenizer-free.

``root`` with a ``train/`` folder: ``train/``, ``val/`` and ``test/`` are the splits (every file under each, at any
depth). Otherwise every file under ``root`` goes to one split by a hash of its relative path (fixed: a file keeps its
split however the folder grows). Hidden files and folders (a name starting with ``.``) are left out. A binary file (a
NUL byte) or one that is not UTF-8 is skipped and counted: one warning line per split, not a crash.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger("lightning_bpd")

SPLITS = ("train", "val", "test")


@dataclass
class SplitTexts:
    """The readable files of one split: ``names`` (paths relative to the data root) and their ``texts``; ``skipped``
    counts the binary or non-UTF-8 files left out."""

    names: list[str] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    skipped: int = 0


def listed(folder: Path, suffixes: tuple[str, ...] | None) -> list[Path]:
    """Every regular file under ``folder`` (sorted, hidden names left out), of the given suffixes if any."""
    files = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts) or not path.is_file():
            continue
        if suffixes is None or path.suffix in suffixes:
            files.append(path)
    return files


def hash_split(rel: str, val_fraction: float, test_fraction: float) -> str:
    """The split of a file by the SHA-1 of its relative path (POSIX form): a fixed draw in [0, 1)."""
    u = int(hashlib.sha1(rel.encode("utf-8")).hexdigest()[:8], 16) / 2**32
    return "val" if u < val_fraction else "test" if u < val_fraction + test_fraction else "train"


def split_files(root: Path, val_fraction: float, test_fraction: float,
                suffixes: tuple[str, ...] | None = None) -> dict[str, list[Path]]:
    """The files of each split under ``root`` (see the module docstring); ValueError (one line) for a missing or
    empty folder."""
    if not root.is_dir():
        raise ValueError(f"data.root: {root} is not a folder (a folder of UTF-8 text or source files is expected)")
    if (root / "train").is_dir():
        out = {s: listed(root / s, suffixes) if (root / s).is_dir() else [] for s in SPLITS}
    else:
        out = {s: [] for s in SPLITS}
        for path in listed(root, suffixes):
            out[hash_split(path.relative_to(root).as_posix(), val_fraction, test_fraction)].append(path)
    if not any(out.values()):
        which = f" with suffixes {list(suffixes)}" if suffixes else ""
        raise ValueError(f"data.root: {root} holds no files{which} (a folder of UTF-8 text or source files is "
                         "expected)")
    return out


def read_text(path: Path) -> str | None:
    """The file's text, or None if it is binary (a NUL byte) or not UTF-8."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_split(root: Path, split: str, files: list[Path]) -> SplitTexts:
    """The texts of one split's ``files``; ValueError (one line) if none is readable."""
    out = SplitTexts()
    for path in files:
        text = read_text(path)
        if text is None:
            out.skipped += 1
            continue
        out.names.append(path.relative_to(root).as_posix())
        out.texts.append(text)
    if out.skipped:
        logger.warning("data: %s split: skipped %d of %d files that are binary or not UTF-8", split, out.skipped,
                       len(files))
    if not any(text.strip() for text in out.texts):
        layout = f"{root / split}/" if (root / "train").is_dir() else f"the hash split of {root} (data.val_fraction, " \
                                                                          "data.test_fraction)"
        raise ValueError(f"the {split} split has no UTF-8 text: {len(files)} file(s) in {layout}, {out.skipped} "
                         "skipped as binary or not UTF-8")
    return out


def training_texts(data: str | Path, val_fraction: float, test_fraction: float) -> list[str]:
    """The train split's texts, split as the LM task splits the folder (held-out files never shape the tokenizer):
    what :func:`~lightning_bpd.hf.causal_base.make_causal_base` learns a tokenizer from."""
    root = Path(data)
    return read_split(root, "train", split_files(root, val_fraction, test_fraction)["train"]).texts
