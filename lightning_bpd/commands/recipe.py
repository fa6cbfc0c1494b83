"""``python -m lightning_bpd recipe <name>``: run one whole pipeline (base -> targets -> heads -> test -> bench).

A recipe is a YAML file ``conf/recipes/<name>.yaml`` (or any ``.yaml`` path given as the name) that lists
ordered stages. Each stage is one ``python -m lightning_bpd`` command, run as a subprocess (exactly the command
a user could type), writing into its own folder ``<runs>/<recipe>/<stage>/``::

    description: what the recipe makes
    reaches: what it reached at its default budget (and the record that says so)
    stages:
      - name: base                        # letters, digits, _; the folder runs/<recipe>/base
        command: fit                      # fit | validate | test | decode | bench | distill | human-eval |
                                          # make-base | export-base | export-heads | build-llamacpp |
                                          # fetch-gguf | store | datastore (bench-generate, bench-drafters: old spellings)
        config: multi30k_k8/base.yaml     # fit/validate/test: --config, relative to the recipe file
      - name: distill
        command: distill
        args: --ckpt {base}/last.ckpt --data-root ../shared/data/translation/multi30k --out {out}
      - reuse: other-recipe/frozen        # the stage of another recipe, in that recipe's folder

``args`` is a string (split like a shell line) or a list. Placeholders: ``{runs}`` (the ``--runs`` folder),
``{recipe}`` (this recipe's name), ``{out}`` (this stage's folder) and ``{<stage>}`` (the folder of a stage
of this recipe, e.g. ``{base}/last.ckpt``; ``{runs}/{recipe}/base/last.ckpt`` is the same path). A fit,
validate or test stage without ``--run_dir`` gets ``--run_dir {out}``; ``config:`` becomes ``--config``.

``beside: <stage>`` runs a stage at the same time as the stage just before it (and as whatever that one runs beside),
each with ``OMP_NUM_THREADS`` = the cores / the stages running (unless set): two one-thread fits on two cores. A stage
may not read the folder of a stage it runs beside; their output comes to the terminal line by line, each line after
``[<stage>]``, and whole to each stage's log. When one fails, the others finish.

``reuse: <recipe>/<stage>`` takes a stage of another recipe as it is defined there: it runs (or is found done)
in that recipe's folder, and ``{<stage>}`` here names that folder. So the paper-head recipes share the base
model and the distilled targets of ``multi30k-k8`` instead of training them again.

Resuming: a stage is finished when ``<stage folder>/stage_done.json`` exists (written when its command exits
0: the command, start and end time, seconds, CPU seconds, and for fit stages the last checkpoint); a finished
stage is skipped. A fit stage that has a ``last.ckpt`` but no marker (interrupted, or trained by hand with the
same command) resumes from it (``--ckpt_path``; a run whose time or step budget is already spent stops at
once, and is then marked done). ``distill`` resumes by itself (finished shards are kept). To run a finished
stage again, delete its ``stage_done.json``. Every attempt's output is appended to ``<stage folder>/stage.log``.

Options: ``--dry-run`` prints the commands (and which stages are done); ``--budget F`` scales every fit
stage's ``trainer.max_time`` and ``trainer.max_steps`` by F (and a ``trainer.val_check_interval`` in steps); ``--set frozen.trainer.max_steps=500`` passes
``--trainer.max_steps=500`` to stage ``frozen`` (after the budget's values, so it wins);
``--from-stage`` / ``--until-stage`` run only part of the stages. At the end a table gives each stage's
status, minutes and its key numbers (from ``decode_<split>.json`` of test/validate, bench's ``--json``),
also written to ``<runs>/<recipe>/summary.json``.

    python -m lightning_bpd recipe multi30k-k8 --dry-run
    python -m lightning_bpd recipe multi30k-k8 --budget 0.1 --runs runs/try
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import resource
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lightning_bpd.config_bases import base_files

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES_DIR = REPO_ROOT / "conf" / "recipes"
DEFAULT_FIT_CONFIG = REPO_ROOT / "conf" / "translation" / "default.yaml"  # what fit uses without --config
STAGE_COMMANDS = ("fit", "validate", "test", "decode", "bench", "bench-generate", "distill", "human-eval", "make-base",
                  "export-base", "export-heads", "build-llamacpp", "bench-drafters", "fetch-gguf", "store", "datastore")
LIGHTNING_COMMANDS = ("fit", "validate", "test")
RESERVED = ("runs", "recipe", "out")
DONE_FILE, RUNNING_FILE, LOG_FILE, ATTEMPTS_FILE = "stage_done.json", "stage_running.json", "stage.log", \
    "stage_attempts.jsonl"
NAME_RE = re.compile(r"^[A-Za-z0-9_]+$")
PLACEHOLDER_RE = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
# the command line a stage runs; the display form is what a user would type
PYTHON_M = [sys.executable, "-m", "lightning_bpd"]
DISPLAY_M = ["python", "-m", "lightning_bpd"]


class RecipeError(ValueError):
    """A recipe, an option or a stage's inputs that are wrong: one line for the user."""


