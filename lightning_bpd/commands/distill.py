"""``python -m lightning_bpd distill``: sequence-level knowledge distillation (section 6.2).

A teacher checkpoint beam-decodes the source side of a training corpus; the result is a data folder
that ``fit`` trains on directly (``--data.init_args.root=<out>``): ``<out>/<prefix>.<src>`` (the
source lines, unchanged) and ``<out>/<prefix>.<tgt>`` (the teacher's translations), one line per
source line, in order, plus copies of the gold validation and test files.

The work is cut into shards of ``--shard-size`` lines written atomically to ``<out>/shards/``; a
run that is killed and started again skips the finished shards (the settings that shape them, teacher and decoding
options, are recorded in ``<out>/distill_plan.json`` when a run starts: a resume with others is refused). With ``--devices N`` (or under
``torchrun``) every rank decodes its own shards (shard i goes to rank i % N) on its own device.

    python -m lightning_bpd distill --ckpt runs/m30k-base/last.ckpt \\
        --data-root ../shared/data/translation/multi30k --out runs/distill/multi30k

A super-resolution checkpoint is distilled greedily (``--beam 1``) on its own training faces (the data
of the checkpoint's run; ``--data-root`` points at another CelebA copy) into ``<out>/train_targets.pt``,
which ``fit`` reads with ``--data.init_args.distilled=<out>`` (:mod:`lightning_bpd.tasks.superres.self_distilled`).

A language-model checkpoint (an LM run's ``last.ckpt``, k = 1 included, or a heads folder) is distilled greedily
(``--beam 1``) on its own training files (the data of the checkpoint's run; ``--data-root`` another folder): prefixes of
up to ``--prompt-tokens`` tokens of whole lines, tiling each training file, continued by ``--new-tokens`` tokens
(``--decoder exact``: blockwise with the heads, greedy's output in fewer calls; ``greedy``), written as a data folder
that ``fit --data.init_args.root=<out>`` reads: ``train/`` a file per prefix (prefix + continuation), ``val/`` and
``test/`` copies of the original held-out files, ``distill.json`` the record
(:mod:`lightning_bpd.tasks.lm.self_distill`; shards in ``<out>/shards/``, resumable as above).

    python -m lightning_bpd distill --ckpt runs/code-lm/base/last.ckpt --beam 1 --out runs/code-lm/distill
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm import tqdm

from lightning_bpd.checkpoints import load_model
from lightning_bpd.commands.out_paths import file_above
from lightning_bpd.decoding import parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.deprecated_options import deprecated_alias
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.tasks.translation.module import translate
from lightning_bpd.tasks.translation.text_files import read_lines, resolve_split_files

if TYPE_CHECKING:  # the LM task imports transformers: imported at run time, by the functions that use it
    from lightning_bpd.tasks.lm import LMDataModule
    from lightning_bpd.tasks.lm.self_distill import Prefix


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lightning_bpd distill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", required=True, help="teacher checkpoint (a translation, super-resolution or language-model "
                   "run; a folder of LM heads)")
    p.add_argument("--data-root", default=None, help="folder of the gold corpus (translation: required; "
                   "super-resolution and language model: default the checkpoint's own data)")
    p.add_argument("--out", required=True, help="output data folder")
    p.add_argument("--prefix", default="train", help="split to distill (default: train)")
    p.add_argument("--copy", nargs="*", default=["val", "test", "test_2016_flickr"],
                   help="gold splits copied unchanged when present")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="de")
    p.add_argument("--beam", type=int, default=4, help="beam size (1 = greedy)")
    p.add_argument("--alpha", type=float, default=0.6, help="length penalty ((5 + len) / 6) ** alpha")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--shard-size", type=int, default=1000)
    p.add_argument("--devices", type=int, default=1, help="processes, one device each (CUDA when available)")
    p.add_argument("--limit", type=int, default=None,
                   help="super-resolution: distill only the first N training faces (train the heads on them with "
                        "--data.init_args.limits.train=N); a CPU budget sees fewer faces than the 4,560 anyway; "
                        "language model: N prefixes, evenly spaced over the training files")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="language model: at most this many tokens (whole lines) per training prefix")
    p.add_argument("--max-new-tokens", type=int, default=64, dest="new_tokens",
                   help="language model: tokens generated after each prefix")
    deprecated_alias(p, "--new-tokens", "--max-new-tokens")
    p.add_argument("--suffixes", nargs="+", default=None,
                   help="language model: only the data files with these suffixes (default: the run's data.suffixes)")
    p.add_argument("--decoder", choices=("exact", "greedy"), default="exact",
                   help="language model: exact blockwise decoding with the heads (greedy's output in fewer model "
                        "calls; greedy for k = 1) or greedy")
    return p


def shard_path(out: Path, prefix: str, lang: str, i: int) -> Path:
    return out / "shards" / f"{prefix}.{i:05d}.{lang}"


def translate_lines(module, lines: list[str], beam: int, alpha: float, batch_size: int,
                    progress: Callable[[int], object] | None = None) -> list[str]:
    """Beam-decode ``lines`` (greedy for beam 1; empty lines stay empty); ``progress(n)`` after each batch."""
    runtime = build_runtime(module.model, InferenceOptions())  # the model's own weights, lean steps
    method = make_method("greedy" if beam == 1 else f"beam{beam}_a{alpha}", parse_criterion, runtime)
    texts, _ = translate(module, lines, method, batch_size, progress, model=runtime)
    return [text.replace("\n", " ") for text in texts]


def run_rank(rank: int, world: int, args: argparse.Namespace, lines: list[str]) -> None:
    """Decode every unfinished shard i with i % world == rank."""
    device = f"cuda:{rank}" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    module = load_model(args.ckpt, device)
    out = Path(args.out)
    n_shards = -(-len(lines) // args.shard_size)
    mine = [i for i in range(n_shards) if i % world == rank]
    todo = [i for i in mine if not shard_path(out, args.prefix, args.tgt_lang, i).is_file()]
    done_lines = sum(min(args.shard_size, len(lines) - i * args.shard_size) for i in mine if i not in todo)
    total = sum(min(args.shard_size, len(lines) - i * args.shard_size) for i in mine)
    bar = tqdm(total=total, initial=done_lines, unit="sent", desc=f"distill rank {rank}", position=rank,
               disable=None)
    start, decoded = time.perf_counter(), 0
    for i in todo:
        chunk = lines[i * args.shard_size : (i + 1) * args.shard_size]
        texts = translate_lines(module, chunk, args.beam, args.alpha, args.batch_size, bar.update)
        bar.update(len(chunk) - sum(1 for line in chunk if line.strip()))  # empty lines: not decoded
        path = shard_path(out, args.prefix, args.tgt_lang, i)
        tmp = path.with_suffix(path.suffix + f".tmp{rank}")
        tmp.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
        os.replace(tmp, path)  # a shard exists only when it is complete
        decoded += len(chunk)
        if bar.disable:  # no terminal (a log file): one line per shard instead of the bar
            seconds = time.perf_counter() - start
            print(f"rank {rank}: shard {i} done, {done_lines + decoded}/{total} sentences, "
                  f"{decoded / seconds:.2f} sentences/s", file=sys.stderr, flush=True)
    bar.close()
    if decoded:
        seconds = time.perf_counter() - start
        print(f"rank {rank}: decoded {decoded} sentences in {seconds:.1f} s ({decoded / seconds:.2f} sentences/s, "
              f"beam {args.beam}, {torch.get_num_threads()} thread(s) on {device})", file=sys.stderr)


def run_ranks(run: Callable[[int, int, argparse.Namespace, list], None], args: argparse.Namespace,
              work: list) -> bool:
    """``run(rank, world, args, work)`` on every rank: this process alone (one device), ``--devices N`` processes
    spawned here, or this process as one rank of torchrun's (``WORLD_SIZE``, ``RANK``). True where this process
    goes on to merge the shards (rank 0)."""
    if "WORLD_SIZE" in os.environ:  # torchrun: rank 0 merges once every shard is there
        rank = int(os.environ.get("RANK", "0"))
        run(rank, int(os.environ["WORLD_SIZE"]), args, work)
        return rank == 0
    if args.devices > 1:
        torch.multiprocessing.spawn(run, args=(args.devices, args, work), nprocs=args.devices, join=True)
    else:
        run(0, 1, args, work)
    return True


def check_shards(n: int, path: Callable[[int], Path]) -> None:
    """Exit in one line unless the file ``path(i)`` of every shard i < n exists."""
    missing = [i for i in range(n) if not path(i).is_file()]
    if missing:
        sys.exit(f"distill: shards {missing[:10]} are not finished yet (other ranks still running?): run again")


def merge(args: argparse.Namespace, lines: list[str], src_path: Path) -> None:
    out = Path(args.out)
    n_shards = -(-len(lines) // args.shard_size)
    targets: list[str] = []
    for i in range(n_shards):
        shard = read_lines(shard_path(out, args.prefix, args.tgt_lang, i))
        expected = min(args.shard_size, len(lines) - i * args.shard_size)
        if len(shard) != expected:
            raise ValueError(f"shard {i} has {len(shard)} lines, expected {expected}: delete it and run again")
        targets += shard
    (out / f"{args.prefix}.{args.src_lang}").write_text("".join(s + "\n" for s in lines), encoding="utf-8")
    (out / f"{args.prefix}.{args.tgt_lang}").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    for split in args.copy:
        try:
            pair = resolve_split_files(args.data_root, split, args.src_lang, args.tgt_lang)
        except FileNotFoundError:
            continue
        for path in pair:
            shutil.copyfile(path, out / path.name)
    print(f"distilled {len(lines)} lines of {src_path} into {out}", file=sys.stderr)


PLAN = "distill_plan.json"  # what the shards are made of (the LM path's file: lightning_bpd.tasks.lm.self_distill.PLAN)
PLAN_OPTIONS = {"data_root": "--data-root", "prefix": "--prefix", "src_lang": "--src-lang", "tgt_lang": "--tgt-lang",
                "beam": "--beam", "alpha": "--alpha", "shard_size": "--shard-size", "ckpt": "--ckpt"}


def check_out(out: str) -> None:
    """Exit in one line where ``--out`` cannot be a folder: an existing file, or a path under one."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        sys.exit(f"distill: --out {out} is a file: give a folder (new, or one a distill run made)")
    if (parent := file_above(path.absolute())) is not None:
        sys.exit(f"distill: --out {out} lies under the file {parent}: give a folder")


