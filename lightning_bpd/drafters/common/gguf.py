"""What llama.cpp's ``convert_hf_to_gguf.py`` writes alike of every drafter it converts (DFlash:
:mod:`~lightning_bpd.drafters.dflash.gguf`, EAGLE-3: :mod:`~lightning_bpd.drafters.eagle3.gguf`), written here with
the ``gguf`` package: the text model's keys of the drafter's layer config, the target's tokenizer (as the converter
copies it from ``--target-model-dir``: llama.cpp's ``gpt2`` tokenizer with the ``gpt-2`` pre-tokenizer, which our
byte-level BPE tokenizers are, see :mod:`~lightning_bpd.hf.gguf_llama`) and the file itself.

A drafter of a Llama target (every EAGLE-3 one: the converter's ``LlamaModel``; a DFlash one whose target is a Llama:
its ``DFlashModel.set_vocab`` calls the target's ``LlamaModel.set_vocab``) gets that ``set_vocab``'s extras too
(:func:`add_llama_vocab`): ``tokenizer.ggml.add_space_prefix`` where the target's ``tokenizer_config.json`` sets
``add_prefix_space``, and its two vocabulary-size special cases: 32,016 tokens (CodeLlama: FIM prefix / suffix /
middle / EOT ids 32007..32010) and 49,152 tokens (Granite's small models, and SmolLM / SmolLM2's: ``add_bos_token``
false). The latter is written as the converter writes it unless the target's tokenizer adds BOS: llama.cpp refuses a
drafter whose ``add_bos_token`` differs from its target's, so the target's ``true`` is kept there.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from lightning_bpd.hf.gguf_llama import gguf_vocabulary

__all__ = ["CODELLAMA_VOCAB", "GRANITE_VOCAB", "LLAMA_ARCHITECTURES", "add_layer_keys", "add_llama_vocab",
           "add_target_vocab"]

CODELLAMA_VOCAB, GRANITE_VOCAB = 32016, 49152  # the converter's LlamaModel.set_vocab special cases
CODELLAMA_FIM = {"prefix": 32007, "suffix": 32008, "middle": 32009, "eot": 32010}
LLAMA_ARCHITECTURES = ("LLaMAForCausalLM", "LlamaForCausalLM", "MistralForCausalLM", "LlamaModel")  # LlamaModel's


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


@contextmanager
def quiet(name: str) -> Iterator[None]:
    """The logger ``name`` reporting errors only, within the block."""
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def add_target_vocab(writer: Any, tokenizer: Any, target_dir: str | os.PathLike, vocab_size: int) -> dict[str, Any]:
    """The target's tokenizer keys as the converter writes them (``tokenizer.ggml.model`` .. its special vocabulary:
    merges, special ids, add_bos / add_eos); the vocabulary (:func:`gguf_vocabulary`); ValueError (one line) for a
    tokenizer llama.cpp would not read alike."""
    import gguf

    vocab = gguf_vocabulary(tokenizer, vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # as in write_llama_gguf: GPT-2's regex, byte-level, no prefix space
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])  # merges, special ids, add_bos/eos: the converter's own SpecialVocab
    with quiet("gguf.vocab"):  # its notes on the tokenizer's pair template, which llama.cpp does not read
        gguf.SpecialVocab(os.fspath(target_dir), load_merges=True, n_vocab=vocab_size).add_to_gguf(writer, quiet=True)
    return vocab


def add_llama_vocab(writer: Any, tokenizer: Any, target_dir: str | os.PathLike, vocab_size: int) -> None:
    """The tokenizer keys the converter's ``LlamaModel.set_vocab`` writes of the target in ``target_dir``:
    ``add_space_prefix`` (where its ``tokenizer_config.json`` sets ``add_prefix_space``), :func:`add_target_vocab`,
    then its special cases of a 32,016 or 49,152-token vocabulary (see the module's notes)."""
    import gguf

    config_file = Path(target_dir) / "tokenizer_config.json"
    prefix = json.loads(config_file.read_text()).get("add_prefix_space") if config_file.is_file() else None
    if prefix is not None:
        writer.add_add_space_prefix(prefix)
    vocab = add_target_vocab(writer, tokenizer, target_dir, vocab_size)
    if vocab_size == CODELLAMA_VOCAB:
        special = gguf.SpecialVocab(os.fspath(target_dir), load_merges=False, special_token_types=list(CODELLAMA_FIM))
        for kind, token_id in CODELLAMA_FIM.items():
            special._set_special_token(kind, token_id)  # what the converter calls
        with quiet("gguf.vocab"), quiet("gguf.gguf_writer"):  # its keys again: overwritten in place, as there
            special.add_to_gguf(writer, quiet=True)
    if vocab_size == GRANITE_VOCAB and not vocab["add_bos"]:
        with quiet("gguf.gguf_writer"):  # overwritten in place where the tokenizer's config named it
            writer.add_add_bos_token(False)

