"""Command line: ``python -m lightning_bpd <command>``.

``fit``, ``validate`` and ``test`` are a LightningCLI (``parser_mode="omegaconf"``) whose model and
data are chosen by ``class_path`` in the YAML config, so both tasks share one entry point; with no
``--config`` the translation default (conf/translation/default.yaml) is used. Every run gets a
folder ``runs/<name>/`` with its resolved ``config.yaml`` beside its checkpoints and W&B files.
``decode`` is a plain function (see :mod:`lightning_bpd.decode`).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch
from jsonargparse import Namespace
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback

from lightning_bpd.callbacks.decode_eval import DecodeEval
from lightning_bpd.nn.warm_start import CheckpointMismatchError
from lightning_bpd.tasks.translation.text_files import DataError

# Errors that mean "the input is wrong", reported as one line instead of a traceback.
USER_ERRORS = (DataError, CheckpointMismatchError, FileNotFoundError, ValueError)

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
DEFAULT_CONFIG = CONF_DIR / "translation" / "default.yaml"

COMMANDS = {
    "fit": "train a model (default: translation on the built-in synthetic data)",
    "validate": "evaluate a checkpoint on the whole validation split (--ckpt_path)",
    "test": "evaluate a checkpoint on the test split (--ckpt_path)",
    "decode": "translate a file or stdin with a checkpoint, k and a criterion",
    "bench": "time greedy against blockwise decoding of a checkpoint (table and JSON)",
    "distill": "beam-decode a training corpus with a teacher (sequence-level distillation), sharded, resumable",
    "human-eval": "export side-by-side image pairs for raters (export) and score their answers (analyze)",
}

# Commands that are plain functions: ``main(argv)`` of these modules.
PLAIN_COMMANDS = {
    "decode": "lightning_bpd.decode",
    "bench": "lightning_bpd.bench",
    "distill": "lightning_bpd.distill",
    "human-eval": "lightning_bpd.human_eval",
}

USAGE = "usage: python -m lightning_bpd {" + ",".join(COMMANDS) + "} [options]\n\n" + "\n".join(
    f"  {name:9s} {text}" for name, text in COMMANDS.items()
) + (
    "\n\nExamples:\n"
    "  python -m lightning_bpd fit\n"
    "  python -m lightning_bpd fit --config conf/translation/multi30k_base.yaml --trainer.max_steps=1000\n"
    "  python -m lightning_bpd fit --config conf/translation/multi30k_k8_finetune.yaml "
    "--model.init_args.init_from=runs/base/last.ckpt\n"
    "  python -m lightning_bpd validate --config runs/<name>/config.yaml --ckpt_path runs/<name>/last.ckpt\n"
    "  python -m lightning_bpd decode --ckpt runs/<name>/last.ckpt --k 8 --criterion exact < input.en\n"
    "  python -m lightning_bpd bench --ckpt runs/<name>/last.ckpt --input input.en --batch-sizes 1 32\n"
    "  python -m lightning_bpd distill --ckpt runs/<name>/last.ckpt --data-root <corpus> --out runs/distill/<name>\n"
    "\n'python -m lightning_bpd <command> --help' lists every option of a command.\n"
)


def import_object(path: str) -> Any:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def to_plain(value: Any) -> Any:
    """Namespaces (from jsonargparse) -> dicts, recursively."""
    if isinstance(value, Namespace):
        return {k: to_plain(v) for k, v in vars(value).items()}
    if isinstance(value, list):
        return [to_plain(v) for v in value]
    return value


class RunFolderConfig(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run folder (beside the checkpoints)."""


RUN_DIR_ENV = "LIGHTNING_BPD_RUN_DIR"


