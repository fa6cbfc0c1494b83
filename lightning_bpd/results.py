"""The measured results in ``results/``: load them, tabulate them (README) and feed the notebook's plots.

Every record is a JSON file with a ``label`` (what was measured) and the ``command`` that made it,
beside the data of one of four kinds:

- ``decode``: a ``decode_<stage>.json`` of the :class:`~lightning_bpd.callbacks.decode_eval.DecodeEval`
  callback (``metrics`` holds ``<method>/bleu`` or ``<method>/psnr``, ``<method>/mean_accepted_block_size``, ...);
- ``bench``: the JSON of ``python -m lightning_bpd bench`` (``batch_sizes`` -> method -> timings);
- ``step_cost``: the JSON of ``python -m lightning_bpd.benchmarks.step_cost``;
- ``where_time_goes``: the JSON of ``python -m lightning_bpd.benchmarks.where_time_goes``.

``python -m lightning_bpd.results add RUN/decode_test.json results/x.json --label L --command C`` files a
run's record with its provenance; ``python -m lightning_bpd.results table [results]`` prints the
Markdown tables, and ``python -m lightning_bpd.results readme`` writes them into README.md between
its markers.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUALITY_KEYS = ("bleu", "psnr")


@dataclass
class Record:
    path: Path
    kind: str  # decode | bench | step_cost | where_time_goes
    label: str
    command: str
    data: dict[str, Any]


def kind_of(data: dict[str, Any]) -> str | None:
    if "metrics" in data:
        return "decode"
    if "batch_sizes" in data:
        return "bench"
    if "ratio_vs_greedy_base_step" in data:
        return "step_cost"
    if isinstance(data.get("methods"), dict) and all("ms_per_step_by_part" in m for m in data["methods"].values()):
        return "where_time_goes"
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
        records.append(Record(path, kind, data.get("label", path.stem), data.get("command", ""), data))
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
                     "command": rec.command})
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


def fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_tables(records: list[Record]) -> str:
    """The README's result tables: quality and accepted block size, then wall-clock speed."""
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


def write_json(path: str | Path, data: dict[str, Any]) -> Path:
    """Write a record (or a benchmark's results) as indented JSON, making the folder if needed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


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


BEGIN, END = "<!-- results:begin (python -m lightning_bpd.results readme) -->", "<!-- results:end -->"


def readme_block(text: str) -> str:
    """The generated tables between the README's markers."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"the README has no {BEGIN} ... {END} block")
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip("\n")


def update_readme(readme: str | Path, folder: str | Path) -> None:
    """Rewrite the README's generated block from the records in ``folder``."""
    text = Path(readme).read_text()
    readme_block(text)  # both markers present
    head, tail = text[: text.index(BEGIN) + len(BEGIN)], text[text.index(END) :]
    Path(readme).write_text(f"{head}\n{markdown_tables(load(folder))}\n{tail}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd.results", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("table", help="print the Markdown result tables")
    t.add_argument("folder", nargs="?", default="results")
    r = sub.add_parser("readme", help="rewrite the README's generated result tables")
    r.add_argument("readme", nargs="?", default="README.md")
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
            update_readme(args.readme, args.folder)
        else:
            print(add(args.source, args.dest, args.label, args.command, parse_meta(args.meta)))
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"results: {err}") from None


if __name__ == "__main__":
    main()
