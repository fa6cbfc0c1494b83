"""``bench-generate`` on a causal LM: the base's own ``generate`` (greedy, prompt lookup, assisted by a draft model),
our exact blockwise decoding and llama.cpp, on the same prompts, timed batch by batch.

A method is ``method(src, max_new) -> rows`` on (B, P) left-padded prompts (``encode_prompts``): each row's new tokens
up to and including its first EOS id. Ours returns ``(rows, iterations, model_calls)``; a method that times itself
(llama.cpp's binaries, by their own clock) returns :class:`SelfTimed`. Batches alternate between the
methods (each batch decoded by every method in turn) after ``warmup`` untimed batches. ``generate`` methods run the
base as loaded with the checkpoint's own generation config, greedy (``num_beams=1, do_sample=False``),
``max_new_tokens`` the cap; prompt lookup and assisted generation take one row only (transformers: "assisted generate
is only supported for batch_size = 1"), so at a larger batch they are tried once untimed and recorded as ``skipped``
with transformers' message; llama.cpp decodes one sequence at a time and is skipped at a larger batch too.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lightning_bpd.benchmarks.ctranslate2_hf import cut
from lightning_bpd.benchmarks.ctranslate2_peer import failure, quiet_transformers
from lightning_bpd.benchmarks.tally import Tally, differing
from lightning_bpd.evaluation import timed

GENERATE, LOOKUP, ASSISTED, OURS = "hf_generate", "hf_prompt_lookup", "hf_assisted", "exact"
ONE_ROW = (LOOKUP, ASSISTED)  # transformers' assisted loop takes batch 1 only

__all__ = ["ASSISTED", "GENERATE", "LOOKUP", "OURS", "LMGenerate", "SelfTimed", "bench_methods", "load_assistant",
           "same_tokenizer"]


@dataclass(frozen=True)
class SelfTimed:
    """A method's result with the seconds it measured itself (instead of the bench's wall clock around the call) and
    its target calls (``mean_accepted_block_size`` = tokens / calls). ``rows``: token ids; or None for a method that
    gives text (llama.cpp's binaries print text, not ids): then ``texts`` and ``counts`` (its tokens per row), and a
    row whose text is generate's (``same_text(text, generate's row)``) is tallied as generate's row, another as
    ``counts`` unknown ids (-1), which differ."""

    rows: list[list[int]] | None
    seconds: float
    calls: int
    texts: list[bytes] | None = None
    counts: list[int] | None = None
    same_text: Callable[[bytes, list[int]], bool] | None = None

    def resolved(self, reference: Sequence[Sequence[int]]) -> list[list[int]]:
        """The rows, text rows resolved against ``reference`` (generate's rows of the same prompts)."""
        if self.rows is not None:
            return self.rows
        assert self.texts is not None and self.counts is not None and self.same_text is not None
        return [list(ref) if self.same_text(text, list(ref)) else [-1] * count
                for text, count, ref in zip(self.texts, self.counts, reference, strict=True)]


class LMGenerate:
    """``base.generate`` as a bench method, greedy with the base's own generation config; ``lookup``: assisted by
    prompt lookup (``prompt_lookup_num_tokens``, ``max_matching_ngram_size``); ``assistant``: assisted by that draft
    model (``assistant_model``)."""

    def __init__(self, base: Any, pad_id: int, eos_ids: Sequence[int], lookup: tuple[int, int] | None = None,
                 assistant: Any = None) -> None:
        self.base, self.pad_id, self.eos_ids = base, pad_id, list(eos_ids)
        self.lookup, self.assistant = lookup, assistant

    def config(self, max_new: int):
        config = copy.deepcopy(self.base.generation_config)
        config.update(num_beams=1, do_sample=False, max_new_tokens=max_new, pad_token_id=self.pad_id)
        if self.lookup is not None:
            config.prompt_lookup_num_tokens, config.max_matching_ngram_size = self.lookup
        return config

    def __call__(self, src: Tensor, max_new: int) -> list[list[int]]:
        extra = {} if self.assistant is None else {"assistant_model": self.assistant}
        with torch.no_grad(), quiet_transformers():
            out = self.base.generate(input_ids=src, attention_mask=(src != self.pad_id).long(),
                                     generation_config=self.config(max_new), **extra)
        return cut(out[:, src.shape[1]:].tolist(), self.eos_ids)


def same_tokenizer(ours: Any, theirs: Any, texts: Sequence[str]) -> str | None:
    """None if ``theirs`` is ``ours`` for every purpose here (vocabulary, special ids, the ids of ``texts``), else
    what differs."""
    if ours.get_vocab() != theirs.get_vocab():
        return f"another vocabulary ({len(theirs)} tokens, ours {len(ours)})"
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(ours, name) != getattr(theirs, name):
            return f"another {name} ({getattr(theirs, name)}, ours {getattr(ours, name)})"
    if texts and ours(list(texts))["input_ids"] != theirs(list(texts))["input_ids"]:
        return "other token ids for the prompts"
    return None


def load_assistant(path: str | Path, module: Any, prompts: Sequence[str], device: str | torch.device) -> Any:
    """The draft model of ``--assistant``: a local Hugging Face causal LM directory (or .gguf file) with the
    checkpoint's tokenizer, or a language-modelling checkpoint (its base); float32, eval mode. One-line ValueError
    for a seq2seq model, a folder that is no checkpoint, or another tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from lightning_bpd.checkpoints import load_model
    from lightning_bpd.hf.gguf_target import resolve_pretrained
    from lightning_bpd.hf.prompts import load_tokenizer
    from lightning_bpd.tasks.lm.module import LMModule

    path = Path(resolve_pretrained(path))  # a .gguf file: its dequantized folder
    if path.is_file():
        theirs = load_model(path, device)
        if not isinstance(theirs, LMModule):
            raise ValueError(f"--assistant {path}: not a language-modelling checkpoint ({type(theirs).__name__}); "
                             "assisted generation needs a causal LM")
        draft, tokenizer = theirs.model.base, theirs.tokenizer
    else:
        try:
            config = AutoConfig.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError) as err:
            raise ValueError(f"--assistant {path}: not a Hugging Face model directory "
                             f"({str(err).strip().splitlines()[0][:160]})") from None
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"--assistant {path}: a seq2seq checkpoint ({config.model_type}); assisted generation "
                             "needs a decoder-only causal LM with the checkpoint's tokenizer")
        tokenizer = load_tokenizer(path)
        with quiet_transformers():
            draft = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)
    differs = same_tokenizer(module.tokenizer, tokenizer, prompts)
    if differs is not None:
        raise ValueError(f"--assistant {path}: its tokenizer is not the checkpoint's ({differs}); the draft model must "
                         "share the tokenizer")
    return draft.to(device).eval()


def run_or_drop(methods: dict[str, Callable], failed: dict[str, str], name: str, src: Tensor, max_new: int,
                peers: Sequence[str]) -> tuple[Any, float] | None:
    """``timed`` one method on ``src``; a peer (one of ``peers``) that raises is removed from ``methods`` with its
    reason in ``failed`` (None returned); the other methods' errors propagate."""
    try:
        return timed(src.device, methods[name], src, max_new)
    except Exception as err:
        if name not in peers:
            raise
        failed[name] = f"failed at batch size {src.shape[0]}: {failure(err)}"
        del methods[name]
        return None


def one_row_refusal(method: Callable, src: Tensor, max_new: int) -> str | None:
    """None if ``generate`` takes this assisted method at this batch (one untimed try), else transformers' message."""
    try:
        method(src, max_new)
    except ValueError as err:
        return str(err).strip().splitlines()[0]
    return None


def bench_methods(methods: dict[str, Callable], batches: Sequence[Tensor], max_new: int, warmup: int,
                  ours: Sequence[str], peers: Sequence[str] = (), own_greedy: str | None = None) -> dict[str, Any]:
    """Every method (name -> method; :data:`GENERATE` first) on every batch, alternating, after ``warmup`` untimed
    batches: the report of each (``ours``: the names of our decoders; ``peers``: llama.cpp's, which run at batch 1
    only and whose failure is a ``skipped`` row rather than an error; a :class:`SelfTimed` result is tallied with
    its own seconds and target calls; ``own_greedy``: the row of our runtime's greedy decoding, which every other
    row of ours is compared with as well: ``differs_from_own_greedy``)."""
    methods, skipped, batch_size, self_timed = dict(methods), {}, batches[0].shape[0], set()
    for name in ONE_ROW:
        if name in methods and batch_size > 1:
            refused = one_row_refusal(methods[name], batches[0], max_new)
            if refused is not None:
                skipped[name] = f"transformers refuses it at batch size {batch_size}: {refused}"
                del methods[name]
    for name in peers:
        if name in methods and batch_size > 1:
            skipped[name] = "llama.cpp decodes one sequence at a time here: batch 1 only"
            del methods[name]
    order = [*methods, *skipped]
    for src in batches[:warmup]:
        for name in list(methods):
            run_or_drop(methods, skipped, name, src, max_new, peers)
    tallies = {name: Tally() for name in methods}
    for src in batches:
        for name in list(methods):
            ran = run_or_drop(methods, skipped, name, src, max_new, peers)
            if ran is None:
                del tallies[name]
                continue
            out, seconds = ran
            if isinstance(out, SelfTimed):
                self_timed.add(name)
                reference = tallies[GENERATE].outputs[-src.shape[0]:]  # generate ran this batch first
                tallies[name].add(out.resolved(reference), out.seconds, out.calls, out.calls)
            elif name in ours:
                rows, iterations, calls = out
                tallies[name].add(rows, seconds, iterations, calls)
            else:
                tallies[name].add(out, seconds)
    report = summarize(tallies, ours)
    if own_greedy in tallies:
        for name in ours:
            if name in tallies and name != own_greedy:
                report[name]["differs_from_own_greedy"] = len(differing(tallies[name].outputs,
                                                                        tallies[own_greedy].outputs))
    for name in self_timed & set(tallies):
        tally = tallies[name]
        report[name].update(mean_accepted_block_size=tally.tokens / max(1, tally.iterations),
                            target_calls=tally.iterations, timed_by="its own clock")
    report.update({name: {"skipped": reason} for name, reason in skipped.items()})
    return {name: report[name] for name in order}


def summarize(tallies: dict[str, Tally], ours: Sequence[str]) -> dict[str, Any]:
    """Each tally's report, its rows compared with :data:`GENERATE`'s, our block sizes, and the speedups: every
    method's ``speedup_over_hf_generate`` (generate's seconds over its own) and, for each of ours, ``speedup_over``
    every other method (their seconds over ours)."""
    greedy = tallies[GENERATE]
    report: dict[str, Any] = {}
    for name, tally in tallies.items():
        r = report[name] = tally.report()
        r["speedup_over_hf_generate"] = greedy.seconds / max(tally.seconds, 1e-9)
        if name != GENERATE:
            rows = differing(tally.outputs, greedy.outputs)
            r["differs_from_hf_generate"], r["differing_rows"] = len(rows), rows[:10]
        if name in ours:
            r["mean_accepted_block_size"] = tally.tokens / max(1, tally.iterations)
            r["iterations"], r["model_calls"] = tally.iterations, tally.model_calls
            r["speedup_over"] = {other: t.seconds / max(tally.seconds, 1e-9)
                                 for other, t in tallies.items() if other != name}
    return report
