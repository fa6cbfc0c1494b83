"""A Hugging Face Llama and its byte-level BPE tokenizer written as a float32 GGUF file for llama.cpp.

llama.cpp's own ``convert_hf_to_gguf.py`` identifies a BPE pre-tokenizer by hashing the token ids it gives on a fixed
text and refuses every hash it does not list, which is every ``tokenizers`` BPE trained locally (the code LM recipe's,
:mod:`lightning_bpd.hf.causal_base`). This writer goes through the ``gguf`` package's ``GGUFWriter`` instead and names
the pre-tokenizer itself: a tokenizer whose model is BPE, whose pre-tokenizer is byte-level with GPT-2's regex and no
prefix space, with no normalizer, is llama.cpp's ``gpt-2`` pre-tokenizer (of its ``gpt2`` tokenizer model, a
byte-level BPE). Anything else is refused in one line, and :func:`tokenization_mismatches` checks the claim on the
texts at hand (the bench refuses the peer if one differs).

Weights: every tensor float32 under llama.cpp's Llama names (``token_embd``, ``blk.{i}.attn_q``, ... ``output``);
or (``weights="q8_0"``) the matrices in Q8_0, as a user's quantized GGUF would have them.
Rotary positions: transformers rotates the first half of each head's dimensions against the second half, llama.cpp's
Llama rotates adjacent pairs; so each head's rows of ``q_proj`` and ``k_proj`` are interleaved (row ``j`` of the first
half becomes row ``2j``, row ``j`` of the second half row ``2j + 1``), which makes llama.cpp's rotation the same map.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["check_llama", "gguf_vocabulary", "interleave_rotary", "tokenization_mismatches", "write_gguf",
           "write_llama_gguf"]

LAYER_NAMES = {  # transformers' name in model.layers.{i} -> llama.cpp's in blk.{i}
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def rope_theta(config: Any) -> float:
    """The rotary base of a Llama config (transformers 5's ``rope_parameters`` or the older ``rope_theta``)."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise ValueError("the Llama config names no rope_theta")
    return float(theta)


def check_llama(config: Any) -> None:
    """One-line ValueError unless ``config`` is a plain Llama this writer maps exactly (default rotary positions, no
    biases, SiLU gated MLP)."""
    if config.model_type != "llama":
        raise ValueError(f"the GGUF writer handles Llama checkpoints only, not {config.model_type!r}")
    params = getattr(config, "rope_parameters", None) or {}
    scaling = params.get("rope_type", "default") if params else (getattr(config, "rope_scaling", None) or {}).get(
        "rope_type", "default")
    problems = [name for name, bad in (("rope scaling", scaling != "default"),
                                       ("attention biases", getattr(config, "attention_bias", False)),
                                       ("MLP biases", getattr(config, "mlp_bias", False)),
                                       ("an activation other than SiLU", config.hidden_act != "silu")) if bad]
    if problems:
        raise ValueError(f"the GGUF writer does not map a Llama with {', '.join(problems)}")


def interleave_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """(heads * d, D) projection rows, each head's halves [a_0..a_{d/2-1}, b_0..b_{d/2-1}] reordered to
    [a_0, b_0, a_1, b_1, ...] (transformers' rotary layout -> llama.cpp's)."""
    rows, cols = weight.shape
    d = rows // heads
    return weight.reshape(heads, 2, d // 2, cols).transpose(1, 2).reshape(rows, cols)


def tokenizer_json(tokenizer: Any) -> dict[str, Any]:
    """The fast tokenizer's ``tokenizer.json`` content; ValueError for a slow tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("the GGUF writer needs a fast (tokenizers) tokenizer")
    return json.loads(backend.to_str())


def is_gpt2_byte_level(pre: dict[str, Any] | None) -> bool:
    """Whether a ``tokenizers`` pre-tokenizer is byte-level with GPT-2's regex and no prefix space (alone or the only
    step of a sequence)."""
    if pre is not None and pre.get("type") == "Sequence" and len(pre.get("pretokenizers", [])) == 1:
        pre = pre["pretokenizers"][0]
    return (pre is not None and pre.get("type") == "ByteLevel" and not pre.get("add_prefix_space", True)
            and pre.get("use_regex", True))


def gguf_vocabulary(tokenizer: Any, vocab_size: int) -> dict[str, Any]:
    """llama.cpp's ``gpt2`` tokenizer fields of a byte-level BPE tokenizer: tokens and their types (ids the
    tokenizer lacks up to the model's ``vocab_size`` are unused pads), merges, special ids, whether BOS / EOS are added;
    ValueError (one line) for a tokenizer llama.cpp's ``gpt-2`` pre-tokenizer would not reproduce."""
    import gguf

    spec = tokenizer_json(tokenizer)
    if spec["model"].get("type") != "BPE":
        raise ValueError(f"llama.cpp's gpt2 tokenizer reads BPE models, not {spec['model'].get('type')}")
    if not is_gpt2_byte_level(spec.get("pre_tokenizer")):
        raise ValueError("the tokenizer's pre-tokenizer is not byte-level with GPT-2's regex and no prefix space: "
                         "llama.cpp's gpt-2 pre-tokenizer would split text differently")
    if spec.get("normalizer") is not None:
        raise ValueError("the tokenizer has a normalizer, which llama.cpp's gpt2 tokenizer does not apply")
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    if max(by_id) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(by_id)}, past the model's vocabulary ({vocab_size})")
    special = set(tokenizer.all_special_ids)
    added = {int(i) for i in getattr(tokenizer, "added_tokens_decoder", {})}
    tokens, types = [], []
    for i in range(vocab_size):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        types.append(gguf.TokenType.UNUSED if i not in by_id else gguf.TokenType.CONTROL if i in special
                     else gguf.TokenType.USER_DEFINED if i in added else gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"].get("merges", [])]
    plain, full = tokenizer("a", add_special_tokens=False)["input_ids"], tokenizer("a")["input_ids"]
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    return {"tokens": tokens, "types": types, "merges": merges, "bos": bos, "eos": eos, "pad": tokenizer.pad_token_id,
            "add_bos": bos is not None and full[:1] == [bos] and plain[:1] != [bos],
            "add_eos": eos is not None and full[-1:] == [eos] and plain[-1:] != [eos]}


def llama_tensors(model: Any) -> dict[str, np.ndarray]:
    """llama.cpp's tensor name -> float32 array of a ``LlamaForCausalLM``."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    state = {name: p.detach().to(torch.float32).cpu() for name, p in model.state_dict().items()}
    out = {"token_embd.weight": state["model.embed_tokens.weight"], "output_norm.weight": state["model.norm.weight"],
           "output.weight": state.get("lm_head.weight", state["model.embed_tokens.weight"])}
    for i in range(config.num_hidden_layers):
        for theirs, ours in LAYER_NAMES.items():
            w = state[f"model.layers.{i}.{theirs}.weight"]
            if ours in ("attn_q", "attn_k"):
                w = interleave_rotary(w, heads if ours == "attn_q" else kv_heads)
            out[f"blk.{i}.{ours}.weight"] = w
    return {name: t.contiguous().numpy() for name, t in out.items()}


def write_llama_gguf(model: Any, tokenizer: Any, path: str | Path, name: str = "lightning_bpd",
                     weights: str = "f32") -> Path:
    """``model`` (a ``LlamaForCausalLM``) and its ``tokenizer`` as one GGUF file at ``path``: float32, or
    (``weights="q8_0"``) with every matrix whose rows are whole Q8_0 blocks (32 values) in Q8_0 (a quantized target
    as users bring them, small enough for tests)."""
    import gguf

    if weights not in ("f32", "q8_0"):
        raise ValueError(f"weights must be f32 or q8_0, got {weights!r}")
    config = model.config
    check_llama(config)
    vocab = gguf_vocabulary(tokenizer, config.vocab_size)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(name)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if weights == "f32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # llama.cpp's name of GPT-2's regex
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    for key, add in (("bos", writer.add_bos_token_id), ("eos", writer.add_eos_token_id),
                     ("pad", writer.add_pad_token_id)):
        if vocab[key] is not None:
            add(int(vocab[key]))
    writer.add_add_bos_token(vocab["add_bos"])
    writer.add_add_eos_token(vocab["add_eos"])
    tensors = llama_tensors(model)
    q8 = gguf.GGMLQuantizationType.Q8_0
    raw = {} if weights == "f32" else {k: q8 for k, t in tensors.items() if t.ndim == 2 and t.shape[1] % 32 == 0}
    return write_gguf(writer, {k: gguf.quants.quantize(t, q8) if k in raw else t for k, t in tensors.items()}, raw)


def write_gguf(writer: Any, tensors: dict[str, np.ndarray], raw_types: dict[str, Any] | None = None) -> Path:
    """Add ``tensors`` (in order; each array's dtype its GGML type: float32 F32, int64 I64; or, named in
    ``raw_types``, bytes of that quantized type), write the file and close it; its path."""
    for name, array in tensors.items():
        writer.add_tensor(name, array, raw_dtype=(raw_types or {}).get(name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(writer.path)


def tokenization_mismatches(theirs: Callable[[str], list[int]], tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Indices of the ``texts`` that ``theirs`` (e.g. llama.cpp's tokenizer, special tokens added and parsed)
    tokenizes otherwise than the Hugging Face ``tokenizer``."""
    return [i for i, text in enumerate(texts) if list(theirs(text)) != list(tokenizer(text)["input_ids"])]
