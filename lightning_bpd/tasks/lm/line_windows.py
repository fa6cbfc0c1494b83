"""Line-aligned windows of a text: runs of whole lines within a token budget. Tokenizer-free (token counts in).

Validation's held-out prompts (:meth:`~lightning_bpd.tasks.lm.datamodule.LMDataModule.windows`) and the training
prefixes of self-distillation (:mod:`lightning_bpd.tasks.lm.self_distill`) are both such windows.
"""

from __future__ import annotations


def line_spans(counts: list[int], budget: int, gap: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` line ranges of a text whose lines have ``counts`` tokens: each as many whole lines as fit in
    ``budget`` tokens; the next starts ``gap`` lines after its end. A line longer than the budget starts no window
    (the next line is tried)."""
    out, start = [], 0
    while start < len(counts):
        end, used = start, 0
        while end < len(counts) and used + counts[end] <= budget:
            used += counts[end]
            end += 1
        if end == start:  # a line longer than the budget: no window starts here
            start += 1
            continue
        out.append((start, end))
        start = end + gap
    return out
