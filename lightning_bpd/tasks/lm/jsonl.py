"""``decode`` on a language-modelling checkpoint: JSON Lines in (``{"prompt": "..."}``), JSON Lines out
(``{"completion": "..."}``), one line per input, in order (a prompt holds newlines, so plain lines do not serve).
Bad input is one ValueError line that names the input line."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from lightning_bpd.evaluation import EvalBatch, MethodRun, run_batch


def read_prompts(path: str) -> list[tuple[int, str]]:
    """(line number, prompt) of every non-blank line of a JSON Lines file or of stdin (``-``)."""
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except UnicodeDecodeError as err:
        raise ValueError(f"{'stdin' if path == '-' else path} is not UTF-8 ({err.reason} at byte {err.start})") from None
    where = "stdin" if path == "-" else path
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} line {number}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            message = f'{where} line {number}: expected an object with a string "prompt", e.g. {{"prompt": "def f():"}}'
            raise ValueError(message)  # noqa: TRY004 (bad input: one line, as every other)
        prompts.append((number, record["prompt"]))
    return prompts


def check_prompts(module: Any, prompts: list[tuple[int, str]], max_new_tokens: int) -> None:
    """Every prompt tokenizes to at least one token, holds no pad id, and fits the model's context with
    ``max_new_tokens`` more (a verify pass near the end holds fewer proposals: none past the context)."""
    positions = module.model.n_positions
    for number, prompt in prompts:
        ids = module.tokenizer(prompt)["input_ids"]
        if not ids:
            raise ValueError(f"line {number}: the prompt is empty after tokenization")
        if module.model.pad_id in ids:
            raise ValueError(f"line {number}: the prompt holds the pad id {module.model.pad_id}")
        if positions is not None and len(ids) + max_new_tokens > positions:
            raise ValueError(f"line {number}: the prompt has {len(ids)} tokens, which with --max-new-tokens "
                             f"{max_new_tokens} exceeds the model's context ({positions} positions)")


def complete(module: Any, prompts: list[str], method: Callable, batch_size: int = 32, model: Any = None,
             max_new_tokens: int | None = None) -> tuple[list[str], dict[str, float]]:
    """Continue each prompt by at most ``max_new_tokens`` tokens (default: the module's ``max_new_tokens``) with
    ``method`` on ``model`` (default the module's; or a runtime of it): the continuations and decode stats."""
    cap = module.max_new_tokens if max_new_tokens is None else max_new_tokens
    texts: list[str] = []
    run = MethodRun()
    for start in range(0, len(prompts), batch_size):
        src = module.encode_prompts(prompts[start : start + batch_size])  # (B, P)
        _, part = run_batch(method, module.model if model is None else model, EvalBatch(src, cap))
        run.merge(part)
        texts += module.detokenize(part.outputs)
    return texts, {"prompts": len(prompts), "tokens": run.tokens, "iterations": run.iterations,
                   "mean_accepted_block_size": run.mean_accepted_block_size, "seconds": run.seconds}


def as_lines(texts: list[str]) -> list[str]:
    """One JSON object per continuation."""
    return [json.dumps({"completion": text}, ensure_ascii=False) for text in texts]
