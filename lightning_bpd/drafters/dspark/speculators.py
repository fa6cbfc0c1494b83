"""A trained DSpark drafter in speculators' ``dspark`` layout (what vLLM serves with ``"method": "dspark"``, what
speculators' own ``DSparkDraftModel.from_pretrained`` reads, and what llama.cpp's converter turns into a GGUF), and
read back.

The layout is DFlash's (:func:`~lightning_bpd.drafters.dflash.speculators.speculators_config`: the Qwen3
``transformer_layer_config``, ``aux_hidden_state_layer_ids`` = our ``target_layer_ids`` + 1, no embedding, no LM
head, no ``d2t``/``t2d``) with, as speculators 0.9.0's ``DSparkSpeculatorConfig`` (a subclass of its DFlash one)
names them: ``architectures`` ``["DSparkDraftModel"]``, ``speculators_model_type`` and ``algorithm`` ``"dspark"``,
``speculative_tokens`` = K (anchor-first: every slot drafts; DFlash's K - 1), and the DSpark flags written
explicitly, never left to a reader's default (vLLM reads ``enable_confidence_head`` and
``confidence_head_with_markov`` as False when absent, llama.cpp's converter reads a missing ``sample_from_anchor``
as False for this schema): ``sample_from_anchor`` true, ``markov_rank``, ``markov_head_type`` ``"vanilla"``,
``enable_confidence_head``, ``confidence_head_with_markov``. The weights: DFlash's and ``markov_head.markov_w1``,
``markov_head.markov_w2``, ``confidence_head.proj`` (weight, bias) under those names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.dflash.speculators import (
    CONFIG,
    WEIGHTS,
    _write,
    drafter_target,
    drafter_weights,
    loaded,
)
from lightning_bpd.drafters.dflash.speculators import speculators_config as dflash_config
from lightning_bpd.drafters.dspark.network import DSparkConfig, DSparkDrafter

__all__ = ["read_speculators", "speculators_config", "write_speculators"]


def dspark_drafter(source: Any) -> DSparkDrafter:
    drafter = getattr(source, "drafter", source)
    if not isinstance(drafter, DSparkDrafter):
        raise TypeError(f"a DSparkModule or a DSparkDrafter is expected, not {type(source).__name__}")
    return drafter


def speculators_config(source: Any, target: str | os.PathLike | None = None) -> dict[str, Any]:
    """The ``config.json`` of :func:`write_speculators` (``source``: a DSparkModule, or a drafter with ``target`` =
    the Hugging Face directory of its target)."""
    c = dspark_drafter(source).config
    _, _, facts = drafter_target(source, target)
    if c.vocab_size != facts["vocab_size"]:
        raise ValueError(f"the drafter's vocabulary {c.vocab_size} is not the target's {facts['vocab_size']}")
    config = dflash_config(source, target)
    spec = config["speculators_config"]
    spec["algorithm"] = "dspark"
    spec["proposal_methods"][0]["speculative_tokens"] = c.block_size  # anchor-first: K drafts per block
    return {**config, "architectures": ["DSparkDraftModel"], "speculators_model_type": "dspark",
            "sample_from_anchor": True, "markov_rank": c.markov_rank, "markov_head_type": "vanilla",
            "enable_confidence_head": c.enable_confidence_head,
            "confidence_head_with_markov": c.confidence_head_with_markov, "speculators_config": spec}


def write_speculators(source: Any, out_dir: str | os.PathLike, target: str | os.PathLike | None = None) -> Path:
    """Write the drafter of ``source`` in speculators' ``dspark`` layout: ``config.json`` (:func:`speculators_config`)
    and ``model.safetensors`` (the drafter's tensors under their own names)."""
    config = speculators_config(source, target)
    return _write(out_dir, config, drafter_weights(dspark_drafter(source)))


def read_speculators(folder: str | os.PathLike) -> DSparkDrafter:
    """A speculators ``dspark`` folder (as :func:`write_speculators` writes: a vanilla Markov head, the target's
    vocabulary, anchor-first) -> the DSparkDrafter it holds (eval mode, the saved dtype); ValueError (one line)
    for a missing file or key, another kind, or weights that are not the drafter's."""
    from safetensors.torch import load_file

    path = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (path / name).is_file():
            raise ValueError(f"{path}: no {name} (a speculators dspark folder, as write_speculators writes, is expected)")
    data = json.loads((path / CONFIG).read_text())
    if data.get("speculators_model_type") != "dspark":
        raise ValueError(f"{path}: speculators_model_type {data.get('speculators_model_type')!r}, not 'dspark'")
    if data.get("markov_head_type", "vanilla") != "vanilla" or data.get("sample_from_anchor") is not True:
        raise ValueError(f"{path}: a {data.get('markov_head_type')!r} Markov head with sample_from_anchor "
                         f"{data.get('sample_from_anchor')}: only vanilla heads, anchor-first, are read")
    try:
        layer = data["transformer_layer_config"]
        heads = int(layer["num_attention_heads"])
        theta = layer.get("rope_theta") or (layer.get("rope_parameters") or {})["rope_theta"]
        config = DSparkConfig(
            hidden_size=int(layer["hidden_size"]), num_heads=heads,
            num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or int(layer["hidden_size"]) // heads),
            intermediate_size=int(layer["intermediate_size"]),
            target_layer_ids=tuple(i - 1 for i in data["aux_hidden_state_layer_ids"]),
            mask_token_id=int(data["mask_token_id"]), num_layers=int(layer["num_hidden_layers"]),
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
            block_size=int(data["block_size"]), vocab_size=int(data["draft_vocab_size"]),
            markov_rank=int(data["markov_rank"]), enable_confidence_head=bool(data["enable_confidence_head"]),
            confidence_head_with_markov=bool(data["confidence_head_with_markov"]))
    except KeyError as err:
        raise ValueError(f"{path}: config.json has no {err.args[0]!r}") from None
    return loaded(DSparkDrafter(config), load_file(str(path / WEIGHTS)), path)
