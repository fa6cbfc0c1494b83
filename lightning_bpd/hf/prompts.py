"""Text in and out of a causal LM with blockwise heads, without Lightning: a checkpoint's own tokenizer
(``AutoTokenizer``) beside an :class:`~lightning_bpd.hf.causal.HFCausalBlockwise`.

``blockwise_decode(lm.model, lm.encode_prompts(texts), Exact(), max_len=N)`` generates at most N new tokens, and
``lm.detokenize(out.sequences())`` is the continuation text, equal to
``tokenizer.batch_decode(generate(...)[:, prompt_width:], skip_special_tokens=True)``.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import Tensor
from transformers import AutoTokenizer

from lightning_bpd.hf.causal import HFCausalBlockwise, load_causal


class CausalLM:
    """An :class:`HFCausalBlockwise` (``model``) and its ``tokenizer``: prompts to token tensors, tokens to text."""

    def __init__(self, model: HFCausalBlockwise, tokenizer: Any) -> None:
        if len(tokenizer) > model.vocab_size:
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens, more than the model's vocabulary "
                             f"({model.vocab_size}): they do not belong together")
        self.model, self.tokenizer = model, tokenizer

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any) -> CausalLM:
        """A local checkpoint directory with its tokenizer beside it; ``kwargs`` go to
        :func:`~lightning_bpd.hf.causal.load_causal` (k, head_type, ...)."""
        model = load_causal(path, **kwargs)
        try:
            tokenizer = AutoTokenizer.from_pretrained(os.fspath(path), local_files_only=True)
        except (OSError, ValueError, KeyError, TypeError) as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise ValueError(f"{path}: no tokenizer beside the checkpoint ({first})") from None
        return cls(model, tokenizer)

    def encode_prompts(self, prompts: list[str], device: torch.device | str | None = None) -> Tensor:
        """Prompts -> token ids (B, P) as the tokenizer makes them (its own BOS included), left-padded with the
        model's pad id."""
        if isinstance(prompts, str) or not prompts:
            raise ValueError("prompts must be a non-empty list of strings")
        rows = [self.tokenizer(p)["input_ids"] for p in prompts]
        pad = self.model.pad_id
        for i, row in enumerate(rows):
            if not row:
                raise ValueError(f"prompt {i} is empty after tokenization")
            if pad in row:
                raise ValueError(f"prompt {i} holds the pad id {pad}, which marks padding: pass another pad_id")
        width = max(len(r) for r in rows)
        out = torch.full((len(rows), width), pad, dtype=torch.long)
        for i, row in enumerate(rows):
            out[i, width - len(row):] = torch.tensor(row, dtype=torch.long)
        return out.to(device) if device is not None else out

    def detokenize(self, sequences: list[list[int]]) -> list[str]:
        """Generated tokens (one list per row, e.g. ``DecodeResult.sequences()``) -> text, special tokens
        skipped."""
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=True)
