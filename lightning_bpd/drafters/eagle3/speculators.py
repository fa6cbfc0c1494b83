"""A trained EAGLE-3 drafter (:class:`~lightning_bpd.drafters.eagle3.network.Eagle3Drafter`) written in speculators' ``eagle3``
layout, and read back.

:func:`write_speculators` writes ``config.json`` + ``model.safetensors`` as speculators 0.9.0's
``Eagle3DraftModel.save_pretrained`` does (checked against what it writes, and loaded by its own class in
``tests/drafters/eagle3/test_speculators.py``):

* ``architectures`` ``["Eagle3DraftModel"]``, ``speculators_model_type`` "eagle3", ``speculators_version``,
  ``speculators_config`` (algorithm "eagle3", one greedy proposal method, the verifier's path and architectures);
* ``transformer_layer_config``: the one decoder layer as a Llama (or Qwen3) config, ``num_hidden_layers`` 1,
  ``vocab_size`` the target's; ``draft_vocab_size``; ``target_hidden_size`` (= the drafter's: ``fc`` reads
  ``A * target_hidden_size``);
* ``eagle_aux_hidden_state_layer_ids``: the ids of the residual stream ENTERING a target layer (vLLM's capture
  points, llama.cpp's ``extract_layers``), our ``target_layer_ids`` (layer outputs) + 1;
* every norm flag, written even when false (vLLM reads a missing ``norm_before_residual`` as TRUE): 
  ``norm_before_residual``, ``norm_before_fc``, ``fc_norm``, ``norm_output``; ``embed_requires_grad`` false;
* weights under the drafter's own names: ``embed_tokens``, ``fc`` (and ``input_norm`` / ``fc_norm.{i}``),
  ``layers.0.{input_layernorm, hidden_norm, self_attn.*, post_attention_layernorm, mlp.*}``, ``norm``,
  ``lm_head`` (H -> draft vocabulary), and with a draft vocabulary ``d2t`` (int64 offsets: target id = d + d2t[d])
  and ``t2d`` (bool over the target vocabulary).

Who serves what (:func:`serving_notes` says it per drafter): vLLM maps every ``eagle3`` export to its
``Eagle3LlamaForCausalLM`` (a Llama layer; it reads ``norm_before_residual`` and ``norm_before_fc``, not ``fc_norm``
or ``norm_output``). llama.cpp's ``convert_hf_to_gguf.py <out> --target-model-dir <target>`` takes the folder as it
is: it detects EAGLE-3 by ``draft_vocab_size`` and a 1-layer ``transformer_layer_config`` (merged into its
hyper-parameters), needs exactly 3 aux layer ids, reads ``target_hidden_size``, ``norm_before_residual`` and
``norm_before_fc``, maps ``layers.0.*`` to ``model.layers.0.*`` (``hidden_norm`` to ``attn_norm_2``, ``input_norm``
to ``enc_output_norm``), keeps ``fc``, writes ``d2t`` as absolute ids (checked in range and distinct), drops
``t2d``, uses ``embed_tokens`` when present and the target's tokenizer; it has no tensor for Qwen3's q/k norms nor
for ``fc_norm``, and always feeds the pre-norm state back (no ``norm_output``). The GGUF it writes is also written
directly, byte for byte, by :mod:`lightning_bpd.drafters.eagle3.gguf` (``export-heads --format llamacpp``).

:func:`read_speculators` reads such a folder back into an :class:`Eagle3Drafter`.

Wired into ``export-heads --format speculators`` (:meth:`lightning_bpd.drafters.eagle3.kind.Eagle3Kind.export`): an
EAGLE-3 run's ``write_speculators(module.drafter, out, module.hparams.pretrained)`` (the verifier's architectures and
fit read from that directory), then each of ``serving_notes(module.drafter.config)`` on stderr, and a warning where a
target layer is the target's last (``eagle_aux_hidden_state_layer_ids`` = the number of layers: transformers gives
that output after the final norm, vLLM / llama.cpp capture it before), as the DFlash export does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_bpd.drafters.dflash.speculators import SPECULATORS_VERSION, loaded
from lightning_bpd.drafters.eagle3.network import FAMILIES, Eagle3Config, Eagle3Drafter

__all__ = ["SPECULATORS_VERSION", "read_speculators", "serving_notes", "speculators_config", "write_speculators"]

CONFIG, WEIGHTS = "config.json", "model.safetensors"
FLAGS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def _verifier(path: str, architectures: list[str] | None) -> tuple[list[str], dict[str, Any] | None]:
    """The verifier's architectures (given, else its config.json's) and its text config where ``path`` is a local
    directory with a config.json (None for a hub id)."""
    file = Path(path) / CONFIG
    data = json.loads(file.read_text()) if file.is_file() else None
    text = None if data is None else {**data, **(data.get("text_config") or {})}
    if architectures is None:
        if data is None:
            raise ValueError(f"verifier {path}: no {CONFIG} there: give verifier_architectures")
        architectures = list(data.get("architectures") or [])
    return list(architectures), text


def _check_fits(config: Eagle3Config, target: dict[str, Any]) -> None:
    """ValueError (one line) where the drafter was not made for the target config ``target``."""
    n = int(target.get("num_hidden_layers", 0))
    wrong = [f"{key} {getattr(config, ours)} (the target's {target[key]})"
             for key, ours in (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size"))
             if key in target and int(target[key]) != getattr(config, ours)]
    if n and any(i >= n for i in config.target_layer_ids):
        wrong.append(f"target_layer_ids {list(config.target_layer_ids)} (target layers 0..{n - 1})")
    if wrong:
        raise ValueError("the drafter does not fit its verifier: " + ", ".join(wrong))


def layer_config(config: Eagle3Config) -> dict[str, Any]:
    """``transformer_layer_config``: the one decoder layer as a Llama or Qwen3 config (the target's vocabulary)."""
    out = {"model_type": config.family, "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
           "intermediate_size": config.intermediate_size, "num_hidden_layers": 1,
           "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
           "head_dim": config.head_dim, "hidden_act": "silu",
           "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.rms_norm_eps,
           "rope_theta": config.rope_theta,
           "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
           "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False, "use_cache": True}
    if config.family == "llama":
        out.update(mlp_bias=False, pretraining_tp=1)
    else:
        out.update(use_sliding_window=False, sliding_window=None, max_window_layers=1, layer_types=["full_attention"])
    return out


def speculators_config(drafter: Eagle3Drafter, verifier_name_or_path: str | os.PathLike,
                       verifier_architectures: list[str] | None = None, *, speculative_tokens: int = 3
                       ) -> dict[str, Any]:
    """The ``config.json`` of :func:`write_speculators`; a local verifier directory is checked to fit the drafter
    (hidden size, vocabulary, layers) and gives the architectures when none are given."""
    if not isinstance(drafter, Eagle3Drafter):
        raise TypeError(f"an Eagle3Drafter is expected, not {type(drafter).__name__}")
    if speculative_tokens < 1:
        raise ValueError(f"speculative_tokens must be >= 1, got {speculative_tokens}")
    c = drafter.config
    path = os.fspath(verifier_name_or_path)
    architectures, target = _verifier(path, verifier_architectures)
    if target is not None:
        _check_fits(c, target)
    return {"architectures": ["Eagle3DraftModel"], "speculators_model_type": "eagle3",
            "speculators_version": SPECULATORS_VERSION, "dtype": str(drafter.fc.weight.dtype).removeprefix("torch."),
            "draft_vocab_size": c.draft_vocab_size, "target_hidden_size": c.hidden_size,
            "eagle_aux_hidden_state_layer_ids": [i + 1 for i in c.target_layer_ids],
            **{flag: bool(getattr(c, flag)) for flag in FLAGS}, "embed_requires_grad": False,
            "tie_word_embeddings": False,
            "speculators_config": {
                "algorithm": "eagle3",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": int(speculative_tokens),
                                      "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                "default_proposal_method": "greedy",
                "verifier": {"name_or_path": path, "architectures": architectures}},
            "transformer_layer_config": layer_config(c)}


def serving_notes(config: Eagle3Config) -> list[str]:
    """One line per thing vLLM or llama.cpp would not run as trained (empty: both take the export as it is)."""
    notes = []
    if config.family != "llama":
        notes.append(f"a {config.family} layer (q/k norms): vLLM's Eagle3LlamaForCausalLM and llama.cpp's eagle3 run a "
                     "Llama layer; only speculators' own class loads it")
    if config.fc_norm:
        notes.append("fc_norm: neither vLLM nor llama.cpp applies per-layer norms before fc")
    if config.norm_output:
        notes.append("norm_output: vLLM and llama.cpp feed the pre-norm state back, this drafter was trained on the "
                     "post-norm one")
    if config.num_target_features != 3:
        notes.append(f"{config.num_target_features} target layers: llama.cpp's eagle3 takes exactly 3")
    return notes


def write_speculators(drafter: Eagle3Drafter, folder: str | os.PathLike, verifier_name_or_path: str | os.PathLike,
                      verifier_architectures: list[str] | None = None, *, speculative_tokens: int = 3) -> Path:
    """Write ``drafter`` in speculators' ``eagle3`` layout: ``config.json`` (:func:`speculators_config`) and
    ``model.safetensors`` (its state_dict: CPU, contiguous, as it is). Returns the folder."""
    from safetensors.torch import save_file

    config = speculators_config(drafter, verifier_name_or_path, verifier_architectures,
                                speculative_tokens=speculative_tokens)
    weights = {key: value.detach().cpu().contiguous() for key, value in drafter.state_dict().items()}
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(path / WEIGHTS), metadata={"format": "pt"})
    (path / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return path


def _config(path: Path, data: dict[str, Any]) -> Eagle3Config:
    """The Eagle3Config of a speculators eagle3 config.json; ValueError (one line) for what the drafter lacks."""
    if data.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{path}: speculators_model_type {data.get('speculators_model_type')!r}, not 'eagle3'")
    layer = data.get("transformer_layer_config") or {}
    family = layer.get("model_type", "llama")
    if family not in FAMILIES:
        raise ValueError(f"{path}: a {family!r} decoder layer; Eagle3Drafter has {' or '.join(FAMILIES)} layers")
    if int(layer.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{path}: {layer['num_hidden_layers']} decoder layers; Eagle3Drafter has one")
    rope = layer.get("rope_parameters") or {}
    kind = rope.get("rope_type") or (layer.get("rope_scaling") or {}).get("rope_type") or "default"
    if kind != "default" or layer.get("rope_scaling"):
        raise ValueError(f"{path}: RoPE {kind!r} scaling; Eagle3Drafter rotates plainly (rope_type default)")
    ids = data.get("eagle_aux_hidden_state_layer_ids")
    if not ids:
        raise ValueError(f"{path}: no eagle_aux_hidden_state_layer_ids (their default needs the verifier: write them)")
    if min(ids) < 1:
        raise ValueError(f"{path}: aux layer id 0 is the embeddings' output, not a layer's: not supported")
    if data.get("target_hidden_size") not in (None, layer.get("hidden_size")):
        raise ValueError(f"{path}: target_hidden_size {data['target_hidden_size']} differs from the drafter's "
                         f"{layer.get('hidden_size')}: not supported")
    try:
        heads, hidden = int(layer["num_attention_heads"]), int(layer["hidden_size"])
        return Eagle3Config(
            hidden_size=hidden, num_heads=heads, num_kv_heads=int(layer.get("num_key_value_heads") or heads),
            head_dim=int(layer.get("head_dim") or hidden // heads),
            intermediate_size=int(layer["intermediate_size"]), target_layer_ids=tuple(int(i) - 1 for i in ids),
            vocab_size=int(layer["vocab_size"]), draft_vocab_size=int(data["draft_vocab_size"]), family=family,
            rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta") or layer.get("rope_theta") or 10000.0),
            max_position_embeddings=int(layer.get("max_position_embeddings") or 2048),
            **{flag: bool(data.get(flag, False)) for flag in FLAGS}).validate()
    except KeyError as err:
        raise ValueError(f"{path}: config.json has no {err.args[0]!r}") from None


def read_speculators(folder: str | os.PathLike, embeddings: Tensor | None = None) -> Eagle3Drafter:
    """A speculators eagle3 folder (config.json + model.safetensors) -> the Eagle3Drafter it holds (eval mode, the
    saved dtype). ``embeddings`` (V, H): the target's, for a folder saved without ``embed_tokens``. ValueError (one
    line) for a missing file or key, what the drafter lacks, or weights that are not the drafter's."""
    from safetensors.torch import load_file

    path = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (path / name).is_file():
            raise ValueError(f"{path}: no {name} (a speculators eagle3 folder, as write_speculators writes, is "
                             "expected)")
    drafter = Eagle3Drafter(_config(path, json.loads((path / CONFIG).read_text())))
    state = {k: v for k, v in load_file(str(path / WEIGHTS)).items() if not k.startswith("verifier_")}
    if not drafter.config.uses_draft_vocab:  # a whole-vocabulary drafter's mappings are the identity
        state.pop("d2t", None)
        state.pop("t2d", None)
    if "embed_tokens.weight" not in state and embeddings is not None:
        state["embed_tokens.weight"] = embeddings
    hint = " (give embeddings=, the target's)" if set(drafter.state_dict()) - set(state) == {"embed_tokens.weight"} else ""
    return loaded(drafter, state, path, hint)
