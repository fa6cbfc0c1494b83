"""Every YAML config in conf/ must parse against the classes it names (no training, no data)."""

from pathlib import Path

import pytest

from lightning_bpd.commands.cli import BPDCLI, CONF_DIR, to_plain

# conf/common/ holds the shared parts that recipes name in their _base_, not configs to run; conf/recipes/*.yaml
# are pipelines (python -m lightning_bpd recipe), their stage configs are in conf/recipes/<recipe>/
CONFIGS = sorted(p for p in CONF_DIR.rglob("*.yaml")
                 if not {"sweeps", "common"} & set(p.parts) and p.parent != CONF_DIR / "recipes")


class ParseOnly(BPDCLI):
    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass


def parse(*args: str) -> ParseOnly:
    """The CLI's parse of these arguments (as after ``fit``), nothing built."""
    return ParseOnly(model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
                     parser_kwargs={"parser_mode": "omegaconf"}, args=list(args), run=False,
                     auto_configure_optimizers=False)


def resolved(path: Path) -> dict:
    """Every value a config file resolves to (its bases applied, the parser's defaults filled in)."""
    values = to_plain(parse("--config", str(path)).config)
    for key in ("config", "_base_"):  # the files read, not values
        values.pop(key, None)
    return values


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(CONF_DIR)))
def test_config_parses(path: Path):
    cfg = parse("--config", str(path)).config
    assert cfg.model.class_path.startswith(("lightning_bpd.tasks.", "lightning_bpd.drafters."))
    assert cfg.data.class_path.startswith("lightning_bpd.tasks.")
    args = cfg.model.init_args  # a Hugging Face model: its own k; a DFlash drafter: its block size
    k = args.get("architecture.k", args.get("k", args.get("block_size")))
    assert 1 <= k <= 16


def test_there_are_configs():
    names = {p.name for p in CONFIGS}
    assert {"default.yaml", "multi30k_base.yaml", "multi30k_k8_finetune.yaml", "multi30k_k8_frozen.yaml"} <= names
