"""The measured results in ``results/``: load them, tabulate them (README.md, docs/results.md) and feed the
notebook's plots.

Every record is a JSON file with a ``label`` (what was measured) and the ``command`` that made it,
beside the data of one of five kinds:

- ``decode``: a ``decode_<stage>.json`` of the :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval`
  callback (``metrics`` holds ``<method>/bleu`` or ``<method>/psnr``, ``<method>/mean_accepted_block_size``, ...);
- ``bench``: the JSON of ``python -m lightning_bpd bench`` (``batch_sizes`` -> method -> timings);
- ``step_cost``: the JSON of ``python -m lightning_bpd.benchmarks.step_cost``;
- ``where_time_goes``: the JSON of ``python -m lightning_bpd.benchmarks.where_time_goes``;
- ``peer``: the JSON of ``python -m lightning_bpd.benchmarks.peer`` (our greedy against peer systems).

``python -m lightning_bpd results add RUN/decode_test.json results/x.json --label L --command C`` files a
run's record with its provenance; ``python -m lightning_bpd results table [results]`` prints the
Markdown tables of every record, and ``python -m lightning_bpd results readme`` rewrites the generated
blocks of README.md (the default run's printout and the headline tables, :func:`headline_tables`) and
of docs/results.md (every record, :func:`markdown_tables`) between their markers.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_bpd.records import write_json

QUALITY_KEYS = ("bleu", "psnr")


@dataclass
class Record:
    path: Path
    kind: str  # decode | bench | step_cost | where_time_goes | peer
    label: str
    command: str
    data: dict[str, Any]
    root: Path | None = None  # the folder it was loaded from


def kind_of(data: dict[str, Any]) -> str | None:
    if "metrics" in data:
        return "decode"
    if "batch_sizes" in data and "generate_dtype" in data:  # benchmarks.hf_generate: against HF generate
        return None
    if "batch_sizes" in data:
        return "bench"
    if "ratio_vs_greedy_base_step" in data:
        return "step_cost"
    if isinstance(data.get("methods"), dict) and all("ms_per_step_by_part" in m for m in data["methods"].values()):
        return "where_time_goes"
    if "peer_over_ours" in data:
        return "peer"
    return None


def load(folder: str | Path) -> list[Record]:
    """Every result record under ``folder`` (recursively, sorted by path); other JSON files are skipped."""
    records = []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not valid JSON: {err}") from None
        kind = kind_of(data) if isinstance(data, dict) else None
        if kind is None:
            continue
        records.append(Record(path, kind, data.get("label", path.stem), data.get("command", ""), data, Path(folder)))
    return records


def methods_of(metrics: dict[str, float]) -> list[str]:
    """Method names in a decode record, in logged order."""
    return [key.rsplit("/", 1)[0] for key in metrics if key.endswith("/mean_accepted_block_size")]


def quality_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per (decode record, method): quality (BLEU or PSNR), mean accepted block size, speedup."""
    rows = []
    for rec in records:
        if rec.kind != "decode":
            continue
        m = rec.data["metrics"]
        for method in methods_of(m):
            key = next((q for q in QUALITY_KEYS if f"{method}/{q}" in m), None)
            rows.append({
                "label": rec.label, "stage": rec.data.get("stage", ""), "k": rec.data.get("k"), "method": method,
                "metric": key or "", "quality": m.get(f"{method}/{key}", math.nan) if key else math.nan,
                "block": m[f"{method}/mean_accepted_block_size"], "speedup": m.get(f"{method}/speedup", math.nan),
                "matches_greedy": m.get(f"{method}/matches_greedy"), "examples": m.get("examples"),
                "command": rec.command,
            })
    return rows


