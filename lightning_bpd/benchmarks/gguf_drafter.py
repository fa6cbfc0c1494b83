"""What llama.cpp's ``convert_hf_to_gguf.py`` writes alike of every drafter it converts (DFlash:
:mod:`~lightning_bpd.benchmarks.gguf_dflash`, EAGLE-3: :mod:`~lightning_bpd.benchmarks.gguf_eagle3`), written here with
the ``gguf`` package: the text model's keys of the drafter's layer config, the target's tokenizer (as the converter
copies it from ``--target-model-dir``: llama.cpp's ``gpt2`` tokenizer with the ``gpt-2`` pre-tokenizer, which our
byte-level BPE tokenizers are, see :mod:`~lightning_bpd.benchmarks.gguf_llama`) and the file itself.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from lightning_bpd.benchmarks.gguf_llama import gguf_vocabulary

__all__ = ["add_layer_keys", "add_target_vocab"]


def add_layer_keys(writer: Any, layer: dict[str, Any], name: str, tensors: dict[str, np.ndarray]) -> None:
    """The converter's ``general.type`` .. ``general.file_type`` (float32) of a drafter whose layer config (Hugging
    Face keys) is ``layer`` and whose ``tensors`` are written, in its order."""
    import gguf

    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(name)
    writer.add_size_label(gguf.size_label(sum(int(t.size) for t in tensors.values()), 0, 0, 0))
    writer.add_block_count(layer["num_hidden_layers"])
    writer.add_context_length(layer["max_position_embeddings"])
    writer.add_embedding_length(layer["hidden_size"])
    writer.add_feed_forward_length(layer["intermediate_size"])
    writer.add_head_count(layer["num_attention_heads"])
    writer.add_head_count_kv(layer["num_key_value_heads"])
    writer.add_rope_freq_base(layer["rope_theta"])
    writer.add_layer_norm_rms_eps(layer["rms_norm_eps"])
    writer.add_key_length(layer["head_dim"])
    writer.add_value_length(layer["head_dim"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)


def add_target_vocab(writer: Any, tokenizer: Any, target_dir: str | os.PathLike, vocab_size: int) -> None:
    """The target's tokenizer keys as the converter writes them (``tokenizer.ggml.model`` .. its special vocabulary:
    merges, special ids, add_bos / add_eos); ValueError (one line) for a tokenizer llama.cpp would not read alike."""
    import gguf

    vocab = gguf_vocabulary(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # as in write_llama_gguf: GPT-2's regex, byte-level, no prefix space
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])  # merges, special ids, add_bos/eos: the converter's own SpecialVocab
    special = logging.getLogger("gguf.vocab")
    level = special.level
    special.setLevel(logging.ERROR)  # its notes on the tokenizer's pair template, which llama.cpp does not read
    try:
        gguf.SpecialVocab(os.fspath(target_dir), load_merges=True, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)
    finally:
        special.setLevel(level)

