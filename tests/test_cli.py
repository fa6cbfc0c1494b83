"""The CLI's preparation of a parsed config before anything is built: run folder, loggers, callbacks; and the data
check of every fit before it writes anything."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.loggers import WandbLogger

from lightning_bpd.callbacks.progress_lines import ProgressLines
from lightning_bpd.commands.cli import (
    CONF_DIR,
    DEFAULT_CONFIG,
    REPO_ROOT,
    RUN_DIR_ENV,
    drop_lr_monitor_without_logger,
    hide_own_files_checkpoint_warning,
    main,
    outputs_in_run_folder,
    run_folder,
    wandb_in_run_folder,
)
from tests.test_configs import parse


class MyCheckpoint(ModelCheckpoint):
    """A subclass is still a checkpoint callback (the class is checked, not its name)."""


@pytest.fixture
def cfg():
    return parse("--config", str(DEFAULT_CONFIG), "--trainer.callbacks+=tests.test_cli.MyCheckpoint").config


def test_run_folder_explicit_inherited_by_ddp_children_or_new(cfg, monkeypatch):
    monkeypatch.setenv(RUN_DIR_ENV, "runs/parent")
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert run_folder(cfg).startswith("runs/translation-")  # rank 0 (or no DDP): a new folder
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert run_folder(cfg) == "runs/parent"
    cfg.run_dir = "runs/mine"
    assert run_folder(cfg) == "runs/mine"


def test_loggers_and_checkpoints_write_into_the_run_folder(cfg, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "")  # restored afterwards
    monkeypatch.delenv("WANDB_MODE")
    wandb_in_run_folder(cfg.trainer, "runs/x")
    assert cfg.trainer.logger.init_args.save_dir == str(Path("runs/x").resolve())
    assert os.environ["WANDB_MODE"] == "offline"  # offline: true in the config
    outputs_in_run_folder(cfg.trainer, "runs/x")
    dirpaths = {cb.class_path.rsplit(".", 1)[1]: cb.init_args.get("dirpath") for cb in cfg.trainer.callbacks}
    assert dirpaths == {"ModelCheckpoint": "runs/x", "LearningRateMonitor": None, "MyCheckpoint": "runs/x"}
    assert cfg.trainer.default_root_dir == "runs/x"


def test_a_saved_config_with_another_run_dir_writes_into_the_new_folder(cfg):
    """``validate --config runs/old/config.yaml --run_dir runs/new``: the saved config names runs/old as the
    trainer's root and the checkpoint folder; both follow the new run folder (a folder chosen elsewhere stays)."""
    cfg.trainer.default_root_dir = "runs/old"
    cfg.trainer.callbacks[0].init_args.dirpath = "runs/old"
    cfg.trainer.callbacks[2].init_args.dirpath = "elsewhere/ckpts"
    outputs_in_run_folder(cfg.trainer, "runs/new")
    assert cfg.trainer.default_root_dir == "runs/new"
    assert [cb.init_args.get("dirpath") for cb in cfg.trainer.callbacks] == ["runs/new", None, "elsewhere/ckpts"]


def test_no_logger_leaves_the_lr_monitor_out(cfg):
    drop_lr_monitor_without_logger(cfg.trainer)
    assert len(cfg.trainer.callbacks) == 3  # a logger: kept
    cfg.trainer.logger = False
    drop_lr_monitor_without_logger(cfg.trainer)
    assert [cb.class_path.rsplit(".", 1)[1] for cb in cfg.trainer.callbacks] == ["ModelCheckpoint", "MyCheckpoint"]


CELEBA = ["--config", str(CONF_DIR / "superres" / "celeba_base.yaml")]
# the default translation config (W&B offline) on the folder d, the tokenizer cached outside runs/
TEXTS = ["--data.init_args.root=d", "--data.init_args.vocab_size=40", "--data.init_args.cache_dir=cache"]