def speed_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per (bench record, batch size, method): speedup, mean accepted block size, efficiency."""
    rows = []
    for rec in records:
        if rec.kind != "bench":
            continue
        for batch, methods in rec.data["batch_sizes"].items():
            for method, r in methods.items():
                rows.append({
                    "label": rec.label, "batch": int(batch), "method": method, "k": rec.data.get("k"),
                    "threads": rec.data.get("threads"), "baseline": r.get("baseline", "greedy"),
                    "block": r["mean_accepted_block_size"], "speedup": r["speedup"], "efficiency": r["efficiency"],
                    "seconds_per_input": r["seconds_per_input_median"], "equals_greedy": r.get("equals_greedy"),
                    "acceptance_rate": r.get("acceptance_rate"), "command": rec.command,
                })
    return rows


ABLATION_KEYS = ("k", "head", "targets", "base", "steps", "minutes", "device")


def ablation_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per exact-acceptance decode record filed with ``--meta`` (the acceptance ablation):
    its recipe (k, head type, training targets, frozen or fine-tuned base, steps, minutes, device),
    BLEU, mean accepted block size and each head's agreement with the model's greedy output."""
    rows = []
    for rec in records:
        meta, m = rec.data.get("meta"), rec.data.get("metrics", {})
        if rec.kind != "decode" or not meta or "exact/mean_accepted_block_size" not in m:
            continue
        agreement = [m[key] for i in range(2, 65) if (key := f"greedy/head{i}_agreement") in m]
        rows.append({**{key: meta.get(key, "") for key in ABLATION_KEYS}, "label": rec.label,
                     "bleu": m.get("exact/bleu", math.nan), "block": m["exact/mean_accepted_block_size"],
                     "matches_greedy": m.get("exact/matches_greedy"), "agreement": agreement,
                     "command": rec.command, "recipe": meta.get("recipe"), "path": rec.path,
                     "budget": meta.get("budget", 1)})
    return sorted(rows, key=lambda r: (-int(r["k"] or 0), str(r["base"]), str(r["targets"]), str(r["head"])))


