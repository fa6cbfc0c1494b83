"""A tiny random Llama with its own byte-level BPE tokenizer, and a tiny folder of Python-like source files, written
by the tests (nothing is downloaded)."""

from __future__ import annotations

import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<s>", "</s>"]  # pad 0, BOS 1 (the tokenizer puts it before every text), EOS 2
PAD, BOS, EOS = 0, 1, 2
PROMPTS = ["def f_1(x, y):\n", "    return", "for items in range(3):\n        total = total * items\n"]  # code-like prompts
NAMES = ["x", "y", "total", "items", "value", "count", "result", "data", "key", "index"]


def source_file(rng: random.Random, functions: int = 6) -> str:
    """A few small Python functions, one statement per line."""
    out = []
    for _ in range(functions):
        a, b = rng.sample(NAMES, 2)
        out += [f"def f_{rng.randrange(100)}({a}, {b}):", f"    {a} = {a} + {rng.randrange(10)}",
                f"    for {b} in range({rng.randrange(1, 9)}):", f"        {a} = {a} * {b}", f"    return {a}", ""]
    return "\n".join(out) + "\n"


def write_corpus(root: Path, splits: bool = True, files: int = 4, seed: int = 0) -> Path:
    """``root/{train,val,test}/*.py`` (``splits``) or ``files`` files at the top of ``root``, each a few functions."""
    rng = random.Random(seed)
    folders = {"train": files, "val": 2, "test": 2} if splits else {"": files}
    for folder, n in folders.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (root / folder / f"mod_{i}.py").write_text(source_file(rng), encoding="utf-8")
    return root


def tokenizer(extra: int = 0) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on a few source files; ``extra`` more tokens added."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    rng = random.Random(7)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([source_file(rng) for _ in range(20)], trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.add_tokens([f"extra{i}" for i in range(extra)])
    return fast


def tiny_llama(vocab_size: int, seed: int = 0, positions: int = 128, layers: int = 2) -> LlamaForCausalLM:
    """A tiny random Llama (GQA: 4 heads, 2 KV heads; 2 layers unless told) with scrambled weights: peaked logits, so
    that its greedy output is not a coin toss between near-equal tokens."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=positions,
                         pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False)
    return scrambled(LlamaForCausalLM(config).eval(), seed)


def scrambled(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """The model's matrices redrawn larger (embeddings std 1, attention 3 / sqrt(32), MLP 0.3 / sqrt(32))."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                embedding = any(s in name for s in ("embed", "wte", "wpe"))
                std = 1.0 if embedding else (0.3 if "mlp" in name else 3.0) / 32**0.5
                p.copy_(torch.randn(p.shape, generator=g) * std)
    return model


def write_gpt2(folder: Path, seed: int = 0) -> Path:
    """A tiny random GPT-2 (absolute positions, tied LM head) whose config names no pad id, so that the model pads
    with its EOS (2) while the tokenizer beside it has a pad token (0)."""
    tok = tokenizer()
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=len(tok), n_embd=32, n_layer=2, n_head=4, n_positions=128, bos_token_id=BOS,
                        eos_token_id=EOS, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    scrambled(GPT2LMHeadModel(config).eval(), seed).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def write_checkpoint(folder: Path, with_tokenizer: bool = True, vocab_extra: int = 0, seed: int = 0,
                     positions: int = 128, layers: int = 2) -> Path:
    """The tiny Llama (``layers`` decoder layers) saved with ``save_pretrained`` and (``with_tokenizer``) its tokenizer
    beside it; the model's vocabulary is the tokenizer's plus ``vocab_extra`` (a mismatch when not 0)."""
    tok = tokenizer()
    tiny_llama(len(tok) + vocab_extra, seed, positions, layers).save_pretrained(folder)
    if with_tokenizer:
        tok.save_pretrained(folder)
    return folder
