"""The GGUF files llama.cpp serves a drafter's run with (``export-heads --format llamacpp``, ``bench-generate
--llamacpp-bin``): ``drafter.gguf``, the drafter as llama.cpp's converter writes it (DFlash:
:func:`~lightning_bpd.drafters.dflash.gguf.write_dflash_gguf`, EAGLE-3:
:func:`~lightning_bpd.drafters.eagle3.gguf.write_eagle3_gguf`), and ``target.gguf``, the target as a float32 GGUF
with its tokenizer (:func:`~lightning_bpd.benchmarks.gguf_llama.write_llama_gguf`).

A run whose target is a ``.gguf`` file (``model.pretrained=model.Q4_1.gguf``, read through its dequantized folder:
:func:`~lightning_bpd.hf.gguf_target.resolve_pretrained`) is served with that file itself as the target
(:func:`target_gguf`; its weights' type: :func:`gguf_type`); ``target.gguf`` is then written only when asked.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from lightning_bpd.benchmarks.gguf_llama import write_llama_gguf
from lightning_bpd.drafters.dflash.gguf import write_dflash_gguf
from lightning_bpd.drafters.eagle3.gguf import write_eagle3_gguf

__all__ = ["DRAFTER_GGUF", "TARGET_GGUF", "gguf_type", "target_gguf", "write_llamacpp"]

DRAFTER_GGUF, TARGET_GGUF = "drafter.gguf", "target.gguf"


def target_gguf(module: Any) -> Path | None:
    """The GGUF file that is the run ``module``'s target (its ``pretrained``), absolute; None for any other target."""
    from lightning_bpd.hf.gguf_target import is_gguf

    pretrained = module.hparams.get("pretrained")
    if pretrained is None or not is_gguf(pretrained):
        return None
    return Path(pretrained).expanduser().absolute()


def gguf_type(path: str | Path) -> str:
    """The weights' type of the GGUF file ``path``, lower case as llama.cpp names it (``q4_1``, ``q8_0``, ``f32``):
    its ``general.file_type``, else the most common type of its matrices; ValueError (one line) for an unreadable
    file."""
    try:
        import gguf
    except ImportError:
        raise ValueError(f"{path}: reading a GGUF's type needs the gguf package: pip install -e '.[gguf]'") from None
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as err:  # noqa: BLE001 (a foreign or truncated file fails anywhere in the reader: say so once)
        raise ValueError(f"{path}: not a readable GGUF file ({err})") from None
    field = reader.fields.get("general.file_type")
    if field is not None:
        try:
            name = gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name
            return name.removeprefix("MOSTLY_").removeprefix("ALL_").lower()
        except ValueError:
            pass  # a type this gguf package does not name: the tensors tell
    types = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) > 1)
    if not types:
        raise ValueError(f"{path}: a GGUF file without matrices")
    return types.most_common(1)[0][0].lower()


def write_llamacpp(module: Any, out: str | Path, float32_target: bool | None = None) -> Path:
    """``out/drafter.gguf`` and (``float32_target``; default: unless the run's target is a GGUF file)
    ``out/target.gguf`` of the DFlash or EAGLE-3 run ``module``; ``out``."""
    from lightning_bpd.drafters.eagle3.module import Eagle3Module
    from lightning_bpd.hf.gguf_target import resolve_pretrained

    folder = Path(out)
    own = target_gguf(module)
    target = resolve_pretrained(str(module.hparams.pretrained))  # a .gguf: its dequantized folder (config, tokenizer)
    name = own.stem if own is not None else Path(target).name
    if isinstance(module, Eagle3Module):
        write_eagle3_gguf(module.drafter, folder / DRAFTER_GGUF, target, module.tokenizer, name=f"{name}-eagle3")
    else:
        write_dflash_gguf(module, folder / DRAFTER_GGUF, target if own is not None else None, name=f"{name}-dflash")
    if float32_target or (float32_target is None and own is None):
        write_llama_gguf(module.model.base, module.tokenizer, folder / TARGET_GGUF, name=name)
    return folder