def time_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per (where_time_goes record, method): ms per step or iteration, its cost in greedy steps,
    and the milliseconds of each timed part that took any time."""
    rows = []
    for rec in records:
        if rec.kind != "where_time_goes":
            continue
        greedy = rec.data["methods"].get("greedy", {}).get("ms_per_step")
        for method, r in rec.data["methods"].items():
            parts = {name: ms for name, ms in r["ms_per_step_by_part"].items() if ms > 0}
            rows.append({"label": rec.label, "method": method, "ms": r["ms_per_step"],
                         "x_greedy": r["ms_per_step"] / greedy if greedy else math.nan, "parts": parts,
                         "command": rec.command})
    return rows


def peer_rows(records: list[Record]) -> list[dict[str, Any]]:
    """One row per (record, system) of greedy decoding against peer systems: the ``peer`` records of
    ``benchmarks.peer`` (every system with ``ms_per_token_median``), and the ``peers`` entry of ``bench``
    records (``ms_per_output_token`` per batch size, beside the record's own greedy)."""
    rows = []
    for rec in records:
        if rec.kind == "peer":
            ours = rec.data.get("lightning_bpd", {}).get("ms_per_token_median")
            for name, r in rec.data.items():
                if isinstance(r, dict) and "ms_per_token_median" in r:
                    rows.append({"label": rec.label, "batch": rec.data.get("batch"), "system": name,
                                 "ms_per_token": r["ms_per_token_median"],
                                 "x_ours": r["ms_per_token_median"] / ours if ours else math.nan,
                                 "command": rec.command, "path": rec.path})
        elif rec.kind == "bench" and isinstance(rec.data.get("peers"), dict):
            for batch, peers in rec.data["peers"].get("batch_sizes", {}).items():
                ours = rec.data["batch_sizes"].get(batch, {}).get("greedy", {})
                ours_ms = ours.get("ms_per_output_token")
                if ours_ms is None and ours.get("tokens_per_second"):
                    ours_ms = 1000 / ours["tokens_per_second"]
                for name, r in [("lightning_bpd", {"ms_per_output_token": ours_ms}), *peers.items()]:
                    if r.get("ms_per_output_token") is None:
                        continue
                    rows.append({"label": rec.label, "batch": int(batch), "system": name,
                                 "ms_per_token": r["ms_per_output_token"],
                                 "x_ours": r["ms_per_output_token"] / ours_ms if ours_ms else math.nan,
                                 "command": rec.command, "path": rec.path})
    return rows


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_tables(records: list[Record]) -> str:
    """Every record as tables (docs/results.md): quality and accepted block size, the acceptance ablation,
    wall-clock speed, where the time goes and the peers."""
    lines = ["| run | stage | method | quality | mean accepted block size | = greedy |",
             "|---|---|---|---:|---:|---:|"]
    for r in quality_rows(records):
        quality = f"{r['metric'].upper()} {fmt(r['quality'])}" if r["metric"] else ""
        lines.append(f"| {r['label']} | {r['stage']} | {r['method']} | {quality} | {fmt(r['block'])} "
                     f"| {fmt(r['matches_greedy'])} |")
    ablation = ablation_rows(records)
    if ablation:
        header = ("| k | head | targets | base | BLEU | mean accepted block size (exact) | agreement of heads 2.. "
                  "with greedy | steps | minutes |")
        lines += ["", header, "|---:|---|---|---|---:|---:|---|---:|---:|"]
        for r in ablation:
            agree = " ".join(f"{a:.2f}" for a in r["agreement"])
            lines.append(f"| {r['k']} | {r['head']} | {r['targets']} | {r['base']} | {fmt(r['bleu'])} | "
                         f"{fmt(r['block'])} | {agree} | {r['steps']} | {r['minutes']} {r['device']} |")
    lines += ["", "| run | batch | method | s/input | mean accepted block size | speedup | efficiency | = greedy / acceptance |",
              "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in speed_rows(records):
        if r["method"] == r["baseline"]:
            continue
        last = fmt(r["acceptance_rate"], 3) if r["acceptance_rate"] is not None else fmt(r["equals_greedy"])
        lines.append(f"| {r['label']} | {r['batch']} | {r['method']} (vs {r['baseline']}) | "
                     f"{fmt(r['seconds_per_input'], 4)} | {fmt(r['block'])} | {fmt(r['speedup'])} | "
                     f"{fmt(r['efficiency'])} | {last} |")
    times = time_rows(records)
    if times:
        lines += ["", "| run | method | ms per step / iteration | x greedy step | where it goes (ms) |", "|---|---|---:|---:|---|"]
        for r in times:
            parts = ", ".join(f"{name} {ms:.2f}" for name, ms in r["parts"].items())
            lines.append(f"| {r['label']} | {r['method']} | {fmt(r['ms'])} | {fmt(r['x_greedy'])} | {parts} |")
    peers = peer_rows(records)
    if peers:
        lines += ["", "| run | batch | greedy of | ms per output token | x ours |", "|---|---:|---|---:|---:|"]
        for r in peers:
            lines.append(f"| {r['label']} | {r['batch']} | {r['system']} | {fmt(r['ms_per_token'], 3)} | "
                         f"{fmt(r['x_ours'])} |")
    return "\n".join(lines)


def parse_meta(pairs: list[str]) -> dict[str, Any]:
    """``["head=chained", "steps=1500"]`` -> ``{"head": "chained", "steps": 1500}`` (numbers parsed)."""
    meta: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--meta takes key=value, got {pair!r}")
        try:
            meta[key] = int(value)
        except ValueError:
            try:
                meta[key] = float(value)
            except ValueError:
                meta[key] = value
    return meta


def add(source: str | Path, dest: str | Path, label: str, command: str, meta: dict[str, Any] | None = None) -> Path:
    """Copy a run's JSON record to ``dest`` with its ``label``, ``command`` and optional ``meta``
    (the recipe of an ablation row: k, head, targets, base, steps, minutes, device)."""
    data = json.loads(Path(source).read_text())
    if kind_of(data) is None:
        raise ValueError(f"{source} is not a decode, bench, step_cost or where_time_goes record")
    data = {"label": label, "command": command, **{k: v for k, v in data.items() if k not in ("label", "command")}}
    if meta:
        data["meta"] = meta
    return write_json(dest, data)


# --- The README's headline: which records fill which cell. A cell whose record is missing prints "-".
# Stern et al. (2018), Table 1 (WMT14 En-De, k = 8, mean accepted block size) and Table 2 (CelebA, the
# "both" column: fine-tuned and approximate acceptance eps = 2): the paper's values, not measured here.
PAPER_TABLE1 = {8: (1.76, 1.91, 3.01, 4.69)}
PAPER_TABLE2_BOTH = {4: 3.75, 8: 6.36}
# Table 1 columns: (name, training targets, base) as in the records' ``meta``.
TABLE1_COLUMNS = (("regular", "gold", "frozen"), ("distillation", "self-distilled", "frozen"),
                  ("fine-tuning", "gold", "fine-tuned"), ("both", "self-distilled", "fine-tuned"))
# Table 1 rows: (head, k, the recipes (``python -m lightning_bpd recipe <name>``) that make the row's cells).
TABLE1_ROWS = (("paper", 8, "`recipe multi30k-paper-k8-gold` (gold), `recipe multi30k-paper-k8` (self-distilled)"),
               ("paper", 4, ""), ("chained", 8, ""), ("chained_attn", 4, ""),
               ("chained_attn", 8, "`recipe multi30k-k8` (self-distilled)"))
TABLE1_BASE = "multi30k/acceptance/base_k1_test.json"
TABLE1_BUDGET = 0.8  # the reduced-budget table: the recipes as a CPU user runs them in ~2 hours each
TABLE1_BUDGET_ROWS = (("paper", 8), ("chained_attn", 8))
TABLE1_BUDGET_NOTE = ("heads 800 steps frozen and 800 fine-tuned, every cell on one base of 1,309 steps: 40 minutes alone "
                      "on 2 cores, greedy test BLEU 32.39; records in `results/multi30k/recipes/`")
TABLE2_BASE = "superres/i14_gaussian_base_60min_val64.json"
# Table 2 rows, newest first: (heads, the cell records (k, base: frozen | the fine-tuned stage), the k's, made by,
# the fine-tuned stage's record name: finetune (the whole base) or readout (train_readout: its Gaussian readout alone)).
TABLE2_SETS = (
    ("chained, own pixel + pixel neighbours, self-distilled (CPU base), readout fine-tuned",
     "superres/table2n_k{k}_{base}.json", (4, 8), "`recipe celeba-table2-neighbours`", "readout"),
    ("chained, own pixel + pixel neighbours, self-distilled (CPU base)", "superres/table2n_k{k}_{base}.json", (4, 8),
     "`recipe celeba-table2-neighbours`", "finetune"),
    ("chained, own pixel, self-distilled (H100 base)", "superres/table2c_k{k}_{base}.json", (2, 4, 6, 8),
     "`recipe celeba-table2-chained`", "finetune"),
    ("paper, gold (issue 14)", "superres/table2g_k{k}_{base}.json", (2, 4, 8), "`recipe celeba-table2` (k=8)",
     "finetune"),
)
TABLE2_COLUMNS = (("frozen", "exact"), ("frozen", "eps2"), ("finetune", "exact"), ("finetune", "eps2"))
# the wall-clock of the best "both" cell: the readout-fine-tuned k=8 heads (recipe's bench_readout stage)
TABLE2_BENCH = "superres/table2n_k8_bench_readout.json"
DEFAULT_RUN = "default/translation_fresh_clone.json"
RECIPE_BENCH = "multi30k/speed/recipe_k8_bench_{}.json"  # issue 26: the recipe's model, with CTranslate2 peers
LEAN_BENCH = "multi30k/speed/i26_b06_bench_{}.json"  # issue 26, lean steps and int8: recipe --budget 0.6, AMD EPYC
HEADLINE_BENCH = LEAN_BENCH.format("int8")  # the bench record whose peers the README shows
DV = "--draft-vocab 1000"
INT8 = "`recipe multi30k-k8` (stage bench_int8)"  # bench --precision int8 --proposal-precision int8 --draft-vocab 1000
# Wall-clock rows: (record, batch (None: a decode record), method, what, how it is made).
SPEED_ROWS = (
    (DEFAULT_RUN, None, "exact", "built-in default: k=4 chained heads, synthetic val", "`python -m lightning_bpd fit`"),
    (LEAN_BENCH.format("before"), 1, "greedy",
     "Multi30k k=8 `chained_attn` (recipe, `--budget 0.6`), test, float32, the code before the lean steps",
     f"`bench {DV}` at commit ed5106b"),
    (LEAN_BENCH.format("before"), 1, "exact@k8", "same, k=8", f"`bench {DV}` at commit ed5106b"),
    (LEAN_BENCH.format("fp32"), 1, "exact@k8", "same model, float32, lean steps (TorchScript), k=8", f"`bench {DV}`"),
    (LEAN_BENCH.format("fp32_screened_int8prop"), 1, "exact@k8", "same, screened argmax, int8 proposals, k=8",
     f"`bench --screened-argmax --proposal-precision int8 {DV}`"),
    (LEAN_BENCH.format("int8"), 1, "greedy", "same model in precision int8 (speedups over its int8 greedy)", INT8),
    (LEAN_BENCH.format("int8"), 1, "exact@k4", "same, k=4", INT8),
    (LEAN_BENCH.format("int8"), 1, "exact@k8", "same, k=8", INT8),
    (LEAN_BENCH.format("int8"), 32, "greedy", "same, batch 32", INT8),
    (LEAN_BENCH.format("int8"), 32, "exact@k8", "same, batch 32, k=8", INT8),
)


def find(records: list[Record], rel: str) -> Record | None:
    """The record whose path ends with ``rel`` (a path under the results folder)."""
    return next((r for r in records if r.path.as_posix().endswith("/" + rel) or r.path.as_posix() == rel), None)


def rel_link(rec: Record) -> str:
    """``[name](results/...)``: a link to the record from the folder that holds the results folder."""
    path = (Path(rec.root.name) / rec.path.relative_to(rec.root)).as_posix() if rec.root else rec.path.as_posix()
    return f"[{rec.path.name}]({path})"


def table1_cell(rows: list[dict[str, Any]], head: str, k: int, targets: str, base: str,
                budget: float = 1) -> dict[str, Any] | None:
    """The acceptance-ablation row of (head, k, targets, base) trained at recipe ``budget`` (``--meta budget=F``;
    none = 1); among several, one filed with ``--meta recipe=<name>`` wins, then the last by path."""
    found = [r for r in rows if (r["head"], r["k"], r["targets"], r["base"], r["budget"]) ==
             (head, k, targets, base, budget) and not math.isnan(r["bleu"])]  # translation rows only
    found.sort(key=lambda r: (bool(r.get("recipe")), str(r["path"])))
    return found[-1] if found else None


def budget_table1(rows: list[dict[str, Any]], budget: float) -> list[str]:
    """Table 1 at a reduced recipe budget (records filed with ``--meta budget=F``): every cell of a row from one
    recipe run, so the paper head's four cells share one base."""
    found = [(head, k) for head, k in TABLE1_BUDGET_ROWS
             if any(table1_cell(rows, head, k, t, b, budget) for _, t, b in TABLE1_COLUMNS)]
    if not found:
        return []
    lines = [f"The same table from the recipes at `--budget {budget}` ({TABLE1_BUDGET_NOTE}):", "",
             "| head | k | regular | distillation | fine-tuning | both | made by |", "|---|---:|---:|---:|---:|---:|---|"]
    for k, paper in PAPER_TABLE1.items():
        lines.append(f"| Stern et al. 2018, WMT14 | {k} | " + " | ".join(f"{v:.2f}" for v in paper) + " | the paper |")
    for head, k in found:
        cells, made = [], set()
        for _, targets, base_kind in TABLE1_COLUMNS:
            r = table1_cell(rows, head, k, targets, base_kind, budget)
            cells.append(f"{fmt(r['block'])} ({fmt(r['bleu'])})" if r else "-")
            if r and r.get("recipe"):
                made.add(f"`recipe {r['recipe']} --budget {budget}`")
        lines.append(f"| `{head}` | {k} | " + " | ".join(cells) + f" | {', '.join(sorted(made))} |")
    return lines + [""]


def table2_rows(records: list[Record]) -> list[dict[str, Any]]:
    """The Table 2 analog's cells: one row per (heads, k) with a record, each column's mean accepted block
    size and PSNR (None where no record), the paper's "both" value, and who makes it."""
    rows = []
    for heads, pattern, ks, made, tuned in TABLE2_SETS:
        for k in ks:
            cells = []
            for base_kind, method in TABLE2_COLUMNS:
                rec = find(records, pattern.format(k=k, base=tuned if base_kind == "finetune" else base_kind))
                m = rec.data["metrics"] if rec else {}
                cells.append((m.get(f"{method}/mean_accepted_block_size"), m.get(f"{method}/psnr")))
            if any(block is not None for block, _ in cells):
                rows.append({"heads": heads, "k": k, "cells": cells, "paper_both": PAPER_TABLE2_BOTH.get(k),
                             "made": made})
    return rows


def table2_lines(records: list[Record]) -> list[str]:
    """The README's Table 2 analog (super-resolution) and the k=8 heads' wall-clock, from the records."""
    cell = find(records, TABLE2_SETS[0][1].format(k=8, base="frozen")) or find(records, TABLE2_BASE)
    sm = cell.data["metrics"] if cell else {}
    lines = [(f"**Table 2 analog: super-resolution** (CelebA 8x8 -> 32x32, {int(sm.get('examples', 0))} val faces; "
              "mean accepted block size, PSNR dB in brackets; regular and fine-tuned = exact acceptance, so the "
              "regular cell's PSNR is its base's greedy PSNR; bicubic upsampling "
              f"{fmt(sm.get('bicubic/psnr'))} dB, nearest-neighbour {fmt(sm.get('nearest/psnr'))}. Pixel-neighbour "
              "rows: CPU base (960 steps, 97 CPU-minutes), heads 10 minutes per stage on 2 CPU threads; other chained "
              "rows: base 5 minutes on an H100, heads 10 CPU-minutes per stage; all chained rows float32-invariant, "
              "exact output = greedy on every face; paper-head rows: 60-minute CPU base, heads 5 CPU-minutes, float32, exact = "
              "greedy on 62-81% of faces; [docs/superres.md](docs/superres.md) has the budgets)"), "",
             "| heads | k | regular | approximate (eps=2) | fine-tuned | both | paper, both | made by |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in table2_rows(records):
        cells = [f"{fmt(b)} ({fmt(q)})" if b is not None else "-" for b, q in r["cells"]]
        lines.append(f"| {r['heads']} | {r['k']} | " + " | ".join(cells) +
                     f" | {fmt(r['paper_both']) if r['paper_both'] else '-'} | {r['made']} |")
    lines += ["", ("Records: `results/superres/table2n_*.json` (pixel neighbours), `table2c_*.json` (chained) and "
                   "`table2g_*.json` (paper heads); each "
                   "holds its `command` and, in `meta`, the minutes and machine of its training."), ""]
    bench = find(records, TABLE2_BENCH)
    if bench is not None:
        parts = []
        for batch, methods in sorted(bench.data.get("batch_sizes", {}).items(), key=lambda kv: int(kv[0])):
            for name, r in methods.items():
                if name != "greedy" and r.get("speedup") is not None:
                    parts.append(f"batch {batch} {name}: block {fmt(r.get('mean_accepted_block_size'))}, "
                                 f"speedup {fmt(r['speedup'])}")
        lines += [f"Wall-clock of the k=8 readout-fine-tuned heads over their own greedy ({rel_link(bench)}, "
                  f"{bench.data.get('precision', 'float32')}): " + "; ".join(parts) + ".", ""]
    return lines


def headline_tables(records: list[Record]) -> str:
    """The README's headline: Table 1 analog (translation), Table 2 analog (super-resolution) and
    wall-clock speed, each cell from a record in ``results/`` (cells without one print ``-``)."""
    lines: list[str] = []
    base = find(records, TABLE1_BASE)
    bm = base.data["metrics"] if base else {}
    rows = ablation_rows(records)
    lines += [(f"**Table 1 analog: translation** (Multi30k En->De, {int(bm.get('examples', 0)):,} test_2016_flickr "
              "sentences; mean accepted block size with exact acceptance, BLEU in brackets; the k=1 base scores "
              f"BLEU {fmt(bm.get('greedy/bleu'))} and every frozen cell decodes exactly its greedy output)"), "",
              "| head | k | regular | distillation | fine-tuning | both | made by |",
              "|---|---:|---:|---:|---:|---:|---|"]
    for k, paper in PAPER_TABLE1.items():
        lines.append(f"| Stern et al. 2018, WMT14 | {k} | " + " | ".join(f"{v:.2f}" for v in paper) + " | the paper |")
    for head, k, recipes in TABLE1_ROWS:
        cells = []
        for _, targets, base_kind in TABLE1_COLUMNS:
            r = table1_cell(rows, head, k, targets, base_kind)
            cells.append(f"{fmt(r['block'])} ({fmt(r['bleu'])})" if r else "-")
        made = recipes or "the record's `command`"
        lines.append(f"| `{head}` | {k} | " + " | ".join(cells) + f" | {made} |")
    lines += ["", ("Regular = gold targets, base frozen; distillation = self-distilled targets; fine-tuning = base "
              "fine-tuned jointly with the heads; both = both; - = no record on this recipe yet. Every cell's record "
              "in `results/multi30k/acceptance/` holds its exact `command`."), ""]
    lines += budget_table1(rows, TABLE1_BUDGET)

    lines += table2_lines(records)

    lines += [("**Wall-clock** (CPU; exact acceptance, outputs identical to greedy; speedup = our greedy's time / "
              "blockwise's in the same run; threads and machine load in each record's label)"),
              "", "| model | batch | rule | mean accepted block | speedup | ms per output token | made by | record |",
              "|---|---:|---|---:|---:|---:|---|---|"]
    for rel, batch, method, what, made in SPEED_ROWS:
        rec = find(records, rel)
        if rec is None:
            lines.append(f"| {what} | {batch or 1} | {method} | - | - | - | {made} | `{rel}` (missing) |")
            continue
        if batch is None:
            m = rec.data["metrics"]
            r = {"mean_accepted_block_size": m.get(f"{method}/mean_accepted_block_size"),
                 "speedup": m.get(f"{method}/speedup")}
        else:
            r = rec.data["batch_sizes"].get(str(batch), {}).get(method, {})
        ms = r.get("ms_per_output_token")
        if ms is None and r.get("tokens_per_second"):
            ms = 1000 / r["tokens_per_second"]
        lines.append(f"| {what} | {batch or rec.data.get('batch_size', 1)} | {method} | "
                     f"{fmt(r.get('mean_accepted_block_size'))} | {fmt(r.get('speedup'))} | {fmt(ms, 3)} | {made} | "
                     f"{rel_link(rec)} |")
    peer_rec = find(records, HEADLINE_BENCH)
    peers = [r for r in peer_rows(records) if peer_rec is not None and r["path"] == peer_rec.path]
    lines.append("")
    if peers:
        lines += [("Peers: greedy decoding of the same 96 sentences, forced to our greedy's output lengths, by "
                   "CTranslate2 on a random-weight Transformer of the same shape, in the same run "
                   f"({rel_link(peer_rec)}; every peer row is in [docs/results.md](docs/results.md)):"), "",
                  f"| batch | system | ms per output token | x our {peer_rec.data.get('precision', 'float32')} greedy |",
                  "|---:|---|---:|---:|"]
        for r in peers:
            name = f"lightning_bpd greedy ({peer_rec.data.get('precision', 'float32')})" if r["system"] == "lightning_bpd" \
                else r["system"]
            lines.append(f"| {r['batch']} | {name} | {fmt(r['ms_per_token'], 3)} | {fmt(r['x_ours'])} |")
    else:
        lines.append("Peers (Hugging Face `transformers`, CTranslate2 float32 / int8): no record in `results/` yet; "
                     "see [docs/speed.md](docs/speed.md).")
    return "\n".join(lines)


def default_run_printout(records: list[Record]) -> str:
    """What ``python -m lightning_bpd fit`` prints at the end, rebuilt from its record."""
    from lightning_bpd.callbacks.decode_eval import format_summary

    rec = find(records, DEFAULT_RUN)
    if rec is None:
        return f"(no record {DEFAULT_RUN})"
    m, d = rec.data["metrics"], rec.data
    return "\n".join([
        "```",
        f"[{d.get('stage', 'val')} decode, {int(m['examples'])} examples, k={d.get('k')}, 1 process(es)]",
        format_summary(m, methods_of(m), "bleu"),
        "run folder: runs/translation-<date>-<time>; W&B run: runs/translation-<date>-<time>/wandb/offline-run-<...>",
        f"bleu signature: {d['signature']}" if d.get("signature") else "",
        "```",
    ]).replace("\n\n```", "\n```")


# Generated blocks: name -> the function of the records that fills it. ``results`` (every record) lives in
# docs/results.md; ``default-run`` and ``headline`` in README.md.
GENERATED = {"results": markdown_tables, "default-run": default_run_printout, "headline": headline_tables}
GENERATED_FILES = ("README.md", "docs/results.md")


def markers(name: str) -> tuple[str, str]:
    """The begin and end markers of the generated block ``name``."""
    return f"<!-- {name}:begin (python -m lightning_bpd results readme) -->", f"<!-- {name}:end -->"


BEGIN, END = markers("results")


def readme_block(text: str, name: str = "results") -> str:
    """The generated block ``name`` between its markers."""
    begin, end = markers(name)
    if begin not in text or end not in text:
        raise ValueError(f"no {begin} ... {end} block")
    return text[text.index(begin) + len(begin) : text.index(end)].strip("\n")


def blocks_in(text: str) -> list[str]:
    """The names of the generated blocks in ``text``."""
    return [name for name in GENERATED if markers(name)[0] in text and markers(name)[1] in text]


def update_readme(readme: str | Path, folder: str | Path) -> None:
    """Rewrite every generated block of a Markdown file from the records in ``folder``."""
    text = Path(readme).read_text()
    names = blocks_in(text)
    if not names:
        raise ValueError(f"{readme} has no generated block (markers like {BEGIN} ... {END})")
    records = load(folder)
    for name in names:
        begin, end = markers(name)
        head, tail = text[: text.index(begin) + len(begin)], text[text.index(end) :]
        text = f"{head}\n{GENERATED[name](records)}\n{tail}"
    Path(readme).write_text(text)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="print the Markdown result tables")
    t.add_argument("folder", nargs="?", default="results")
    r = sub.add_parser("readme", help="rewrite the generated blocks of README.md and docs/results.md")
    r.add_argument("files", nargs="*", default=list(GENERATED_FILES))
    r.add_argument("--folder", default="results")
    a = sub.add_parser("add", help="file a run's JSON with its label and command")
    a.add_argument("source")
    a.add_argument("dest")
    a.add_argument("--label", required=True)
    a.add_argument("--command", required=True)
    a.add_argument("--meta", nargs="*", default=[], help="key=value recipe fields of an ablation row "
                   f"({', '.join(ABLATION_KEYS)})")
    args = p.parse_args(argv)
    try:
        if args.cmd == "table":
            print(markdown_tables(load(args.folder)))
        elif args.cmd == "readme":
            for path in args.files:
                update_readme(path, args.folder)
        else:
            print(add(args.source, args.dest, args.label, args.command, parse_meta(args.meta)))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"results: {err}") from None


if __name__ == "__main__":
    main()
