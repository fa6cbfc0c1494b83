"""Writing records: a run's or a benchmark's results as JSON in ``results/``, and the machine they ran on. Below
every command."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import torch


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    """Write a record (or a benchmark's results) as indented JSON, making the folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (else the platform's)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_name(device: torch.device | str) -> str:
    """The GPU's name, or the CPU's model name and the threads torch uses."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"
