"""A trained DFlash drafter (:class:`~lightning_bpd.drafters.dflash.network.DFlashDrafter`) written in the two layouts that serve
it, and the z-lab one read back.

* :func:`write_speculators`: the ``speculators`` ``dflash`` layout (``config.json`` with ``speculators_model_type``
  "dflash" + ``model.safetensors``) that vLLM loads as a DFlash drafter and that speculators' own
  ``DFlashDraftModel.from_pretrained`` reads (class ``speculators.models.dflash.DFlashDraftModel``, config
  ``DFlashSpeculatorConfig``). The format followed is that of speculators 0.9.0 (``SPECULATORS_VERSION``; its DFlash
  config and converter are the same as at ``hsc-v0.7.0``), checked against what its own converter writes:

  - ``architectures`` is ``["DFlashDraftModel"]``, the class name ``save_pretrained`` writes over the config's
    default ``["DFlashSpeculator"]`` (vLLM picks the model by ``speculators_model_type``);

  - ``aux_hidden_state_layer_ids`` are vLLM capture indices, the residual stream ENTERING decoder layer k (= the
    output of layer k - 1): our z-lab ``target_layer_ids`` + 1, as speculators' z-lab converter maps them;
  - ``transformer_layer_config`` is a Qwen3 config of the drafter (full attention in every layer, bidirectional in
    the block; ``vocab_size`` = the target's); ``draft_vocab_size`` = the target's vocabulary (no draft vocabulary:
    no ``d2t``/``t2d``);
  - the weights are the drafter's alone under its own names (``fc``, ``hidden_norm``, ``layers.{i}.*``, ``norm``):
    speculators 0.9.0 saves neither ``embed_tokens.weight`` nor, for a full-vocabulary draft, ``lm_head.weight``
    and rebuilds both from the verifier (``speculators_config.verifier.name_or_path``) on load, as vLLM shares the
    target's (z-lab checkpoints have neither; 0.7.x checkpoints carried copies).

* :func:`write_zlab`: the z-lab layout (``z-lab/*-DFlash-b16``) that llama.cpp's ``convert_hf_to_gguf.py`` reads
  (architectures ``["DFlashDraftModel"]``, the Qwen3 keys at the top level, ``num_target_layers``, ``block_size`` at
  the top level and in ``dflash_config`` with ``target_layer_ids`` (z-lab convention: the OUTPUT of layer L, ours
  as they are) and ``mask_token_id``; weights ``layers.*``, ``fc``, ``hidden_norm``, ``norm``).
  :func:`read_zlab` reads such a folder back into a :class:`DFlashDrafter`.

Both writers take a :class:`~lightning_bpd.drafters.dflash.module.DFlashModule` (drafter + its target), or a drafter
with ``target=`` the Hugging Face directory of its target.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_bpd.drafters.dflash.network import DFlashConfig, DFlashDrafter
from lightning_bpd.hf.gguf_target import resolve_pretrained

__all__ = ["SPECULATORS_VERSION", "drafter_target", "read_zlab", "speculators_config", "write_speculators", "write_zlab",
           "zlab_config"]

CONFIG, WEIGHTS = "config.json", "model.safetensors"
SPECULATORS_VERSION = "0.9.0"  # the speculators release whose DFlash checkpoint layout is written


def drafter_target(source: Any, target: str | os.PathLike | None) -> tuple[DFlashDrafter, str, dict[str, Any]]:
    """(drafter, the target's directory as given, the target's facts: architectures, hidden size, layers, vocabulary,
    positions) of a DFlashModule, or of a drafter and its target directory."""
    drafter = getattr(source, "drafter", source)
    if not isinstance(drafter, DFlashDrafter):
        raise TypeError(f"a DFlashModule or a DFlashDrafter is expected, not {type(source).__name__}")
    if target is None:
        model = getattr(source, "model", None)
        pretrained = getattr(getattr(source, "hparams", None), "pretrained", None)
        if model is None or pretrained is None:
            raise ValueError("a drafter alone: give target=<the Hugging Face directory of its target model>")
        config, vocab = model.base.config, int(model.vocab_size)
        target = resolve_pretrained(pretrained)  # a .gguf target: its dequantized Hugging Face folder
    else:
        from transformers import AutoConfig

        if not Path(target).is_dir():
            raise ValueError(f"target {target}: not a directory (the Hugging Face checkpoint of the target model)")
        config = AutoConfig.from_pretrained(os.fspath(target))
        vocab = None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    facts = {"architectures": list(getattr(config, "architectures", None) or []),
             "hidden_size": int(text.hidden_size), "num_hidden_layers": int(text.num_hidden_layers),
             "vocab_size": int(vocab if vocab is not None else text.vocab_size),
             "max_position_embeddings": getattr(text, "max_position_embeddings", None)}
    c = drafter.config
    if c.hidden_size != facts["hidden_size"]:
        raise ValueError(f"the drafter's hidden size {c.hidden_size} is not the target's {facts['hidden_size']}")
    bad = [i for i in c.target_layer_ids if not 0 <= i < facts["num_hidden_layers"]]
    if bad:
        raise ValueError(f"target_layer_ids {list(c.target_layer_ids)}: {bad} not a layer of the "
                         f"{facts['num_hidden_layers']}-layer target")
    if not 0 <= c.mask_token_id < facts["vocab_size"]:
        raise ValueError(f"mask_token_id {c.mask_token_id} is outside the target's vocabulary "
                         f"[0, {facts['vocab_size']})")
    return drafter, os.fspath(target), facts


def qwen3_layer_config(config: DFlashConfig, facts: dict[str, Any]) -> dict[str, Any]:
    """The drafter as a Qwen3 config (full attention, no sliding window; the target's vocabulary and positions)."""
    positions = facts.get("max_position_embeddings") or 32768
    return {"model_type": "qwen3", "vocab_size": facts["vocab_size"], "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
            "head_dim": config.head_dim, "hidden_act": "silu", "max_position_embeddings": int(positions),
            "rms_norm_eps": config.rms_norm_eps, "rope_theta": config.rope_theta,
            "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": config.num_layers,
            "layer_types": ["full_attention"] * config.num_layers}


def _dtype(drafter: DFlashDrafter) -> str:
    return str(drafter.fc.weight.dtype).removeprefix("torch.")


def speculators_config(source: Any, target: str | os.PathLike | None = None) -> dict[str, Any]:
    """The ``config.json`` of :func:`write_speculators`."""
    drafter, target_dir, facts = drafter_target(source, target)
    c = drafter.config
    return {"architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash",
            "speculators_version": SPECULATORS_VERSION, "dtype": _dtype(drafter),
            "draft_vocab_size": facts["vocab_size"], "block_size": c.block_size,
            "target_hidden_size": facts["hidden_size"],
            "aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
            "mask_token_id": c.mask_token_id, "sliding_window_non_causal": False, "sample_from_anchor": False,
            "speculators_config": {
                "algorithm": "dflash",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": c.block_size - 1,
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": target_dir, "architectures": facts["architectures"]}},
            "transformer_layer_config": qwen3_layer_config(c, facts)}


def zlab_config(source: Any, target: str | os.PathLike | None = None) -> dict[str, Any]:
    """The ``config.json`` of :func:`write_zlab`."""
    drafter, _, facts = drafter_target(source, target)
    c = drafter.config
    layer = qwen3_layer_config(c, facts)
    return {"architectures": ["DFlashDraftModel"], **layer, "dtype": _dtype(drafter),
            "num_target_layers": facts["num_hidden_layers"], "block_size": c.block_size,
            "dflash_config": {"target_layer_ids": list(c.target_layer_ids), "mask_token_id": c.mask_token_id,
                              "block_size": c.block_size}}


def drafter_weights(drafter: DFlashDrafter) -> dict[str, Tensor]:
    """The drafter's tensors under their (speculators = z-lab) names, detached, on the CPU, contiguous."""
    return {key: value.detach().cpu().contiguous() for key, value in drafter.state_dict().items()}


def _write(folder: str | os.PathLike, config: dict[str, Any], weights: dict[str, Tensor]) -> Path:
    from safetensors.torch import save_file

    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path / WEIGHTS), metadata={"format": "pt"})
    (path / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return path


def write_speculators(source: Any, out_dir: str | os.PathLike, target: str | os.PathLike | None = None) -> Path:
    """Write the drafter of ``source`` (a DFlashModule, or a drafter with ``target``) in speculators' ``dflash``
    layout: ``config.json`` (:func:`speculators_config`) and ``model.safetensors`` (the drafter's tensors)."""
    config = speculators_config(source, target)
    return _write(out_dir, config, drafter_weights(getattr(source, "drafter", source)))


def write_zlab(source: Any, out_dir: str | os.PathLike, target: str | os.PathLike | None = None) -> Path:
    """Write the drafter of ``source`` in z-lab's layout: ``config.json`` (:func:`zlab_config`) and
    ``model.safetensors`` (``layers.*``, ``fc``, ``hidden_norm``, ``norm``)."""
    config = zlab_config(source, target)
    return _write(out_dir, config, drafter_weights(getattr(source, "drafter", source)))


def read_zlab(folder: str | os.PathLike) -> DFlashDrafter:
    """A z-lab DFlash folder (config.json + model.safetensors) -> the DFlashDrafter it holds (eval mode, the saved
    dtype); ValueError (one line) for a missing file or key, another architecture, a sliding-window layer or weights
    that are not the drafter's."""
    from safetensors.torch import load_file

    path = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (path / name).is_file():
            raise ValueError(f"{path}: no {name} (a z-lab DFlash folder, as write_zlab writes, is expected)")
    data = json.loads((path / CONFIG).read_text())
    if "speculators_model_type" in data:
        raise ValueError(f"{path}: a speculators export (speculators_model_type), not z-lab's layout")
    if data.get("architectures") != ["DFlashDraftModel"]:
        raise ValueError(f"{path}: architectures {data.get('architectures')}, not ['DFlashDraftModel']")
    dflash = data.get("dflash_config") or {}
    if any(t != "full_attention" for t in data.get("layer_types") or []) or data.get("use_sliding_window"):
        raise ValueError(f"{path}: sliding-window layers, which DFlashDrafter does not have")
    try:
        heads = int(data["num_attention_heads"])
        theta = data.get("rope_theta") or (data.get("rope_parameters") or {})["rope_theta"]
        config = DFlashConfig(hidden_size=int(data["hidden_size"]), num_heads=heads,
                              num_kv_heads=int(data.get("num_key_value_heads") or heads),
                              head_dim=int(data.get("head_dim") or int(data["hidden_size"]) // heads),
                              intermediate_size=int(data["intermediate_size"]),
                              target_layer_ids=tuple(dflash["target_layer_ids"]),
                              mask_token_id=int(dflash["mask_token_id"]), num_layers=int(data["num_hidden_layers"]),
                              rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)), rope_theta=float(theta),
                              block_size=int(data.get("block_size") or dflash.get("block_size") or 16))
    except KeyError as err:
        raise ValueError(f"{path}: config.json has no {err.args[0]!r}") from None
    drafter = DFlashDrafter(config)
    return loaded(drafter, load_file(str(path / WEIGHTS)), path)


def loaded(drafter: Any, state: dict[str, Tensor], path: Path, missing_hint: str = "") -> Any:
    """``drafter`` holding ``state`` (its weights as read from ``path``), in their dtype and eval mode; one line where
    a weight is missing (``missing_hint`` after the names), unexpected or of another shape than config.json makes."""
    want = drafter.state_dict()
    missing, unexpected = sorted(set(want) - set(state)), sorted(set(state) - set(want))
    if missing or unexpected:
        raise ValueError(f"{path}: weights missing {missing[:3]}{missing_hint if missing else ''}, "
                         f"unexpected {unexpected[:3]}")
    shapes = [k for k in want if tuple(want[k].shape) != tuple(state[k].shape)]
    if shapes:
        k = shapes[0]
        raise ValueError(f"{path}: {k} has shape {tuple(state[k].shape)}, config.json says {tuple(want[k].shape)}")
    drafter.to(state["fc.weight"].dtype)
    drafter.load_state_dict(state)
    return drafter.eval()
