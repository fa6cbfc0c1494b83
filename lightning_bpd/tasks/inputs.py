"""What a command reads as a task's input: the sources of a translation or super-resolution checkpoint
(:func:`load_inputs`) and a draft vocabulary counted on a text (:func:`draft_vocab_ids`)."""

from __future__ import annotations

from typing import Any

from torch import Tensor


def draft_vocab_ids(module: Any, size: int | None, text: str | None) -> tuple[int, ...] | None:
    """The draft vocabulary of ``--draft-vocab N --draft-vocab-from TEXT`` (``decode``, ``bench``, ``bench-generate``,
    ``where_time_goes``): a translation module's ``size`` most frequent target tokens in the file ``text`` (a language
    model's: its tokens of the text), for
    :class:`~lightning_bpd.inference.InferenceOptions` (None without ``size``)."""
    if size is None:
        return None
    if text is None or not hasattr(module, "draft_vocab_ids"):
        raise ValueError("--draft-vocab needs a translation or language-modelling checkpoint and --draft-vocab-from "
                         "<target-language text, or text like the prompts' continuations>")
    from lightning_bpd.tasks.translation.text_files import read_lines

    return tuple(module.draft_vocab_ids(read_lines(text), size))


def load_inputs(module: Any, args: Any) -> list[Tensor]:
    """The inputs as a list of single-row source tensors (1, S)."""
    if hasattr(module, "encode_prompts"):
        raise ValueError("a language-modelling checkpoint is not benchmarked yet (decode it: python -m lightning_bpd "
                         "decode --ckpt CKPT reads JSON Lines of prompts)")
    if hasattr(module, "tokenizer"):
        if args.input is None:
            raise ValueError("a translation checkpoint needs --input (source sentences, one per line)")
        from lightning_bpd.tasks.translation.text_files import read_lines

        lines = [s for s in read_lines(args.input) if s.strip()][: args.inputs]
        return [module.encode_sources([s]) for s in lines]
    from lightning_bpd.tasks.superres.pixels import image_to_tokens
    from lightning_bpd.tasks.superres.synthetic_faces import synthetic_split

    if args.images is None:
        low, _ = synthetic_split("val", args.inputs, 0, "runs/cache")
    else:
        from lightning_bpd.tasks.superres.celeba import load_split

        low, _, _ = load_split(args.images, "val", "runs/cache", args.inputs)
    return [image_to_tokens(img)[None].to(module.device) for img in low]