def nothing_written(root: Path) -> bool:
    """No run folder (runs/) and no W&B files (wandb/, offline-run-*) anywhere under ``root``."""
    return not (root / "runs").exists() and not any("wandb" in p.name or "offline-run" in p.name
                                                     for p in root.rglob("*"))


def celeba_folder_only(root: Path) -> None:
    (root / "cel/img_align_celeba").mkdir(parents=True)


def celeba_no_train_image(root: Path) -> None:
    celeba_folder_only(root)
    (root / "cel/list_eval_partition.txt").write_text("000001.jpg 0\n000002.jpg 1\n")


def parallel_texts(root: Path, val_de: bytes | None) -> None:
    (root / "d").mkdir()
    for lang, words in (("en", "the dog number {} sleeps"), ("de", "der hund nummer {} schlaeft")):
        (root / f"d/train.{lang}").write_text("".join(words.format(i) + "\n" for i in range(50)))
    (root / "d/val.en").write_text("a\nb\nc\n")
    if val_de is not None:
        (root / "d/val.de").write_bytes(val_de)


@pytest.mark.parametrize("make, args, message", [
    (None, [*CELEBA, "--data.init_args.root=nowhere"],
     ("CelebA not found under nowhere (that folder does not exist): expected the torchvision layout "
      "nowhere/celeba/img_align_celeba/ and nowhere/celeba/list_eval_partition.txt, or the plain layout "
      "nowhere/img_align_celeba/ and nowhere/list_eval_partition.txt; check data.root")),
    (celeba_folder_only, [*CELEBA, "--data.init_args.root=cel"],
     "CelebA not found under cel (found only cel/img_align_celeba): expected"),
    (celeba_no_train_image, [*CELEBA, "--data.init_args.root=cel"],
     "no images of split 'train' (partition 0) from cel/list_eval_partition.txt are present in cel/img_align_celeba"),
    (lambda root: parallel_texts(root, None), TEXTS,
     "Missing file(s) for split 'val' language(s) ['de'] in 'd'. Expected layout: d/val.en(.gz) and d/val.de(.gz)"),
    (lambda root: parallel_texts(root, b"x\ny\n"), TEXTS,
     "Parallel files are misaligned: 'd/val.en' has 3 lines but 'd/val.de' has 2 lines"),
    (lambda root: parallel_texts(root, b"x\ny\nz\xfc\n"), TEXTS,
     ("'d/val.de' is not UTF-8: line 3 (byte offset 5) has byte 0xfc (invalid start byte); re-encode it as UTF-8, "
      "e.g. iconv -f latin1 -t utf-8 d/val.de > d/val.de.utf8 (if it is Latin-1)")),
], ids=["celeba-no-folder", "celeba-no-partition-file", "celeba-no-train-image", "texts-no-val-file",
        "texts-misaligned", "texts-not-utf8"])
def test_fit_checks_its_data_before_it_writes_anything(tmp_path, monkeypatch, make, args, message):
    """Missing or unusable data is one ``error:`` line before W&B or the run folder write anything."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv(RUN_DIR_ENV, "")  # restored afterwards (the CLI sets it)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the CLI sets it
    # a W&B run left open by another test would be reused without a new folder: fail on any start instead
    monkeypatch.setattr(WandbLogger, "experiment", property(lambda _: pytest.fail("W&B started before the data check")))
    if make is not None:
        make(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["fit", *args, "--trainer.max_steps=1"])
    assert str(err.value).startswith(f"error: {message}")
    assert "\n" not in str(err.value)
    assert nothing_written(tmp_path)


@pytest.mark.parametrize("option, message", [
    ("--model.init_args.architecture.image.head_prior=mine", ("head_prior must be one of ('shared', 'own', "
                                                              "'residual'), got 'mine'")),
    ("--model.init_args.training.train_readout=true", ("model.training.train_readout trains the base's readout beside an "
                                                       "otherwise frozen base: set model.training.freeze_base: true")),
    ("--model.init_args.training.lr=-1", "model.training.lr must be > 0, got -1.0"),
    ("--model.init_args.architecture.eos_id=2", "model.architecture.eos_id is None in super-resolution, got 2"),
])
def test_a_model_that_refuses_its_options_is_one_line(tmp_path, monkeypatch, option, message):
    """A ValueError from the model's __init__ comes wrapped in jsonargparse's list of union subtypes: the CLI
    reports the model's own message, on one line, before a run folder or W&B is written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv(RUN_DIR_ENV, "")  # restored afterwards (the CLI sets it)
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the CLI sets it
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(CONF_DIR / "superres" / "default.yaml"), option, "--trainer.max_steps=1"])
    assert str(err.value).startswith(f"error: {message}")
    assert "\n" not in str(err.value)
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["cache"]  # the synthetic faces' cache, no run folder
    assert not any("wandb" in p.name or "offline-run" in p.name for p in tmp_path.rglob("*"))


