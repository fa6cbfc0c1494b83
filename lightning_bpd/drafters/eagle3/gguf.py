"""A trained EAGLE-3 drafter as a GGUF file for llama.cpp (``--spec-type draft-eagle3``): the file llama.cpp's own
``convert_hf_to_gguf.py <speculators export> --target-model-dir <target> --outtype f32`` makes of our speculators
export (:func:`~lightning_bpd.drafters.eagle3.speculators.write_speculators`), written here with the ``gguf`` package.

Followed: llama.cpp as vendored by llama-cpp-python 0.3.36 (``conversion/llama.py`` ``LlamaModel``, which detects
EAGLE-3 by ``draft_vocab_size`` and a 1-layer ``transformer_layer_config``; ``src/models/eagle3.cpp``;
``common/speculative.cpp``), and checked against its converter (``tests/drafters/eagle3/test_gguf.py``, slow):

* architecture ``eagle3``; first its own keys, from the speculators ``config.json``
  (:func:`~lightning_bpd.drafters.eagle3.speculators.speculators_config`): ``eagle3.target_layers`` = its
  ``eagle_aux_hidden_state_layer_ids`` (our ``target_layer_ids`` + 1: llama.cpp extracts the INPUT of those target
  layers, and of id = the target's layer count its last hidden state), ``eagle3.target_hidden_size``, the two norm
  flags llama.cpp reads (``norm_before_residual``, ``norm_before_fc``); then the Llama keys of
  ``transformer_layer_config`` (one layer, context = its positions, sizes, heads, RoPE base, RMS epsilon, head
  dims), ``eagle3.vocab_size`` (the target's) and ``eagle3.rope.dimension_count`` (the head dim);
* the tokenizer is the target's (``tokenizer.ggml.*``, :func:`~lightning_bpd.drafters.common.gguf.add_target_vocab`);
* tensors in the converter's order, the state_dict's names sorted (``d2t`` and ``t2d`` aside): ``token_embd``
  (``embed_tokens``: the target's embeddings, which the drafter holds), ``fc``, ``enc.output_norm`` (``input_norm``,
  under ``norm_before_fc``), ``blk.0.attn_norm_2`` (``hidden_norm``), ``blk.0.attn_norm``, ``ffn_down/gate/up``,
  ``ffn_norm``, ``attn_k``, ``attn_output``, ``attn_q``, ``attn_v``, ``output`` (``lm_head``, over the draft
  vocabulary), ``output_norm``; float32; then, with a draft vocabulary, ``d2t`` as int64 ABSOLUTE target ids
  (offset + index; ``t2d`` is dropped). ``attn_q`` / ``attn_k`` rows are interleaved per head as for every Llama
  (llama.cpp ropes EAGLE-3 adjacent pairs: :func:`~lightning_bpd.hf.gguf_llama.interleave_rotary`).

The converter's ``LlamaModel.set_vocab`` special cases of a 32,016-token (CodeLlama) or 49,152-token (Granite's small
models; SmolLM2) vocabulary are written as it writes them (:func:`~lightning_bpd.drafters.common.gguf.add_llama_vocab`:
for 49,152, ``add_bos_token`` false, which is what SmolLM2's own GGUFs say).

Refused (one line), as llama.cpp cannot run them: a qwen3 layer (q/k norms), ``fc_norm``, other than 3 target layers.
``norm_output`` is written but not run as trained (llama.cpp feeds the pre-norm state back): output stays the
target's, drafts differ (``export-heads`` notes it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_bpd.drafters.eagle3.network import Eagle3Drafter
from lightning_bpd.hf.gguf_llama import LAYER_NAMES, interleave_rotary

__all__ = ["ARCH", "eagle3_tensors", "gguf_tensor_name", "write_eagle3_gguf"]

ARCH = "eagle3"
TOP_NAMES = {"embed_tokens.weight": "token_embd.weight", "fc.weight": "fc.weight",
             "input_norm.weight": "enc.output_norm.weight", "lm_head.weight": "output.weight",
             "norm.weight": "output_norm.weight"}
MAPPINGS = ("d2t", "t2d")  # the draft vocabulary's buffers: d2t written last as absolute ids, t2d dropped


def gguf_tensor_name(name: str) -> str:
    """llama.cpp's name of a drafter tensor (``layers.0.self_attn.q_proj.weight`` -> ``blk.0.attn_q.weight``)."""
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    inner = name.removeprefix("layers.0.").removesuffix(".weight")
    ours = {**LAYER_NAMES, "hidden_norm": "attn_norm_2"}.get(inner)
    if not name.startswith("layers.0.") or ours is None:
        raise ValueError(f"{name}: not a tensor llama.cpp's eagle3 has")
    return f"blk.0.{ours}.weight"


