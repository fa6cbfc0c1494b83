"""``python -m lightning_bpd lookup-cache``: a retrieval datastore (``datastore``) as llama.cpp's n-gram lookup cache
(:mod:`lightning_bpd.tasks.lm.lookup_cache`), so that llama.cpp drafts from it when it serves the target's GGUF::

    python -m lightning_bpd lookup-cache --datastore runs/datastore.pt --out runs/lookup-cache.bin
    llama-lookup -m model.gguf -f prompt.txt --temp 0 --spec-draft-n-max 6 --lookup-cache-dynamic runs/lookup-cache.bin
    llama-server -m model.gguf --spec-type ngram-cache --lookup-cache-dynamic runs/lookup-cache.bin

``llama-lookup`` writes what it generated into its dynamic cache when it ends (give it a copy to keep the export as
it is); ``llama-server``'s ngram-cache speculator reads the file once and drafts up to 8 tokens a step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

__all__ = ["main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd lookup-cache", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datastore", required=True, help="a datastore file (python -m lightning_bpd datastore)")
    p.add_argument("--out", required=True, help="the lookup cache file to write (llama.cpp's binary format)")
    p.add_argument("--greedy-weight", type=int, default=1,
                   help="how many times each observation of the target's greedy continuations counts (default 1)")
    p.add_argument("--pretrained", default=None,
                   help="the target (a Hugging Face folder or .gguf): refuse a datastore of another tokenizer")
    return p


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    try:
        tokenizer = None
        if args.pretrained:
            from lightning_bpd.commands.datastore import target_tokenizer

            tokenizer = target_tokenizer(args.pretrained)[1]
        start = time.perf_counter()
        from lightning_bpd.tasks.lm.lookup_cache import export_lookup_cache

        record = export_lookup_cache(args.datastore, args.out, args.greedy_weight, tokenizer)
    except ValueError as err:
        sys.exit(f"lookup-cache: {str(err).strip().splitlines()[0]}")
    except OSError as err:
        sys.exit(f"lookup-cache: {err.filename or args.out}: {err.strerror or type(err).__name__}")
    print(f"lookup-cache: {record['lookup_cache']}: {sum(record['ngrams'].values()):,} n-grams llama.cpp can draft "
          f"from ({json.dumps(record['ngrams'])} of 1-4 tokens), {record['bytes'] / 2**20:.1f} MiB, in "
          f"{time.perf_counter() - start:.0f} s; serve with --lookup-cache-dynamic {record['lookup_cache']}",
          flush=True)


if __name__ == "__main__":
    main()
