"""Our own decoder-only base for the LM task (``model.init_args.own``): its shape and the tokenizer directory that sizes
its vocabulary, built into a :class:`~lightning_bpd.nn.causal_model.CausalTransformer` trained from scratch."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from lightning_bpd.nn.causal_model import CausalTransformer
from lightning_bpd.nn.config import ModelConfig


@dataclass
class OwnBase:
    """The shape of our own decoder-only base (:class:`~lightning_bpd.nn.causal_model.CausalTransformer`).

    ``tokenizer``: a tokenizer directory (``AutoTokenizer``, e.g. ``make-base``'s or any ``save_pretrained`` output;
    the CLI fills it from ``data.init_args.tokenizer_path`` and the other way round); ``vocab_size``: the model's
    vocabulary (default the tokenizer's size; larger only as padding to a multiple of 64); ``d_model``, ``n_heads``,
    ``n_layers`` (decoder layers), ``d_ff``, ``dropout``; ``tie_output``: the output projection is the embedding.
    """

    tokenizer: str | None = None
    d_model: int = 256
    n_heads: int = 4
    n_layers: int = 4
    d_ff: int = 1024
    dropout: float = 0.1
    vocab_size: int | None = None
    tie_output: bool = True

    @classmethod
    def of(cls, own: OwnBase | Mapping[str, Any]) -> OwnBase:
        """An :class:`OwnBase` from itself or a dict (a checkpoint's hyperparameters); unknown keys are one error."""
        if isinstance(own, OwnBase):
            return own
        unknown = sorted(set(own) - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"model.init_args.own: unknown keys {unknown} (known: {[f.name for f in fields(cls)]})")
        return cls(**own)


def ids_of(tokenizer: Any) -> tuple[int, int | None]:
    """The tokenizer's (pad id, EOS id): its pad token, else its EOS, pads."""
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    if pad is None:
        raise ValueError("model.init_args.own.tokenizer: the tokenizer has neither a pad nor an EOS token")
    return int(pad), eos


def build_own(own: OwnBase, tokenizer: Any, k: int, head_type: str, head_hidden: int | None) -> CausalTransformer:
    """A fresh :class:`CausalTransformer` of ``own``'s shape with k heads over ``tokenizer``'s vocabulary (a paper head
    reads p_1 from the base's own states: ``identity_first``)."""
    if head_type not in ("paper", "chained"):
        raise ValueError(f"model.head_type must be paper or chained on our own base, got {head_type!r}")
    vocab = own.vocab_size if own.vocab_size is not None else len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than model.init_args.own.vocab_size "
                         f"({vocab})")
    pad, eos = ids_of(tokenizer)
    config = ModelConfig(vocab, vocab, d_model=own.d_model, n_heads=own.n_heads, n_encoder_layers=0,
                         n_decoder_layers=own.n_layers, d_ff=own.d_ff, dropout=own.dropout, k=k,
                         head_hidden=head_hidden or own.d_model, identity_first=head_type == "paper",
                         head_type=head_type, tie_output=own.tie_output, pad_id=pad, bos_id=pad, eos_id=eos,
                         decoder_only=True)
    return CausalTransformer(config)


def tokenizer_dir(own: OwnBase) -> str:
    """``own.tokenizer`` as an absolute directory; one error line where it is unset or no directory."""
    if own.tokenizer is None:
        raise ValueError("model.init_args.own.tokenizer: give a tokenizer directory (or data.init_args.tokenizer_path)")
    path = os.path.abspath(os.fspath(own.tokenizer).removeprefix("hf:"))
    if not os.path.isdir(path):
        raise ValueError(f"model.init_args.own.tokenizer: {path} is not a directory (a saved tokenizer)")
    return path
