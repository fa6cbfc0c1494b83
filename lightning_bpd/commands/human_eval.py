"""``python -m lightning_bpd human-eval``: side-by-side human evaluation of super-resolution (paper 7.2, Table 3).

``export`` super-resolves the first n inputs of a split with two methods (checkpoint, k, criterion) and writes a
folder for raters: ``images/`` (input and the two outputs of each pair, 128x128 nearest), ``sheet.csv`` (crowd-sourcing
upload, no method names), ``key.csv`` (which method is on which side; keep it from the raters), ``methods.json`` and
``index.html`` (a self-contained voting page that downloads ``responses.csv``). The side of each method is random per
pair (``--seed``).

``analyze`` joins ``responses.csv`` files (``pair_id,choice``) with the key and reports the share of votes for method 1
with a 90% bootstrap confidence interval, as in Table 3.
"""

from __future__ import annotations

import argparse
import base64
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor

from lightning_bpd.commands.out_paths import file_above, is_json_record, same_file_as
from lightning_bpd.decoding import parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.decoding.protocol import resolve_k
from lightning_bpd.evaluation import EvalBatch, decode_all
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.arguments import add_precision_arg, options_from_args
from lightning_bpd.records import write_json
from lightning_bpd.tasks.superres import SuperResolutionModule
from lightning_bpd.tasks.superres.module import TARGET_LEN
from lightning_bpd.tasks.superres.pixels import image_to_tokens, intensity_values

MAX_LEN = TARGET_LEN  # 32 * 32 * 3 intensities
INPUT_SCALE, OUTPUT_SCALE = 16, 4  # 8x8 and 32x32 -> 128x128
SIDES = ("left", "right")
SHEET_COLUMNS = ("pair_id", "input_url", "left_url", "right_url")
KEY_COLUMNS = ("pair_id", "left_method", "right_method")
RESPONSE_COLUMNS = ("pair_id", "choice")
MAX_LISTED = 20  # bad rows named in one error message

Method = tuple[str, SuperResolutionModule, int | None, str]  # (name, module, k or None for all heads, criterion)


class HumanEvalError(ValueError):
    """Bad input to a human-eval command, reported as one message."""


# ---- export ---------------------------------------------------------------------------------------
def decode_method(module: SuperResolutionModule, spec: tuple[int | None, str], inputs: Tensor, batch_size: int = 16,
                  options: InferenceOptions | None = None) -> Tensor:
    """Super-resolve uint8 inputs ``(N, 8, 8, 3)`` with ``spec = (k, criterion)`` -> uint8 ``(N, 32, 32, 3)``.

    ``criterion`` is ``greedy`` or a spec of ``module.make_criterion``; ``k=None`` uses all heads; ``options``: the
    runtime's (:func:`~lightning_bpd.inference.build_runtime`; default: the model's own precision).
    """
    k, criterion = spec
    runtime = build_runtime(module.model, options)
    method = make_method(criterion, module.make_criterion, runtime, k)
    batches = [EvalBatch(image_to_tokens(inputs[start : start + batch_size]).to(module.device), MAX_LEN)
               for start in range(0, inputs.shape[0], batch_size)]  # (b, 192) sources
    rows = decode_all(method, runtime, batches).outputs
    return module.to_images(rows).permute(0, 2, 3, 1).to(torch.uint8)  # (N, 32, 32, 3)


def assign_sides(n: int, seed: int) -> list[bool]:
    """Per pair, whether method 1 is shown on the left (a fair coin per pair, seeded)."""
    return (np.random.default_rng(seed).random(n) < 0.5).tolist()


