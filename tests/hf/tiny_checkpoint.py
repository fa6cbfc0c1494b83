"""A tiny random Marian checkpoint with its own word-level tokenizer, and a tiny corpus in the translation layout,
written by the tests (nothing is downloaded)."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import GPT2Config, GPT2LMHeadModel, MarianConfig, MarianMTModel, PreTrainedTokenizerFast

EN = ["the", "a", "cat", "dog", "bird", "sees", "likes", "eats", "big", "small", "red", "green", "house", "tree", "car",
      "ball", "runs", "sleeps", "here", "there"]
DE = ["die", "eine", "katze", "hund", "vogel", "sieht", "mag", "isst", "gross", "klein", "rot", "gruen", "haus", "baum",
      "auto", "ball", "rennt", "schlaeft", "hier", "dort"]
SPECIALS = ["</s>", "<unk>", "<pad>"]  # Marian's order: EOS 0, unk 1; the pad id starts the decoder
EOS, UNK, PAD = 0, 1, 2


def sentence_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """``n`` word-for-word (English, German-like) pairs of 3..7 words."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        words = [rng.randrange(len(EN)) for _ in range(rng.randint(3, 7))]
        pairs.append((" ".join(EN[w] for w in words), " ".join(DE[w] for w in words)))
    return pairs


def write_data(root: Path, sizes: dict[str, int] | None = None) -> Path:
    """``<root>/{train,val,test}.{en,de}.gz``, one sentence per line, aligned."""
    root.mkdir(parents=True, exist_ok=True)
    for seed, (split, n) in enumerate((sizes or {"train": 48, "val": 6, "test": 6}).items()):
        pairs = sentence_pairs(n, seed)
        for side, lang in enumerate(("en", "de")):
            with gzip.open(root / f"{split}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.write("".join(pair[side] + "\n" for pair in pairs))
    return root


def tiny_tokenizer(extra: int = 0) -> PreTrainedTokenizerFast:
    """A word-level tokenizer of the corpus words that appends EOS, as Marian's does; ``extra`` more tokens."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words = EN + DE + [f"extra{i}" for i in range(extra)]
    tok.train_from_iterator([" ".join(words)], trainers.WordLevelTrainer(special_tokens=SPECIALS, min_frequency=1))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


def tiny_marian(vocab_size: int, seed: int = 0) -> MarianMTModel:
    torch.manual_seed(seed)
    config = MarianConfig(vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=64, dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
                          pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, forced_eos_token_id=None,
                          share_encoder_decoder_embeddings=True)
    return MarianMTModel(config).eval()


def write_checkpoint(folder: Path, tokenizer: bool = True, vocab_extra: int = 0, seed: int = 0) -> Path:
    """A tiny random Marian saved with ``save_pretrained`` and (``tokenizer``) its tokenizer beside it; the model's
    vocabulary is the tokenizer's plus ``vocab_extra`` (a mismatch when not 0)."""
    tok = tiny_tokenizer()
    tiny_marian(len(tok) + vocab_extra, seed).save_pretrained(folder)
    if tokenizer:
        tok.save_pretrained(folder)
    return folder


def write_pad_last_checkpoint(folder: Path, seed: int = 0) -> Path:
    """A tiny random Marian laid out as opus-mt is: ``<pad>`` is the last id (and starts the decoder, banned from the
    output), as CTranslate2's Marian converter expects (it drops the last vocabulary row and starts from zeros)."""
    words = list(dict.fromkeys(["</s>", "<unk>", *EN, *DE, "<pad>"]))
    pad = len(words) - 1
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", EOS)])
    torch.manual_seed(seed)
    config = MarianConfig(vocab_size=len(words), d_model=32, encoder_layers=2, decoder_layers=2,
                          encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                          max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
                          pad_token_id=pad, eos_token_id=EOS, decoder_start_token_id=pad, forced_eos_token_id=None,
                          share_encoder_decoder_embeddings=True)
    model = MarianMTModel(config).eval()
    model.generation_config.bad_words_ids = [[pad]]
    model.save_pretrained(folder)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>").save_pretrained(
        folder)
    return folder


def write_decoder_only(folder: Path) -> Path:
    """A tiny GPT-2 (decoder-only) checkpoint with the same tokenizer."""
    tok = tiny_tokenizer()
    GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_embd=16, n_layer=1, n_head=2, n_positions=32)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder
