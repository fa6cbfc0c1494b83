"""The GGUF files llama.cpp serves a drafter's run with (``export-heads --format llamacpp``, ``bench-generate
--llamacpp-bin``): ``drafter.gguf``, the drafter as llama.cpp's converter writes it (DFlash:
:func:`~lightning_bpd.benchmarks.gguf_dflash.write_dflash_gguf`, EAGLE-3:
:func:`~lightning_bpd.benchmarks.gguf_eagle3.write_eagle3_gguf`), and ``target.gguf``, the target as a float32 GGUF
with its tokenizer (:func:`~lightning_bpd.benchmarks.gguf_llama.write_llama_gguf`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning_bpd.benchmarks.gguf_dflash import write_dflash_gguf
from lightning_bpd.benchmarks.gguf_eagle3 import write_eagle3_gguf
from lightning_bpd.benchmarks.gguf_llama import write_llama_gguf

__all__ = ["DRAFTER_GGUF", "TARGET_GGUF", "write_llamacpp"]

DRAFTER_GGUF, TARGET_GGUF = "drafter.gguf", "target.gguf"


def write_llamacpp(module: Any, out: str | Path) -> Path:
    """``out/drafter.gguf`` and ``out/target.gguf`` of the DFlash or EAGLE-3 run ``module``; ``out``."""
    from lightning_bpd.tasks.lm.eagle3_module import Eagle3Module

    folder = Path(out)
    target = str(module.hparams.pretrained)
    name = Path(target).name
    if isinstance(module, Eagle3Module):
        write_eagle3_gguf(module.drafter, folder / DRAFTER_GGUF, target, module.tokenizer, name=f"{name}-eagle3")
    else:
        write_dflash_gguf(module, folder / DRAFTER_GGUF, name=f"{name}-dflash")
    write_llama_gguf(module.model.base, module.tokenizer, folder / TARGET_GGUF, name=name)
    return folder