def png_bytes(image: Tensor, scale: int) -> bytes:
    """A uint8 ``(H, W, 3)`` image upscaled ``scale`` times (nearest) as PNG bytes."""
    big = image.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    buf = io.BytesIO()
    Image.fromarray(big.numpy()).save(buf, format="PNG")
    return buf.getvalue()


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def export(methods: list[Method], low: Tensor, out_dir: str | Path, seed: int, info: dict[str, Any] | None = None,
           method_info: list[dict[str, Any]] | None = None, options: InferenceOptions | None = None) -> None:
    """Decode ``low`` (N, 8, 8, 3) with both methods and write the evaluation folder ``out_dir``.

    ``info`` goes into ``methods.json`` as is, ``method_info[i]`` into the entry of method i + 1 (e.g. checkpoints).
    """
    if len(methods) != 2:
        raise HumanEvalError(f"export compares exactly two methods, got {len(methods)}")
    if methods[0][0] == methods[1][0]:
        raise HumanEvalError(f"the two methods need different names, both are {methods[0][0]!r}")
    outputs = [decode_method(module, (k, criterion), low, options=options) for _, module, k, criterion in methods]
    out = Path(out_dir)
    (out / "images").mkdir(parents=True, exist_ok=True)
    sheet, key, pages = [], [], []
    for i, first_left in enumerate(assign_sides(low.shape[0], seed)):
        pid = f"{i:04d}"
        order = (0, 1) if first_left else (1, 0)
        files = {"input": (low[i], INPUT_SCALE), "a": (outputs[order[0]][i], OUTPUT_SCALE),
                 "b": (outputs[order[1]][i], OUTPUT_SCALE)}
        urls, uris = {}, {}
        for part, (image, scale) in files.items():
            data = png_bytes(image, scale)
            urls[part] = f"images/{pid}_{part}.png"
            (out / urls[part]).write_bytes(data)
            uris[part] = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
        sheet.append({"pair_id": pid, "input_url": urls["input"], "left_url": urls["a"], "right_url": urls["b"]})
        key.append({"pair_id": pid, "left_method": methods[order[0]][0], "right_method": methods[order[1]][0]})
        pages.append({"id": pid, "input": uris["input"], "left": uris["a"], "right": uris["b"]})
    write_csv(out / "sheet.csv", SHEET_COLUMNS, sheet)
    write_csv(out / "key.csv", KEY_COLUMNS, key)
    described = {"pairs": low.shape[0], "seed": seed, "max_len": MAX_LEN, **(info or {})}
    for j, (name, module, k, criterion) in enumerate(methods):
        heads = None if criterion == "greedy" else resolve_k(module.model, k)
        entry = {"name": name, "criterion": criterion, "k": heads, "model_class": type(module).__name__}
        described[f"method{j + 1}"] = {**entry, **((method_info or [{}, {}])[j])}
    (out / "methods.json").write_text(json.dumps(described, indent=2) + "\n", encoding="utf-8")
    (out / "index.html").write_text(render_html(pages), encoding="utf-8")
    log_to_wandb(out, sheet)


def log_to_wandb(out: Path, sheet: list[dict[str, str]]) -> bool:
    """Log the sheet as a ``wandb.Table`` of images under ``human_eval/sheet`` if a W&B run is active."""
    wandb = sys.modules.get("wandb")  # no import: a run can only be active if wandb was imported
    if wandb is None or getattr(wandb, "run", None) is None:
        return False
    table = wandb.Table(columns=["pair_id", "input", "left", "right"])
    for row in sheet:
        table.add_data(row["pair_id"], *[wandb.Image(str(out / row[c])) for c in SHEET_COLUMNS[1:]])
    wandb.log({"human_eval/sheet": table})
    return True


