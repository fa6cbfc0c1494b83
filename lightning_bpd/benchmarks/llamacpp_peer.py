"""llama.cpp greedy decoding of a causal LM checkpoint: the CPU engine a user would run instead (``bench-generate
--peers llamacpp`` on a language-modelling checkpoint).

The base, exactly as the module decodes it (a fine-tuned base included), is written as a float32 GGUF
(:func:`~lightning_bpd.hf.gguf_llama.write_llama_gguf`) and loaded by ``llama-cpp-python``'s ``Llama`` with a
float32 KV cache and ``threads`` threads for both the prompt and the steps. Each row is decoded on its own from the
Hugging Face tokenizer's ids (tokens, not text: no second tokenization), after ``reset()`` (no reuse of an earlier
prompt's cache), with llama.cpp's greedy sampler (``temp=0``), and stopped at the checkpoint's EOS ids or at the cap.
The generation config's other rules (minimum lengths, suppressed tokens) are not applied: a plain greedy decoder.
``Llama`` decodes one sequence at a time, so the peer runs at batch 1 only.

Before timing, every bench prompt is tokenized by llama.cpp from text and compared with the Hugging Face tokenizer's
ids: a GGUF that tokenizes any of them otherwise is refused (the peer skipped, the first differing prompt named).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch import Tensor

from lightning_bpd.hf.gguf_llama import tokenization_mismatches, write_llama_gguf

__all__ = ["LLAMACPP", "LLAMACPP_HINT", "LlamaCppGreedy", "llamacpp_available", "start_llamacpp"]

LLAMACPP = "llamacpp_f32"
LLAMACPP_HINT = ("pip install -e '.[peers]' (llama-cpp-python and gguf; llama-cpp-python builds llama.cpp from source "
                 "where no wheel fits)")
GGML_F32 = 0  # ggml_type of float32, for the KV cache


def llamacpp_available() -> str | None:
    """None if ``llama_cpp`` and ``gguf`` import, else the one-line reason."""
    for name in ("gguf", "llama_cpp"):
        try:
            __import__(name)
        except ImportError as err:
            return f"{name} is not installed ({err.__class__.__name__}): {LLAMACPP_HINT}"
    return None


@contextlib.contextmanager
def quiet_native() -> Iterator[None]:
    """Silence llama.cpp's own prints to the process's stderr (file descriptor 2) while loading."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


class LlamaCppGreedy:
    """A GGUF loaded in llama.cpp, decoding rows of token ids greedily: ``peer(src, max_len)`` -> the new tokens of
    each row of ``src`` (B, P) (pads left out), each up to and including its first EOS id."""

    name = LLAMACPP

    def __init__(self, gguf: str | Path, n_ctx: int, threads: int, pad_id: int, eos_ids: Sequence[int]) -> None:
        from llama_cpp import Llama

        with quiet_native():
            self.llm = Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=threads,
                             n_threads_batch=threads, type_k=GGML_F32, type_v=GGML_F32, seed=0, verbose=False)
        self.pad_id, self.eos_ids = pad_id, frozenset(eos_ids)
        self.threads, self.n_ctx = threads, n_ctx

    def tokenize(self, text: str) -> list[int]:
        """llama.cpp's tokens of ``text``, its BOS added as the GGUF says, special tokens in the text parsed."""
        return self.llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)

    def continue_row(self, prompt: list[int], max_new: int) -> list[int]:
        """At most ``max_new`` greedy tokens after ``prompt``, stopping after an EOS id."""
        out: list[int] = []
        self.llm.reset()
        for token in self.llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if token in self.eos_ids or len(out) >= max_new:
                break
        return out

    def __call__(self, src: Tensor, max_len: int) -> list[list[int]]:
        return [self.continue_row([t for t in row if t != self.pad_id], max_len) for row in src.tolist()]


def start_llamacpp(module: Any, prompts: Sequence[str], threads: int,
                   gguf: str | Path) -> tuple[LlamaCppGreedy | None, dict[str, Any]]:
    """The peer of ``module``'s base, its GGUF written to ``gguf``, and its record; ``(None, {"skipped": reason})``
    where llama.cpp is missing, the base cannot be written, or the GGUF tokenizes one of ``prompts`` otherwise than
    the checkpoint's tokenizer."""
    missing = llamacpp_available()
    if missing is not None:
        return None, {"skipped": missing}
    model = module.model
    try:
        write_llama_gguf(model.base, module.tokenizer, gguf, name=Path(str(module.hparams.get("pretrained"))).name)
    except (ValueError, KeyError) as err:
        return None, {"skipped": f"no GGUF of this base: {err}"}
    n_ctx = model.n_positions or 2048
    peer = LlamaCppGreedy(gguf, n_ctx, threads, model.pad_id, model.generation_rules.eos_ids or [model.eos_id])
    wrong = tokenization_mismatches(peer.tokenize, module.tokenizer, prompts)
    info: dict[str, Any] = {"gguf": str(gguf), "gguf_mib": Path(gguf).stat().st_size / 2**20, "threads": threads,
                            "n_ctx": n_ctx, "kv_cache": "float32", "weights": "float32",
                            "llama_cpp_python": __import__("llama_cpp").__version__,
                            "tokenization_checked_prompts": len(prompts), "tokenization_differs": len(wrong)}
    if wrong:
        first = prompts[wrong[0]]
        info["skipped"] = (f"the GGUF tokenizes {len(wrong)} of {len(prompts)} prompts otherwise than the checkpoint's "
                           f"tokenizer (first: prompt {wrong[0]}, {first[:40]!r})")
        return None, info
    return peer, info
