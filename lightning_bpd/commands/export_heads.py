"""``python -m lightning_bpd export-heads``: the heads of a language-model run written on their own.

``--ckpt`` is the ``last.ckpt`` of an LM ``fit`` run (:class:`~lightning_bpd.tasks.lm.LMModule`) or a folder of heads
already saved; ``--format`` picks what is written to ``--out``:

* ``heads``: ``heads.safetensors`` + ``heads.json`` (:func:`~lightning_bpd.tasks.translation.hf_module.save_heads`),
  which ``load_model(<out>)`` and ``decode --ckpt <out>`` re-attach to the base directory named in ``heads.json``;
* ``vllm-medusa``: medusa heads in vLLM's Medusa layout (``config.json`` + ``model.safetensors``,
  :func:`~lightning_bpd.hf.medusa_export.write_vllm_medusa`), the draft model of vLLM's Medusa speculative decoding on
  a GPU server beside the base directory.

Heads trained with their base (fine-tuned, or multi-token prediction from scratch) fit that base only: ``vllm-medusa``
writes them with a note to serve them beside ``export-base --ckpt <the same run>``'s directory; ``heads`` refuses
them (``heads.json`` re-attaches to a pretrained directory). A run of our own base (``model.init_args.own``) keeps its
heads in its checkpoint.

    python -m lightning_bpd export-heads --ckpt runs/code-lm/heads/last.ckpt --out runs/code-lm/medusa \\
        --format vllm-medusa
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lightning_bpd.checkpoints import load_model

__all__ = ["FORMATS", "export_heads"]

FORMATS = ("heads", "vllm-medusa")


def export_heads(ckpt: str | Path, out: str | Path, layout: str = "heads") -> Path:
    """Write the heads of the LM run or heads folder ``ckpt`` to ``out`` in ``layout`` (a ``--format``); ValueError
    (one line) for a checkpoint that is no LM run, heads the layout cannot take or a fine-tuned base."""
    from lightning_bpd.hf.medusa_export import write_vllm_medusa
    from lightning_bpd.tasks.lm import LMModule
    from lightning_bpd.tasks.translation.hf_module import save_heads

    if layout not in FORMATS:
        raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {layout!r}")
    module = load_model(ckpt)
    if not isinstance(module, LMModule):
        message = (f"{ckpt}: not a language-model run ({type(module).__name__}); export-heads takes the checkpoint of "
                   "an LM fit (conf/lm/) or a folder of its heads")
        raise ValueError(message)  # noqa: TRY004 (bad input: one line, as every other)
    model = module.model
    if module.hparams.get("pretrained") is None:
        raise ValueError(f"{ckpt}: a run of our own decoder-only base (model.init_args.own): its heads stay in its "
                         "checkpoint (load_model reads it), neither layout takes them")
    if model.k < 2:
        raise ValueError(f"{ckpt}: k = 1, the base alone: there are no heads to export")
    if layout == "vllm-medusa":
        if model.head_type != "medusa":
            raise ValueError(f"{ckpt}: --format vllm-medusa takes medusa heads (model.head_type: medusa), these are "
                             f"{model.head_type!r}: use --format heads")
        folder = write_vllm_medusa(model, out)
        base = module.hparams.pretrained if model.frozen else f"the base of {ckpt} (export-base --ckpt {ckpt})"
        (folder / "export_heads.json").write_text(json.dumps(
            {"ckpt": str(Path(ckpt).resolve()), "base": base, "base_trained_with_heads": not model.frozen,
             "format": layout, "k": model.k}, indent=2) + "\n")
        if not model.frozen:
            print(f"export-heads: the base was trained with these heads: serve them beside the directory of "
                  f"'python -m lightning_bpd export-base --ckpt {ckpt} --out DIR', not beside "
                  f"{module.hparams.pretrained}", file=sys.stderr)
    elif not model.frozen:
        raise ValueError(f"{ckpt}: the base was trained with the heads, which fit that base only: keep the whole "
                         "checkpoint, or --format vllm-medusa (medusa heads) beside export-base's directory")
    else:
        folder = save_heads(module, out)
    print(f"export-heads: {model.k - 1} {model.head_type} heads of {ckpt} (base {module.hparams.get('pretrained')}) "
          f"in {folder} ({layout})", file=sys.stderr)
    return folder


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd export-heads", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="the last.ckpt of an LM fit run, or a folder of heads (heads.json)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--format", choices=FORMATS, default="heads",
                   help="heads: safetensors + heads.json (load_model re-attaches them); vllm-medusa: vLLM's Medusa "
                        "draft model (medusa heads only)")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        export_heads(args.ckpt, args.out, args.format)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"export-heads: {err}")


if __name__ == "__main__":
    main()
