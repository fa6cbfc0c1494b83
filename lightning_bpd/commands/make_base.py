"""``python -m lightning_bpd make-base``: a fresh, randomly initialised Marian base with its own tokenizer.

No pretrained weights can be downloaded here, so the Hugging Face recipe (``conf/recipes/multi30k-hf-marian.yaml``)
trains a Marian-architecture model from scratch. This command writes its starting point: a ``MarianMTModel``
(random init, seeded) and a joint BPE tokenizer trained with the ``tokenizers`` library on the training corpus
(source and target side), both ``save_pretrained`` into ``--out``, so that ``AutoModelForSeq2SeqLM.from_pretrained``
and ``AutoTokenizer.from_pretrained`` load the folder like a downloaded opus-mt checkpoint.

    python -m lightning_bpd make-base --data-root ../shared/data/translation/multi30k --out runs/hf-base-init \\
        --vocab 8000 --shape multi30k

``--arch llama`` writes a random ``LlamaForCausalLM`` and a byte-level BPE tokenizer learnt from the training split
of a folder of source files instead (``lightning_bpd/hf/causal_base.py``; the code LM recipe)::

    python -m lightning_bpd make-base --arch llama --data-root ../shared/data/code/python-stdlib --out runs/lm-init \\
        --vocab 8192 --shape code
    python -m lightning_bpd make-base --arch llama --tokenizer-from runs/lm-init --out runs/draft-init --shape code-draft

Marian shapes: ``multi30k`` (d_model 256, 3+3 layers, 4 heads, ffn 1024, dropout 0.1: the shape of our own Multi30k
base) and ``tiny`` (d_model 32, 2+2 layers: tests). As Marian: sinusoidal positions, post-norm layers, shared and
tied embeddings scaled by sqrt(d_model), ``</s>`` 0, ``<unk>`` 1, ``<pad>`` 2 (the decoder's start token).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

from lightning_bpd.commands.out_paths import in_the_way
from lightning_bpd.commands.recipe import ATTEMPTS_FILE, LOG_FILE, RUNNING_FILE
from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.tasks.translation.text_files import read_lines, resolve_split_files

__all__ = ["SHAPES", "make_base", "train_tokenizer"]

SPECIALS = ["</s>", "<unk>", "<pad>"]  # Marian's order: EOS 0, unk 1; pad 2 starts the decoder
EOS, UNK, PAD = 0, 1, 2
SHAPES: dict[str, dict[str, float | int]] = {
    "multi30k": {"d_model": 256, "layers": 3, "heads": 4, "ffn": 1024, "dropout": 0.1, "positions": 256},
    "tiny": {"d_model": 32, "layers": 2, "heads": 4, "ffn": 64, "dropout": 0.1, "positions": 128},
}


def corpus_lines(root: str | Path, prefix: str, langs: tuple[str, ...]) -> Iterator[str]:
    src, tgt = resolve_split_files(root, prefix, langs[0], langs[1])
    for path in (src, tgt):
        yield from (line.strip() for line in read_lines(path))


def train_tokenizer(lines: Iterator[str] | list[str], vocab: int, max_length: int = 256):
    """A joint BPE tokenizer (SentencePiece-like ``▁`` word marks) that appends ``</s>``, as Marian's does."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIALS, min_frequency=2, show_progress=False)
    tok.train_from_iterator(lines, trainer)
    if [tok.token_to_id(s) for s in SPECIALS] != [EOS, UNK, PAD]:
        raise RuntimeError("the special tokens did not get ids 0, 1, 2")
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A $B </s>",
                                                       special_tokens=[("</s>", EOS)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                   model_max_length=max_length)


def marian_config(vocab_size: int, shape: dict[str, float | int]):
    from transformers import MarianConfig

    d, layers, heads, ffn = (int(shape[key]) for key in ("d_model", "layers", "heads", "ffn"))
    return MarianConfig(vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=d, encoder_layers=layers,
                        decoder_layers=layers, encoder_attention_heads=heads, decoder_attention_heads=heads,
                        encoder_ffn_dim=ffn, decoder_ffn_dim=ffn, max_position_embeddings=int(shape["positions"]),
                        dropout=float(shape["dropout"]), attention_dropout=0.0, activation_dropout=0.0,
                        activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True,
                        tie_word_embeddings=True, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
                        forced_eos_token_id=None)