def test_fit_with_a_missing_image_folder_is_one_line_in_a_subprocess(tmp_path):
    """The reported case, as a user runs it: non-zero exit, no traceback, no W&B run folder."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_SILENT": "true",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop(RUN_DIR_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "lightning_bpd", "fit", *CELEBA, "--data.init_args.root=nowhere"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("Seed set to")]
    assert len(lines) == 1 and lines[0].startswith("error: CelebA not found under nowhere (that folder does not exist)")
    assert nothing_written(tmp_path)


# What a first `fit` printed that a user can do nothing about (issue 39), by the text that identifies each.
FIRST_RUN_NOTICES = {
    "W&B: anonymous setting has no effect": "anonymous setting",
    "W&B: git root ... does not exist": "git root",
    "Lightning: checkpoint directory exists and is not empty": "exists and is not empty",
    "torch: LeafSpec deprecated (Lightning's _pytree)": "LeafSpec",
    "Lightning: litlogger tip": "litlogger",
}
TINY_FIT = [
    "--model.init_args.architecture.d_model=32", "--model.init_args.architecture.n_heads=2", "--model.init_args.architecture.d_ff=64",
    "--model.init_args.architecture.n_encoder_layers=1", "--model.init_args.architecture.n_decoder_layers=1", "--model.init_args.architecture.head_hidden=16",
    "--model.init_args.architecture.k=3", "--data.init_args.vocab_size=120", "--data.init_args.max_tokens=600",
    "--data.init_args.eval_max_tokens=100", "--data.init_args.synthetic_sizes={train: 300, val: 13, test: 13}",
    "--decode_eval.batch_size=2", "--decode_eval.criteria=[exact]", "--decode_eval.subset=4",
    "--trainer.max_steps=2", "--trainer.val_check_interval=2",
]


def test_a_first_fit_prints_none_of_the_notices_a_user_cannot_act_on(tmp_path):
    """The default fit (W&B offline logger, checkpoints in a fresh run folder), tiny, as a user runs it in a folder
    that is no git repository: none of the five notices of issue 39 (W&B's anonymous and git root warnings,
    Lightning's non-empty checkpoint folder and litlogger tip, torch's LeafSpec deprecation) comes back."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "WANDB_CONFIG_DIR": str(tmp_path / "cfg"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    for name in (RUN_DIR_ENV, "LOCAL_RANK", "WANDB_SILENT", "WANDB_DIR", "PYTHONWARNINGS"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-m", "lightning_bpd", "fit", *TINY_FIT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "offline-run-" in proc.stdout  # W&B did run (its notices were possible)
    output = proc.stdout + proc.stderr
    assert {name: text for name, text in FIRST_RUN_NOTICES.items() if text in output} == {}


