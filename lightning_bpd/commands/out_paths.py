"""What the commands check of a path they will write, before any work: a file in the way of a folder, an input the
output would erase, an existing file that is no JSON record; and the folders a failed write made, removed again.
Each command words its own one-line message around these answers."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

__all__ = ["file_above", "in_the_way", "is_json_record", "missing_folders", "remove_made", "same_file_as"]


def file_above(path: Path) -> Path | None:
    """The file ``path`` would lie under: its nearest existing ancestor (of ``path.parents``, as given: relative stays
    relative), when that is not a folder; else None."""
    for parent in path.parents:
        if parent.exists():
            return None if parent.is_dir() else parent
    return None


def in_the_way(folder: Path) -> Path | None:
    """The file that keeps ``folder`` from being a folder: ``folder`` itself when it is a file, else
    :func:`file_above`; None when nothing is in the way."""
    if folder.exists() and not folder.is_dir():
        return folder
    return file_above(folder)


def same_file_as(path: Path, others: Iterable[tuple[str, str]]) -> tuple[str, str] | None:
    """The first ``(what, other)`` of ``others`` whose file is ``path`` itself (writing it would erase that input);
    None where none is, or ``path`` does not exist."""
    if not path.exists():
        return None
    for what, other in others:
        if other and os.path.exists(other) and os.path.samefile(other, path):
            return what, other
    return None


def is_json_record(path: Path) -> bool:
    """Whether the file ``path`` holds a JSON object (a record a command wrote, fine to replace)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(record, dict)


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its ancestors that do not exist yet, deepest first: what writing into it will make."""
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_made(made: list[Path]) -> None:
    """Remove the folders ``made`` (:func:`missing_folders`, taken before a write that failed): the deepest with all
    it holds (it did not exist before), those above it where empty."""
    if made and made[0].is_dir():
        shutil.rmtree(made[0], ignore_errors=True)
    for path in made[1:]:
        try:
            path.rmdir()
        except OSError:  # not empty (something else put there meanwhile), or gone
            break