class BPDCLI(LightningCLI):
    """LightningCLI with a run folder per run and the vocabulary size filled in from the data."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_argument("--run_dir", type=str | None, default=None,
                            help="folder of this run (default: runs/<task>-<date>-<time>)")
        parser.add_lightning_class_args(DecodeEval, "decode_eval")

    def before_instantiate_classes(self) -> None:
        cfg = self.config[self.subcommand] if self.subcommand else self.config
        task = cfg.model.class_path.rsplit(".", 1)[-1].removesuffix("Module").lower()
        # DDP re-runs this command in each extra process: they inherit the run folder rank 0 chose
        ddp_child = int(os.environ.get("LOCAL_RANK", "0") or 0) > 0
        run_dir = cfg.run_dir or (os.environ.get(RUN_DIR_ENV) if ddp_child else None) or str(
            Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}")
        cfg.run_dir = run_dir
        os.environ[RUN_DIR_ENV] = run_dir
        if cfg.trainer.default_root_dir is None:
            cfg.trainer.default_root_dir = run_dir
        loggers = cfg.trainer.logger if isinstance(cfg.trainer.logger, list) else [cfg.trainer.logger]
        for lg in loggers:
            if isinstance(lg, Namespace) and lg.class_path.endswith("WandbLogger"):
                # absolute: the W&B service of a process keeps the working directory of its first run
                lg.init_args.save_dir = str(Path(run_dir).resolve())
                if getattr(lg.init_args, "offline", False):
                    os.environ.setdefault("WANDB_MODE", "offline")
        ckpt_path = cfg.get("ckpt_path")
        if ckpt_path and ckpt_path not in ("last", "best", "hpc", "registry") and not Path(ckpt_path).is_file():
            # fail before DDP starts its other processes, which would wait for this one forever
            raise FileNotFoundError(f"--ckpt_path {ckpt_path} does not exist")
        if cfg.trainer.logger in (False, []) and cfg.trainer.callbacks:
            kept = [cb for cb in cfg.trainer.callbacks
                    if not (isinstance(cb, Namespace) and cb.class_path.endswith("LearningRateMonitor"))]
            if len(kept) < len(cfg.trainer.callbacks):
                logging.getLogger("lightning_bpd").warning("no logger: the LearningRateMonitor callback is left out")
                cfg.trainer.callbacks = kept
        for cb in cfg.trainer.callbacks or []:
            if isinstance(cb, Namespace) and cb.class_path.endswith("ModelCheckpoint") and cb.init_args.dirpath is None:
                cb.init_args.dirpath = run_dir
        init_args = cfg.model.init_args
        data_args = cfg.data.init_args
        init_from = getattr(init_args, "init_from", None)
        if init_from and "tokenizer_path" in data_args and data_args.tokenizer_path is None and Path(init_from).is_file():
            # a warm start keeps its base's vocabulary: token ids index the base's embeddings
            data_args.tokenizer_path = init_from
            logging.getLogger("lightning_bpd").info("data.tokenizer_path: the tokenizer of %s", init_from)
        if "vocab_size" in init_args and init_args.vocab_size is None:
            data_cls = import_object(cfg.data.class_path)
            init_args.vocab_size = data_cls(**to_plain(cfg.data.init_args)).vocab_size


    def finish_loggers(self) -> None:
        """Close the W&B run so its offline file is complete (and a next run in this process is new)."""
        for lg in self.trainer.loggers:
            if type(lg).__name__ == "WandbLogger" and lg._experiment is not None:
                lg.experiment.finish()

    def after_fit(self) -> None:
        # Lightning refreshes last.ckpt only when a top-k checkpoint is written; the steps after the
        # last validation (a max_time stop) would be lost. Always leave the final state here.
        cfg = self.config[self.subcommand]
        self.trainer.save_checkpoint(str(Path(cfg.run_dir) / "last.ckpt"))
        self.finish_loggers()

    def after_validate(self) -> None:
        self.finish_loggers()

    def after_test(self) -> None:
        self.finish_loggers()


def run_lightning(argv: list[str]) -> BPDCLI:
    """fit / validate / test through the LightningCLI."""
    command, rest = argv[0], argv[1:]
    if not any(a == "--config" or a.startswith("--config=") or a in ("-h", "--help") for a in rest):
        if not DEFAULT_CONFIG.is_file():
            sys.exit(f"no --config given and the default {DEFAULT_CONFIG} is missing: pass --config <file.yaml>")
        rest = ["--config", str(DEFAULT_CONFIG), *rest]
    # LightningCLI parses sys.argv, and DDP re-runs the command line in sys.argv once per extra process
    sys.argv = [sys.argv[0], command, *rest]
    if torch.cuda.is_available():  # TF32 matrix products on GPUs that have them (fp32 accumulation)
        torch.set_float32_matmul_precision("high")
    return BPDCLI(
        model_class=None,
        datamodule_class=None,
        subclass_mode_model=True,
        subclass_mode_data=True,
        save_config_callback=RunFolderConfig,
        save_config_kwargs={"overwrite": True},
        parser_kwargs={"parser_mode": "omegaconf", "exit_on_error": False, "prog": "python -m lightning_bpd",
                       **{name: {"exit_on_error": False} for name in ("fit", "validate", "test")}},
        auto_configure_optimizers=False,
    )


def config_error(command: str, message: str) -> str:
    """jsonargparse's nested explanation of a bad option, as one line that names the key and says what to fix."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    top = re.match(r'Parser key "([^"]+)"', lines[0]) if lines else None
    detail = lines[0] if lines else message
    key = top.group(1) if top else None
    for i, line in enumerate(lines):
        option = re.match(r"Option '([^']+)' is not accepted", line)
        nested = re.match(r'Parser key "([^"]+)":$', line)
        if option and key:
            detail, key = f"unknown option {option.group(1)!r}", f"{key}.init_args.{option.group(1)}"
            break
        if nested and i > 0 and key and i + 1 < len(lines):
            detail, key = lines[i + 1], f"{key}.init_args.{nested.group(1)}"
            break
    else:
        if top and len(lines) > 1:
            detail = lines[1]
    where = f"{key}: " if key else ""
    return f"{where}{detail} (python -m lightning_bpd {command} --help lists every option)"


def main(argv: list[str] | None = None) -> BPDCLI | None:
    """Run a command; bad input ends with one ``error: ...`` line (LIGHTNING_BPD_DEBUG=1 shows the traceback)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return None
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        sys.exit(f"unknown command {command!r}\n\n{USAGE}")
    try:
        if command in PLAIN_COMMANDS:
            importlib.import_module(PLAIN_COMMANDS[command]).main(rest)
            return None
        return run_lightning([command, *rest])
    except argparse.ArgumentError as err:
        if os.environ.get("LIGHTNING_BPD_DEBUG"):
            raise
        sys.exit(f"error: {config_error(command, str(err))}")
    except USER_ERRORS as err:
        if os.environ.get("LIGHTNING_BPD_DEBUG"):
            raise
        sys.exit(f"error: {err}")
