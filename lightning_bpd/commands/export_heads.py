"""``python -m lightning_bpd export-heads``: the heads of a language-model run written on their own.

``--ckpt`` is the ``last.ckpt`` of an LM ``fit`` run (:class:`~lightning_bpd.tasks.lm.LMModule`) or a folder of heads
already saved; ``--format`` picks what is written to ``--out``:

* ``heads``: ``heads.safetensors`` + ``heads.json`` (:func:`~lightning_bpd.tasks.translation.hf_module.save_heads`),
  which ``load_model(<out>)`` and ``decode --ckpt <out>`` re-attach to the base directory named in ``heads.json``;
* ``vllm-medusa``: medusa heads in vLLM's Medusa layout (``config.json`` + ``model.safetensors``,
  :func:`~lightning_bpd.hf.medusa_export.write_vllm_medusa`), the draft model of vLLM's Medusa speculative decoding on
  a GPU server beside the base directory;
* ``speculators`` and ``dflash-zlab`` take the ``last.ckpt`` of a DFlash drafter run
  (:class:`~lightning_bpd.drafters.dflash.module.DFlashModule`, ``conf/lm/dflash.yaml``) and write the drafter alone
  (:mod:`lightning_bpd.drafters.dflash.speculators`), to be served beside its target (the directory named by the run's
  ``model.pretrained``; the drafter borrows the target's embedding and LM head):

  - ``speculators``: the layout of speculators' ``dflash`` drafters (speculators 0.9.0), which vLLM serves::

        vllm serve <target dir> --speculative-config \\
            '{"method": "dflash", "model": "<out>", "num_speculative_tokens": B-1}'

    (``B`` = the run's ``model.block_size``; ``vllm serve <out>`` alone also names the target, its
    ``speculators_config.verifier``). Checked here (``tests/drafters/dflash/test_speculators.py``, slow): speculators 0.9.0's
    own ``DFlashDraftModel.from_pretrained`` loads the export on the CPU and computes the drafter's hidden states
    and logits. Unverified (no GPU, no vLLM): vLLM's loading and serving of it, and whether vLLM captures a target
    layer that is the target's LAST (``aux_hidden_state_layer_ids`` = ``target_layer_ids`` + 1 = the number of
    layers; export-heads warns);
  - ``dflash-zlab``: z-lab's layout (``z-lab/*-DFlash-b16``), which llama.cpp's converter turns into a GGUF with the
    target's directory beside it (``convert_hf_to_gguf.py <out> --target-model-dir <target dir>``; our tokenizers
    need its pre-tokenizer check bypassed, see ``--format llamacpp``);
  - ``llamacpp``: what llama.cpp serves directly: ``<out>/drafter.gguf``, the GGUF llama.cpp's converter makes of
    the z-lab export (:mod:`lightning_bpd.drafters.dflash.gguf`; the same keys, tensors and values, checked against the
    converter of llama-cpp-python 0.3.36's llama.cpp in ``tests/drafters/dflash/test_gguf.py``, slow), and
    ``<out>/target.gguf``, the target as a float32 GGUF with its tokenizer
    (:func:`~lightning_bpd.hf.gguf_llama.write_llama_gguf`; a Llama target)::

        llama-server -m <out>/target.gguf -md <out>/drafter.gguf --spec-type draft-dflash \\
            --spec-draft-n-max B-1 --spec-draft-p-min 0
        llama-speculative-simple -m <out>/target.gguf -md <out>/drafter.gguf --spec-type draft-dflash \\
            --spec-draft-n-max B-1 --spec-draft-p-min 0 --temp 0 --top-k 1 -n 64 -f prompt.txt

    (``build-llamacpp`` builds ``llama-speculative-simple``; ``bench-generate --peers llamacpp --llamacpp-bin DIR``
    times it against llama.cpp without the drafter.) A run whose target is a ``.gguf`` file (``model.pretrained=
    model.Q4_1.gguf``) is served with that file as ``-m``: only ``drafter.gguf`` is written (``--float32-target``
    adds ``target.gguf``, the dequantized target in float32), and the command names the file to serve.

* ``speculators`` also takes the ``last.ckpt`` of an EAGLE-3 drafter run
  (:class:`~lightning_bpd.drafters.eagle3.module.Eagle3Module`, ``conf/lm/eagle3.yaml``) on a Hugging Face target and
  writes speculators' ``eagle3`` layout (:func:`lightning_bpd.drafters.eagle3.speculators.write_speculators`: the drafter with
  the target's embeddings and its draft vocabulary, ``speculative_tokens`` = the run's ``model.block_size`` - 1),
  which vLLM serves and llama.cpp converts::

        vllm serve <target dir> --speculative-config \\
            '{"method": "eagle3", "model": "<out>", "num_speculative_tokens": B-1}'
        python convert_hf_to_gguf.py <out> --target-model-dir <target dir> --outfile D.gguf

  What either would not run as trained (a qwen3 layer, ``fc_norm``, ``norm_output``, not 3 target layers) is printed
  as a note (:func:`~lightning_bpd.drafters.eagle3.speculators.serving_notes`).

  ``llamacpp`` takes an EAGLE-3 run too: ``<out>/drafter.gguf``, the GGUF llama.cpp's converter makes of the
  speculators export (:mod:`lightning_bpd.drafters.eagle3.gguf`: architecture ``eagle3``, byte for byte the
  converter's file but for ``general.name``, checked in ``tests/drafters/eagle3/test_gguf.py``, slow), and
  ``<out>/target.gguf``; a drafter llama.cpp cannot run (a qwen3 layer, ``fc_norm``, not 3 target layers) is
  refused::

        llama-speculative-simple -m <out>/target.gguf -md <out>/drafter.gguf --spec-type draft-eagle3 \\
            --spec-draft-n-max B-1 --spec-draft-p-min 0 --temp 0 --top-k 1 -n 64 -f prompt.txt

Heads trained with their base (fine-tuned, or multi-token prediction from scratch) fit that base only: ``vllm-medusa``
writes them with a note to serve them beside ``export-base --ckpt <the same run>``'s directory; ``heads`` refuses
them (``heads.json`` re-attaches to a pretrained directory). A run of our own base (``model.init_args.own``) keeps its
heads in its checkpoint.

    python -m lightning_bpd export-heads --ckpt runs/code-lm/heads/last.ckpt --out runs/code-lm/medusa \\
        --format vllm-medusa
    python -m lightning_bpd export-heads --ckpt runs/code-lm/dflash/last.ckpt --out runs/code-lm/dflash-spec \\
        --format speculators
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lightning_bpd.checkpoints import load_model
from lightning_bpd.commands.out_paths import in_the_way, missing_folders, remove_made
from lightning_bpd.drafters.common.kind import article
from lightning_bpd.drafters.registry import kind_of, kinds

__all__ = ["HEADS_FORMATS", "export_heads", "formats"]

HEADS_FORMATS = ("heads", "vllm-medusa")


def formats() -> tuple[str, ...]:
    """Every ``--format``: the heads' and each registered drafter kind's (:attr:`DrafterKind.formats`)."""
    return tuple(dict.fromkeys([*HEADS_FORMATS, *(f for k in kinds() for f in k.formats)]))


def export_heads(ckpt: str | Path, out: str | Path, layout: str = "heads", float32_target: bool = False) -> Path:
    """Write the heads of the LM run or heads folder ``ckpt`` to ``out`` in ``layout`` (a ``--format``;
    ``float32_target``: ``llamacpp`` on a run whose target is a .gguf file writes ``target.gguf`` too); ValueError
    (one line) for an ``out`` that is a file, a checkpoint that is no LM run, heads the layout cannot take or a
    fine-tuned base. A failed export leaves none of the folders it made (an ``out`` there before stays; ``llamacpp`` leaves its
    files as they were)."""
    if layout not in formats():
        raise ValueError(f"--format must be one of {', '.join(formats())}, got {layout!r}")
    if float32_target and layout != "llamacpp":
        raise ValueError(f"--float32-target goes with --format llamacpp, not {layout}")
    folder = Path(out)
    blocker = in_the_way(folder)
    if blocker == folder:
        raise ValueError(f"--out {folder} is a file: give a folder")
    if blocker is not None:
        raise ValueError(f"--out {folder}: {blocker} is a file: give a folder")
    made = missing_folders(folder)  # removed again on a failure
    try:
        return write_heads(ckpt, out, layout, float32_target)
    except BaseException:
        remove_made(made)
        raise


def write_heads(ckpt: str | Path, out: str | Path, layout: str, float32_target: bool) -> Path:
    """:func:`export_heads` once its options are checked."""
    from lightning_bpd.hf.medusa_export import write_vllm_medusa
    from lightning_bpd.tasks.lm import LMModule
    from lightning_bpd.tasks.translation.hf_module import save_heads

    module = load_model(ckpt)
    kind = kind_of(module)
    if kind is not None:  # a drafter's run: its kind writes it
        return kind.export(module, ckpt, out, layout, float32_target)
    if layout not in HEADS_FORMATS:
        takers = [k for k in kinds() if layout in k.formats]
        runs = " or of ".join(f"{article(k.title)} {k.title} drafter run (conf/lm/{k.name}.yaml)" for k in takers)
        message = f"{ckpt}: --format {layout} takes the checkpoint of {runs}, this is a {type(module).__name__}"
        raise ValueError(message)
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
    p.add_argument("--ckpt", required=True, help="the last.ckpt of an LM fit run, or a folder of heads (heads.json), "
                                                  "or the last.ckpt of a DFlash drafter run (--format speculators, "
                                                  "dflash-zlab, llamacpp) or of an EAGLE-3 drafter run (--format "
                                                  "speculators, llamacpp)")
    p.add_argument("--out", required=True, help="the folder to write")
    p.add_argument("--format", choices=formats(), default="heads",
                   help="heads: safetensors + heads.json (load_model re-attaches them); vllm-medusa: vLLM's Medusa "
                        "draft model (medusa heads only); speculators (vLLM) / dflash-zlab (llama.cpp's converter) / "
                        "llamacpp (drafter.gguf + target.gguf): a DFlash drafter run's drafter; speculators / "
                        "llamacpp: an EAGLE-3 drafter run's drafter")
    p.add_argument("--float32-target", action="store_true",
                   help="--format llamacpp on a run whose target is a .gguf file (served as it is): write target.gguf "
                        "too, the target dequantized in float32")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        export_heads(args.ckpt, args.out, args.format, args.float32_target)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"export-heads: {err}")


if __name__ == "__main__":
    main()