def make_base(data: str | Path, out: str | Path, vocab: int = 8000, shape: str = "multi30k", seed: int = 0,
              prefix: str = "train", langs: tuple[str, str] = ("en", "de")) -> Path:
    """Write a seeded random ``MarianMTModel`` and its tokenizer (trained on ``data``'s ``prefix`` split) to ``out``."""
    from transformers import MarianMTModel

    if shape not in SHAPES:
        raise ValueError(f"--shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    dims = SHAPES[shape]
    tokenizer = train_tokenizer(corpus_lines(data, prefix, langs), vocab, int(dims["positions"]))
    torch.manual_seed(seed)
    model = MarianMTModel(marian_config(len(tokenizer), dims))
    generation = model.generation_config
    generation.bad_words_ids = [[PAD]]  # Marian's pad ban (never generated after the start token)
    generation.num_beams, generation.max_length, generation.forced_eos_token_id = 1, int(dims["positions"]), None
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    (folder / "make_base.json").write_text(json.dumps({"data": str(data), "prefix": prefix, "langs": list(langs),
                                                       "vocab": len(tokenizer), "shape": shape, **dims, "seed": seed,
                                                       "parameters": n}, indent=2) + "\n")
    print(f"make_base: random Marian ({shape}, {n / 1e6:.1f}M parameters, vocabulary {len(tokenizer)}) and its "
          f"tokenizer in {folder}", file=sys.stderr)
    return folder


RECIPE_FILES = (LOG_FILE, RUNNING_FILE, ATTEMPTS_FILE)  # a recipe stage's own records in its folder (the --out)


def check_out(out: str | Path, data: str | Path | None, tokenizer_from: str | Path | None) -> None:
    """``--out`` must be a new or empty folder (a recipe stage's records aside), not the ``--tokenizer-from`` model
    and not in, around or at the ``--data-root``: make-base never overwrites a model, a tokenizer or a corpus."""
    folder = Path(out)
    blocker = in_the_way(folder)
    if blocker == folder:
        raise ValueError(f"--out {out} is a file, not a folder: give a new --out")
    if blocker is not None:
        raise ValueError(f"--out {out}: {blocker} is a file, not a folder: give another --out")
    where = folder.resolve()
    if tokenizer_from is not None and where == Path(tokenizer_from).resolve():
        raise ValueError(f"--out {out} is the --tokenizer-from model: give a new --out (it would be replaced)")
    if data is not None:
        root = Path(data).resolve()
        relation = ("is" if where == root else "lies inside" if root in where.parents
                    else "holds" if where in root.parents else None)
        if relation:
            raise ValueError(f"--out {out} {relation} the --data-root {data}: give an --out outside the corpus")
    held = sorted(p.name for p in folder.iterdir() if p.name not in RECIPE_FILES) if folder.is_dir() else []
    if held:
        listed = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ValueError(f"--out {out} already holds files ({listed}): give a new or empty --out")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd make-base", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", default="marian", choices=["marian", "llama"],
                   help="marian (a translation base, default) or llama (a causal LM for the LM task)")
    p.add_argument("--data-root", dest="data",
                   help="the corpus folder: {train}.{en,de}[.gz] (marian), or source files (llama)")
    deprecated_alias(p, "--data", "--data-root")
    p.add_argument("--out", required=True, help="the checkpoint directory to write")
    p.add_argument("--vocab", type=int, default=None, help="the BPE vocabulary size (default 8000 marian, 8192 llama)")
    p.add_argument("--shape", default=None,
                   help=f"marian: {', '.join(SHAPES)} (default multi30k); llama: code, code-draft, tiny (default code)")
    p.add_argument("--tokenizer-from", default=None, help="llama: take this checkpoint's tokenizer (a draft model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prefix", default="train", help="the split the tokenizer learns from")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        if args.vocab is not None and args.vocab < 1:
            raise ValueError(f"--vocab must be at least 1, got {args.vocab}")
        check_out(args.out, args.data, args.tokenizer_from)
        if args.arch == "llama":
            from lightning_bpd.hf.causal_base import make_causal_base
            from lightning_bpd.tasks.lm.files import training_texts

            make_causal_base(args.data, args.out, 8192 if args.vocab is None else args.vocab, args.shape or "code",
                             args.seed, args.tokenizer_from, training_texts=training_texts)
        else:
            if args.data is None or args.tokenizer_from is not None:
                raise ValueError("--arch marian needs --data-root (a translation corpus) and takes no --tokenizer-from")
            make_base(args.data, args.out, 8000 if args.vocab is None else args.vocab, args.shape or "multi30k",
                      args.seed, args.prefix, (args.src_lang, args.tgt_lang))
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"make_base: {err}")


if __name__ == "__main__":
    main()
