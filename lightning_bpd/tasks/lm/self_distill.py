"""Sequence-level self-distillation of a causal LM: its own greedy continuations of training prefixes, as a data folder.

Prefixes are line-aligned windows of the training split's files (:func:`training_prefixes`: each as many whole lines as
fit in ``prompt_tokens`` tokens, the windows tiling each file), each continued greedily by ``new_tokens`` tokens
(:func:`continue_prefixes`: batched through our decoder, greedy or exact blockwise, equal by contract). The folder
that :func:`write_folder` makes is one the LM task reads (``train/``, ``val/``, ``test/``):

* ``train/<file's folder>/<file's stem>.<window><suffix>``: one file per prefix, the prefix followed by its
  continuation (a document of its own: the tokenizer's BOS before it, as before a prompt, EOS after it);
* ``val/``, ``test/``: copies of the original held-out files, so heads are validated on real held-out text.

Work is cut into shards of prefixes, each a JSON file written atomically (:func:`write_shard`): a killed run resumes
at the first missing shard. Lightning-free; the command is ``distill`` (:mod:`lightning_bpd.commands.distill`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_bpd.evaluation import EvalBatch, MethodRun, run_batch
from lightning_bpd.tasks.lm.files import SPLITS
from lightning_bpd.tasks.lm.line_windows import line_spans

PLAN, RECORD = "distill_plan.json", "distill.json"


@dataclass(frozen=True)
class Prefix:
    """One training prefix: the file (``name``, relative to the training split's folder or the data root), its window
    number and its text."""

    name: str
    window: int
    text: str


def training_prefixes(data: Any, pad_id: int, limit: int | None = None) -> tuple[list[Prefix], dict[str, int]]:
    """The training prefixes of an :class:`~lightning_bpd.tasks.lm.datamodule.LMDataModule` ``data`` (its
    ``prompt_tokens``, its tokenizer) and their counts: ``windows`` (every usable one, before ``limit``) and
    ``windows_left_out`` (blank ones, and ones whose text tokenizes past the budget, a line joined with the next may
    tokenize longer than apart, or spells ``pad_id``). ``limit``: that many prefixes, evenly spaced over all of them
    (every file's share kept)."""
    tok, split = data.tokenizer, data.split_texts("train")
    opening = len(tok("", add_special_tokens=True)["input_ids"])
    budget = data.prompt_tokens - opening
    folder = "train/" if (data.root / "train").is_dir() else ""  # names relative to the split's own folder
    out: list[Prefix] = []
    left_out = 0
    for name, text in zip(split.names, split.texts):
        name = name.removeprefix(folder)
        lines = text.splitlines(keepends=True)
        if not lines:
            continue
        counts = [len(ids) for ids in tok(lines, add_special_tokens=False)["input_ids"]]
        windows = ["".join(lines[start:end]) for start, end in line_spans(counts, budget)]
        ids = tok(windows, add_special_tokens=True)["input_ids"] if windows else []
        for i, (window, row) in enumerate(zip(windows, ids)):
            if window.strip() and len(row) <= data.prompt_tokens and pad_id not in row:
                out.append(Prefix(name, i, window))
            else:
                left_out += 1
    counts = {"windows": len(out), "windows_left_out": left_out}
    if limit is not None and limit < len(out):
        out = [out[i * len(out) // limit] for i in range(limit)]
    return out, counts


def continue_prefixes(module: Any, model: Any, method: Any, texts: list[str], new_tokens: int,
                      batch_size: int) -> tuple[list[str], MethodRun]:
    """Each text continued by at most ``new_tokens`` tokens with ``method`` on ``model`` (the module's model or a
    runtime of it), in batches of similar prompt lengths: the continuations (in the order of ``texts``) and the run's
    counts and seconds."""
    lengths = [len(ids) for ids in module.tokenizer(texts)["input_ids"]] if texts else []
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    run, outputs = MethodRun(), [""] * len(texts)
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        src = module.encode_prompts([texts[i] for i in rows])  # (B, P), left-padded
        _, part = run_batch(method, model, EvalBatch(src, new_tokens))
        run.merge(part)
        for i, text in zip(rows, module.detokenize(part.outputs)):
            outputs[i] = text
    return outputs, run


def shard_path(out: Path, i: int) -> Path:
    return out / "shards" / f"train.{i:05d}.json"


def n_shards(n: int, shard_size: int) -> int:
    return -(-n // shard_size)


def write_shard(out: Path, i: int, prefixes: list[Prefix], continuations: list[str], run: MethodRun,
                tag: str = "") -> None:
    """Shard ``i``'s samples and counts, written atomically (the file exists only when complete)."""
    path = shard_path(out, i)
    record = {"samples": [{**asdict(p), "continuation": c} for p, c in zip(prefixes, continuations)],
              "tokens": run.tokens, "iterations": run.iterations, "model_calls": run.model_calls,
              "seconds": run.seconds}
    tmp = path.with_suffix(f".tmp{tag}")
    tmp.write_text(json.dumps(record, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_shards(out: Path, prefixes: list[Prefix], shard_size: int) -> tuple[list[str], dict[str, float]]:
    """The continuations of every shard, checked against the plan's prefixes, and the summed counts."""
    continuations: list[str] = []
    totals = {"tokens": 0, "iterations": 0, "model_calls": 0, "seconds": 0.0}
    for i in range(n_shards(len(prefixes), shard_size)):
        record = json.loads(shard_path(out, i).read_text(encoding="utf-8"))
        want = prefixes[i * shard_size : (i + 1) * shard_size]
        held = [(s["name"], s["window"], s["text"]) for s in record["samples"]]
        if held != [(p.name, p.window, p.text) for p in want]:
            raise ValueError(f"{shard_path(out, i)} holds other prefixes than this run's: delete it and run again")
        continuations += [s["continuation"] for s in record["samples"]]
        for key in totals:
            totals[key] += record[key]
    return continuations, totals


def check_plan(out: Path, plan: dict[str, Any]) -> None:
    """Write ``plan`` (what the shards are made of) to ``out``, or check that a started run's is the same: resuming
    with other prefixes, new tokens or teacher would mix two distillations (one ValueError line)."""
    path = out / PLAN
    if path.is_file():
        before = json.loads(path.read_text())
        changed = sorted(key for key in set(before) | set(plan) if before.get(key) != plan.get(key))
        if changed:
            raise ValueError(f"{out} holds a distillation made with other {', '.join(changed)}: give another --out, "
                             "or delete it to start again")
        return
    taken = [split for split in SPLITS if (out / split).exists()]
    if taken:
        raise ValueError(f"{out} already holds {', '.join(f'{s}/' for s in taken)} that no distill run made: give an "
                         "empty or new --out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")  # atomic: ranks started together may read it at once
    tmp.write_text(json.dumps(plan, indent=2) + "\n")
    os.replace(tmp, path)


def plan_of(prefixes: list[Prefix], **settings: Any) -> dict[str, Any]:
    """The plan of a distillation: its ``settings`` and a digest of its prefixes."""
    digest = hashlib.sha1()
    for p in prefixes:
        digest.update(json.dumps([p.name, p.window, p.text]).encode("utf-8"))
    return {**settings, "prefixes": len(prefixes), "prefixes_sha1": digest.hexdigest()}


def sample_name(prefix: Prefix) -> Path:
    """``json/decoder.py``'s window 3 -> ``json/decoder.0003.py`` (the suffix kept: a data config may filter by it)."""
    path = Path(prefix.name)
    return path.parent / f"{path.stem}.{prefix.window:04d}{path.suffix}"


def write_folder(out: Path, prefixes: list[Prefix], continuations: list[str], held_out: dict[str, list[Path]],
                 split_root: dict[str, Path]) -> dict[str, int]:
    """``out/train/`` (a file per prefix: prefix + continuation, written afresh) and ``out/val/``, ``out/test/``
    (``held_out``'s files copied, named relative to ``split_root[split]``): the files written per split."""
    counts = {}
    for split in SPLITS:
        folder = out / split
        if folder.is_dir():
            shutil.rmtree(folder)  # this command's own output of an earlier run (the plan matched)
        folder.mkdir(parents=True)
    for prefix, continuation in zip(prefixes, continuations):
        path = out / "train" / sample_name(prefix)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(prefix.text + continuation, encoding="utf-8")
    counts["train"] = len(prefixes)
    for split, files in held_out.items():
        for source in files:
            target = out / split / source.relative_to(split_root[split])
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)
        counts[split] = len(files)
    return counts

