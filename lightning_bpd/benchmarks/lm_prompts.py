"""A language-modelling checkpoint's bench prompts (``bench-generate``'s and ``where_time_goes``'s): ``--input``
JSON Lines or the held-out split of ``--data-root`` as the run split it, and how far each is continued."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

DATA_KEYS = ("suffixes", "val_fraction", "test_fraction", "prompt_tokens", "reference_lines")


def add_prompt_args(p: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """Where a language-modelling checkpoint's prompts come from and how far they are continued (:func:`lm_prompts`;
    also ``where_time_goes``'s); the group, for more options."""
    g = p.add_argument_group("language-modelling checkpoints")
    g.add_argument("--data-root", default=None, help="prompts from this data folder's held-out split (instead of "
                   "--input FILE.jsonl)")
    g.add_argument("--split", default="test", choices=["val", "test"], help="the held-out split of --data-root")
    g.add_argument("--suffixes", nargs="+", default=None, help="only files with these suffixes (default: the run's)")
    g.add_argument("--prompt-tokens", type=int, default=None, help="tokens per held-out prompt (default: the run's, "
                   "else 64)")
    g.add_argument("--max-new-tokens", type=int, default=None, help="new tokens per prompt at most (default: the "
                   "module's max_new_tokens)")
    return g


def data_settings(ckpt: str | Path) -> dict[str, Any]:
    """The data split settings a ``.ckpt`` was trained with (its ``datamodule_hyper_parameters``), else {} (a heads
    folder, a bare base: a ``.gguf`` file or a Hugging Face folder)."""
    from lightning_bpd.hf.gguf_target import is_gguf

    path = Path(ckpt)
    if not path.is_file() or is_gguf(path):
        return {}
    saved = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    hparams = saved.get("datamodule_hyper_parameters") or {}
    return {key: hparams[key] for key in DATA_KEYS if key in hparams}


def held_out_prompts(module: Any, args: argparse.Namespace) -> list[str]:
    """The first ``--inputs`` held-out prompts of ``--data-root`` (those holding the pad id left out, as the decode
    evaluation does)."""
    from lightning_bpd.tasks.lm.datamodule import LMDataModule
    from lightning_bpd.tasks.lm.own_base import OwnBase

    settings = data_settings(args.ckpt)
    for key, value in (("suffixes", args.suffixes), ("prompt_tokens", args.prompt_tokens)):
        if value is not None:
            settings[key] = value
    tokenizer = module.hparams.pretrained or OwnBase.of(module.hparams.own).tokenizer  # the base's, or our own base's
    data = LMDataModule(root=args.data_root, tokenizer_path=tokenizer, **settings)
    prompts, _ = data.eval_prompts(args.split, None)
    pad = module.model.pad_id
    return [p for p in prompts if pad not in module.tokenizer(p)["input_ids"]][: args.inputs]


def new_tokens(module: Any, args: argparse.Namespace) -> int:
    """``--max-new-tokens``, default the module's ``max_new_tokens``; ValueError below 1."""
    max_new = module.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    if max_new < 1:
        raise ValueError(f"--max-new-tokens must be >= 1, got {max_new}")
    return max_new


def lm_prompts(module: Any, args: argparse.Namespace, max_new: int) -> list[str]:
    """The bench prompts (``--input`` JSON Lines or ``--data-root``), each checked against the model's context."""
    from lightning_bpd.tasks.lm.jsonl import check_prompts, read_prompts

    if (args.input is None) == (args.data_root is None):
        raise ValueError('give one of --input FILE.jsonl ({"prompt": ...} per line) and --data-root DIR')
    if args.input is not None:
        numbered = read_prompts(args.input)[: args.inputs]
    else:
        numbered = list(enumerate(held_out_prompts(module, args), start=1))
    if not numbered:
        raise ValueError(f"{args.input or args.data_root}: no prompts")
    check_prompts(module, numbered, max_new)
    return [prompt for _, prompt in numbered]
