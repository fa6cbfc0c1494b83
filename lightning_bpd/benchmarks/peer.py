"""Greedy decoding against a peer implementation: Hugging Face ``transformers`` Marian of the same shape.

    python -m lightning_bpd.benchmarks.peer --tokens 40 --inputs 20 [--device cuda] [--json out.json]

Both models get random weights of one shape (default: the Multi30k base, d_model 256, 3+3 layers,
ff 1024, 4 heads, vocabulary 8000) and decode the same random sources greedily to a forced length
(our EOS disabled; Marian's ``min_new_tokens = max_new_tokens``), one batch at a time, alternating,
so the per-token cost compares the decoding loops and kernels, not what the models learned. Reports
milliseconds per generated token (median over batches) of each and their ratio. ``transformers`` is
an optional dependency (``pip install transformers``).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from lightning_bpd.decoding import greedy_decode
from lightning_bpd.evaluation import timed
from lightning_bpd.nn.model import BlockwiseTransformer, ModelConfig
from lightning_bpd.results import write_json


def build_ours(args: argparse.Namespace) -> BlockwiseTransformer:
    torch.manual_seed(0)
    config = ModelConfig(args.vocab, args.vocab, d_model=args.d_model, n_heads=args.heads, n_encoder_layers=args.layers,
                         n_decoder_layers=args.layers, d_ff=args.d_ff, dropout=0.0, share_embeddings=True)
    model = BlockwiseTransformer(config).eval()
    model.eos_id = None  # decode exactly --tokens tokens
    return model


def build_peer(args: argparse.Namespace):
    try:
        from transformers import MarianConfig, MarianMTModel
    except ImportError:
        raise SystemExit("peer: the transformers package is needed (pip install transformers)") from None
    torch.manual_seed(0)
    config = MarianConfig(vocab_size=args.vocab, d_model=args.d_model, encoder_layers=args.layers,
                          decoder_layers=args.layers, encoder_attention_heads=args.heads,
                          decoder_attention_heads=args.heads, encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff,
                          max_position_embeddings=max(512, args.tokens + 2), pad_token_id=0, eos_token_id=2,
                          decoder_start_token_id=1, forced_eos_token_id=None, dropout=0.0)
    return MarianMTModel(config).eval()



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
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if min(args.tokens, args.inputs, args.batch, args.source_length) < 1:
        raise SystemExit("peer: --tokens, --inputs, --batch and --source-length must be >= 1")
    device = torch.device(args.device)
    ours, peer = build_ours(args).to(device), build_peer(args).to(device)
    g = torch.Generator().manual_seed(1)
    times: dict[str, list[float]] = {"lightning_bpd": [], "transformers": []}
    with torch.no_grad():
        for i in range(args.warmup + args.inputs):
            src = torch.randint(3, args.vocab, (args.batch, args.source_length), generator=g).to(device)
            out, ours_s = timed(device, greedy_decode, ours, src, args.tokens)
            gen, peer_s = timed(device, peer.generate, src, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                do_sample=False, num_beams=1)
            if out.tokens.shape[1] != args.tokens or gen.shape[1] != args.tokens + 1:  # Marian keeps its start token
                raise RuntimeError(f"forced length not reached: {out.tokens.shape[1]} / {gen.shape[1] - 1}")
            if i >= args.warmup:
                times["lightning_bpd"].append(1000 * ours_s / args.tokens)
                times["transformers"].append(1000 * peer_s / args.tokens)
    result = {"device": str(device), "threads": torch.get_num_threads(), "batch": args.batch, "tokens": args.tokens,
              "inputs": args.inputs, "shape": {k: getattr(args, k) for k in ("d_model", "layers", "heads", "d_ff", "vocab")}}
    for name, values in times.items():
        result[name] = {"ms_per_token_median": statistics.median(values)}
        print(f"{name:14s} {statistics.median(values):8.3f} ms per token (batch {args.batch})")
    ratio = result["transformers"]["ms_per_token_median"] / result["lightning_bpd"]["ms_per_token_median"]
    result["peer_over_ours"] = ratio
    print(f"transformers / lightning_bpd: {ratio:.2f}x the time per token")
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
