"""A new drafter kind needs no change in the commands: a fake kind registered here (one registry line, as a kind's
folder adds) reaches ``decode``, ``bench`` and ``export-heads`` through the registry alone. Its "drafter" is prompt
lookup in disguise, so every output must still equal greedy's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lightning_bpd.drafters import registry
from lightning_bpd.drafters.common.kind import DrafterKind, Spelling

pytest.importorskip("transformers")

CALLS: list[tuple[str, Any]] = []  # what the commands asked of the fake kind


@dataclass(frozen=True)
class FakeKind(DrafterKind):
    def default_k(self, module: Any) -> int:
        return 3

    def load_drafter(self, path: str | Path) -> Any:
        CALLS.append(("load_drafter", str(path)))
        return SimpleNamespace(config=SimpleNamespace(to_dict=lambda: {"from": str(path)}))

    def prepare(self, drafter: Any, model: Any, what: str = "the drafter") -> Any:
        CALLS.append(("prepare", what))
        return drafter

    def build(self, prepared: Any, spelling: Spelling, k: int | None = None) -> Any:
        from lightning_bpd.decoding.proposers import PromptLookup

        if spelling.form != "chain":
            raise self.refuse(spelling)
        CALLS.append(("build", k))
        return PromptLookup(2, (k or 3) - 1)

    def export(self, module: Any, ckpt: str | Path, out: str | Path, layout: str, float32_target: bool = False
               ) -> Path:
        folder = Path(out)
        folder.mkdir(parents=True)
        (folder / "fake.json").write_text(json.dumps({"ckpt": str(ckpt), "format": layout}))
        return folder


KIND = FakeKind(name="fakedraft", title="Fake", module_class_path=f"{__name__}.FakeRun", formats=("fake-format",),
                proposes="copies")


@pytest.fixture
def fake(checkpoint, tmp_path, monkeypatch) -> Path:
    """The fake kind registered, a run of it on the tiny Llama that ``load_model`` returns for ``fake.ckpt``, and
    ``prompts.jsonl``; ``tmp_path``."""
    from lightning_bpd.commands import bench, decode, export_heads
    from lightning_bpd.tasks.lm import LMModule
    from tests.drafters.dflash.tiny import PROMPTS

    class FakeRun(LMModule):
        drafter_kind = "fakedraft"

    module = FakeRun(str(checkpoint), k=2, max_new_tokens=8).eval()
    module.drafter = SimpleNamespace(config=SimpleNamespace(to_dict=lambda: {"fake": True}))
    heads = LMModule(str(checkpoint), k=2, max_new_tokens=8).eval()

    def load_model(path: Any, *args: Any, **kwargs: Any) -> Any:
        return module if Path(path).name == "fake.ckpt" else heads

    monkeypatch.setitem(registry.REGISTERED, "fakedraft", __name__)
    for command in (decode, bench, export_heads):
        monkeypatch.setattr(command, "load_model", load_model)
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    CALLS.clear()
    return tmp_path


def completions(root: Path, capsys, *extra: str) -> tuple[list[str], str]:
    from lightning_bpd.commands.decode import main

    out = root / "out.jsonl"
    main(["--input", str(root / "prompts.jsonl"), "--out", str(out), "--device", "cpu", "--max-new-tokens", "8",
          *extra])
    return [json.loads(line)["completion"] for line in out.read_text().splitlines()], capsys.readouterr().err


def test_a_registered_kind_decodes_through_the_registry(fake, capsys):
    greedy, _ = completions(fake, capsys, "--ckpt", str(fake / "heads"), "--criterion", "greedy")
    got, err = completions(fake, capsys, "--ckpt", str(fake / "fake.ckpt"))  # its own drafter: the default
    assert got == greedy and ("build", 3) in CALLS and re.search(r"mean_accepted_block_size=", err)
    CALLS.clear()
    got, _ = completions(fake, capsys, "--ckpt", str(fake / "heads"), "--proposer", "fakedraft:d.ckpt", "--k", "4")
    assert got == greedy and CALLS[0] == ("load_drafter", "d.ckpt") and ("build", 4) in CALLS
    with pytest.raises(SystemExit, match="a Fake checkpoint's drafter proposes copies"):
        completions(fake, capsys, "--ckpt", str(fake / "fake.ckpt"), "--proposer", "dynamic:4")
    with pytest.raises(SystemExit, match="holds no Fake drafter"):
        completions(fake, capsys, "--ckpt", str(fake / "heads"), "--proposer", "fakedraft")


def test_a_registered_kind_is_a_row_of_the_bench(fake, capsys):
    from lightning_bpd.commands.bench import main

    result = main(["--ckpt", str(fake / "fake.ckpt"), "--batch-sizes", "1", "--warmup", "0", "--device", "cpu",
                   "--max-new-tokens", "8", "--input", str(fake / "prompts.jsonl"), "--peers", "generate,prompt-lookup:2:3"])
    assert "fakedraft" in result["methods"] and result["head_type"] == "fakedraft"
    assert result["batch_sizes"]["1"]["fakedraft"]["differs_from_hf_generate"] == 0
    assert "ours = exact with the Fake drafter" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--tree-nodes: a Fake checkpoint's target has no heads"):
        main(["--ckpt", str(fake / "fake.ckpt"), "--batch-sizes", "1", "--device", "cpu", "--max-new-tokens", "8",
              "--input", str(fake / "prompts.jsonl"), "--tree-nodes", "4"])


def test_a_registered_kind_exports_its_formats(fake):
    from lightning_bpd.commands.export_heads import main

    main(["--ckpt", str(fake / "fake.ckpt"), "--out", str(fake / "out"), "--format", "fake-format"])
    assert json.loads((fake / "out" / "fake.json").read_text())["format"] == "fake-format"
    with pytest.raises(SystemExit, match="--format fake-format takes the checkpoint of a Fake drafter run"):
        main(["--ckpt", str(fake / "heads"), "--out", str(fake / "other"), "--format", "fake-format"])
