"""One method's timings and outputs over the batches of one batch size (``bench-generate``'s rows)."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def differing(got: Sequence[Sequence[int]], want: Sequence[Sequence[int]]) -> list[int]:
    """Indices of the rows where ``got`` and ``want`` differ."""
    return [i for i, (a, b) in enumerate(zip(got, want, strict=True)) if list(a) != list(b)]


@dataclass
class Tally:
    """One method's timings and outputs over the batches of one batch size."""

    per_input: list[float] = field(default_factory=list)
    seconds: float = 0.0
    tokens: int = 0
    iterations: int = 0
    model_calls: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    def add(self, outputs: list[list[int]], seconds: float, iterations: int = 0, model_calls: int = 0) -> None:
        self.per_input.append(seconds / len(outputs))
        self.seconds += seconds
        self.tokens += sum(len(o) for o in outputs)
        self.iterations += iterations
        self.model_calls += model_calls
        self.outputs += outputs

    def report(self) -> dict[str, Any]:
        secs = sorted(self.per_input)
        q = statistics.quantiles(secs, n=4) if len(secs) > 1 else [secs[0]] * 3
        return {"sentences": len(self.outputs), "seconds": self.seconds, "tokens": self.tokens,
                "seconds_per_input_median": statistics.median(secs), "seconds_per_input_iqr": [q[0], q[2]],
                "tokens_per_second": self.tokens / max(self.seconds, 1e-9),
                "ms_per_output_token": 1000 * self.seconds / max(1, self.tokens)}
