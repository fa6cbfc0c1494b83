"""The one table of ``bench`` on a Hugging Face causal base: a row per method (``generate``'s, ours per run, our
prompt lookup, llama.cpp's), each with its run's training cost. ``bench --run`` prints and records it
(:mod:`lightning_bpd.commands.bench_drafters`); ``bench --ckpt`` on a causal base records it too, its checkpoint the
one run (:mod:`lightning_bpd.commands.bench_generate_lm`): the record's ``runs`` (name -> checkpoint, proposer, block,
parameters, training minutes and steps) and ``tables`` (batch size -> rows)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_bpd.benchmarks.lm_generate import ASSISTED, GENERATE, LOOKUP
from lightning_bpd.callbacks.training_clock import training_seconds
from lightning_bpd.commands.proposer_option import base_only_kind
from lightning_bpd.drafters.registry import kind_of

OURS_LOOKUP = "prompt_lookup"  # our prompt lookup (PromptLookup through the one loop), exact, any batch size
GREEDY = "greedy"  # --run NAME=BASE@greedy: our runtime's own greedy decoding, the reference of a precision's rows
KINDS = {GENERATE: "generate (greedy)", LOOKUP: "transformers' prompt lookup", OURS_LOOKUP: "prompt lookup (ours)",
         ASSISTED: "transformers' assisted generation"}
MINUTES_NOTE = ("training minutes: the training loop's wall clock less its validations (loss and decode evaluation), "
                "as the checkpoint's TrainingClock counts them; a checkpoint without one: its Timer's (max_time), "
                "validations included; or --minutes")


def proposer_parameters(module: Any) -> int:
    """The parameters that the run trained for proposing: the module's trainable ones, less its base's (each tensor
    once; an EAGLE-3 drafter's frozen copy of the target's embeddings is not counted)."""
    base = {id(p) for p in module.model.base.parameters()}
    seen: dict[int, int] = {}
    for p in module.parameters():
        if id(p) not in base and p.requires_grad:
            seen[id(p)] = p.numel()
    return sum(seen.values())


def proposer_title(module: Any) -> str:
    """What proposes in a run: ``chained heads``, ``medusa heads``, ``paper heads``, or a drafter kind's title
    (``DFlash``, ``EAGLE-3``, ...)."""
    found = kind_of(module)
    return found.title if found is not None else f"{module.model.head_type} heads"


def training_record(path: str, minutes: str | None) -> dict[str, Any]:
    """A run's training cost: minutes (``--minutes``, else its checkpoint's clock), steps (None: a heads folder)."""
    # a heads folder (save_heads) keeps no clock, nor what is no checkpoint file (a loader's stand-in)
    saved = torch.load(path, map_location="cpu", weights_only=False) if Path(path).is_file() else {}
    seconds = training_seconds(saved)
    record: dict[str, Any] = {"steps": saved.get("global_step")}
    if minutes is not None:
        record.update(minutes=float(minutes), minutes_from="--minutes")
    elif seconds is not None:
        record.update(minutes=seconds / 60, minutes_from="the checkpoint's training clock")
    else:
        record.update(minutes=None, minutes_from="unknown (no training clock in the checkpoint; give --minutes)")
    return record


def run_record(path: str, module: Any, k: int | None = None, minutes: str | None = None,
               spelling: str | None = None) -> dict[str, Any]:
    """The record's entry of one run: its checkpoint, proposer (``spelling``: its ``@PROPOSER``), block ``k`` (None:
    the run's own), the proposer's parameters and its training cost (:func:`training_record`). A proposer that reads
    only the base (``@prompt-lookup``, ``@retrieval:FILE``) is named so, with no parameters and no training."""
    base_only = GREEDY if spelling == GREEDY else base_only_kind(spelling)
    if base_only is not None:
        title = {"retrieval": "retrieval", GREEDY: "greedy (ours)"}.get(base_only, "prompt lookup (ours)")
        return {"ckpt": path, "proposer": title, "spelling": spelling, "k": k, "parameters": 0, "steps": None,
                "minutes": 0.0, "minutes_from": "no training (the proposer reads the base and its text only)"}
    return {"ckpt": path, "proposer": proposer_title(module), **({"spelling": spelling} if spelling else {}), "k": k,
            "parameters": proposer_parameters(module), **training_record(path, minutes)}


def llamacpp_titles(info: dict[str, Any] | None, runs: dict[str, dict[str, Any]], row_run: dict[str, str]
                    ) -> dict[str, str]:
    """The proposer column of llama.cpp's rows (``info``: the record of its peer; a drafted row's run by ``row_run``):
    ``llama.cpp alone (<GGUF>)`` and ``llama.cpp + <the run's proposer> (<GGUF>)``."""
    if not info:
        return {}
    rows = info.get("rows") or {"llamacpp_f32": info.get("gguf", "")}  # llama-cpp-python's one row
    drafted = {pair[1] for pair in info.get("pairs", [])}
    named = {row: d["proposer"] for row, d in info.get("drafters", {}).items() if "proposer" in d}  # llama-lookup's
    return {row: (f"llama.cpp + {named.get(row) or runs.get(row_run.get(row, ''), {}).get('proposer', 'our drafter')}"
                  if row in drafted
                  else "llama.cpp alone") + f" ({Path(gguf).name})" for row, gguf in rows.items()}


