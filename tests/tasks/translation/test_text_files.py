"""Tests for lightning_bpd.tasks.translation.text_files (only data written to tmp_path)."""

from __future__ import annotations

import gzip
import io
import logging
import sys
from pathlib import Path

import pytest

from lightning_bpd.tasks.translation.text_files import (
    DataError,
    FilterStats,
    read_lines,
    read_parallel,
    resolve_split_files,
)


def _write(path: Path, lines: list[str], gz: bool = False) -> Path:
    text = "".join(line + "\n" for line in lines)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_read_lines_plain_and_gz_identical(tmp_path: Path) -> None:
    lines = ["hello world", "Grüße aus Köln", "", "last"]
    plain = _write(tmp_path / "a.de", lines)
    gz = _write(tmp_path / "a.de.gz", lines, gz=True)
    assert read_lines(plain) == lines
    assert read_lines(gz) == lines


def test_read_lines_only_splits_on_newline(tmp_path: Path) -> None:
    path = tmp_path / "x.en"
    path.write_bytes("a\u2028b\r\nc\rd\n".encode())
    assert read_lines(path) == ["a\u2028b", "c\rd"]


@pytest.mark.parametrize("gz", [False, True])
def test_not_utf8_is_one_line_with_line_offset_and_fix(tmp_path: Path, gz: bool) -> None:
    """The line and the byte offset in the whole (gunzipped) file, not in the decoder's chunk, and how to fix it."""
    data = b"ok\n" * 5000 + "Caf\u00e9 ".encode() + "Caf\xe9\n".encode("latin1")
    path = tmp_path / ("x.en.gz" if gz else "x.en")
    if gz:
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    with pytest.raises(DataError) as exc:
        read_lines(path)
    msg = str(exc.value)
    offset = 3 * 5000 + len("Caf\u00e9 Caf".encode())
    assert msg.startswith(f"'{path}' is not UTF-8: line 5001 (byte offset {offset}")
    assert "has byte 0xe9" in msg and "\n" not in msg and "iconv -f latin1 -t utf-8" in msg
    assert ("zcat" in msg and "gunzipped" in msg) == gz


def test_read_lines_from_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    """``-`` reads standard input's bytes, split on \\n only like files; not UTF-8 is the same one line."""
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("a\u2028b\r\nc\rd\n".encode())))
    assert read_lines("-") == ["a\u2028b", "c\rd"]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"fine\nCaf\xe9\n")))
    with pytest.raises(DataError, match=r"^standard input is not UTF-8: line 2 \(byte offset 8\) has byte 0xe9 .*"
                                        r"pipe it through iconv -f latin1 -t utf-8"):
        read_lines("-")


def test_read_lines_missing_file_message(tmp_path: Path) -> None:
    missing = tmp_path / "nope.en"
    with pytest.raises(FileNotFoundError) as exc:
        read_lines(missing)
    assert str(missing) in str(exc.value)
    assert "data.root" in str(exc.value)


def test_misaligned_files_single_message(tmp_path: Path) -> None:
    src = _write(tmp_path / "train.en", ["a", "b", "c"])
    tgt = _write(tmp_path / "train.de", ["x", "y"])
    with pytest.raises(DataError) as exc:
        read_parallel(src, tgt)
    msg = str(exc.value)
    assert str(src) in msg and str(tgt) in msg
    assert "3 lines" in msg and "2 lines" in msg
    assert isinstance(exc.value, ValueError)


def test_filtering_counts_and_logging(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src_lines = ["  one two  ", "", "a b c d e", "ok", "x", "tab\tsep"]
    tgt_lines = ["eins zwei", "leer", "kurz", "   ", "y z w v u t", "tab sep"]
    src = _write(tmp_path / "s.en", src_lines)
    tgt = _write(tmp_path / "t.de.gz", tgt_lines, gz=True)
    with caplog.at_level(logging.INFO, logger="lightning_bpd"):
        src_out, tgt_out, stats = read_parallel(src, tgt, max_tokens_per_side=4)
    assert src_out == ["one two", "tab\tsep"]
    assert tgt_out == ["eins zwei", "tab sep"]
    assert stats == FilterStats(kept=2, empty=2, too_long=2)
    assert stats.total == 6 and stats.dropped == 4
    assert any("kept 2" in r.getMessage() for r in caplog.records)


def test_no_length_filter_by_default(tmp_path: Path) -> None:
    long = " ".join(["w"] * 500)
    src = _write(tmp_path / "s.en", [long])
    tgt = _write(tmp_path / "t.de", ["k"])
    src_out, _, stats = read_parallel(src, tgt)
    assert src_out == [long] and stats.kept == 1 and stats.too_long == 0


def test_resolve_split_files_plain_gz_and_preference(tmp_path: Path) -> None:
    _write(tmp_path / "train.en", ["a"])
    _write(tmp_path / "train.de.gz", ["b"], gz=True)
    assert resolve_split_files(tmp_path, "train", "en", "de") == (tmp_path / "train.en", tmp_path / "train.de.gz")
    _write(tmp_path / "train.de", ["b"])
    assert resolve_split_files(tmp_path, "train", "en", "de")[1] == tmp_path / "train.de"


def test_resolve_missing_folder_shows_layout(tmp_path: Path) -> None:
    root = tmp_path / "wmt14"
    with pytest.raises(FileNotFoundError) as exc:
        resolve_split_files(root, "train", "en", "de")
    msg = str(exc.value)
    assert str(root) in msg
    assert f"{root / 'train.en'}(.gz)" in msg and f"{root / 'train.de'}(.gz)" in msg
    assert "\n" not in msg  # one line


def test_resolve_missing_file_shows_layout(tmp_path: Path) -> None:
    _write(tmp_path / "valid.en", ["a"])
    with pytest.raises(FileNotFoundError) as exc:
        resolve_split_files(tmp_path, "valid", "en", "de")
    msg = str(exc.value)
    assert "'de'" in msg and f"{tmp_path / 'valid.de'}(.gz)" in msg and "valid.en" in msg
    assert "\n" not in msg  # one line