def check_overlap(out: str, data_root: str | Path) -> None:
    """Exit in one line where ``--out`` is the data folder, lies inside it or contains it (merging would overwrite the
    gold files)."""
    out_path, root = Path(out).resolve(), Path(data_root).resolve()
    if out_path == root or root in out_path.parents or out_path in root.parents:
        sys.exit(f"distill: --out {out} overlaps the data folder {data_root}: give a folder outside it")


def translation_plan(args: argparse.Namespace, lines: list[str]) -> dict[str, Any]:
    """The settings that shape a translation distillation's shards: the teacher (its path, size and modification
    time), the corpus split (its lines' digest), the decoding options and the shard size."""
    ckpt = Path(args.ckpt).resolve()
    stat = ckpt.stat()
    digest = hashlib.sha1("".join(line + "\n" for line in lines).encode("utf-8")).hexdigest()
    return {"kind": "translation", "ckpt": str(ckpt), "ckpt_bytes": stat.st_size, "ckpt_mtime_ns": stat.st_mtime_ns,
            "data_root": str(Path(args.data_root).resolve()), "prefix": args.prefix, "src_lang": args.src_lang,
            "tgt_lang": args.tgt_lang, "beam": args.beam, "alpha": args.alpha if args.beam > 1 else None,
            "shard_size": args.shard_size, "lines": len(lines), "lines_sha1": digest}


