"""Reading parallel plain-text corpora (optionally gzip-compressed) for the translation task.

Layout expected on disk (one sentence per line, the two sides aligned line by line)::

    <data.root>/<split>.<src_lang>[.gz]
    <data.root>/<split>.<tgt_lang>[.gz]
"""

from __future__ import annotations

import gzip
import hashlib
import io
import logging
import shlex
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DataError", "FilterStats", "file_sha256", "not_utf8_message", "read_lines", "read_parallel",
           "resolve_split_files"]

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


STDIN = "-"


def not_utf8_message(name: str, lineno: int, offset: int, byte: int, reason: str, gz: bool = False) -> str:
    """One line: where the input stops being UTF-8 (line, byte offset) and how to re-encode it."""
    where = "standard input" if name == STDIN else f"'{name}'"
    text = " of the gunzipped text" if gz else ""
    if name == STDIN:
        fix = "pipe it through iconv -f latin1 -t utf-8"
    elif gz:
        fix = f"zcat {shlex.quote(name)} | iconv -f latin1 -t utf-8 | gzip > {shlex.quote(name[:-3] + '.utf8.gz')}"
    else:
        fix = f"iconv -f latin1 -t utf-8 {shlex.quote(name)} > {shlex.quote(name + '.utf8')}"
    return (f"{where} is not UTF-8: line {lineno} (byte offset {offset}{text}) has byte 0x{byte:02x} ({reason}); "
            f"re-encode it as UTF-8, e.g. {fix} (if it is Latin-1)")


def _strip(lines: Iterable[str]) -> list[str]:
    return [line.rstrip("\n").rstrip("\r") for line in lines]


def _not_utf8(f: Iterable[bytes], name: str, gz: bool = False) -> DataError:
    """The error for the first line of a binary stream that is not UTF-8 (line and byte offset)."""
    offset = 0
    for lineno, raw in enumerate(f, 1):
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as e:
            return DataError(not_utf8_message(name, lineno, offset + e.start, raw[e.start], e.reason, gz))
        offset += len(raw)
    return DataError(f"{name} is not UTF-8")  # not reached: the text was not decodable


def read_lines(path: str | Path) -> list[str]:
    """Read a UTF-8 text file (transparently gunzipping ``*.gz``; ``-`` is standard input) into lines without their
    line terminators.

    Lines are split on ``\\n`` only (a trailing ``\\r`` is removed), so that stray Unicode separators such as
    U+2028 or a lone ``\\r`` inside a sentence cannot shift the alignment of parallel files.

    Raises:
        FileNotFoundError: if the file does not exist.
        DataError: if it is not UTF-8 (one line naming the line and byte offset, and how to re-encode it), or a
            ``.gz`` file is not gzip.
    """
    if str(path) == STDIN:
        if not hasattr(sys.stdin, "buffer"):  # a text stream put in place of stdin (tests): already decoded
            return _strip(sys.stdin)
        data = sys.stdin.buffer.read()
        try:
            return _strip(io.StringIO(data.decode("utf-8"), newline="\n"))
        except UnicodeDecodeError:
            raise _not_utf8(io.BytesIO(data), STDIN) from None
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"Text file not found: '{path}'. Check `data.root` and the split/language file names in the config "
            f"(expected files like <data.root>/<split>.<lang> or <data.root>/<split>.<lang>.gz)."
        )
    gz = path.suffix == ".gz"
    opener = gzip.open if gz else open
    try:
        try:
            with opener(path, "rt", encoding="utf-8", newline="\n") as f:
                return _strip(f)
        except UnicodeDecodeError:  # read it again as bytes to say where (the decoder's position is per chunk)
            with opener(path, "rb") as f:
                raise _not_utf8(f, str(path), gz) from None
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
        f"Expected layout: {root / f'{split_prefix}.{src_lang}'}(.gz) and {root / f'{split_prefix}.{tgt_lang}'}(.gz), "
        "one sentence per line, both files aligned line by line; check `data.root` and the language/split names in "
        "the config."
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
        FileNotFoundError: if ``root`` or one of the files is missing; the message (one line) shows the expected
            layout.
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
            f"Missing file(s) for split '{split_prefix}' language(s) {missing} in '{root}'. {hint} "
            f"Files present there (first 20): {present}"
        )
    src_file, tgt_file = found[src_lang], found[tgt_lang]
    assert src_file is not None and tgt_file is not None
    return src_file, tgt_file
