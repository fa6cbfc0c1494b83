"""A drafter's target, read once for every kind: a frozen Hugging Face causal LM (a folder or a ``.gguf`` file) or a
language-modelling run on our own decoder-only base (:func:`frozen_target`), and which of the two a model is
(:func:`is_own_base`). Read by the kinds' training modules and by the ``store`` command."""

from __future__ import annotations

import os
from typing import Any

from lightning_bpd.hf.causal import load_causal
from lightning_bpd.hf.gguf_target import is_gguf
from lightning_bpd.hf.prompts import load_tokenizer

__all__ = ["frozen_target", "is_own_base", "own_target"]


def is_own_base(model: Any) -> bool:
    """Whether ``model`` (or the runtime of one) is our own decoder-only base
    (:class:`~lightning_bpd.nn.causal_model.CausalTransformer`), not a Hugging Face causal LM."""
    return bool(getattr(model, "decoder_only", False)) and getattr(model, "base", None) is None


def own_target(path: str) -> tuple[Any, Any]:
    """The frozen base and tokenizer of a language-modelling run on our own decoder-only base (its .ckpt); one clear
    line where the checkpoint is another kind."""
    from lightning_bpd.checkpoints import load_model
    from lightning_bpd.tasks.lm.module import LMModule

    try:
        module = load_model(path)
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"model.pretrained: {err}") from None
    model = getattr(module, "model", None)
    if not isinstance(module, LMModule) or not is_own_base(model):
        raise ValueError(f"model.pretrained: {path} is a {type(module).__name__} checkpoint, not a language-modelling "
                         "run on our own decoder-only base (give that run's .ckpt, or a Hugging Face causal LM folder)")
    return model, module.tokenizer


def frozen_target(pretrained: str | os.PathLike | None) -> tuple[str, Any, Any]:
    """A drafter's target, frozen (eval mode, no gradients): ``pretrained`` a local Hugging Face causal LM directory
    with its tokenizer, a ``.gguf`` file (read through its dequantized folder,
    :func:`~lightning_bpd.hf.gguf_target.resolve_pretrained`), or the .ckpt of an LM run on our own decoder-only base
    -> (its absolute path, the model, the tokenizer); one clear line for anything else."""
    if pretrained is None or not (os.path.isdir(os.fspath(pretrained)) or os.path.isfile(os.fspath(pretrained))
                                  or is_gguf(pretrained)):
        raise ValueError(f"model.pretrained: {pretrained} is not a .ckpt of a run on our own decoder-only base and "
                         "not a directory (a local Hugging Face causal LM checkpoint with its tokenizer) nor a .gguf "
                         "file")
    path = os.path.abspath(os.fspath(pretrained))
    if os.path.isdir(path) or is_gguf(path):
        target, tokenizer = load_causal(path, k=1, frozen=True), load_tokenizer(path)
    else:
        target, tokenizer = own_target(path)
    target.eval().requires_grad_(False)
    return path, target, tokenizer
