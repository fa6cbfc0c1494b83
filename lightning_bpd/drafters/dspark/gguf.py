"""A trained DSpark drafter as a GGUF file for llama.cpp (``--spec-type draft-dspark``): the file llama.cpp's own
converter makes of our speculators export (:func:`~lightning_bpd.drafters.dspark.speculators.write_speculators`),
written here with the ``gguf`` package, float32.

Followed: llama.cpp as vendored by llama-cpp-python 0.3.36 (``conversion/qwen.py`` ``DSparkModel``, a
``DFlashModel``; ``src/models/dflash.cpp``; ``common/speculative.cpp``), checked against its converter
(``tests/drafters/dspark/test_gguf.py``, slow). There is no ``dspark`` architecture: a DSpark drafter is a
``dflash`` one (DFlash's keys, :mod:`~lightning_bpd.drafters.dflash.gguf`) that holds ``markov_w1``, which is how
llama.cpp tells them apart; beside DFlash's keys, ``dflash.sample_from_anchor`` (true: slot j drafts the token
after the anchor's j-th successor) and ``dflash.has_confidence_head``; beside DFlash's tensors, ``markov_w1.weight``
(V, r), ``markov_w2.weight`` (V, r) and, with a confidence head, ``conf_proj.weight`` (1, H + r) and
``conf_proj.bias`` (1,) (llama.cpp's confidence reads ``[h ; W1[prev]]``: a head without the Markov input is not
written). Tensors in the converter's order: the speculators names sorted. The rank is ``markov_w1``'s width.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from lightning_bpd.drafters.dflash.gguf import ARCH, gguf_tensor_name
from lightning_bpd.drafters.dflash.speculators import drafter_target, drafter_weights, zlab_config

__all__ = ["HEAD_NAMES", "dspark_tensor_name", "dspark_tensors", "write_dspark_gguf"]

HEAD_NAMES = {"markov_head.markov_w1.weight": "markov_w1.weight", "markov_head.markov_w2.weight": "markov_w2.weight",
              "confidence_head.proj.weight": "conf_proj.weight", "confidence_head.proj.bias": "conf_proj.bias"}


def dspark_tensor_name(name: str) -> str:
    """llama.cpp's name of a DSpark drafter tensor (the heads', else DFlash's)."""
    return HEAD_NAMES.get(name) or gguf_tensor_name(name)


def dspark_tensors(drafter: Any) -> dict[str, np.ndarray]:
    """llama.cpp's name -> float32 array of every drafter tensor, in the converter's order."""
    weights = drafter_weights(drafter)
    return {dspark_tensor_name(name): weights[name].float().numpy() for name in sorted(weights)}


def write_dspark_gguf(source: Any, path: str | os.PathLike, target: str | os.PathLike | None = None,
                      name: str | None = None) -> Path:
    """The drafter of ``source`` (a DSparkModule, or a drafter with ``target`` = its target's Hugging Face directory)
    as one float32 GGUF at ``path``; ValueError (one line) where llama.cpp could not run it alike."""
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
    c = drafter.config
    last = facts["num_hidden_layers"] - 1
    if last in c.target_layer_ids:
        raise ValueError(f"target layer {last} is the target's last: llama.cpp feeds the drafter the input of the layer "
                         f"after each target layer, and the {last + 1}-layer target has none after {last} (train the "
                         f"drafter on layers below {last})")
    if c.vocab_size != facts["vocab_size"]:
        raise ValueError(f"the drafter's vocabulary {c.vocab_size} is not the target's {facts['vocab_size']}")
    if c.enable_confidence_head and not c.confidence_head_with_markov:
        raise ValueError("a confidence head without the Markov input: llama.cpp's reads [h ; W1[prev]] (train with "
                         "confidence_head_with_markov true, or without a confidence head)")
    if not Path(target_dir).is_dir():
        raise ValueError(f"the target {target_dir} is not a directory: its tokenizer goes into the drafter's GGUF")
    config = zlab_config(source, target)
    tokenizer = getattr(source, "tokenizer", None) or load_tokenizer(target_dir)
    tensors = dspark_tensors(drafter)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), ARCH)
    add_layer_keys(writer, config, name or f"{Path(target_dir).name}-dspark", tensors)
    writer.add_uint32(f"{ARCH}.block_size", c.block_size)
    writer.add_array(f"{ARCH}.target_layers", [i + 1 for i in c.target_layer_ids])
    writer.add_bool(f"{ARCH}.sample_from_anchor", True)
    writer.add_bool(f"{ARCH}.has_confidence_head", bool(c.enable_confidence_head))
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    llama = bool(facts["architectures"]) and facts["architectures"][0] in LLAMA_ARCHITECTURES  # its set_vocab
    (add_llama_vocab if llama else add_target_vocab)(writer, tokenizer, target_dir, facts["vocab_size"])
    writer.add_mask_token_id(c.mask_token_id)
    return write_gguf(writer, tensors)
