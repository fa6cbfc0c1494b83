"""A trained DFlash drafter as a GGUF file for llama.cpp (``--spec-type draft-dflash``): the file llama.cpp's own
``convert_hf_to_gguf.py`` makes of our z-lab export (:func:`~lightning_bpd.drafters.dflash.speculators.write_zlab`), written
here with the ``gguf`` package, float32.

Followed: llama.cpp as vendored by llama-cpp-python 0.3.36 (``conversion/qwen.py`` ``DFlashModel``, a ``Qwen3Model``;
``src/models/dflash.cpp``; ``common/speculative.cpp``), and checked against its converter
(``tests/drafters/dflash/test_gguf.py``, slow):

* architecture ``dflash``; the Qwen3 keys of the z-lab config under it (layers, context = the target's positions,
  hidden and MLP sizes, heads, RoPE base, RMS epsilon, head dims), ``dflash.block_size`` and ``dflash.target_layers``
  = our ``target_layer_ids`` + 1: llama.cpp extracts the INPUT of those target layers (= the output of ours), so the
  target's last layer cannot be one (llama.cpp aborts: there is no layer after it to take its output as input); the
  writer refuses it;
* the tokenizer is the target's (``tokenizer.ggml.*``, as the converter copies it from ``--target-model-dir``; of a
  Llama target with its ``LlamaModel.set_vocab`` extras, e.g. ``add_bos_token`` false for 49,152 tokens:
  :func:`~lightning_bpd.drafters.common.gguf.add_llama_vocab`), with ``tokenizer.ggml.mask_token_id`` (the
  block's mask slots);
* tensors (the converter's order: the z-lab weights' names sorted): ``fc``, ``enc.output_norm`` (hidden_norm), per
  layer ``blk.{i}.attn_norm``, ``ffn_down/gate/up``, ``ffn_norm``, ``attn_k_norm``, ``attn_k``, ``attn_output``,
  ``attn_q_norm``, ``attn_q``, ``attn_v``, then ``output_norm``; no embedding and no LM head: llama.cpp shares the
  target's. Rotary rows are not permuted: llama.cpp ropes a DFlash drafter NeoX-style (halves), as transformers does.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from lightning_bpd.drafters.dflash.speculators import drafter_target, drafter_weights, zlab_config

__all__ = ["ARCH", "dflash_tensors", "gguf_tensor_name", "write_dflash_gguf"]

ARCH = "dflash"
TOP_NAMES = {"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
             "norm.weight": "output_norm.weight"}
LAYER_NAMES = {  # the drafter's name in layers.{i} -> llama.cpp's in blk.{i}
    "input_layernorm": "attn_norm", "mlp.down_proj": "ffn_down", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "post_attention_layernorm": "ffn_norm", "self_attn.k_norm": "attn_k_norm", "self_attn.k_proj": "attn_k",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.q_proj": "attn_q",
    "self_attn.v_proj": "attn_v",
}


def gguf_tensor_name(name: str) -> str:
    """llama.cpp's name of a drafter tensor (``layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight``)."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    parts = name.split(".")
    inner = ".".join(parts[2:-1])
    if parts[0] != "layers" or inner not in LAYER_NAMES or parts[-1] != "weight":
        raise ValueError(f"{name}: not a tensor of a DFlash drafter")
    return f"blk.{parts[1]}.{LAYER_NAMES[inner]}.weight"


def dflash_tensors(drafter: Any) -> dict[str, np.ndarray]:
    """llama.cpp's name -> float32 array of every drafter tensor, in the converter's order."""
    weights = drafter_weights(drafter)
    return {gguf_tensor_name(name): weights[name].float().numpy() for name in sorted(weights)}


def write_dflash_gguf(source: Any, path: str | os.PathLike, target: str | os.PathLike | None = None,
                      name: str | None = None) -> Path:
    """The drafter of ``source`` (a DFlashModule, or a drafter with ``target`` = its target's Hugging Face directory)
    as one float32 GGUF at ``path``; ValueError (one line) for a target whose tokenizer llama.cpp would not read
    alike."""
    import gguf

    from lightning_bpd.drafters.common.gguf import (
        LLAMA_ARCHITECTURES,
        add_layer_keys,
        add_llama_vocab,
        add_target_vocab,
    )
    from lightning_bpd.hf.gguf_llama import write_gguf
    from lightning_bpd.hf.prompts import load_tokenizer

    drafter, target_dir, facts = drafter_target(source, target)
    last = facts["num_hidden_layers"] - 1
    if last in drafter.config.target_layer_ids:
        raise ValueError(f"target layer {last} is the target's last: llama.cpp feeds the drafter the input of the layer "
                         f"after each target layer, and the {last + 1}-layer target has none after {last} (train the "
                         f"drafter on layers below {last})")
    config = zlab_config(source, target)
    if not Path(target_dir).is_dir():
        raise ValueError(f"the target {target_dir} is not a directory: its tokenizer goes into the drafter's GGUF")
    tokenizer = getattr(source, "tokenizer", None) or load_tokenizer(target_dir)
    tensors = dflash_tensors(drafter)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), ARCH)
    add_layer_keys(writer, config, name or f"{Path(target_dir).name}-dflash", tensors)
    writer.add_uint32(f"{ARCH}.block_size", config["dflash_config"]["block_size"])
    writer.add_array(f"{ARCH}.target_layers", [i + 1 for i in config["dflash_config"]["target_layer_ids"]])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    llama = bool(facts["architectures"]) and facts["architectures"][0] in LLAMA_ARCHITECTURES  # its set_vocab
    (add_llama_vocab if llama else add_target_vocab)(writer, tokenizer, target_dir, facts["vocab_size"])
    writer.add_mask_token_id(config["dflash_config"]["mask_token_id"])
    return write_gguf(writer, tensors)
