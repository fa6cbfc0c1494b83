"""Medusa heads written in vLLM's Medusa layout, and read back (issue 46, deliverable 3).

vLLM's Medusa draft model (``vllm/model_executor/models/medusa.py``, config ``transformers_utils/configs/medusa.py``)
is a folder with a ``config.json`` (``model_type`` "medusa", ``hidden_size``, ``vocab_size``, ``num_heads``,
``num_hidden_layers``, ``medusa_fc_bias``, ``original_lm_head``) and weights ``blocks.{i}.layers.{j}.weight`` /
``.bias`` (block i proposes the token i + 2 ahead: our head i + 1, 0-based) and ``lm_heads.0.weight``, the one LM head
every block projects through (``original_lm_head``: the base's own). vLLM proposes each head's top-1 and runs on a
GPU server; here the export is checked by reading it back (:func:`read_vllm_medusa`) and computing its logits as
vLLM's forward does (:func:`vllm_medusa_logits`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import Tensor, nn

from lightning_bpd.hf.causal import HFCausalBlockwise

CONFIG, WEIGHTS = "config.json", "model.safetensors"


def write_vllm_medusa(model: HFCausalBlockwise, out_dir: str | os.PathLike) -> Path:
    """Write ``model``'s medusa heads (heads 2..k) with the base's LM head in vLLM's Medusa layout."""
    from safetensors.torch import save_file

    if model.head_type != "medusa":
        raise ValueError(f"the vLLM Medusa layout takes medusa heads, not {model.head_type!r} ones")
    if model.k < 2:
        raise ValueError("k = 1 has no medusa heads to export (the base alone)")
    lm_head = model.base.get_output_embeddings()
    if getattr(lm_head, "bias", None) is not None:
        raise ValueError(f"{model.base.config.model_type}: its LM head has a bias, which vLLM's Medusa heads lack")
    state = {key: value.detach().cpu().contiguous() for key, value in model.head.state_dict().items()}
    state["lm_heads.0.weight"] = lm_head.weight.detach().cpu().contiguous()
    config = {"model_type": "medusa", "architectures": ["MedusaModel"], "hidden_size": model.head.d_model,
              "vocab_size": model.vocab_size, "num_heads": model.k - 1, "num_hidden_layers": model.head.n_layers,
              "medusa_fc_bias": True, "original_lm_head": True,
              "torch_dtype": str(lm_head.weight.dtype).removeprefix("torch.")}
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return folder


def read_vllm_medusa(folder: str | os.PathLike) -> tuple[dict, dict[str, Tensor]]:
    """A vLLM Medusa folder -> (its config, its weights); one clear line where a file or a weight is missing."""
    from safetensors.torch import load_file

    path = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (path / name).is_file():
            raise ValueError(f"{path}: no {name} (a folder written by write_vllm_medusa is expected)")
    config = json.loads((path / CONFIG).read_text())
    if config.get("model_type") != "medusa":
        raise ValueError(f"{path}: model_type {config.get('model_type')!r}, not 'medusa'")
    state = load_file(str(path / WEIGHTS))
    want = {f"blocks.{i}.layers.{j}.{w}" for i in range(config["num_heads"])
            for j in range(config["num_hidden_layers"]) for w in ("weight", "bias")} | {"lm_heads.0.weight"}
    missing = sorted(want - set(state))
    if missing:
        raise ValueError(f"{path}: weights missing: {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return config, state


def vllm_medusa_logits(config: dict, state: dict[str, Tensor], h: Tensor) -> Tensor:
    """vLLM's Medusa forward, written plainly: h (..., D) -> each block's logits (..., num_heads, V), block i
    ``x = x + SiLU(W_j x + b_j)`` over its layers j, then the shared LM head."""
    out = []
    for i in range(config["num_heads"]):
        x = h
        for j in range(config["num_hidden_layers"]):
            w, b = state[f"blocks.{i}.layers.{j}.weight"], state[f"blocks.{i}.layers.{j}.bias"]
            x = x + nn.functional.silu(nn.functional.linear(x, w.to(h.dtype), b.to(h.dtype)))
        out.append(nn.functional.linear(x, state["lm_heads.0.weight"].to(h.dtype)))
    return torch.stack(out, dim=-2)
