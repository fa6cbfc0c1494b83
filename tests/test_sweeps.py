"""Every W&B sweep config expands into runs whose arguments the CLI accepts (parse only, no training)."""

import itertools
from pathlib import Path

import pytest
import yaml

from lightning_bpd.cli import CONF_DIR, REPO_ROOT
from tests.test_configs import ParseOnly

SWEEPS = sorted((CONF_DIR / "sweeps").glob("*.yaml"))


def expand(sweep: dict) -> list[list[str]]:
    """The argument lists a `wandb agent` passes for a grid sweep (``--key=value``)."""
    params = sweep["parameters"]
    keys = list(params)
    grids = [params[k]["values"] if "values" in params[k] else [params[k]["value"]] for k in keys]
    runs = []
    for combo in itertools.product(*grids):
        args = []
        for key, value in zip(keys, combo):
            text = str(value).lower() if isinstance(value, bool) else str(value)
            args.append(f"--{key}={text}")
        runs.append(args)
    return runs


def command_args(sweep: dict, run_args: list[str]) -> list[str]:
    cmd = []
    for part in sweep["command"]:
        if part == "${args}":
            cmd += run_args
        elif part not in ("${env}", "${interpreter}", "-m", "lightning_bpd"):
            cmd.append(part)
    return cmd


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_every_sweep_run_parses(path: Path):
    sweep = yaml.safe_load(path.read_text())
    assert sweep["method"] == "grid" and sweep["command"][:5] == ["${env}", "${interpreter}", "-m", "lightning_bpd", "fit"]
    runs = expand(sweep)
    assert len(runs) >= 12
    for run_args in runs:
        cmd = command_args(sweep, run_args)
        assert cmd[0] == "fit"
        cmd = [str(REPO_ROOT / a) if a.startswith("conf/") else a for a in cmd[1:]]
        cli = ParseOnly(model_class=None, datamodule_class=None, subclass_mode_model=True, subclass_mode_data=True,
                        parser_kwargs={"parser_mode": "omegaconf"}, args=cmd, run=False,
                        auto_configure_optimizers=False)
        for arg in run_args:
            key, _, value = arg[2:].partition("=")
            node = cli.config
            for part in key.split("."):
                node = node[part]
            norm = lambda s: s.lower().replace(" ", "").replace("'", "")
            assert norm(str(node)) == norm(value), key


def test_the_paper_grids_are_covered():
    t1 = yaml.safe_load((CONF_DIR / "sweeps/table1_translation.yaml").read_text())["parameters"]
    assert t1["model.init_args.k"]["values"] == [1, 2, 4, 6, 8, 10]
    assert t1["model.init_args.freeze_base"]["values"] == [True, False]
    assert len(t1["data.init_args.root"]["values"]) == 2
