"""Greedy decoding against peer implementations: Hugging Face ``transformers`` Marian of the same shape
and, when installed, that Marian converted for CTranslate2 (float32 and int8).

    python -m lightning_bpd.benchmarks.peer --tokens 40 --inputs 20 [--device cuda] [--json out.json]

All models get random weights of one shape (default: the Multi30k base, d_model 256, 3+3 layers,
ff 1024, 4 heads, vocabulary 8000) and decode the same random sources greedily to a forced length
(our EOS disabled; Marian's ``min_new_tokens = max_new_tokens``; CTranslate2's ``min_decoding_length
= max_decoding_length``), one batch at a time, alternating, so the per-token cost compares the decoding
loops and kernels, not what the models learned. Reports milliseconds per generated token (median over
batches) of each and each peer's ratio to ours. The peers are an optional extra
(``pip install -e '.[peers]'``); without ``ctranslate2`` (or with ``--no-ctranslate2``) its rows are left
out. The Marian / CTranslate2 build is :mod:`lightning_bpd.benchmarks.ctranslate2_peer`'s.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from lightning_bpd.benchmarks.ctranslate2_peer import (
    MarianShape,
    PeerUnavailableError,
    build_ctranslate2_peers,
    build_marian,
    ct2_device,
    require,
    source_tokens,
)
from lightning_bpd.decoding import greedy_decode
from lightning_bpd.evaluation import timed
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.records import write_json


def build_ours(args: argparse.Namespace) -> BlockwiseTransformer:
    torch.manual_seed(0)
    config = ModelConfig(args.vocab, args.vocab, d_model=args.d_model, n_heads=args.heads, n_encoder_layers=args.layers,
                         n_decoder_layers=args.layers, d_ff=args.d_ff, dropout=0.0, share_embeddings=True)
    model = BlockwiseTransformer(config).eval()
    model.eos_id = None  # decode exactly --tokens tokens
    model.use_lean_steps(True)  # the lean steps, as a runtime's snapshot runs them
    return model


def peer_shape(args: argparse.Namespace) -> MarianShape:
    return MarianShape(vocab=args.vocab, d_model=args.d_model, encoder_layers=args.layers, decoder_layers=args.layers,
                       heads=args.heads, d_ff=args.d_ff, max_positions=max(512, args.tokens + 2, args.source_length))


def build_peer(args: argparse.Namespace):
    try:
        return build_marian(peer_shape(args))
    except PeerUnavailableError as err:
        raise SystemExit(f"peer: {err}") from None


def build_ct2(args: argparse.Namespace, marian) -> list:
    """The CTranslate2 conversions of ``marian`` (float32, int8), or none without ctranslate2 / when disabled."""
    if args.no_ctranslate2:
        return []
    try:
        require("ctranslate2")
    except PeerUnavailableError as err:
        print(f"peer: no CTranslate2 rows: {err}")
        return []
    return build_ctranslate2_peers(peer_shape(args), device=ct2_device(args.device), model=marian.cpu())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.benchmarks.peer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=40, help="tokens generated per source")
    p.add_argument("--inputs", type=int, default=20, help="batches timed (after --warmup)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--source-length", type=int, default=14)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--d-ff", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--no-ctranslate2", action="store_true", help="leave the CTranslate2 rows out")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if min(args.tokens, args.inputs, args.batch, args.source_length) < 1:
        raise SystemExit("peer: --tokens, --inputs, --batch and --source-length must be >= 1")
    device = torch.device(args.device)
    marian = build_peer(args)
    ct2 = build_ct2(args, marian)
    ours, peer = build_ours(args).to(device), marian.to(device)
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {"lightning_bpd": [], "transformers": [], **{p.name: [] for p in ct2}}
    with torch.no_grad():
        for i in range(args.warmup + args.inputs):
            src = torch.randint(3, args.vocab, (args.batch, args.source_length), generator=g).to(device)
            out, ours_s = timed(device, greedy_decode, ours, src, args.tokens)
            gen, peer_s = timed(device, peer.generate, src, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                do_sample=False, num_beams=1)
            if out.tokens.shape[1] != args.tokens or gen.shape[1] != args.tokens + 1:  # Marian keeps its start token
                raise RuntimeError(f"forced length not reached: {out.tokens.shape[1]} / {gen.shape[1] - 1}")
            sources = source_tokens(src, None)
            ct2_s = {p.name: p.translate(sources, args.tokens) for p in ct2}
            if any(lengths != [args.tokens] * args.batch for lengths, _ in ct2_s.values()):
                raise RuntimeError(f"forced length not reached by CTranslate2: {ct2_s}")
            if i >= args.warmup:
                times["lightning_bpd"].append(1000 * ours_s / args.tokens)
                times["transformers"].append(1000 * peer_s / args.tokens)
                for name, (_, seconds) in ct2_s.items():
                    times[name].append(1000 * seconds / args.tokens)
    result = {"device": str(device), "threads": torch.get_num_threads(), "batch": args.batch, "tokens": args.tokens,
              "inputs": args.inputs, "shape": {k: getattr(args, k) for k in ("d_model", "layers", "heads", "d_ff", "vocab")}}
    for name, values in times.items():
        result[name] = {"ms_per_token_median": statistics.median(values)}
        print(f"{name:19s} {statistics.median(values):8.3f} ms per token (batch {args.batch})")
    ours_ms = result["lightning_bpd"]["ms_per_token_median"]
    result["peer_over_ours"] = result["transformers"]["ms_per_token_median"] / ours_ms
    if ct2:
        import ctranslate2

        result["ctranslate2_version"] = ctranslate2.__version__
        result["ctranslate2_device"] = ct2_device(device)
    for name in times:
        if name != "lightning_bpd":
            ratio = result[name]["ms_per_token_median"] / ours_ms
            result[name]["over_ours"] = ratio
            print(f"{name} / lightning_bpd: {ratio:.2f}x the time per token")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