def table(report: dict[str, Any], runs: dict[str, dict[str, Any]], row_run: dict[str, str],
          titles: dict[str, str] | None = None, alone_differs: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """One batch size's rows for the table: the report's numbers with each row's run and its training cost
    (``titles``: the proposer of rows of no run's, e.g. llama.cpp's; ``alone_differs``: a llama.cpp row with a
    drafter -> its rows whose text differs from llama.cpp alone's on the same GGUF)."""
    titles, alone_differs = titles or {}, alone_differs or {}
    out = []
    for row, r in report.items():
        if "skipped" in r:
            continue
        run = runs.get(row_run.get(row, ""), {})
        entry = {"row": row, "proposer": KINDS.get(row) or titles.get(row) or run.get("proposer"),
                 "tokens_per_call": r.get("mean_accepted_block_size"),
                 "speedup_over_hf_generate": r["speedup_over_hf_generate"],
                 "differs_from_hf_generate": r.get("differs_from_hf_generate"),
                 "training_minutes": run.get("minutes"), "steps": run.get("steps"),
                 "parameters": run.get("parameters")}
        if "timed_by" in r:
            entry["timed_by"] = r["timed_by"]
        if "differs_from_own_greedy" in r:
            entry["differs_from_own_greedy"] = r["differs_from_own_greedy"]
        if row in alone_differs:
            entry["differs_from_llamacpp_alone"] = alone_differs[row]
        out.append(entry)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """The table as Markdown, one row per method, under a line that says what its training minutes count (a column
    of rows that differ from llama.cpp alone where a llama.cpp row has a drafter)."""
    alone = any("differs_from_llamacpp_alone" in r for r in rows)
    greedy = any("differs_from_own_greedy" in r for r in rows)
    lines = [MINUTES_NOTE, "",
             "| row | proposer | tokens per call | x generate | differ | training minutes | steps | parameters |"
             + (" differ from llama.cpp alone |" if alone else "") + (" differ from our greedy |" if greedy else ""),
             "|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if alone else "") + ("---:|" if greedy else "")]

    def cell(value: Any, digits: int = 2) -> str:
        return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)

    for r in rows:
        lines.append(f"| {r['row']} | {r['proposer']} | {cell(r.get('tokens_per_call'))} | "
                     f"{cell(r['speedup_over_hf_generate'])} | {cell(r.get('differs_from_hf_generate'))} | "
                     f"{cell(r.get('training_minutes'), 1)} | {cell(r.get('steps'))} | {cell(r.get('parameters'))} |"
                     + (f" {cell(r.get('differs_from_llamacpp_alone'))} |" if alone else "")
                     + (f" {cell(r.get('differs_from_own_greedy'))} |" if greedy else ""))
    return "\n".join(lines)
