"""llama.cpp drafting from our retrieval datastore: its ``llama-lookup`` (built by ``build-llamacpp``) on the target's
GGUF with the datastore exported as its n-gram lookup cache (:mod:`lightning_bpd.tasks.lm.lookup_cache`,
``--lookup-cache-dynamic``), one process per prompt, as :class:`~lightning_bpd.benchmarks.llamacpp_speculative.
SpeculativeSimple` runs the target alone and with a drafter: the same settings (threads, float32 KV cache, greedy
sampling, ``-n max_new - 1``), the same clock (its "encoded" + "decoded" lines), the same summary lines and the same
output (``\\n\\n`` + prompt + new text, the end of generation not printed; ``--color off``).

``llama-lookup`` drafts up to ``--spec-draft-n-max`` tokens a step from three n-gram caches: the prompt's and its own
output's, then the dynamic cache (ours), then a static one (none here); it merges the first into the dynamic cache
and writes that back to its file when it ends, so every run reads a fresh copy of the exported cache (a prompt is
never drafted from another prompt's output).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from lightning_bpd.benchmarks.llamacpp_speculative import SpeculativeSimple

__all__ = ["LOOKUP", "Lookup"]

LOOKUP = "llama-lookup"


class Lookup(SpeculativeSimple):
    """``llama-lookup`` on ``target`` drafting up to ``n_draft`` tokens a step from the lookup cache ``cache``."""

    def __init__(self, binary: str | Path, target: str | Path, threads: int, n_ctx: int, cache: str | Path,
                 n_draft: int, timeout: float = 600.0) -> None:
        if n_draft < 1:
            raise ValueError(f"llama-lookup drafts >= 1 token a step, got {n_draft}")
        if not Path(cache).is_file():
            raise ValueError(f"{cache}: no lookup cache there (python -m lightning_bpd lookup-cache writes one)")
        super().__init__(binary, target, threads, n_ctx, drafter=cache, block_size=n_draft + 1, timeout=timeout)

    def speculator_args(self) -> list[str]:
        return ["--spec-draft-n-max", str(self.block_size - 1)]

    def call(self, prompt_file: Path, max_new: int) -> tuple[bytes, str]:
        """One run on a fresh copy of the cache (``llama-lookup`` writes its cache back when it ends)."""
        shutil.copyfile(self.drafter, run_copy(prompt_file))
        return super().call(prompt_file, max_new)

    def args(self, prompt_file: str | Path, max_new: int) -> list[str]:
        return [*super().args(prompt_file, max_new), "--lookup-cache-dynamic", str(run_copy(prompt_file))]


def run_copy(prompt_file: str | Path) -> Path:
    """Where a run's copy of the cache goes: beside its prompt file, in the run's own temporary folder."""
    return Path(prompt_file).parent / "lookup-cache.bin"