def test_every_fit_prints_progress_lines_where_no_bar_shows_on_a_terminal(tmp_path, monkeypatch, capsys):
    """A fit whose output goes to a file (pytest's captured stdout is no TTY) prints its progress (issue 59): every
    fit carries ProgressLines (once), here the end's line alone (a line a minute)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUN_DIR_ENV, "")  # restored afterwards: the fit sets it
    cli = main(["fit", *TINY_FIT, "--trainer.logger=false", f"--run_dir={tmp_path / 'run'}"])
    assert sum(isinstance(cb, ProgressLines) for cb in cli.trainer.callbacks) == 1
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train: ")]
    assert len(lines) == 1 and lines[0].startswith("train: step 2/2, ") and ", done in 0:" in lines[0]
    assert ", loss " in lines[0]


def test_the_checkpoint_folder_warning_is_hidden_only_for_a_fresh_run_folder(tmp_path):
    """A run folder that held files before the run (a reused --run_dir) still gets Lightning's warning; so does a
    checkpoint folder elsewhere."""
    def shown(run_dir: Path, dirpath: Path) -> bool:
        cb = ModelCheckpoint(dirpath=dirpath)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            hide_own_files_checkpoint_warning([cb], str(run_dir))
            warnings.warn_explicit(f"Checkpoint directory {cb.dirpath} exists and is not empty.", UserWarning,
                                   "model_checkpoint.py", 1, module="pytorch_lightning.callbacks.model_checkpoint")
        return len(caught) == 1

    run = tmp_path / "run"
    assert not shown(run, run)  # a new folder
    run.mkdir()
    assert not shown(run, run)  # an empty one
    assert shown(run, tmp_path / "elsewhere")
    (run / "last.ckpt").write_bytes(b"")
    assert shown(run, run)  # an earlier run's files


def test_a_fit_into_a_finished_run_is_refused_and_its_resume_still_runs(tmp_path, monkeypatch):
    """``fit --run_dir tr`` on a folder holding a run (its last.ckpt) without resuming it would overwrite the run: one
    line, nothing touched. Resuming from a checkpoint in that folder (as the recipe runner does) goes on; resuming
    another run's checkpoint into it is refused too."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUN_DIR_ENV, "")  # restored afterwards: the fit sets it
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the CLI sets it
    fit = ["fit", *TINY_FIT, "--trainer.logger=false"]
    main([*fit, "--run_dir=tr"])
    run = {p.name: p.read_bytes() for p in Path("tr").iterdir()}
    Path("other.ckpt").write_bytes(run["last.ckpt"])
    for extra in ([], ["--ckpt_path=other.ckpt"]):
        with pytest.raises(SystemExit) as err:
            main([*fit, "--run_dir=tr", *extra])
        assert str(err.value) == ("error: --run_dir tr holds a run (last.ckpt): give --ckpt_path tr/last.ckpt to resume "
                                  "it, or a new --run_dir")
        assert {p.name: p.read_bytes() for p in Path("tr").iterdir()} == run
    resumed = main([*fit, "--run_dir=tr", "--ckpt_path=tr/last.ckpt", "--trainer.max_steps=4"])
    assert resumed.trainer.global_step == 4


@pytest.mark.parametrize("option, message", [
    ("--run_dir=afile.txt", "error: --run_dir afile.txt is a file, not a folder: give a new --run_dir"),
    ("--run_dir=afile.txt/sub", ("error: --run_dir afile.txt/sub: afile.txt is a file, not a folder: give another "
                                 "--run_dir")),
    ("--ckpt_path=afile.txt", "error: --ckpt_path afile.txt: not a readable PyTorch checkpoint ("),
])
def test_a_run_dir_or_ckpt_path_that_is_no_such_thing_is_one_line(tmp_path, monkeypatch, option, message):
    """A file as --run_dir (or above it), a text file as --ckpt_path: one line, before anything is written."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(RUN_DIR_ENV, "")  # restored afterwards: the fit sets it
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the CLI sets it
    Path("afile.txt").write_text("notes\n")
    with pytest.raises(SystemExit) as err:
        main(["fit", *TINY_FIT, "--trainer.logger=false", option])
    assert str(err.value).startswith(message) and "\n" not in str(err.value), err.value
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile.txt"]
    assert Path("afile.txt").read_text() == "notes\n"