@dataclass
class Stage:
    name: str
    command: str
    args: list[str]  # with placeholders, --config and --run_dir included
    recipe: str  # the recipe whose folder holds this stage (another one for a reused stage)
    context: dict[str, str]  # placeholder -> value (runs, recipe, out, the stage folders of its recipe)
    reused: str | None = None  # "<recipe>/<stage>" when taken from another recipe
    beside: str | None = None  # the stage just before, which this one runs at the same time as

    @property
    def folder(self) -> Path:
        return Path(self.context["out"])


@dataclass
class Recipe:
    name: str
    path: Path
    description: str
    reaches: str
    runs: str
    stages: list[Stage]

    @property
    def folder(self) -> Path:
        return Path(self.runs) / self.name

    def stage_names(self) -> list[str]:
        return [s.name for s in self.stages]


@dataclass
class Planned:
    stage: Stage
    argv: list[str]  # the command after "python -m lightning_bpd", placeholders filled in, without a resume
    status: str  # done | run | skipped
    resume_from: str | None = None
    marker: dict[str, Any] | None = None
    inputs: list[tuple[str, str]] = field(default_factory=list)  # (path, name of the stage that makes it)
    notes: list[str] = field(default_factory=list)
    seconds: float | None = None
    returncode: int | None = None

    def full_argv(self) -> list[str]:
        return [*self.argv, "--ckpt_path", self.resume_from] if self.resume_from else list(self.argv)


# ---------------------------------------------------------------------------------------------- loading


def available(recipes_dir: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.stem for p in recipes_dir.glob("*.yaml"))


def recipe_file(name: str, recipes_dir: Path = RECIPES_DIR) -> tuple[str, Path]:
    """``(name, path)`` of a recipe given by name (``conf/recipes/<name>.yaml``) or as a path to a YAML file."""
    if name.endswith((".yaml", ".yml")):
        path = Path(name)
        if not path.is_file():
            raise RecipeError(f"recipe file {name} does not exist")
        return path.stem, path
    path = recipes_dir / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(available(recipes_dir)) or "none"
        raise RecipeError(f"unknown recipe {name!r} (available: {names}; files {recipes_dir}/<name>.yaml)")
    return name, path


