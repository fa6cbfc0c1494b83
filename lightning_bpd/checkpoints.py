"""Loading trained models: ``lightning_bpd.load_model(path)``."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytorch_lightning as pl
import torch

from lightning_bpd.class_paths import current


def load_model(path: str | Path, device: str | torch.device = "cpu", base: str | Path | None = None) -> pl.LightningModule:
    """The task module of a checkpoint written by ``python -m lightning_bpd fit``, in eval mode.

    ``module.model`` is the model that the decoding functions take (a
    :class:`~lightning_bpd.nn.model.BlockwiseTransformer` or a Hugging Face adapter); a translation module also carries
    its ``tokenizer``, a language-modelling one (:class:`~lightning_bpd.tasks.lm.LMModule`) ``encode_prompts`` and
    ``detokenize``. A folder of heads saved on their own
    (:func:`~lightning_bpd.tasks.translation.hf_module.save_heads`) comes back on its Hugging Face base: the
    directory named in its ``heads.json``, or ``base``; ``base`` also replaces the base directory that the
    checkpoint of a Hugging Face run names (``model.pretrained``), should it have moved.
    """
    path = Path(path)
    if path.is_dir() and (path / "heads.json").is_file():
        from lightning_bpd.tasks.translation.hf_module import HEADS_MODULES, read_heads_meta

        module_name, _, name = str(read_heads_meta(path).get("module", HEADS_MODULES[0])).rpartition(".")
        if f"{module_name}.{name}" not in HEADS_MODULES:
            raise ValueError(f"{path}: heads.json names {module_name}.{name}, which re-attaches no heads")
        return getattr(importlib.import_module(module_name), name).from_heads(path, base, device)
    if path.is_dir():
        raise ValueError(f"{path} is a folder, not a checkpoint: give a .ckpt file from a fit run, or a folder of "
                         "heads written by save_heads (with heads.json)")
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {str(path)!r}: give the path of a .ckpt file from a fit run")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 (a corrupt or foreign file: say so once)
        raise ValueError(f"{path} is not a readable PyTorch checkpoint ({type(err).__name__}: {err})") from None
    class_path = ckpt.get("lightning_bpd_class") if isinstance(ckpt, dict) else None
    if class_path is None:
        raise ValueError(f"{path} was not written by lightning_bpd (no 'lightning_bpd_class' entry)")
    module_name, _, name = current(class_path).rpartition(".")  # a drafter kind's older path: today's
    cls = getattr(importlib.import_module(module_name), name)
    hparams = ckpt.get("hyper_parameters", {})
    init_args = cls.init_args_of_checkpoint(hparams)  # this layout, or the flat one of older checkpoints
    if init_args.get("feature_store"):  # what the run trained from: not needed (nor kept) to decode
        init_args["feature_store"] = None
    if base is not None:  # a Hugging Face run's base directory, moved since it was trained
        if not init_args.get("pretrained"):  # an LM run on our own base holds pretrained: None
            raise ValueError(f"base={base}: {path} is not a run on a Hugging Face base (no model.pretrained)")
        init_args["pretrained"] = str(base)
    module = cls(**init_args)
    module.on_load_checkpoint(ckpt)
    module.load_state_dict(ckpt["state_dict"], strict=True)
    return module.to(device).eval()


def load_error(err: Exception, base: str | Path | None = None) -> str:
    """One line for a command that could not load a checkpoint: ``err``'s first line, with a hint where the base
    directory a Hugging Face run names (a DFlash drafter's target, ...) is missing and no ``--base`` was given."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if base is None and "pretrained" in text and ("not a directory" in text or "no such file" in text):
        text += "; if the base (target) moved since the run, give --base DIR"
    return text
