"""Configs that build on others (``_base_``): the order files apply in, the errors, and conf/ itself.

To check that a change of conf/ leaves every recipe's values as they were::

    python -m tests.test_config_bases /tmp/before.json          # before the change
    LIGHTNING_BPD_CONFIG_SNAPSHOT=/tmp/before.json python -m pytest tests/test_config_bases.py
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.config_bases import base_files
from tests.test_configs import CONFIGS, parse, resolved


def translation(name: str) -> Path:
    return CONF_DIR / "translation" / f"{name}.yaml"


def superres(name: str) -> Path:
    return CONF_DIR / "superres" / f"{name}.yaml"


def write(folder: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def differences(a: dict, b: dict, prefix: str = "") -> set[str]:
    """The dotted keys whose values differ between two resolved configs."""
    keys = set(a) | set(b)
    found = set()
    for key in keys:
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            found |= differences(x, y, f"{prefix}{key}.")
        elif x != y:
            found.add(f"{prefix}{key}")
    return found


def test_bases_apply_first_in_order_and_once(tmp_path):
    write(tmp_path, {
        "common/a.yaml": "seed_everything: 1\n",
        "common/b.yaml": "_base_: a.yaml\n",
        "c.yaml": "_base_: common/a.yaml\n",
        "recipe.yaml": "_base_: [common/b.yaml, c.yaml]\n",
    })
    order = [p.resolve() for p in base_files(tmp_path / "recipe.yaml")]
    assert order == [(tmp_path / name).resolve() for name in ("common/a.yaml", "common/b.yaml", "c.yaml")]
    assert base_files(tmp_path / "common/a.yaml") == []


def test_a_recipe_overrides_its_base_and_appends_with_plus(tmp_path):
    write(tmp_path, {
        "base.yaml": (f"_base_: {CONF_DIR / 'common/trainer.yaml'}\n"
                      "trainer: {max_steps: 7}\n"
                      "model:\n  class_path: lightning_bpd.tasks.translation.TranslationModule\n"
                      "  init_args: {architecture: {d_model: 64, k: 2}}\n"
                      "data: {class_path: lightning_bpd.tasks.translation.TranslationDataModule}\n"),
        "recipe.yaml": ("_base_: base.yaml\n"
                        "trainer:\n  callbacks+:\n    - class_path: pytorch_lightning.callbacks.LearningRateMonitor\n"
                        "model: {init_args: {architecture: {k: 3}}}\n"),
    })
    cfg = parse("--config", str(tmp_path / "recipe.yaml"), "--model.init_args.training.lr=0.5").config
    assert (cfg.trainer.max_steps, cfg.trainer.max_epochs) == (7, -1)  # the recipe's base, and its base's
    model = cfg.model.init_args
    assert (model.architecture.d_model, model.architecture.k, model.training.lr) == (64, 3, 0.5)
    assert [cb.class_path.rsplit(".", 1)[1] for cb in cfg.trainer.callbacks] == ["ModelCheckpoint",
                                                                                  "LearningRateMonitor"]


@pytest.mark.parametrize("files, message", [
    ({"recipe.yaml": "_base_: nowhere.yaml\n"}, "recipe.yaml: _base_ {root}/nowhere.yaml does not exist"),
    ({"recipe.yaml": "_base_: [a.yaml]\n", "a.yaml": "_base_: recipe.yaml\n"}, "_base_ cycle"),
    ({"recipe.yaml": "_base_: {a: 1}\n"}, "_base_ must be a file name or a list of file names"),
])
def test_a_bad_base_is_one_error_line(tmp_path, monkeypatch, files, message):
    write(tmp_path, files)
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # main sets it for DDP's re-runs
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(tmp_path / "recipe.yaml")])
    text = str(exit_.value)
    assert text.startswith("error: ") and message.format(root=tmp_path) in text and "\n" not in text


def test_a_resolved_config_has_no_base_and_reads_back(tmp_path):
    cli = parse("--config", str(translation("multi30k_k8_finetune")))
    text = cli.parser.dump(cli.config, skip_unset=False)  # as a run saves it
    assert "_base_" not in text
    (tmp_path / "config.yaml").write_text(text)
    assert resolved(tmp_path / "config.yaml") == resolved(translation("multi30k_k8_finetune"))


def test_stage_two_fine_tuning_is_the_frozen_recipe_with_four_values():
    frozen, finetune = resolved(translation("multi30k_k8_frozen")), resolved(translation("multi30k_k8_finetune"))
    assert differences(frozen, finetune) == {f"model.init_args.training.{key}" for key in
                                             ("freeze_base", "init_from", "lr", "warmup_steps")}
    frozen, finetune = resolved(superres("celeba_frozen")), resolved(superres("celeba_finetune"))
    assert differences(frozen, finetune) == {"model.init_args.training.freeze_base", "model.init_args.training.lr"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_every_recipe_has_the_shared_trainer_logger_and_callbacks(path):
    cfg = resolved(path)
    trainer = cfg["trainer"]
    assert (cfg["seed_everything"], trainer["devices"], trainer["max_epochs"], trainer["gradient_clip_val"]) == (
        0, 1, -1, 1.0)
    assert trainer["logger"]["class_path"] == "pytorch_lightning.loggers.WandbLogger"
    assert {k: trainer["logger"]["init_args"][k] for k in ("project", "offline")} == {
        "project": "lightning_bpd", "offline": True}
    checkpoint = trainer["callbacks"][0]
    assert checkpoint["class_path"] == "pytorch_lightning.callbacks.ModelCheckpoint"
    assert {k: checkpoint["init_args"][k] for k in ("filename", "monitor", "save_last")} == {
        "filename": "best-{step}", "monitor": "val/loss", "save_last": True}
    if "translation" in path.parts:
        assert trainer["use_distributed_sampler"] is False
        assert [cb["class_path"].rsplit(".", 1)[1] for cb in trainer["callbacks"]] == ["ModelCheckpoint",
                                                                                       "LearningRateMonitor"]


def snapshot(conf_dir: Path = CONF_DIR) -> dict[str, dict]:
    """Every config of ``conf_dir`` (not sweeps, not common parts), resolved."""
    configs = sorted(p for p in conf_dir.rglob("*.yaml")
                     if not {"sweeps", "common"} & set(p.parts) and p.parent != conf_dir / "recipes")
    return {str(p.relative_to(conf_dir)): resolved(p) for p in configs}


SNAPSHOT = os.environ.get("LIGHTNING_BPD_CONFIG_SNAPSHOT")


@pytest.mark.skipif(not SNAPSHOT, reason="set LIGHTNING_BPD_CONFIG_SNAPSHOT to a snapshot written before a change")
def test_every_config_resolves_as_in_the_snapshot():
    before = json.loads(Path(SNAPSHOT).read_text())
    now = json.loads(json.dumps(snapshot(), default=str))
    assert sorted(now) == sorted(before)
    for name in before:
        assert differences(before[name], now[name]) == set(), name
        assert json.dumps(now[name], sort_keys=True) == json.dumps(before[name], sort_keys=True), name  # 1 vs 1.0


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(snapshot(), indent=1, sort_keys=True, default=str))


@pytest.mark.parametrize("text, message", [
    ("model: {init_args: {training: {lrr: 1}}}\n", "model.init_args.training.lrr: unknown option 'lrr'"),
    ("model: {init_args: {architecture: {image: {zzz: 1}}}}\n", "model.init_args.architecture.image.zzz: unknown option"),
    ("model: {init_args: {lr: 0.1}}\n", "unknown option 'lr' (did you mean model.init_args.training.lr?)"),
    ("model: {init_args: {training: {lr: abc}}}\n", "model.init_args.training.lr: Expected a <class 'float'>"),
])
def test_a_bad_model_option_in_a_file_is_one_error_line(tmp_path, monkeypatch, text, message):
    write(tmp_path, {"recipe.yaml": f"_base_: {CONF_DIR / 'superres/default.yaml'}\n{text}"})
    monkeypatch.setattr(sys, "argv", sys.argv[:1])  # main sets it for DDP's re-runs
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(tmp_path / "recipe.yaml")])
    text = str(exit_.value)
    assert text.startswith("error: ") and message in text and "\n" not in text
