"""Every W&B sweep config expands into runs whose arguments the CLI accepts and whose model can be built
(on the meta device: no weights, no data, no training)."""

import itertools
from pathlib import Path

import pytest
import torch
import yaml

from lightning_bpd.commands.cli import CONF_DIR, REPO_ROOT, import_object, to_plain
from tests.test_configs import ParseOnly, resolved

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
    assert len(runs) >= 10
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
        # the module's own checks (k range, freeze_base with k = 1, ...) run at construction
        init_args = to_plain(cli.config.model.init_args)
        for key in ("src_vocab_size", "tgt_vocab_size"):
            if init_args.get("architecture", {}).get(key, 0) is None:
                init_args["architecture"][key] = 100  # linked from the data's tokenizer at run time
        with torch.device("meta"):
            import_object(cli.config.model.class_path)(**init_args)


def test_the_paper_grids_are_covered():
    """Table 1: k = 1 is stage 1 (a base config per data), k 2..10 x frozen/fine-tuned per data; Table 2."""
    sweeps = {name: yaml.safe_load((CONF_DIR / f"sweeps/{name}.yaml").read_text())["parameters"]
              for name in ("table1_translation", "table1_translation_distilled", "table2_superres")}
    roots = set()
    for name in ("table1_translation", "table1_translation_distilled"):
        grid = sweeps[name]
        assert grid["model.init_args.architecture.k"]["values"] == [2, 4, 6, 8, 10]
        assert grid["model.init_args.training.freeze_base"]["values"] == [True, False]
        roots.add(grid["data.init_args.root"]["value"])
    bases = [resolved(CONF_DIR / f"translation/{name}.yaml") for name in ("multi30k_base", "multi30k_distilled_base")]
    assert {b["data"]["init_args"]["root"] for b in bases} == roots
    assert all(b["model"]["init_args"]["architecture"]["k"] == 1 for b in bases)
    t2 = sweeps["table2_superres"]
    assert t2["model.init_args.architecture.k"]["values"] == [2, 4, 6, 8, 10]
    assert t2["model.init_args.training.freeze_base"]["values"] == [True, False]
    assert t2["decode_eval.criteria"]["values"] == ["[exact]", "[eps2]"]
