"""What a verify pass of n tokens costs llama.cpp against a 1-token step, on one GGUF: ``llama-bench`` (built by
``build-llamacpp``) timing a prompt pass of n tokens (``-p n -n 0``) after ``depth`` tokens already in the KV cache
(``-d``), its mean over ``repetitions`` runs after a warm-up, at ``threads`` threads.

A drafted step of llama.cpp is one such pass over the last token and its drafts, so ``pass(n) / pass(1)`` is the
tokens per target call a chain of ``n - 1`` drafts must average merely to break even, and ``x * pass(n) / pass(1)``
to be ``x`` times faster than the target alone (drafting itself not counted): the bound the record states beside
llama.cpp's drafted rows.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BENCH", "pass_costs", "pass_record"]

BENCH = "llama-bench"


def pass_costs(binary: str | Path, gguf: str | Path, threads: int, sizes: Sequence[int], depth: int,
               repetitions: int = 3, timeout: float = 900.0) -> dict[int, float]:
    """n -> milliseconds of a pass of n tokens (each n of ``sizes``) after ``depth`` tokens of context, on ``gguf``;
    RuntimeError (one line) when ``llama-bench`` fails."""
    if not sizes or min(sizes) < 1 or depth < 0 or repetitions < 1:
        raise ValueError(f"pass sizes >= 1, depth >= 0 and repetitions >= 1 expected, got {list(sizes)}, {depth}, "
                         f"{repetitions}")
    command = [str(binary), "-m", str(gguf), "-p", ",".join(str(n) for n in sizes), "-n", "0", "-d", str(depth),
               "-t", str(threads), "-r", str(repetitions), "-o", "jsonl"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{BENCH} took longer than {timeout:.0f} s on {Path(gguf).name}") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "no output"
        raise RuntimeError(f"{BENCH} failed on {Path(gguf).name} (exit {done.returncode}): {tail}")
    costs = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            try:
                entry = json.loads(line)
                costs[int(entry["n_prompt"])] = float(entry["avg_ns"]) / 1e6
            except (ValueError, KeyError, TypeError) as err:  # a JSON error is a ValueError
                raise RuntimeError(f"{BENCH} wrote a line this reader cannot parse ({type(err).__name__}: "
                                   f"{str(err)[:100]}): {line[:120]}") from None
    if set(costs) != set(sizes):
        raise RuntimeError(f"{BENCH} reported passes of {sorted(costs)} tokens, not {sorted(set(sizes))}")
    return costs


def pass_record(costs: dict[int, float], depth: int, threads: int, repetitions: int) -> dict[str, Any]:
    """The record of :func:`pass_costs`: each pass in ms and against the 1-token step (the tokens per call a chain of
    n - 1 drafts must average to break even; 1.3x that for 1.3x)."""
    one = costs[1]
    return {"measured_by": f"{BENCH} -p N -n 0 -d {depth} -t {threads} -r {repetitions} (mean ms of a pass of N "
                           "tokens after the context; weights as the GGUF's, KV cache f16)",
            "pass_ms": {str(n): round(ms, 3) for n, ms in sorted(costs.items())},
            "over_one_token": {str(n): round(ms / one, 3) for n, ms in sorted(costs.items())},
            "tokens_per_call_for_1.3x": {str(n): round(1.3 * ms / one, 3) for n, ms in sorted(costs.items()) if n > 1}}
