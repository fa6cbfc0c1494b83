"""Reading parallel plain-text corpora (optionally gzip-compressed) for the translation task.

Layout expected on disk (one sentence per line, the two sides aligned line by line)::

    <data.root>/<split>.<src_lang>[.gz]
    <data.root>/<split>.<tgt_lang>[.gz]
"""

from __future__ import annotations

import gzip
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DataError", "FilterStats", "file_sha256", "read_lines", "read_parallel", "resolve_split_files"]

logger = logging.getLogger("lightning_bpd")


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes (read in 1 MiB chunks: corpora may be large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class DataError(ValueError):
    """Raised when data files exist but their content is unusable (e.g. misaligned parallel files)."""


@dataclass
class FilterStats:
    """Counts of sentence pairs kept and dropped by :func:`read_parallel`."""

    kept: int = 0
    empty: int = 0
    too_long: int = 0

    @property
    def total(self) -> int:
        """Number of pairs read before filtering."""
        return self.kept + self.empty + self.too_long

    @property
    def dropped(self) -> int:
        """Number of pairs removed by filtering."""
        return self.empty + self.too_long


def read_lines(path: str | Path) -> list[str]:
    """Read a UTF-8 text file (transparently gunzipping ``*.gz``) into lines without their line terminators.

    Lines are split on ``\\n`` only (a trailing ``\\r`` is removed), so that stray Unicode separators such as
    U+2028 or a lone ``\\r`` inside a sentence cannot shift the alignment of parallel files.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Text file not found: '{path}'. Check `data.root` and the split/language file names in the config "
            f"(expected files like <data.root>/<split>.<lang> or <data.root>/<split>.<lang>.gz)."
        )
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8", newline="\n") as f:
            return [line.rstrip("\n").rstrip("\r") for line in f]
    except UnicodeDecodeError as e:
        raise DataError(f"File '{path}' is not valid UTF-8: {e}") from e
    except (gzip.BadGzipFile, EOFError) as e:
        raise DataError(f"File '{path}' has a .gz suffix but is not a valid gzip file: {e}") from e


def read_parallel(
    src_path: str | Path, tgt_path: str | Path, max_tokens_per_side: int | None = None
) -> tuple[list[str], list[str], FilterStats]:
    """Read two line-aligned files and return the cleaned (source, target) sentences plus filtering counts.

    Whitespace is stripped; pairs where either side is empty are dropped, and so are pairs where either side has
    more than ``max_tokens_per_side`` whitespace-separated tokens (no length filter when it is ``None``).

    Raises:
        DataError: if the two files do not have the same number of lines.
    """
    src_lines = read_lines(src_path)
    tgt_lines = read_lines(tgt_path)
    if len(src_lines) != len(tgt_lines):
        raise DataError(
            f"Parallel files are misaligned: '{src_path}' has {len(src_lines)} lines but '{tgt_path}' has "
            f"{len(tgt_lines)} lines; they must have one sentence per line with the same number of lines."
        )
    if max_tokens_per_side is not None and max_tokens_per_side < 1:
        raise ValueError(f"max_tokens_per_side must be >= 1 or None, got {max_tokens_per_side}")

    stats = FilterStats()
    src_out: list[str] = []
    tgt_out: list[str] = []
    for src, tgt in zip(src_lines, tgt_lines):
        src, tgt = src.strip(), tgt.strip()
        if not src or not tgt:
            stats.empty += 1
            continue
        if max_tokens_per_side is not None and (
            len(src.split()) > max_tokens_per_side or len(tgt.split()) > max_tokens_per_side
        ):
            stats.too_long += 1
            continue
        src_out.append(src)
        tgt_out.append(tgt)
        stats.kept += 1

    logger.info(
        "Read %d pairs from '%s' / '%s': kept %d, dropped %d empty, %d too long (max_tokens_per_side=%s)",
        stats.total,
        src_path,
        tgt_path,
        stats.kept,
        stats.empty,
        stats.too_long,
        max_tokens_per_side,
    )
    return src_out, tgt_out, stats


def _layout_hint(root: Path, split_prefix: str, src_lang: str, tgt_lang: str) -> str:
    return (
        "Expected layout:\n"
        f"  {root / f'{split_prefix}.{src_lang}'}(.gz)\n"
        f"  {root / f'{split_prefix}.{tgt_lang}'}(.gz)\n"
        "(one sentence per line, both files aligned line by line). Check `data.root` and the language/split "
        "names in the config."
    )


def _find_one(root: Path, split_prefix: str, lang: str) -> Path | None:
    """Return ``root/{prefix}.{lang}`` if present, else the ``.gz`` variant, else ``None``."""
    plain = root / f"{split_prefix}.{lang}"
    if plain.is_file():
        return plain
    gz = root / f"{split_prefix}.{lang}.gz"
    if gz.is_file():
        return gz
    return None


def resolve_split_files(root: str | Path, split_prefix: str, src_lang: str, tgt_lang: str) -> tuple[Path, Path]:
    """Locate the source/target files of one split, preferring the uncompressed file when both exist.

    Raises:
        FileNotFoundError: if ``root`` or one of the files is missing; the message shows the expected layout.
    """
    root = Path(root)
    hint = _layout_hint(root, split_prefix, src_lang, tgt_lang)
    if not root.is_dir():
        raise FileNotFoundError(f"Data folder '{root}' does not exist. {hint}")
    found = {lang: _find_one(root, split_prefix, lang) for lang in (src_lang, tgt_lang)}
    missing = [lang for lang, path in found.items() if path is None]
    if missing:
        present = sorted(p.name for p in root.iterdir())[:20]
        raise FileNotFoundError(
            f"Missing file(s) for split '{split_prefix}' language(s) {missing} in '{root}'. {hint}\n"
            f"Files present there (first 20): {present}"
        )
    src_file, tgt_file = found[src_lang], found[tgt_lang]
    assert src_file is not None and tgt_file is not None
    return src_file, tgt_file