HTML = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Which face is more realistic?</title>
<style>
body{font-family:sans-serif;max-width:820px;margin:2em auto;padding:0 1em}
.pair{border:1px solid #ccc;border-radius:6px;padding:1em;margin:1em 0}
.row{display:flex;gap:1.5em;align-items:flex-start}figure{margin:0;text-align:center}
img{width:128px;height:128px;image-rendering:pixelated}button{margin-top:.5em}button.on{background:#2a7;color:#fff}
#bar{position:sticky;top:0;background:#fff;padding:.5em 0;border-bottom:1px solid #ccc}
</style></head><body>
<h1>Which face is more realistic?</h1>
<p>Each pair shows a tiny input picture and two enlarged versions of it. Click the button under the
enlargement that looks more like a real photograph. When done, download your answers and send us the file.</p>
<div id="bar"><span id="count">0</span> / <span id="total">0</span> answered
<button id="download">Download responses.csv</button></div>
<div id="pairs"></div>
<script>
const PAIRS = __PAIRS__, choices = {};
function fig(src, side, label) {
  return '<figure><img src="' + src + '" alt="' + side + '"><br>' + (side === "input" ? label
    : '<button data-side="' + side + '">' + label + '</button>') + '</figure>';
}
PAIRS.forEach(function (p) {
  const div = document.createElement("div"); div.className = "pair";
  div.innerHTML = "<b>Pair " + p.id + '</b><div class="row">' + fig(p.input, "input", "input")
    + fig(p.left, "left", "left is more realistic") + fig(p.right, "right", "right is more realistic") + "</div>";
  div.querySelectorAll("button").forEach(function (b) { b.onclick = function () {
    choices[p.id] = b.dataset.side;
    div.querySelectorAll("button").forEach(function (o) { o.className = o === b ? "on" : ""; });
    document.getElementById("count").textContent = Object.keys(choices).length;
  }; });
  document.getElementById("pairs").appendChild(div);
});
document.getElementById("total").textContent = PAIRS.length;
document.getElementById("download").onclick = function () {
  const lines = ["pair_id,choice"];
  PAIRS.forEach(function (p) { if (choices[p.id]) lines.push(p.id + "," + choices[p.id]); });
  const missing = PAIRS.length - (lines.length - 1);
  if (missing > 0 && !confirm(missing + " pair(s) are unanswered. Download anyway?")) return;
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([lines.join("\\n") + "\\n"], {type: "text/csv"}));
  a.download = "responses.csv"; document.body.appendChild(a); a.click(); a.remove();
  setTimeout(function () { URL.revokeObjectURL(a.href); }, 1000);
};
</script></body></html>
"""


def render_html(pages: list[dict[str, str]]) -> str:
    """The voting page with the images inlined as data URIs (works offline, from any folder)."""
    return HTML.replace("__PAIRS__", json.dumps(pages).replace("</", "<\\/"))


# ---- analyze --------------------------------------------------------------------------------------
def norm_id(pid: str) -> str:
    """Pair ids compare after stripping, and numerically when all digits (spreadsheets turn 0007 into 7)."""
    pid = pid.strip()
    return str(int(pid)) if pid.isdigit() else pid


def read_table(path: str | Path, columns: tuple[str, ...], what: str) -> list[tuple[int, dict[str, str]]]:
    """Rows of the CSV ``what`` file with the given columns as ``(row number, row)``; the header is row 1."""
    path = Path(path)
    if not path.is_file():
        raise HumanEvalError(f"{what} file not found: {path}")
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        header = [h.strip() for h in reader.fieldnames or []]
        missing = [c for c in columns if c not in header]
        if missing:
            raise HumanEvalError(f"{path}: missing column(s) {', '.join(missing)}; expected a header "
                                 f"{','.join(columns)}, got {','.join(header) or 'nothing'}")
        reader.fieldnames = header
        return [(reader.line_num, {c: (row.get(c) or "").strip() for c in columns}) for row in reader]


def method1_of(key_path: str | Path, names: list[str], given: str | None) -> str:
    """Method 1's name: ``--method1``, else ``methods.json`` beside the key."""
    meta = Path(key_path).with_name("methods.json")
    if given is None and meta.is_file():
        given = json.loads(meta.read_text(encoding="utf-8")).get("method1", {}).get("name")
    if given is None:
        raise HumanEvalError(f"cannot tell which method is method 1: no {meta}; pass --method1 (one of {names})")
    if given not in names:
        raise HumanEvalError(f"method 1 {given!r} does not appear in {key_path} (methods there: {names})")
    return given


def analyze(responses: list[str], key_path: str, bootstrap: int = 10000, seed: int = 0,
            method1: str | None = None) -> dict[str, Any]:
    """Share of votes for method 1 with a 90% percentile bootstrap interval (responses resampled)."""
    if bootstrap < 1:
        raise HumanEvalError(f"--bootstrap must be >= 1, got {bootstrap}")
    key: dict[str, tuple[str, str]] = {}
    for row_no, row in read_table(key_path, KEY_COLUMNS, "key"):
        if not (row["pair_id"] and row["left_method"] and row["right_method"]):
            raise HumanEvalError(f"{key_path} row {row_no}: empty field in {row}")
        if norm_id(row["pair_id"]) in key:
            raise HumanEvalError(f"{key_path} row {row_no}: pair_id {row['pair_id']!r} appears twice")
        key[norm_id(row["pair_id"])] = (row["left_method"], row["right_method"])
    names = sorted({m for pair in key.values() for m in pair})
    if len(names) != 2:
        raise HumanEvalError(f"{key_path} should name exactly two methods, found {names}")
    m1 = method1_of(key_path, names, method1)
    m2 = names[1] if names[0] == m1 else names[0]
    votes, pairs, bad = [], set(), []
    for path in responses:
        for row_no, row in read_table(path, RESPONSE_COLUMNS, "responses"):
            pid, choice = norm_id(row["pair_id"]), row["choice"].lower()
            problems = ([f"pair_id {row['pair_id']!r} is not in the key"] if pid not in key else []) + (
                [f"choice {row['choice']!r} is not left or right"] if choice not in SIDES else [])
            if problems:
                bad.append(f"{path} row {row_no}: " + "; ".join(problems))
            else:
                votes.append(key[pid][SIDES.index(choice)] == m1)
                pairs.add(pid)
    if bad:
        more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
        raise HumanEvalError(f"{len(bad)} bad response row(s) (row 1 is the header):\n  "
                             + "\n  ".join(bad[:MAX_LISTED]) + more)
    if not votes:
        raise HumanEvalError(f"no responses in {', '.join(responses)}")
    v = np.asarray(votes, dtype=np.float64)
    rng, means = np.random.default_rng(seed), []
    for start in range(0, bootstrap, 1000):  # chunks keep the (replicates, n) index matrix small
        means.append(v[rng.integers(0, v.size, (min(1000, bootstrap - start), v.size))].mean(axis=1))
    low, high = np.percentile(np.concatenate(means), [5, 95])
    return {"method1": m1, "method2": m2, "share_method1": float(v.mean()), "ci90": [float(low), float(high)],
            "responses": int(v.size), "pairs": len(pairs), "pairs_in_key": len(key), "files": len(responses),
            "bootstrap": bootstrap, "seed": seed}


def print_report(r: dict[str, Any]) -> None:
    w1, w2 = max(8, len(r["method1"])), max(8, len(r["method2"]))
    print(f"{'method 1':{w1}s}  {'method 2':{w2}s}  {'share(m1)':>9s}  {'90% CI':>15s}  {'responses':>9s}  {'pairs':>5s}")
    ci = f"[{r['ci90'][0]:.3f}, {r['ci90'][1]:.3f}]"
    print(f"{r['method1']:{w1}s}  {r['method2']:{w2}s}  {r['share_method1']:9.3f}  {ci:>15s}  "
          f"{r['responses']:9d}  {r['pairs']:5d}")


# ---- command line ---------------------------------------------------------------------------------
def parse_method(text: str) -> tuple[str, int | None, str]:
    """``CKPT:K:CRITERION`` (K may be empty) -> ``(ckpt, k, criterion)``; the criterion is checked here."""
    parts = text.rsplit(":", 2)
    if len(parts) != 3 or not parts[0] or not parts[2]:
        raise HumanEvalError(f"method {text!r}: expected CKPT:K:CRITERION, e.g. last.ckpt:8:eps2 or last.ckpt::greedy")
    ckpt, k_text, criterion = parts[0], parts[1].strip(), parts[2].strip().lower()
    if k_text and not (k_text.isdigit() and int(k_text) >= 1):
        raise HumanEvalError(f"method {text!r}: K must be a positive integer or empty (all heads), got {k_text!r}")
    if criterion != "greedy":
        parse_criterion(criterion, values=intensity_values())
    return ckpt, int(k_text) if k_text else None, criterion


def check_export_out(out: str) -> None:
    """``--out`` must be a new or empty folder: a rater kit already there (its key.csv) would be rewritten under the
    responses collected for it."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise HumanEvalError(f"--out {out} is a file: give a new folder")
    if (parent := file_above(path.absolute())) is not None:
        raise HumanEvalError(f"--out {out} lies under the file {parent}: give a new folder")
    if path.is_dir() and any(path.iterdir()):
        what = "a rater kit (key.csv)" if (path / "key.csv").exists() else "files"
        raise HumanEvalError(f"--out {out} already holds {what}, which export would rewrite: give a new --out")


def check_json_out(args: argparse.Namespace) -> None:
    """``analyze --json`` must not be a folder, lie under a file, or be one of its inputs (the key, a responses file,
    methods.json beside the key) or another existing file that is not a JSON record."""
    path = Path(args.json)
    if path.is_dir():
        raise HumanEvalError(f"--json {args.json} is a folder: give the JSON file's path")
    if (parent := file_above(path.absolute())) is not None:
        raise HumanEvalError(f"--json {args.json} lies under the file {parent}: give another path")
    if not path.exists():
        return
    inputs = [("the --key file", args.key), *(("a --responses file", r) for r in args.responses),
              ("the methods.json beside --key", str(Path(args.key).with_name("methods.json")))]
    if (erased := same_file_as(path, inputs)) is not None:
        raise HumanEvalError(f"--json {args.json} is {erased[0]} ({erased[1]}), which writing would erase: give another "
                             "path")
    if not is_json_record(path):
        raise HumanEvalError(f"--json {args.json} exists and is not a JSON record, which writing would erase: give "
                             "another path")


def run_export(args: argparse.Namespace) -> None:
    from lightning_bpd.checkpoints import load_model

    if args.n < 1:
        raise HumanEvalError(f"--n must be >= 1, got {args.n}")
    check_export_out(args.out)
    specs = [parse_method(args.method1), parse_method(args.method2)]
    names = [args.name1 or "", args.name2 or ""]
    for j, (_, k, criterion) in enumerate(specs):
        names[j] = names[j] or (criterion if criterion == "greedy" or k is None else f"{criterion}_k{k}")
    if names[0] == names[1] and not (args.name1 and args.name2):
        names = [f"1-{names[0]}", f"2-{names[1]}"]
    loaded: dict[str, Any] = {}
    methods: list[Method] = []
    for name, (ckpt, k, criterion) in zip(names, specs):
        if ckpt not in loaded:
            loaded[ckpt] = load_model(ckpt, args.device)
        module = loaded[ckpt]
        if not isinstance(module, SuperResolutionModule):
            raise HumanEvalError(f"{ckpt} is a {type(module).__name__} checkpoint, not a super-resolution one")
        if criterion != "greedy":
            module.make_criterion(criterion).validate(resolve_k(module.model, k))
        methods.append((name, module, k, criterion))
    if args.images:
        from lightning_bpd.tasks.superres.celeba import load_split

        low, _, files = load_split(args.images, args.split, cache_dir=None, limit=args.n)
        source = {"dataset": "celeba", "root": args.images, "split": args.split, "files": files}
    else:
        from lightning_bpd.tasks.superres.synthetic_faces import synthetic_split

        low, _ = synthetic_split(args.split, args.n, seed=args.data_seed)
        source = {"dataset": "synthetic_faces", "split": args.split, "data_seed": args.data_seed}
    options = options_from_args(args)
    export(methods, low, args.out, args.seed, info={"inputs": source, "precision": options.precision},
           method_info=[{"checkpoint": ckpt} for ckpt, _, _ in specs], options=options)
    print(f"wrote {low.shape[0]} pairs to {args.out} (upload sheet.csv or open index.html; keep key.csv hidden)")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd human-eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export", help="decode pairs and write the rater folder")
    e.add_argument("--method1", required=True, help="CKPT:K:CRITERION, e.g. runs/x/last.ckpt:8:eps2 (K empty = all)")
    e.add_argument("--method2", required=True, help="CKPT:K:CRITERION, e.g. runs/x/last.ckpt::greedy")
    e.add_argument("--out", required=True, help="output folder")
    e.add_argument("--images", default=None, help="CelebA root (default: built-in synthetic faces)")
    e.add_argument("--split", default="val", choices=["train", "val", "test"])
    e.add_argument("--n", type=int, default=50, help="number of pairs (the first n images of the split)")
    e.add_argument("--seed", type=int, default=0, help="seed of the left/right assignment")
    e.add_argument("--data-seed", type=int, default=0, help="seed of the synthetic faces")
    e.add_argument("--name1", default=None, help="name of method 1 in key.csv (default: from the criterion)")
    e.add_argument("--name2", default=None, help="name of method 2 in key.csv")
    e.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    add_precision_arg(e)
    a = sub.add_parser("analyze", help="share of votes for method 1 with a 90%% bootstrap interval")
    a.add_argument("--responses", nargs="+", required=True, help="responses.csv files (pair_id,choice)")
    a.add_argument("--key", required=True, help="key.csv written by export")
    a.add_argument("--method1", default=None, help="name of method 1 (default: from methods.json beside the key)")
    a.add_argument("--bootstrap", type=int, default=10000, help="bootstrap replicates")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--json", default=None, help="also write the result as JSON here (- for stdout)")
    return p


def main(argv: list[str] | None = None) -> None:
    """Run ``export`` or ``analyze``; bad input ends with one ``human-eval <command>: ...`` message."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "export":
            run_export(args)
            return
        if args.json and args.json != "-":
            check_json_out(args)
        result = analyze(args.responses, args.key, args.bootstrap, args.seed, args.method1)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"human-eval {args.command}: {err}")
    print_report(result)
    if args.json == "-":
        print(json.dumps(result, indent=2))
    elif args.json:
        write_json(args.json, result)
