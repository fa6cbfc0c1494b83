"""Tiny DSpark drafters for the tests: random float64 drafters whose Markov and confidence heads matter (weights
large enough that the bias changes the argmax and the confidence crosses 0.5 on some slots), and a tiny fitted
DSparkModule on the tiny Llama of :mod:`tests.tasks.lm.tiny_lm`, saved as ``fit`` saves it."""

from __future__ import annotations

from pathlib import Path

import torch

from lightning_bpd.drafters.dspark.network import DSparkConfig, DSparkDrafter


def random_dspark(hidden: int, vocab: int, block_size: int = 4, layers: tuple[int, ...] = (0, 1), seed: int = 7,
                  mask_token_id: int = 3, rank: int = 8, confidence: bool = True, with_markov: bool = True,
                  head_scale: float = 1.0) -> DSparkDrafter:
    """A random drafter in float64, eval mode; the heads' weights N(0, head_scale) (the confidence bias 0)."""
    torch.manual_seed(seed)
    config = DSparkConfig(hidden_size=hidden, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          target_layer_ids=layers, mask_token_id=mask_token_id, num_layers=2, block_size=block_size,
                          vocab_size=vocab, markov_rank=rank, enable_confidence_head=confidence,
                          confidence_head_with_markov=with_markov)
    drafter = DSparkDrafter(config).double()
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name.startswith(("markov_head", "confidence_head")) and name.endswith("weight"):
                p.normal_(0.0, head_scale)
    return drafter.eval()


def fit_dspark(target: Path, steps: int = 60, block_size: int = 4, **kwargs):
    """A DSparkModule on ``target`` trained ``steps`` AdamW steps on the target's own greedy continuations of the
    DFlash fixture's prompts; eval mode."""
    from lightning_bpd.drafters.dspark.module import DSparkModule
    from tests.drafters.dflash.tiny import PROMPTS, own_sequences

    torch.manual_seed(0)
    module = DSparkModule(str(target), block_size=block_size, anchors=16, max_new_tokens=12, markov_rank=16,
                          **kwargs)
    src = own_sequences(module, PROMPTS + [p[: len(p) // 2] for p in PROMPTS if len(p) > 3])
    optimizer = torch.optim.AdamW(module.drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    for i in range(steps):
        out = module.step({"src": src}, torch.Generator().manual_seed(i), 0.0)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    return module.eval()


def save_module(module, path: Path) -> Path:
    """``module`` written as ``fit`` writes its checkpoints (what ``load_model`` reads back)."""
    import pytorch_lightning as pl

    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
            "pytorch-lightning_version": pl.__version__}
    module.on_save_checkpoint(ckpt)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(ckpt, path)
    return path
