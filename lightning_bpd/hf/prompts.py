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
from lightning_bpd.hf.gguf_target import resolve_pretrained
from lightning_bpd.nn.causal_model import CausalTransformer

PAD_MULTIPLE = 64  # a model's vocabulary may be its tokenizer's padded up to a multiple of this
PAD_MOST = 1024  # ... by fewer than this many rows (Qwen2.5: 151,665 tokens, 151,936 rows)


def load_tokenizer(path: str | os.PathLike) -> Any:
    """The tokenizer saved beside a local checkpoint (``AutoTokenizer``, never downloaded; a ``.gguf`` file's from its
    dequantized folder, :func:`~lightning_bpd.hf.gguf_target.resolve_pretrained`); one-line ValueError if there is
    none."""
    folder = resolve_pretrained(path)
    try:
        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{path}: no tokenizer beside the checkpoint ({first[:200]})") from None


def check_vocabulary(tokenizer: Any, model: HFCausalBlockwise | CausalTransformer) -> None:
    """The tokenizer must index the model's vocabulary: as many ids, or the model's rows padded up to a multiple of
    64 (by fewer than 1024); and its EOS must be one of the model's."""
    n, v = len(tokenizer), model.vocab_size
    if n > v:
        raise ValueError(f"the tokenizer has {n} tokens, more than the model's vocabulary ({v}): they do not "
                         "belong together")
    if n < v and not (v % PAD_MULTIPLE == 0 and v - n < PAD_MOST):
        raise ValueError(f"the tokenizer has {n} tokens but the model's vocabulary has {v} (vocab_size mismatch): "
                         "the tokenizer beside the checkpoint must be the model's own")
    eos, rules = tokenizer.eos_token_id, model.generation_rules
    if eos is not None and model.eos_id is not None and eos not in (model.eos_id, *(rules.eos_ids if rules else ())):
        raise ValueError(f"the tokenizer's EOS id {eos} is not the model's ({model.eos_id})")


class CausalLM:
    """An :class:`HFCausalBlockwise` or our own :class:`~lightning_bpd.nn.causal_model.CausalTransformer` (``model``)
    and its ``tokenizer``: prompts to token tensors, tokens to text."""

    def __init__(self, model: HFCausalBlockwise | CausalTransformer, tokenizer: Any) -> None:
        check_vocabulary(tokenizer, model)
        self.model, self.tokenizer = model, tokenizer

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **kwargs: Any) -> CausalLM:
        """A local checkpoint directory with its tokenizer beside it; ``kwargs`` go to
        :func:`~lightning_bpd.hf.causal.load_causal` (k, head_type, ...)."""
        return cls(load_causal(path, **kwargs), load_tokenizer(path))

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