def check_llamacpp(drafter: Eagle3Drafter) -> None:
    """One-line ValueError where llama.cpp's eagle3 cannot run the drafter as trained."""
    c = drafter.config
    problems = [what for what, bad in (
        (f"a {c.family} layer (q/k norms; llama.cpp's eagle3 is a Llama layer)", c.family != "llama"),
        ("fc_norm (llama.cpp has no per-layer norms before fc)", c.fc_norm),
        (f"{c.num_target_features} target layers (llama.cpp's eagle3 takes exactly 3)", c.num_target_features != 3),
    ) if bad]
    if problems:
        raise ValueError(f"llama.cpp's eagle3 does not take this drafter: {'; '.join(problems)}")


def eagle3_tensors(drafter: Eagle3Drafter) -> dict[str, np.ndarray]:
    """llama.cpp's name -> array of every drafter tensor, in the converter's order: float32 weights, then ``d2t``
    (int64 absolute target ids) where the drafter has a draft vocabulary."""
    c = drafter.config
    state = {name: t.detach().cpu() for name, t in drafter.state_dict().items()}
    out = {}
    for name in sorted(k for k in state if k not in MAPPINGS):
        weight = state[name].to(torch.float32)
        if name.endswith(("q_proj.weight", "k_proj.weight")):
            weight = interleave_rotary(weight, c.num_heads if "q_proj" in name else c.num_kv_heads)
        out[gguf_tensor_name(name)] = weight.contiguous().numpy()
    if state.get("d2t") is not None:
        d2t = state["d2t"].to(torch.int64).reshape(-1)  # (Vd,) offsets: target id = d + d2t[d]
        out["d2t"] = (d2t + torch.arange(d2t.numel())).numpy()
    return out


def write_eagle3_gguf(drafter: Eagle3Drafter, path: str | os.PathLike, target: str | os.PathLike,
                      tokenizer: Any = None, name: str | None = None) -> Path:
    """``drafter`` as one GGUF at ``path``, beside its target (``target``: the target's Hugging Face directory, whose
    tokenizer it copies; ``tokenizer``: that tokenizer, loaded from it when not given); ValueError (one line) for a
    drafter llama.cpp cannot run (:func:`check_llamacpp`), that does not fit the target, or a tokenizer llama.cpp
    would not read alike."""
    import gguf

    from lightning_bpd.drafters.common.gguf import add_layer_keys, add_llama_vocab
    from lightning_bpd.drafters.eagle3.speculators import speculators_config
    from lightning_bpd.hf.gguf_llama import write_gguf
    from lightning_bpd.hf.prompts import load_tokenizer

    if not isinstance(drafter, Eagle3Drafter):
        raise TypeError(f"an Eagle3Drafter is expected, not {type(drafter).__name__}")
    check_llamacpp(drafter)
    if not Path(target).is_dir():
        raise ValueError(f"the target {target} is not a directory: its config and tokenizer go into the drafter's GGUF")
    spec = speculators_config(drafter, target)  # what the converter reads; checks that the drafter fits the target
    layer = spec["transformer_layer_config"]
    tensors = eagle3_tensors(drafter)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), ARCH)
    writer.add_array(f"{ARCH}.target_layers", spec["eagle_aux_hidden_state_layer_ids"])
    writer.add_uint32(f"{ARCH}.target_hidden_size", spec["target_hidden_size"])
    writer.add_bool(f"{ARCH}.norm_before_residual", spec["norm_before_residual"])
    writer.add_bool(f"{ARCH}.norm_before_fc", spec["norm_before_fc"])
    add_layer_keys(writer, layer, name or f"{Path(target).name}-eagle3", tensors)
    writer.add_vocab_size(layer["vocab_size"])
    writer.add_rope_dimension_count(layer["head_dim"])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    add_llama_vocab(writer, tokenizer or load_tokenizer(target), target, layer["vocab_size"])
    return write_gguf(writer, tensors)
