"""The CLI's preparation of a parsed config before anything is built: run folder, loggers, callbacks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pytorch_lightning.callbacks import ModelCheckpoint

from lightning_bpd.cli import (
    DEFAULT_CONFIG,
    RUN_DIR_ENV,
    drop_lr_monitor_without_logger,
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
