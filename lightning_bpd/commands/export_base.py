"""``python -m lightning_bpd export-base``: the trained base of a Hugging Face run as a normal HF directory.

A ``fit`` run of :class:`~lightning_bpd.tasks.translation.hf_module.HFTranslationModule` (e.g. the base trained from
scratch with ``conf/hf/base_scratch.yaml``) keeps the base's weights in its Lightning checkpoint. This command
writes them out with ``save_pretrained``, beside the run's tokenizer, so the heads stages read the folder with
``--model.init_args.pretrained=<out>`` exactly as a downloaded opus-mt directory (the heads, if any, are left out).
A language-modelling run (:class:`~lightning_bpd.tasks.lm.module.LMModule`, e.g. the code LM recipe's base) is
written the same way, its tokenizer beside it.
A Marian is written as opus-mt lays it out, ``<pad>`` the last id (swapped with the last token, see
:mod:`lightning_bpd.hf.pad_last`), so that CTranslate2 converts it; ``export_base.json`` records the swap.

    python -m lightning_bpd export-base --ckpt runs/multi30k-hf-marian/base/last.ckpt \\
        --out runs/multi30k-hf-marian/export
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lightning_bpd.checkpoints import load_model
from lightning_bpd.commands.out_paths import in_the_way
from lightning_bpd.hf.pad_last import move_pad_last

__all__ = ["export_base"]


MODEL_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json")
MODEL_SUFFIXES = (".ckpt", ".safetensors", ".bin", ".gguf", ".pt")


def check_out(out: str | Path, pretrained: str | Path | None = None) -> None:
    """``--out`` must be a folder (new, empty, or an earlier export of ours: ``export_base.json``): not a file, not the
    run's base (``pretrained``), not one holding a model or checkpoint that export-base did not write."""
    folder = Path(out)
    blocker = in_the_way(folder)
    if blocker == folder:
        raise ValueError(f"--out {out} is a file, not a folder: give a new --out")
    if blocker is not None:
        raise ValueError(f"--out {out}: {blocker} is a file, not a folder: give another --out")
    if pretrained is not None and folder.is_dir() and folder.resolve() == Path(pretrained).resolve():
        raise ValueError(f"--out {out} is the base this run started from (model.pretrained): give a new --out")
    if folder.is_dir() and not (folder / "export_base.json").is_file():
        held = sorted(p.name for p in folder.iterdir() if p.name in MODEL_FILES or p.suffix in MODEL_SUFFIXES)
        if held:
            raise ValueError(f"--out {out} holds a model export-base did not write ({', '.join(held[:3])}): give a new "
                             "--out")


def export_base(ckpt: str | Path, out: str | Path) -> Path:
    """``save_pretrained`` of the base (and of its tokenizer) of the Hugging Face run ``ckpt`` into ``out``: a
    translation run (``HFTranslationModule``) or a language-modelling one (``LMModule``)."""
    from lightning_bpd.tasks.lm.module import LMModule
    from lightning_bpd.tasks.translation.hf_module import HFTranslationModule

    module = load_model(ckpt)
    if not isinstance(module, (HFTranslationModule, LMModule)):
        raise ValueError(f"{ckpt}: not a run on a Hugging Face base ({type(module).__name__})")  # noqa: TRY004
    if isinstance(module, LMModule) and module.hparams.get("pretrained") is None:
        raise ValueError(f"{ckpt}: a run of our own decoder-only base (model.init_args.own), not of a Hugging Face "
                         "one: its checkpoint is the base (load_model reads it); there is no HF directory to write")
    check_out(out, module.hparams.get("pretrained"))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    base = module.model.base
    base.save_pretrained(folder)
    if isinstance(module, LMModule):
        module.tokenizer.save_pretrained(folder)
        moved = None
    else:
        module.tokenizer.hf.save_pretrained(folder)
        moved = move_pad_last(folder)
    (folder / "export_base.json").write_text(json.dumps({"ckpt": str(Path(ckpt).resolve()),
                                                         "from": module.hparams.get("pretrained"),
                                                         "pad_moved_last": moved}, indent=2) + "\n")
    if moved is not None:
        start = moved["start_row_norm"]
        print(f"export-base: <pad> moved from id {moved['pad'][0]} to {moved['pad'][1]} (swapped with "
              f"{moved['swapped_with']!r}) as opus-mt lays it out, for CTranslate2"
              + (f"; its row (the decoder's start) has norm {start:.3g} where CTranslate2 starts from zeros, so "
                 "CTranslate2's translations may differ from generate's" if start > 0 else ""), file=sys.stderr)
    print(f"export-base: the base of {ckpt} ({base.config.model_type}, "
          f"{sum(p.numel() for p in base.parameters()) / 1e6:.1f}M parameters) and its tokenizer in {folder}",
          file=sys.stderr)
    return folder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd export-base", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="the last.ckpt of a fit run on a Hugging Face base")
    p.add_argument("--out", required=True, help="the directory to write (save_pretrained)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        export_base(args.ckpt, args.out)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"export-base: {err}")


if __name__ == "__main__":
    main()
