"""The GGUF files llama.cpp serves a drafter's run with (``export-heads --format llamacpp``, ``bench --peers llamacpp
--llamacpp-bin``): ``drafter.gguf``, the drafter as llama.cpp's converter writes it (its kind's
:meth:`~lightning_bpd.drafters.common.kind.DrafterKind.write_gguf`, e.g. DFlash:
:func:`~lightning_bpd.drafters.dflash.gguf.write_dflash_gguf`, EAGLE-3:
:func:`~lightning_bpd.drafters.eagle3.gguf.write_eagle3_gguf`), and ``target.gguf``, the target as a float32 GGUF
with its tokenizer (:func:`~lightning_bpd.hf.gguf_llama.write_llama_gguf`).

A run whose target is a ``.gguf`` file (``model.pretrained=model.Q4_1.gguf``, read through its dequantized folder:
:func:`~lightning_bpd.hf.gguf_target.resolve_pretrained`) is served with that file itself as the target
(:func:`target_gguf`; its weights' type: :func:`gguf_type`); ``target.gguf`` is then written only when asked.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.registry import kind_of
from lightning_bpd.hf.gguf_llama import write_llama_gguf

__all__ = ["DRAFTER_GGUF", "TARGET_GGUF", "gguf_type", "llamacpp_serving", "target_gguf", "write_llamacpp"]

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
    ``out/target.gguf`` of the drafter's run ``module`` (a registered kind's); ``out``. Both are written into a
    temporary sibling folder and moved into ``out`` once both are complete: a refused GGUF leaves ``out`` as it was
    (no folder made, no lone drafter.gguf)."""
    from lightning_bpd.hf.gguf_target import resolve_pretrained

    kind = kind_of(module)
    if kind is None:
        raise ValueError(f"llama.cpp's drafter GGUF is written of a drafter's run, not of a {type(module).__name__}")
    folder = Path(out)
    own = target_gguf(module)
    target = resolve_pretrained(str(module.hparams.pretrained))  # a .gguf: its dequantized folder (config, tokenizer)
    name = own.stem if own is not None else Path(target).name
    folder.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".partial", dir=folder.parent))
    try:
        kind.write_gguf(module, stage / DRAFTER_GGUF, target, own is not None, name)
        if float32_target or (float32_target is None and own is None):
            write_llama_gguf(module.model.base, module.tokenizer, stage / TARGET_GGUF, name=name)
        folder.mkdir(exist_ok=True)
        for path in sorted(stage.iterdir()):
            os.replace(path, folder / path.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return folder


def llamacpp_serving(module: Any, folder: Path, spec_type: str, block_size: int) -> dict[str, str]:
    """Print how llama.cpp serves the GGUFs written in ``folder``: the target is the run's own .gguf file where it is
    one, else ``target.gguf``; the record's keys for it (``serve_target``, ``serve_drafter``)."""
    own = target_gguf(module)
    target = own if own is not None else folder / TARGET_GGUF
    if own is not None:
        print(f"export-heads: the target to serve is the run's own GGUF {own} (the drafter was trained on its "
              f"dequantized weights){'; target.gguf is its float32 copy' if (folder / TARGET_GGUF).is_file() else ''}",
              file=sys.stderr)
    print(f"export-heads: serve with llama-server -m {target} -md {folder / DRAFTER_GGUF} --spec-type {spec_type} "
          f"--spec-draft-n-max {block_size - 1} --spec-draft-p-min 0", file=sys.stderr)
    return {"serve_target": str(target), "serve_drafter": str(folder / DRAFTER_GGUF)}