def plan_changes(before: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """What ``before`` (a started run's plan) was made with that ``plan`` changes, as options: ``--beam 1``, ..."""
    changed = [f"{option} {before.get(key)}" for key, option in PLAN_OPTIONS.items()
               if before.get(key) != plan[key] and before.get(key) is not None]  # alpha: None under --beam 1
    if before.get("ckpt") == plan["ckpt"] and any(before.get(key) != plan[key] for key in ("ckpt_bytes",
                                                                                              "ckpt_mtime_ns")):
        changed.append(f"another version of --ckpt {plan['ckpt']} (its size or modification time changed since)")
    same_split = all(before.get(key) == plan[key] for key in ("data_root", "prefix", "src_lang"))
    if same_split and any(before.get(key) != plan[key] for key in ("lines", "lines_sha1")):
        changed.append(f"other source lines ({before.get('lines')} then; the {plan['prefix']}.{plan['src_lang']} "
                       "file changed since)")
    return changed


def written_names(args: argparse.Namespace) -> list[str]:
    """What a translation distillation writes in ``--out``: its shards, the split's two files and the gold copies."""
    names = ["shards", f"{args.prefix}.{args.src_lang}", f"{args.prefix}.{args.tgt_lang}"]
    for split in args.copy:
        try:
            names += [path.name for path in resolve_split_files(args.data_root, split, args.src_lang, args.tgt_lang)]
        except FileNotFoundError:
            continue
    return names


def start_plan(out: Path, plan: dict[str, Any], writes: list[str]) -> None:
    """Record ``plan`` in ``out`` (made here), or exit in one line unless a started run's plan is the same: resuming a
    folder distilled with other settings would mix its shards with these. A folder that holds any of ``writes`` (the
    names the run writes) without a plan is left alone (files of another kind, e.g. a recipe's stage.log, may be
    there)."""
    path = out / PLAN
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            before = None
        if not isinstance(before, dict) or before.get("kind") != "translation":
            sys.exit(f"distill: {out} holds another kind of distillation ({path} is not a translation run's): give a "
                     "new --out")
        changed = plan_changes(before, plan)
        if changed:
            sys.exit(f"distill: {out} was distilled with {', '.join(changed)}: give a new --out or the same options")
        return
    taken = [name for name in writes if (out / name).exists()]
    if taken:
        sys.exit(f"distill: {out} already holds {', '.join(taken[:5])} but no {PLAN} (not a distill run's, or one "
                 "that did not record its settings): give an empty or new --out")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{PLAN}.tmp{os.getpid()}"  # atomic: ranks started together may read it at once
    tmp.write_text(json.dumps(plan, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def distill_superres(module, args: argparse.Namespace) -> None:
    """Greedy targets of a super-resolution base for its training faces (one process)."""
    from lightning_bpd.tasks.superres.datamodule import SuperResolutionDataModule
    from lightning_bpd.tasks.superres.self_distilled import distill_images

    if args.beam != 1 or args.devices != 1:
        sys.exit("distill: super-resolution targets are the base's greedy outputs: use --beam 1 --devices 1")
    ckpt = torch.load(args.ckpt, map_location="cpu", weights_only=False)
    hp = {key: value for key, value in (ckpt.get("datamodule_hyper_parameters") or {}).items()
          if not key.startswith("_") and key != "distilled"}  # jsonargparse adds _class_path
    if args.data_root is not None:
        hp["root"] = args.data_root
    if args.limit is not None:
        hp["limits"] = {**(hp.get("limits") or {}), "train": args.limit}
    try:
        data = SuperResolutionDataModule(**hp)
        data.check_data("fit")
        low, _ = data.split_images("train")
    except (ValueError, FileNotFoundError, TypeError) as err:
        sys.exit(f"distill: the training faces of {args.ckpt}: {err}")
    out = Path(args.out)
    start = time.perf_counter()
    high = distill_images(build_runtime(module.model, InferenceOptions()), low, out, args.batch_size, args.shard_size)
    print(f"distilled {high.shape[0]} training faces ({data.root or 'synthetic'}) into {out / 'train_targets.pt'} "
          f"in {time.perf_counter() - start:.1f} s ({torch.get_num_threads()} thread(s)); train on them with "
          f"--data.init_args.distilled={out}", file=sys.stderr)


def lm_data(module, args: argparse.Namespace) -> LMDataModule:
    """The data module of the LM checkpoint's run (its root, split and suffixes), ``--data-root`` the root if given,
    read with the checkpoint's own tokenizer; ``--prompt-tokens`` its prefixes' budget."""
    from lightning_bpd.tasks.lm import LMDataModule

    hp = {}
    if Path(args.ckpt).is_file():
        hp = torch.load(args.ckpt, map_location="cpu", weights_only=False).get("datamodule_hyper_parameters") or {}
    root = args.data_root if args.data_root is not None else hp.get("root")
    if root is None:
        sys.exit(f"distill: {args.ckpt} names no training data (a folder of heads): give --data-root")
    own = module.hparams.get("own")  # our own base: its tokenizer directory
    tokenizer = module.hparams.pretrained if own is None else own["tokenizer"]
    data = LMDataModule(root=root, tokenizer_path=tokenizer, prompt_tokens=args.prompt_tokens,
                        suffixes=args.suffixes or hp.get("suffixes"), val_fraction=hp.get("val_fraction", 0.05),
                        test_fraction=hp.get("test_fraction", 0.05))
    data.check_data("fit")  # train and val (a run validates on the copies of val)
    return data


def lm_method(module, args: argparse.Namespace) -> str:
    return "greedy" if args.decoder == "greedy" or module.model.k == 1 else "exact"


def check_lm_args(module, args: argparse.Namespace) -> None:
    """Greedy targets, the training split, and room in the model's context for a prefix and its continuation."""
    if args.beam != 1:
        sys.exit("distill: a language model's targets are its own greedy continuations: use --beam 1")
    if args.prefix != "train":
        sys.exit("distill: a language model is distilled on its training split: leave --prefix out")
    positions = module.model.n_positions  # the last verify passes shrink to the context (no k past it)
    if positions is not None and args.prompt_tokens + args.new_tokens > positions:
        sys.exit(f"distill: --prompt-tokens {args.prompt_tokens} + --max-new-tokens {args.new_tokens} exceeds the "
                 f"model's context ({positions} positions)")


def run_lm_rank(rank: int, world: int, args: argparse.Namespace, prefixes: list[Prefix]) -> None:
    """Continue the prefixes of every unfinished shard i with i % world == rank."""
    from lightning_bpd.tasks.lm import self_distill as sd

    device = f"cuda:{rank}" if torch.cuda.is_available() else "cpu"
    if device == "cpu" and world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    module = load_model(args.ckpt, device)
    runtime = build_runtime(module.model, InferenceOptions())
    method = make_method(lm_method(module, args), parse_criterion, runtime)
    out = Path(args.out)
    todo = [i for i in range(sd.n_shards(len(prefixes), args.shard_size))
            if i % world == rank and not sd.shard_path(out, i).is_file()]
    for i in todo:
        chunk = prefixes[i * args.shard_size : (i + 1) * args.shard_size]
        texts, run = sd.continue_prefixes(module, runtime, method, [p.text for p in chunk], args.new_tokens,
                                          args.batch_size)
        sd.write_shard(out, i, chunk, texts, run, tag=str(rank))
        print(f"rank {rank}: shard {i} done ({len(chunk)} prefixes, {run.tokens} tokens, {run.model_calls} calls, "
              f"{run.tokens / max(run.seconds, 1e-9):.1f} tokens/s)", file=sys.stderr, flush=True)


def distill_lm(module, args: argparse.Namespace) -> None:
    """Self-distil a language model on its training prefixes (:mod:`lightning_bpd.tasks.lm.self_distill`)."""
    from lightning_bpd.tasks.lm import self_distill as sd

    check_lm_args(module, args)
    data = lm_data(module, args)
    prefixes, windows = sd.training_prefixes(data, module.model.pad_id, args.limit)
    if not prefixes:
        sys.exit(f"distill: the training split of {data.root} has no prefix within --prompt-tokens "
                 f"{args.prompt_tokens}")
    check_overlap(args.out, data.root)
    out, root = Path(args.out).resolve(), data.root.resolve()
    plan = sd.plan_of(prefixes, ckpt=str(Path(args.ckpt).resolve()), data_root=str(root),
                      prompt_tokens=args.prompt_tokens, new_tokens=args.new_tokens, shard_size=args.shard_size,
                      limit=args.limit)
    sd.check_plan(out, plan)
    (out / "shards").mkdir(exist_ok=True)
    if not run_ranks(run_lm_rank, args, prefixes):
        return
    check_shards(sd.n_shards(len(prefixes), args.shard_size), lambda i: sd.shard_path(out, i))
    continuations, totals = sd.read_shards(out, prefixes, args.shard_size)
    split_root = {s: data.root / s if (data.root / "train").is_dir() else data.root for s in ("val", "test")}
    files = sd.write_folder(out, prefixes, continuations, {s: data.files[s] for s in ("val", "test")}, split_root)
    record = {**plan, "decoder": lm_method(module, args), "k": module.model.k, **windows,
              "source_files": len(data.split_texts("train").names), "files": files, **totals,
              "mean_accepted_block_size": totals["tokens"] / max(1, totals["iterations"]),
              "tokens_per_second": totals["tokens"] / max(totals["seconds"], 1e-9),
              "threads": torch.get_num_threads(), "device": "cuda" if torch.cuda.is_available() else "cpu"}
    (out / sd.RECORD).write_text(json.dumps(record, indent=2) + "\n")
    print(f"distilled {len(prefixes)} prefixes of {record['source_files']} training files of {data.root} into "
          f"{out} ({totals['tokens']} tokens, {totals['model_calls']} model calls, {totals['seconds']:.1f} s); train "
          f"on them with --data.init_args.root={out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if min(args.beam, args.batch_size, args.shard_size, args.devices, args.prompt_tokens, args.new_tokens,
           1 if args.limit is None else args.limit) < 1 or args.alpha < 0:
        sys.exit("distill: --beam, --batch-size, --shard-size, --devices, --prompt-tokens, --new-tokens and --limit "
                 "must be >= 1, --alpha >= 0")
    check_out(args.out)
    try:
        module = load_model(args.ckpt)  # fail early on a bad checkpoint, before spawning anything
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"distill: {err}")
    from lightning_bpd.tasks.lm.module import LMModule
    from lightning_bpd.tasks.superres.module import SuperResolutionModule

    if isinstance(module, LMModule):
        try:
            return distill_lm(module, args)
        except (ValueError, FileNotFoundError) as err:  # the data, a started run of other settings: one line
            sys.exit(f"distill: {err}")
    if isinstance(module, SuperResolutionModule):
        if torch.cuda.is_available():  # one process, one device (--devices 1)
            module = module.to("cuda")
        return distill_superres(module, args)
    if args.limit is not None:
        sys.exit("distill: --limit is for super-resolution checkpoints; for translation, distill a corpus folder "
                 "that holds the lines you want")
    if args.data_root is None:
        sys.exit("distill: --data-root (the folder of the gold corpus) is required for a translation checkpoint")
    check_overlap(args.out, args.data_root)
    try:
        src_path, _ = resolve_split_files(args.data_root, args.prefix, args.src_lang, args.tgt_lang)
        lines = [line.strip() for line in read_lines(src_path)]
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"distill: {err}")
    start_plan(Path(args.out), translation_plan(args, lines), written_names(args))
    (Path(args.out) / "shards").mkdir(exist_ok=True)
    if not run_ranks(run_rank, args, lines):
        return
    check_shards(-(-len(lines) // args.shard_size), lambda i: shard_path(Path(args.out), args.prefix, args.tgt_lang, i))
    merge(args, lines, src_path)