def split_args(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise RecipeError(f"{where}: args must be a string or a list of strings, got {value!r}")


def has_option(args: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


def reused_stage(entry: dict, where: str, runs: str, recipes_dir: Path, chain: tuple[str, ...]) -> tuple[str, Stage]:
    """``reuse: <recipe>/<stage>``: that stage as the other recipe defines it, in that recipe's folder."""
    extra = set(entry) - {"reuse", "name"}
    if extra:
        raise RecipeError(f"{where}: a reused stage takes only 'reuse' and 'name', not {sorted(extra)}")
    other, _, stage_name = str(entry["reuse"]).partition("/")
    if not other or not stage_name:
        raise RecipeError(f"{where}: reuse must be <recipe>/<stage>, got {entry['reuse']!r}")
    source = load_recipe(other, runs, recipes_dir, chain)
    found = [s for s in source.stages if s.name == stage_name]
    if not found:
        raise RecipeError(f"{where}: recipe {other} has no stage {stage_name!r} "
                          f"(its stages: {', '.join(source.stage_names())})")
    s = found[0]
    local = str(entry.get("name", s.name))
    return local, Stage(local, s.command, s.args, s.recipe, s.context, s.reused or f"{other}/{stage_name}")


def own_stage(entry: dict, where: str, path: Path) -> tuple[str, tuple[str, list[str]]]:
    """A stage of this recipe: ``(name, (command, args))``, ``config`` as ``--config``, ``--run_dir {out}`` added."""
    extra = set(entry) - {"name", "command", "config", "args", "beside"}
    if extra:
        raise RecipeError(f"{where}: unknown keys {sorted(extra)} (known: name, command, config, args, beside, reuse)")
    local = str(entry.get("name", ""))
    command = entry.get("command")
    if command not in STAGE_COMMANDS:
        raise RecipeError(f"{where} ({local or '?'}): command must be one of {', '.join(STAGE_COMMANDS)}, "
                          f"got {command!r}")
    args = split_args(entry.get("args"), f"{where} ({local})")
    prefix = []
    if entry.get("config") is not None:
        if command not in LIGHTNING_COMMANDS:
            raise RecipeError(f"{where} ({local}): 'config' is for fit, validate and test, not {command}")
        config = path.parent / str(entry["config"])
        if not config.is_file():
            raise RecipeError(f"{where} ({local}): config {config} does not exist")
        prefix = ["--config", display_path(config)]
    if command in LIGHTNING_COMMANDS and not has_option(args, "--run_dir"):
        prefix += ["--run_dir", "{out}"]
    return local, (command, [*prefix, *args])


def load_recipe(name: str, runs: str = "runs", recipes_dir: Path = RECIPES_DIR, _chain: tuple[str, ...] = ()) -> Recipe:
    """Read a recipe and the stages it reuses from other recipes (found beside it)."""
    name, path = recipe_file(name, recipes_dir)
    if name in _chain:
        raise RecipeError(f"recipe {name}: reuse cycle {' -> '.join((*_chain, name))}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise RecipeError(f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise RecipeError(f"{path}: a recipe needs a non-empty list 'stages'")
    unknown = set(data) - {"description", "reaches", "stages"}
    if unknown:
        raise RecipeError(f"{path}: unknown keys {sorted(unknown)} (known: description, reaches, stages)")
    folders: dict[str, str] = {}
    entries: list[tuple[str, Stage | tuple[str, list[str]]]] = []  # (name, a reused stage or (command, args))
    beside: dict[str, str] = {}  # stage -> the stage just before it, which it runs beside
    for i, entry in enumerate(data["stages"]):
        where = f"{path}: stage {i + 1}"
        if not isinstance(entry, dict):
            raise RecipeError(f"{where}: a stage is a mapping (name, command, config, args) or reuse: <recipe>/<stage>")
        if "reuse" in entry:
            local, item = reused_stage(entry, where, runs, path.parent, (*_chain, name))
            folder = str(item.folder)
        else:
            local, item = own_stage(entry, where, path)
            folder = str(Path(runs) / name / local)
        if not NAME_RE.match(local) or local in RESERVED:
            raise RecipeError(f"{where}: stage name {local!r}: letters, digits and _ only, not {', '.join(RESERVED)}")
        if local in folders:
            raise RecipeError(f"{path}: two stages are named {local!r}")
        if isinstance(entry, dict) and entry.get("beside") is not None:
            beside[local] = beside_of(entry, where, local, entries)
        folders[local] = folder
        entries.append((local, item))
    context = {"runs": runs, "recipe": name, **folders}
    stages = [item if isinstance(item, Stage) else Stage(local, item[0], item[1], name, {**context, "out": folders[local]},
                                                         beside=beside.get(local))
              for local, item in entries]
    check_groups(stages, path)
    for stage in stages:
        for arg in stage.args:
            for key in PLACEHOLDER_RE.findall(arg):
                if key not in stage.context:
                    raise RecipeError(f"{path}: stage {stage.name}: unknown placeholder {{{key}}} in {arg!r} "
                                      f"(known: {', '.join('{' + k + '}' for k in stage.context if k != 'out')}, {{out}})")
    return Recipe(name, path, str(data.get("description", "")), str(data.get("reaches", "")), runs, stages)


def beside_of(entry: dict, where: str, local: str, before: list[tuple[str, Any]]) -> str:
    """``beside: <stage>``'s stage: the one just before this one (a stage of this recipe, not a reused one)."""
    other = str(entry["beside"])
    if "reuse" in entry:
        raise RecipeError(f"{where} ({local}): a reused stage runs in its own recipe's order: no 'beside'")
    if not before or before[-1][0] != other:
        just = f"stage {before[-1][0]!r}" if before else "no stage"
        raise RecipeError(f"{where} ({local}): beside {other!r}: a stage runs beside the stage just before it "
                          f"({just})")
    return other


def groups(stages: list[Any], of: Any = lambda s: s) -> list[list[Any]]:
    """``stages`` (or the items ``of`` maps to a Stage) cut into the groups that run at the same time: a stage with
    ``beside`` joins the group of the one before it."""
    out: list[list[Any]] = []
    for item in stages:
        if out and of(item).beside is not None and of(out[-1][-1]).name == of(item).beside:
            out[-1].append(item)
        else:
            out.append([item])
    return out


def check_groups(stages: list[Stage], path: Path) -> None:
    """A stage never reads the folder of a stage it runs beside."""
    for group in groups(stages):
        names = {s.name for s in group}
        for stage in group:
            read = sorted({key for arg in stage.args for key in PLACEHOLDER_RE.findall(arg)} & (names - {stage.name}))
            if read:
                raise RecipeError(f"{path}: stage {stage.name} reads the folder of stage {read[0]}, which it runs beside: "
                                  "drop 'beside' (it must wait for it)")


def display_path(path: Path) -> str:
    """A path relative to the working directory when it is below it (``conf/recipes/...``), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


def expand(arg: str, context: dict[str, str]) -> str:
    return PLACEHOLDER_RE.sub(lambda m: context.get(m.group(1), m.group(0)), arg)


# ---------------------------------------------------------------------------------------------- budgets


def parse_max_time(value: Any) -> float | None:
    """Lightning's ``trainer.max_time`` ("DD:HH:MM:SS" or a mapping of days/hours/minutes/seconds) in seconds."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("null", "none", "")):
        return None
    if isinstance(value, dict):
        return dt.timedelta(**value).total_seconds()
    parts = str(value).split(":")
    if len(parts) != 4 or not all(p.strip().isdigit() for p in parts):
        raise RecipeError(f"trainer.max_time {value!r}: expected DD:HH:MM:SS")
    d, h, m, s = (int(p) for p in parts)
    return float(((d * 24 + h) * 60 + m) * 60 + s)


def format_max_time(seconds: float) -> str:
    total = max(1, round(seconds))
    d, rest = divmod(total, 86400)
    h, rest = divmod(rest, 3600)
    m, s = divmod(rest, 60)
    return f"{d:02d}:{h:02d}:{m:02d}:{s:02d}"


def option_value(args: list[str], option: str) -> tuple[bool, str | None]:
    """The last value given to ``option`` in ``args`` (``--opt=v`` or ``--opt v``)."""
    found, value = False, None
    for i, a in enumerate(args):
        if a.startswith(option + "="):
            found, value = True, a.split("=", 1)[1]
        elif a == option and i + 1 < len(args):
            found, value = True, args[i + 1]
    return found, value


BUDGET_KEYS = ("max_time", "max_steps", "val_check_interval")


def trainer_budget(args: list[str]) -> tuple[Any, Any, Any]:
    """``(max_time, max_steps, val_check_interval)`` of a fit command: its config (with bases), then its
    command-line options."""
    found, config = option_value(args, "--config")
    path = Path(config) if found and config else DEFAULT_FIT_CONFIG
    values: dict[str, Any] = {}
    if path.is_file():
        try:
            for file in [*base_files(path), path]:
                data = yaml.safe_load(file.read_text()) or {}
                trainer = data.get("trainer") if isinstance(data, dict) else None
                if isinstance(trainer, dict):
                    values.update({k: trainer[k] for k in BUDGET_KEYS if k in trainer})
        except (OSError, ValueError, yaml.YAMLError) as err:
            raise RecipeError(f"--budget: cannot read the trainer budget of {path}: {' '.join(str(err).split())}") \
                from None
    for key in BUDGET_KEYS:
        found, value = option_value(args, f"--trainer.{key}")
        if found:
            values[key] = yaml.safe_load(value) if value is not None else None
    return values.get("max_time"), values.get("max_steps"), values.get("val_check_interval")


def budget_args(args: list[str], factor: float) -> list[str]:
    """The options that scale a fit command's time and step budgets by ``factor`` (none for 1), and a validation
    interval given in steps with them, so that a scaled run validates at the same fractions of its length (a
    stage that validates once, at its last step, still does, and its checkpoint keeps what validation measures)."""
    if factor == 1:
        return []
    max_time, max_steps, interval = trainer_budget(args)
    out = []
    if isinstance(interval, int) and not isinstance(interval, bool) and interval > 0:
        out.append(f"--trainer.val_check_interval={max(1, round(interval * factor))}")
    seconds = parse_max_time(max_time)
    if seconds is not None:
        out.append(f"--trainer.max_time={format_max_time(seconds * factor)}")
    if isinstance(max_steps, int) and max_steps > 0:
        out.append(f"--trainer.max_steps={max(1, round(max_steps * factor))}")
    return out


# ---------------------------------------------------------------------------------------------- planning


def parse_sets(sets: list[str], recipe: Recipe) -> dict[str, list[str]]:
    """``stage.key=value`` -> ``{stage: ["--key=value", ...]}``."""
    out: dict[str, list[str]] = {}
    for item in sets:
        target, eq, value = item.partition("=")
        stage, dot, key = target.partition(".")
        if not eq or not dot or not stage or not key:
            raise RecipeError(f"--set {item!r}: expected <stage>.<option>=<value>, e.g. frozen.trainer.max_steps=500")
        if stage not in recipe.stage_names():
            raise RecipeError(f"--set {item!r}: recipe {recipe.name} has no stage {stage!r} "
                              f"(stages: {', '.join(recipe.stage_names())})")
        out.setdefault(stage, []).append(f"--{key}={value}")
    return out


def stage_index(recipe: Recipe, name: str | None, option: str, default: int) -> int:
    if name is None:
        return default
    if name not in recipe.stage_names():
        raise RecipeError(f"{option} {name!r}: recipe {recipe.name} has no such stage "
                          f"(stages: {', '.join(recipe.stage_names())})")
    return recipe.stage_names().index(name)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def under(path: str, folder: str) -> bool:
    p, f = os.path.normpath(path), os.path.normpath(folder)
    return p == f or p.startswith(f + os.sep)


def stage_inputs(argv: list[str], stage: Stage, recipe: Recipe) -> list[tuple[str, str]]:
    """The paths in ``argv`` that lie in the folder of another stage of the recipe: ``(path, that stage)``. A value
    ``PREFIX:PATH`` (``--draft-vocab 1000:PATH``, ``--proposer draft:PATH``) names its PATH, and each item of a
    comma-separated list does (``--peers generate,assisted:PATH,llamacpp:PATH``)."""
    found = []
    for arg in argv:
        value = arg.split("=", 1)[1] if arg.startswith("-") and "=" in arg else arg
        if arg.startswith("-") and "=" not in arg:
            continue
        for path in value.split(","):
            prefix, colon, rest = path.partition(":")
            if colon and rest and "/" not in prefix:
                path = rest
            for other in recipe.stages:
                if other.name != stage.name and str(other.folder) != str(stage.folder) and under(path, str(other.folder)):
                    found.append((path, other.name))
                    break
    return found


def plan(recipe: Recipe, budget: float = 1.0, sets: list[str] | None = None, from_stage: str | None = None,
         until_stage: str | None = None) -> list[Planned]:
    if not budget > 0:
        raise RecipeError(f"--budget must be > 0, got {budget}")
    overrides = parse_sets(sets or [], recipe)
    first = stage_index(recipe, from_stage, "--from-stage", 0)
    last = stage_index(recipe, until_stage, "--until-stage", len(recipe.stages) - 1)
    if first > last:
        raise RecipeError(f"--from-stage {from_stage} comes after --until-stage {until_stage}")
    planned = []
    for i, stage in enumerate(recipe.stages):
        argv = [stage.command, *(expand(a, stage.context) for a in stage.args)]
        if stage.command == "fit":
            argv += budget_args(argv[1:], budget)
        argv += [expand(a, stage.context) for a in overrides.get(stage.name, [])]
        marker = read_json(stage.folder / DONE_FILE)
        status = "done" if marker is not None else "run" if first <= i <= last else "skipped"
        p = Planned(stage, argv, status, marker=marker, inputs=stage_inputs(argv[1:], stage, recipe))
        if status == "done":
            if overrides.get(stage.name):
                p.notes.append(f"done: --set for {stage.name} has no effect (delete {stage.folder / DONE_FILE} "
                               "to run it again)")
            if marker.get("argv") not in (None, argv):
                p.notes.append(f"done with another command (recorded in {stage.folder / DONE_FILE})")
        if status == "run" and stage.command == "fit" and not has_option(argv, "--ckpt_path"):
            last_ckpt = stage.folder / "last.ckpt"
            if last_ckpt.is_file():
                p.resume_from = str(last_ckpt)
        planned.append(p)
    for group in groups(planned, lambda p: p.stage):  # --set may name a path too
        names = {p.stage.name for p in group}
        for p in group:
            read = [(path, maker) for path, maker in p.inputs if maker in names - {p.stage.name}]
            if read:
                raise RecipeError(f"stage {p.stage.name} reads {read[0][0]}, made by stage {read[0][1]}, which it runs "
                                  "beside: it cannot wait for it")
    return planned


def missing_inputs(planned: list[Planned]) -> list[str]:
    """One line for each input of a stage to run that no earlier stage to run makes and that does not exist."""
    order = {p.stage.name: i for i, p in enumerate(planned)}
    problems = []
    for i, p in enumerate(planned):
        if p.status != "run":
            continue
        for path, maker in p.inputs:
            made_here = planned[order[maker]].status == "run" and order[maker] < i
            if not made_here and not Path(path).exists():
                source = planned[order[maker]]
                fix = (f"stage {maker} is marked done: delete {source.stage.folder / DONE_FILE} to run it again"
                       if source.status == "done" else f"run stage {maker} first")
                problems.append(f"stage {p.stage.name} needs {path} (made by stage {maker}), which does not exist: "
                                f"{fix}")
    return problems


def shell_line(argv: list[str]) -> str:
    return shlex.join([*DISPLAY_M, *argv])


def print_plan(recipe: Recipe, planned: list[Planned]) -> None:
    print(f"# recipe {recipe.name} ({display_path(recipe.path)}): {recipe.description}".rstrip(": "))
    for i, p in enumerate(planned, 1):
        where = f" (from recipe {p.stage.recipe})" if p.stage.reused else f" (beside {p.stage.beside})" \
            if p.stage.beside else ""
        if p.status == "done":
            state = f"done ({p.stage.folder / DONE_FILE}), skipped"
        elif p.status == "skipped":
            state = "skipped (outside --from-stage/--until-stage)"
        else:
            state = "would run" + (f", resuming from {p.resume_from}" if p.resume_from else "")
        print(f"# [{i}/{len(planned)}] {p.stage.name}{where}: {state}")
        for note in p.notes:
            print(f"#   {note}")
        line = shell_line(p.full_argv())
        print(line if p.status == "run" else f"#   {line}")


# ---------------------------------------------------------------------------------------------- metrics


def fmt(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "?"


def decode_summary(record: dict[str, Any]) -> str:
    """``greedy BLEU 35.44; exact: block 3.83, BLEU 35.44`` from a DecodeEval record (and its tree budgets,
    ``exact+nodes16: block ...``, where the stage ran ``--decode_eval.tree_nodes``)."""
    m = record.get("metrics") or {}
    quality = next((q for q in ("bleu", "psnr") if f"greedy/{q}" in m), None)
    parts = []
    if quality:
        parts.append(f"greedy {quality.upper()} {fmt(m.get(f'greedy/{quality}'))}")
    for c in [*(record.get("criteria") or []), *(f"exact+nodes{n}" for n in record.get("tree_nodes") or [])]:
        if f"{c}/mean_accepted_block_size" in m:
            text = f"{c}: block {fmt(m[f'{c}/mean_accepted_block_size'])}"
            if quality and f"{c}/{quality}" in m:
                text += f", {quality.upper()} {fmt(m[f'{c}/{quality}'])}"
            parts.append(text)
    return "; ".join(parts)


def bench_summary(data: dict[str, Any]) -> str:
    """``speedup bs1: exact@k4 1.21, exact@k8 1.33; bs32: ...`` from bench's --json."""
    parts = []
    for bs, report in (data.get("batch_sizes") or {}).items():
        cells = [f"{name} {fmt(r.get('speedup'))}" for name, r in report.items()
                 if isinstance(r, dict) and r.get("baseline") not in (None, name)]
        if cells:
            parts.append(f"bs{bs}: " + ", ".join(cells))
    return ("speedup " + "; ".join(parts)) if parts else ""


def stage_metrics(p: Planned) -> tuple[str, dict[str, Any]]:
    """The key numbers a stage wrote (a line for the table, and the data for summary.json)."""
    argv, command = p.argv, p.stage.command
    if command in ("test", "validate"):
        found, run_dir = option_value(argv, "--run_dir")
        split = "test" if command == "test" else "val"
        record = read_json(Path(run_dir if found and run_dir else p.stage.folder) / f"decode_{split}.json")
        if record:
            return decode_summary(record), record.get("metrics", {})
    elif command == "bench":
        found, path = option_value(argv, "--json")
        data = read_json(Path(path)) if found and path else None
        if data:
            speedups = {bs: {n: r.get("speedup") for n, r in rep.items() if isinstance(r, dict)}
                        for bs, rep in (data.get("batch_sizes") or {}).items()}
            return bench_summary(data), {"speedup": speedups}
    elif command == "fit":
        records = []
        for path in p.stage.folder.glob("decode_val_step*.json"):
            step = re.search(r"_step(\d+)\.json$", path.name)
            if step:
                records.append((int(step.group(1)), path))
        if records:
            step, path = max(records)
            record = read_json(path)
            if record:
                text = decode_summary(record)
                return (f"val@{step}: {text}" if text else ""), {"step": step, **record.get("metrics", {})}
    return "", {}


# ---------------------------------------------------------------------------------------------- running


def now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_not_running(p: Planned) -> None:
    running = read_json(p.stage.folder / RUNNING_FILE)
    if running and running.get("host") == socket.gethostname() and isinstance(running.get("pid"), int) \
            and running["pid"] != os.getpid() and pid_alive(running["pid"]):
        raise RecipeError(f"stage {p.stage.name} is running now in another recipe command (pid {running['pid']}, "
                          f"{p.stage.folder / RUNNING_FILE})")


def cpu_seconds_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def out_stream() -> Any:
    return getattr(sys.stdout, "buffer", None)


def tee(proc: subprocess.Popen, log: Any) -> None:
    """Copy the child's output to our stdout and to the log as it comes (progress bars included); a stdout that
    closes (``| head``) stops the copy to it, never the log's: the child is never left blocked on a full pipe."""
    fd, shown = proc.stdout.fileno(), True
    while True:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        log.write(chunk)
        log.flush()
        shown = shown and write_out(chunk)


@dataclass
class Running:
    """A stage's command started: its process, its open log, and what its markers record."""
    p: Planned
    proc: subprocess.Popen
    log: Any
    line: str
    started: str
    t0: float
    ended: threading.Event = field(default_factory=threading.Event)  # set once reaped and recorded (a stage beside)


def start_stage(p: Planned, recipe: Recipe, index: int, total: int, threads: int | None = None) -> Running:
    """Start one stage's command (``threads``: its ``OMP_NUM_THREADS`` unless ours is set), logging to its stage.log."""
    folder = p.stage.folder
    make_folder(p)
    argv = p.full_argv()
    line = shell_line(argv)
    resume = f", resuming from {p.resume_from}" if p.resume_from else ""
    print(f"\n=== recipe {recipe.name}: stage {p.stage.name} [{index}/{total}]{resume}\n{line}", flush=True)
    (folder / RUNNING_FILE).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                                   "started": now(), "command": line}) + "\n")
    started, t0 = now(), time.perf_counter()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if threads is not None and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    log = open(folder / LOG_FILE, "ab")  # noqa: SIM115 (closed by finish_stage)
    try:
        log.write(f"\n=== {started} recipe {recipe.name}, stage {p.stage.name}{resume}\n$ {line}\n".encode())
        log.flush()
        proc = subprocess.Popen([*PYTHON_M, *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    except BaseException:
        log.close()
        (folder / RUNNING_FILE).unlink(missing_ok=True)
        raise
    return Running(p, proc, log, line, started, t0)


def finish_stage(run: Running, returncode: int | None, cpu: float) -> int | None:
    """Close a stage's log, record the attempt, and write stage_done.json when it exited 0."""
    p, folder = run.p, run.p.stage.folder
    run.log.close()
    seconds = time.perf_counter() - run.t0
    attempt = {"started": run.started, "ended": now(), "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1),
               "returncode": returncode, "resumed_from": p.resume_from, "command": run.line}
    with open(folder / ATTEMPTS_FILE, "a") as f:
        f.write(json.dumps(attempt) + "\n")
    (folder / RUNNING_FILE).unlink(missing_ok=True)
    p.seconds, p.returncode = seconds, returncode
    if returncode == 0:
        attempts = read_attempts(folder)
        marker = {"recipe": p.stage.recipe, "stage": p.stage.name, "command": shell_line(p.argv), "argv": p.argv,
                  "resumed_from": p.resume_from, "cwd": os.getcwd(), "started": run.started, "ended": attempt["ended"],
                  "seconds": round(seconds, 1), "cpu_seconds": round(cpu, 1), "attempts": len(attempts),
                  "seconds_all_attempts": round(sum(a.get("seconds") or 0 for a in attempts), 1),
                  "cpu_seconds_all_attempts": round(sum(a.get("cpu_seconds") or 0 for a in attempts), 1)}
        if p.stage.command == "fit":
            last = folder / "last.ckpt"
            marker["last_ckpt"] = str(last) if last.is_file() else None
        marker["summary"], marker["metrics"] = stage_metrics(p)
        (folder / DONE_FILE).write_text(json.dumps(marker, indent=2) + "\n")
        p.marker = marker
    return returncode


def run_stage(p: Planned, recipe: Recipe, index: int, total: int) -> int | None:
    """Run one stage's command, tee'd to its stage.log; write stage_done.json when it exits 0."""
    cpu0 = cpu_seconds_of_children()
    run = start_stage(p, recipe, index, total)
    returncode = None
    try:
        tee(run.proc, run.log)
        returncode = run.proc.wait()
    except BaseException:
        stop(run.proc)
        raise
    finally:
        finish_stage(run, returncode, cpu_seconds_of_children() - cpu0)
    return returncode


def tee_lines(run: Running, lock: threading.Lock) -> None:
    """Copy a stage's output to its log as it comes, and to our stdout line by line after ``[<stage>]`` (until our
    stdout closes; the log takes all of it)."""
    prefix, pending, shown = f"[{run.p.stage.name}] ".encode(), b"", True
    fd = run.proc.stdout.fileno()
    while True:
        chunk = os.read(fd, 65536)
        if chunk:
            run.log.write(chunk)
            run.log.flush()
            *lines, pending = re.split(rb"\r\n|\r|\n", pending + chunk)  # a progress bar's \r ends a line too
        else:
            lines, pending = [pending], b""
        with lock:
            for line in lines:
                if shown and line.strip():
                    shown = write_out(prefix + line + b"\n")
        if not chunk:
            return


def write_out(data: bytes) -> bool:
    """``data`` on our stdout (binary where it has a buffer) -> False once our stdout is closed."""
    try:
        binary = out_stream()
        if binary is not None:
            binary.write(data)
            binary.flush()
        else:
            sys.stdout.write(data.decode("utf-8", errors="replace"))
            sys.stdout.flush()
    except (BrokenPipeError, ValueError):  # the reader went away (| head), or stdout was closed
        return False
    return True


def follow(run: Running, lock: threading.Lock, codes: dict[str, int | None]) -> None:
    """A stage running beside others, to its end: its output copied, its process reaped (its own CPU time), its
    attempt and marker written as soon as it exits."""
    code: int | None = None
    cpu = 0.0
    try:
        tee_lines(run, lock)
        try:
            _, status, usage = os.wait4(run.proc.pid, 0)
            code = os.waitstatus_to_exitcode(status)
            cpu = usage.ru_utime + usage.ru_stime
            run.proc.returncode = code
        except ChildProcessError:  # reaped elsewhere
            code = run.proc.returncode
    finally:
        codes[run.p.stage.name] = finish_stage(run, code, cpu)
        run.ended.set()


def make_folder(p: Planned) -> None:
    """A stage's folder, made before it starts; RecipeError (one line) where it cannot be."""
    try:
        p.stage.folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RecipeError(f"stage {p.stage.name}: cannot make its folder {p.stage.folder} "
                          f"({err.strerror or type(err).__name__}): move what is there away") from None


def run_beside(group: list[Planned], recipe: Recipe, index: dict[str, int], total: int) -> list[int | None]:
    """Run the stages of ``group`` at the same time, each on its share of the cores; each is marked done when it exits
    0, and one failing leaves the others running to their end. -> their exit codes (None: interrupted)."""
    for p in group:
        make_folder(p)
    threads = max(1, (os.cpu_count() or 1) // len(group))
    lock = threading.Lock()
    codes: dict[str, int | None] = {}
    runs: list[Running] = []
    try:
        for p in group:
            run = start_stage(p, recipe, index[p.stage.name], total, threads)
            runs.append(run)
            threading.Thread(target=follow, args=(run, lock, codes), daemon=True).start()
        for run in runs:
            while not run.ended.wait(0.2):  # an Event, not Thread.join: a join Ctrl-C interrupts can mark a live
                pass                        # thread as ended (Python 3.11)
    except BaseException:
        stop_all(runs)
        for run in runs:  # stopped by us: interrupted, not failed (a stage that had finished keeps its marker)
            if codes.get(run.p.stage.name) != 0:
                run.p.returncode = None
        raise
    return [codes.get(p.stage.name) for p in group]


def stop_all(runs: list[Running]) -> None:
    """Stop the stages still running (as :func:`stop` does one), their workers reaping and recording them."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        alive = [run for run in runs if not run.ended.is_set()]
        if not alive:
            return
        for run in alive:
            try:
                os.kill(run.proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        for run in alive:
            run.ended.wait(max(0.0, deadline - time.monotonic()))


def stop(proc: subprocess.Popen) -> None:
    """Stop the child after an interrupt: it had the terminal's SIGINT too; give it time to stop cleanly."""
    for sig, wait in ((signal.SIGINT, 60), (signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def read_attempts(folder: Path) -> list[dict[str, Any]]:
    try:
        lines = (folder / ATTEMPTS_FILE).read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


def summary_rows(planned: list[Planned], ran: set[str]) -> list[dict[str, Any]]:
    rows = []
    for p in planned:
        if p.stage.name in ran:
            status = "ran" if p.returncode == 0 else "failed" if p.returncode is not None else "interrupted"
        elif p.status == "done":
            status = "done"
        elif p.status == "skipped":
            status = "skipped"
        else:
            status = "not run"
        finished = status in ("done", "ran")
        marker = p.marker or {}
        seconds = marker.get("seconds_all_attempts", marker.get("seconds")) if finished else p.seconds
        cpu = marker.get("cpu_seconds_all_attempts", marker.get("cpu_seconds")) if finished else None
        text, data = stage_metrics(p) if finished else ("", {})
        rows.append({"stage": p.stage.name, "beside": p.stage.beside, "status": status, "minutes": None if seconds is None else seconds / 60,
                     "cpu_minutes": None if cpu is None else cpu / 60, "folder": str(p.stage.folder),
                     "summary": text, "metrics": data})
    return rows


def print_summary(recipe: Recipe, rows: list[dict[str, Any]]) -> None:
    width = max(5, *(len(r["stage"]) for r in rows))
    print(f"\nrecipe {recipe.name} ({recipe.folder}):")
    print(f"{'stage':{width}s}  {'status':11s} {'minutes':>7s} {'cpu-min':>7s}  metrics")
    for r in rows:
        minutes, cpu = ("-" if r[k] is None else f"{r[k]:.1f}" for k in ("minutes", "cpu_minutes"))
        print(f"{r['stage']:{width}s}  {r['status']:11s} {minutes:>7s} {cpu:>7s}  {r['summary']}")
    total, cpu = (sum(r[k] or 0 for r in rows) for k in ("minutes", "cpu_minutes"))
    print(f"{'total':{width}s}  {'':11s} {total:7.1f} {cpu:7.1f}  (wall-clock and CPU minutes, all attempts"
          f"{'; stages beside others overlap' if any(r.get('beside') for r in rows) else ''})")
    if recipe.reaches:
        print(f"(this recipe at its default budget: {recipe.reaches})")


def interrupt(signum: int, frame: Any) -> None:
    """SIGTERM: stop like Ctrl-C (the running stage is stopped, no marker is written)."""
    raise KeyboardInterrupt


def run(recipe: Recipe, planned: list[Planned]) -> int:
    problems = missing_inputs(planned)
    if problems:
        raise RecipeError(problems[0])
    todo = [p for p in planned if p.status == "run"]
    for p in todo:
        check_not_running(p)
    by_name = {p.stage.name: p for p in planned}
    ran: set[str] = set()
    failed: Planned | None = None
    interrupted = False
    previous = signal.signal(signal.SIGTERM, interrupt)
    index = {p.stage.name: i for i, p in enumerate(planned, 1)}
    try:
        for group in groups(planned, lambda p: p.stage):
            todo_now = [p for p in group if p.status == "run"]
            for p in todo_now:
                for path, maker in p.inputs:  # made by a stage that ran just now: it must be there
                    if not Path(path).exists():
                        raise RecipeError(f"stage {p.stage.name} needs {path} (made by stage {maker}), which does not "
                                          f"exist although stage {maker} finished: see "
                                          f"{by_name[maker].stage.folder / LOG_FILE}")
            ran.update(p.stage.name for p in todo_now)
            if len(todo_now) == 1:
                codes = [run_stage(todo_now[0], recipe, index[todo_now[0].stage.name], len(planned))]
            elif todo_now:
                codes = run_beside(todo_now, recipe, index, len(planned))
            else:
                codes = []
            failed = next((p for p, code in zip(todo_now, codes) if code != 0), None)
            if failed is not None:
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    rows = summary_rows(planned, ran)
    print_summary(recipe, rows)
    recipe.folder.mkdir(parents=True, exist_ok=True)
    (recipe.folder / "summary.json").write_text(json.dumps(
        {"recipe": recipe.name, "written": now(), "rows": rows}, indent=2, default=str) + "\n")
    print(f"summary: {recipe.folder / 'summary.json'}")
    if interrupted:
        current = next((p for p in planned if p.stage.name in ran and p.returncode is None), None)
        where = f" in stage {current.stage.name}" if current else ""
        print(f"recipe: interrupted{where}; the same command resumes", file=sys.stderr)
        return 130
    if failed is not None:
        print(f"recipe: stage {failed.stage.name} failed (exit {failed.returncode}); its output is in "
              f"{failed.stage.folder / LOG_FILE}; the same command resumes", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd recipe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", help="recipe: conf/recipes/<name>.yaml, or a path to a recipe .yaml "
                   "(without: list the recipes)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and which stages are done")
    p.add_argument("--budget", type=float, default=1.0,
                   help="scale every fit stage's trainer.max_time and trainer.max_steps by this factor")
    p.add_argument("--set", dest="sets", action="extend", nargs="+", default=[], metavar="STAGE.KEY=VALUE",
                   help="pass --KEY=VALUE to that stage's command (e.g. frozen.trainer.max_steps=500)")
    p.add_argument("--runs", default="runs", help="folder of the runs (default: runs): stages write "
                   "<runs>/<recipe>/<stage>/")
    p.add_argument("--from-stage", default=None, help="run no stage before this one")
    p.add_argument("--until-stage", default=None, help="run no stage after this one")
    return p


def list_recipes(recipes_dir: Path = RECIPES_DIR) -> None:
    print("recipes (python -m lightning_bpd recipe <name> [--dry-run]):")
    for name in available(recipes_dir):
        try:
            recipe = load_recipe(name, recipes_dir=recipes_dir)
        except RecipeError as err:
            print(f"  {name:26s} (broken: {err})")
            continue
        print(f"  {name:26s} {recipe.description}")
        print(f"  {'':26s} stages: {' -> '.join(recipe.stage_names())}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.name is None:
            list_recipes()
            return 0
        recipe = load_recipe(args.name, args.runs)
        planned = plan(recipe, args.budget, args.sets, args.from_stage, args.until_stage)
        if args.dry_run:
            print_plan(recipe, planned)
            problems = missing_inputs(planned)
            if problems:
                raise RecipeError(problems[0])
            return 0
        code = run(recipe, planned)
    except RecipeError as err:
        sys.exit(f"recipe: {err}")
    if code:
        sys.exit(code)
    return 0


if __name__ == "__main__":
    main()
