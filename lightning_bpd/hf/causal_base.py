"""A fresh, randomly initialised Llama-architecture causal LM and its own byte-level BPE tokenizer.

No pretrained weights can be downloaded here, so the code LM recipe (``conf/recipes/code-lm.yaml``) trains a Llama
from scratch with the ``transformers`` class. This module writes its starting point (``make-base --arch llama``): a
``LlamaForCausalLM`` (seeded random init) and a byte-level BPE tokenizer trained with the ``tokenizers`` library on
the training split of a folder of source files (the LM task's own split, so that held-out files stay unseen), both
``save_pretrained`` into one directory that ``AutoModelForCausalLM`` / ``AutoTokenizer`` load like a downloaded one.

The tokenizer is GPT-2's kind: byte-level (every byte string has a tokenization, no unknown token), GPT-2's
pre-tokenization regex, no prefix space, so that llama.cpp's converter can read it as its ``gpt2`` pre-tokenizer.
Specials: ``<pad>`` 0, ``<s>`` 1 (put before every text, as Llama's tokenizer does), ``</s>`` 2 (EOS).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

__all__ = ["CAUSAL_SHAPES", "byte_bpe_tokenizer", "llama_config", "make_causal_base"]

SPECIALS = ["<pad>", "<s>", "</s>"]
PAD, BOS, EOS = 0, 1, 2
# d: hidden size; layers; heads / kv_heads (grouped-query attention); ffn: the gated MLP's width; positions: context.
CAUSAL_SHAPES: dict[str, dict[str, int]] = {
    # the code LM recipe's base: 18.9M parameters at vocabulary 8,192 (tied embeddings); ~560 training tokens/s on
    # one AMD EPYC thread at batch 8 x 256
    "code": {"d": 384, "layers": 10, "heads": 6, "kv_heads": 2, "ffn": 1024, "positions": 1024},
    # its draft model for assisted generation: same tokenizer, 2 layers
    "code-draft": {"d": 256, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 704, "positions": 1024},
    "tiny": {"d": 32, "layers": 2, "heads": 4, "kv_heads": 2, "ffn": 64, "positions": 256},  # tests
}


def check_vocab(vocab: int) -> None:
    """A byte-level BPE holds every byte and the specials: a smaller ``vocab`` is one line."""
    if vocab < 256 + len(SPECIALS):
        raise ValueError(f"--vocab must be at least {256 + len(SPECIALS)} (every byte and the specials), got {vocab}")


def byte_bpe_tokenizer(texts: Iterable[str], vocab: int, max_length: int):
    """A byte-level BPE of ``vocab`` tokens (the three specials included) learnt from ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    check_vocab(vocab)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's regex
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    if [tok.token_to_id(s) for s in SPECIALS] != [PAD, BOS, EOS]:
        raise RuntimeError("the special tokens did not get ids 0, 1, 2")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", BOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=max_length, clean_up_tokenization_spaces=False)


def llama_config(vocab_size: int, shape: dict[str, int]):
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=vocab_size, hidden_size=shape["d"], intermediate_size=shape["ffn"],
                       num_hidden_layers=shape["layers"], num_attention_heads=shape["heads"],
                       num_key_value_heads=shape["kv_heads"], max_position_embeddings=shape["positions"],
                       rope_theta=10000.0, tie_word_embeddings=True, pad_token_id=PAD, bos_token_id=BOS,
                       eos_token_id=EOS, attention_dropout=0.0)


def make_causal_base(data: str | Path | None, out: str | Path, vocab: int = 8192, shape: str = "code", seed: int = 0,
                     tokenizer_from: str | Path | None = None, val_fraction: float = 0.05,
                     test_fraction: float = 0.05,
                     training_texts: Callable[[str | Path, float, float], list[str]] | None = None) -> Path:
    """Write a seeded random ``LlamaForCausalLM`` of ``shape`` and its tokenizer to ``out``: a tokenizer learnt from
    ``data``'s training split, or the one in ``tokenizer_from`` (a draft model shares its target's).
    ``training_texts(data, val_fraction, test_fraction)`` reads that split (the LM task's
    :func:`~lightning_bpd.tasks.lm.files.training_texts`, which the command passes in: the task layer sits above
    this one); it is needed only without ``tokenizer_from``."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    if shape not in CAUSAL_SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(CAUSAL_SHAPES)} for --arch llama, got {shape!r}")
    dims = CAUSAL_SHAPES[shape]
    if tokenizer_from is not None:
        if not (Path(tokenizer_from) / "tokenizer.json").is_file():
            raise ValueError(f"--tokenizer-from: {tokenizer_from} holds no tokenizer.json")
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_from))
    else:
        if data is None:
            raise ValueError("--data: give the folder of source files the tokenizer learns from (or --tokenizer-from)")
        if training_texts is None:
            raise ValueError("make_causal_base: learning a tokenizer from --data needs training_texts (the LM task's "
                             "lightning_bpd.tasks.lm.files.training_texts)")
        check_vocab(vocab)  # before reading the folder
        tokenizer = byte_bpe_tokenizer(training_texts(data, val_fraction, test_fraction), vocab, dims["positions"])
    torch.manual_seed(seed)
    model = LlamaForCausalLM(llama_config(len(tokenizer), dims))
    generation = model.generation_config
    generation.max_length, generation.pad_token_id = dims["positions"], PAD
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    (folder / "make_base.json").write_text(json.dumps(
        {"arch": "llama", "data": None if data is None else str(data), "tokenizer_from": None if tokenizer_from is None
         else str(tokenizer_from), "vocab": len(tokenizer), "shape": shape, **dims, "seed": seed, "parameters": n},
        indent=2) + "\n")
    print(f"make_base: random Llama ({shape}, {n / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}) and its "
          f"tokenizer in {folder}", file=sys.stderr)
    return folder
