"""Every YAML config in conf/ must parse against the classes it names (no training, no data)."""

from pathlib import Path

import pytest

from lightning_bpd.cli import BPDCLI, CONF_DIR

CONFIGS = sorted(p for p in CONF_DIR.rglob("*.yaml") if "sweeps" not in p.parts)


class ParseOnly(BPDCLI):
    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_config_parses(path: Path):
    cli = ParseOnly(model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
                    parser_kwargs={"parser_mode": "omegaconf"}, args=["--config", str(path)], run=False,
                    auto_configure_optimizers=False)
    cfg = cli.config
    assert cfg.model.class_path.startswith("lightning_bpd.tasks.")
    assert cfg.data.class_path.startswith("lightning_bpd.tasks.")
    k = cfg.model.init_args.k
    assert 1 <= k <= 16


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert {"default.yaml", "multi30k_base.yaml", "multi30k_k8_finetune.yaml", "multi30k_k8_frozen.yaml"} <= names
