"""Read a W&B offline run file (``run-*.wandb``) back: a LevelDB-log of protobuf ``Record``s."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

from wandb.proto import wandb_internal_pb2 as pb

BLOCK = 32768
HEADER = 7  # checksum (4), length (2), type (1)
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: str | Path, settle: float = 10.0) -> list[pb.Record]:
    """Every complete record of the run file. W&B's service process writes the file on its own time, so a
    file read just after a run ends can stop inside a record: it is read again until its last record is
    whole (for up to ``settle`` seconds), and a record still cut short then is left out."""
    deadline = time.monotonic() + settle
    while True:
        data = Path(path).read_bytes()
        records, complete = parse_records(data, path)
        if complete or time.monotonic() > deadline:
            return records
        time.sleep(0.2)


def parse_records(data: bytes, path: str | Path) -> tuple[list[pb.Record], bool]:
    """(the records of ``data``, whether the last one was whole)."""
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, records, pending = 7, [], b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # block trailer padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if pos + HEADER + length > len(data):  # written only in part so far
            return records, False
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 0 and length == 0:
            break
        if kind == FULL:
            pending = chunk
        elif kind == FIRST:
            pending = chunk
            continue
        elif kind == MIDDLE:
            pending += chunk
            continue
        elif kind == LAST:
            pending += chunk
        rec = pb.Record()
        rec.ParseFromString(pending)
        records.append(rec)
        pending = b""
    return records, not pending


def history(path: str | Path) -> list[dict]:
    """Every logged history row as {key: value}."""
    rows = []
    for rec in read_records(path):
        if rec.WhichOneof("record_type") == "history":
            row = {}
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)
                row[key] = json.loads(item.value_json)
            rows.append(row)
    return rows


def find_run_file(root: str | Path) -> Path:
    files = sorted(Path(root).rglob("offline-run-*/run-*.wandb"))
    assert files, f"no W&B offline run file under {root}"
    return files[-1]


def rows_with(root: str | Path, key: str, timeout: float = 60.0) -> list[dict]:
    """The history rows of the run under ``root`` that hold ``key``, waiting up to ``timeout`` seconds
    for W&B's writer process to flush them (it can lag behind ``finish()`` on a loaded machine)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        rows = [r for r in history(find_run_file(root)) if key in r]
        if rows or time.monotonic() > deadline:
            return rows
        time.sleep(1.0)
