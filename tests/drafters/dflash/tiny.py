"""A tiny fitted DFlash drafter checkpoint on the tiny Llama of :mod:`tests.tasks.lm.tiny_lm`: a few AdamW steps on the
target's own greedy continuations of a few prompts (so that its blocks are accepted beyond their first token), saved as
``fit`` saves a DFlashModule (the drafter alone, its config, the target's directory)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from lightning_bpd.decoding import greedy_decode
from lightning_bpd.drafters.dflash.module import DFlashModule

PROMPTS = ["def f_1(x, y):\n", "    return", "for items in range(3):\n        total = total * items\n",
           "def f_2(key, value):\n    key = key + 4\n", "x"]


def own_sequences(module: DFlashModule, prompts: list[str], new: int = 40) -> Tensor:
    """The target's own greedy continuations of ``prompts`` (prompt and continuation, right-padded) (N, T)."""
    rows = []
    for prompt in prompts:
        src = module.encode_prompts([prompt])
        out = greedy_decode(module.model, src, new)
        rows.append(src[0].tolist() + out.sequences()[0])
    width = max(len(r) for r in rows)
    return torch.tensor([r + [module.model.pad_id] * (width - len(r)) for r in rows])


def fit_drafter(target: Path, steps: int = 400, block_size: int = 4) -> DFlashModule:
    """A DFlashModule on ``target`` trained ``steps`` AdamW steps on the target's own greedy continuations of
    :data:`PROMPTS` and a few of their prefixes (so that decoding those prompts accepts whole blocks)."""
    torch.manual_seed(0)
    module = DFlashModule(str(target), block_size=block_size, anchors=16, max_new_tokens=12)
    prompts = PROMPTS + [p[: len(p) // 2] for p in PROMPTS if len(p) > 3]
    src = own_sequences(module, prompts)
    optimizer = torch.optim.AdamW(module.drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    for i in range(steps):
        out = module.step({"src": src}, torch.Generator().manual_seed(i), 0.0)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    return module.eval()


def save_dflash(module: DFlashModule, path: Path) -> Path:
    """``module`` written as ``fit`` writes its checkpoints (what ``load_model`` reads back)."""
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(ckpt)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path


def write_dflash(path: Path, target: Path, steps: int = 400) -> Path:
    """A fitted drafter on ``target`` saved at ``path``."""
    return save_dflash(fit_drafter(target, steps), path)
