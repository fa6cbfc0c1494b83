"""``bench --run`` (issue 54's one table, once ``bench-drafters``, which still runs with one deprecation line): heads
and drafter runs of one base on the same prompts, every row equal to ``generate``, each with its training cost; a run
under another proposer (``NAME=CKPT@PROPOSER``); runs of another base, bad pairs and unknown names are one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

from lightning_bpd.benchmarks.lm_generate import GENERATE, LOOKUP
from lightning_bpd.callbacks.training_clock import STATE_KEY
from lightning_bpd.commands.bench import main as bench
from lightning_bpd.commands.bench_generate_lm import OURS_LOOKUP
from lightning_bpd.commands.old_benches import DEPRECATED, bench_drafters
from lightning_bpd.tasks.lm.module import LMModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.drafters.dflash.tiny import PROMPTS, fit_drafter, save_dflash
from tests.drafters.eagle3.test_commands import fit_eagle3

pytestmark = pytest.mark.usefixtures("one_thread")
N = 10


def with_clock(path: Path, seconds: float) -> Path:
    """The checkpoint at ``path`` with a training clock of ``seconds`` (as fit's TrainingClock saves it)."""
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    ckpt.setdefault("callbacks", {})[STATE_KEY] = {"train_seconds": seconds}
    ckpt["global_step"] = 7
    torch.save(ckpt, path)
    return path


@pytest.fixture(scope="module")
def runs(checkpoint, tmp_path_factory) -> Path:
    """chained and medusa heads folders, a DFlash and an EAGLE-3 checkpoint (clocks of 90 s and 30 s), all on the
    tiny Llama ``checkpoint``, and the prompts."""
    root = tmp_path_factory.mktemp("drafters")
    save_heads(LMModule(str(checkpoint), k=3, max_new_tokens=N).eval(), root / "chained")
    save_heads(LMModule(str(checkpoint), k=3, head_type="medusa", max_new_tokens=N).eval(), root / "medusa")
    with_clock(save_dflash(fit_drafter(checkpoint, steps=120), root / "dflash.ckpt"), 90.0)
    with_clock(save_dflash(fit_eagle3(checkpoint, steps=60), root / "eagle3.ckpt"), 30.0)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root


def args_of(root: Path, *runs: str) -> list[str]:
    pairs = [f"{name}={root / name}{'.ckpt' if name in ('dflash', 'eagle3') else ''}" for name in runs]
    return [x for pair in pairs for x in ("--run", pair)] + [
        "--input", str(root / "prompts.jsonl"), "--max-new-tokens", str(N), "--warmup", "1",
        "--prompt-lookup-tokens", "3"]


def new_args(root: Path, *runs: str) -> list[str]:
    """:func:`args_of` in ``bench``'s spelling: prompt lookup's settings in ``--peers``, the device named."""
    old = args_of(root, *runs)
    return [*old[: old.index("--prompt-lookup-tokens")], "--peers", "generate,prompt-lookup:2:3", "--device", "cpu"]


def test_one_table_of_heads_and_drafters_every_row_equals_generate(runs, checkpoint, capsys):
    out = runs / "table.json"
    result = bench([*new_args(runs, "chained", "medusa", "dflash", "eagle3"), "--batch-sizes", "1", "2",
                    "--tree-nodes", "0", "5", "--minutes", "chained=2.5", "--k", "eagle3=3", "--json", str(out)])
    assert result["methods"] == [GENERATE, LOOKUP, "chained", "chained+nodes5", "medusa", "medusa+nodes5", "dflash",
                                 "eagle3", "eagle3+tree5", OURS_LOOKUP]
    for bs in ("1", "2"):
        report = result["batch_sizes"][bs]
        for name in result["methods"][1:]:
            if "skipped" not in report[name]:
                assert report[name]["differs_from_hf_generate"] == 0, (bs, name)
        assert report["dflash"]["mean_accepted_block_size"] > 1.0
        assert report["eagle3"]["mean_accepted_block_size"] > 1.0
    assert "skipped" in result["batch_sizes"]["2"][LOOKUP]  # transformers' assisted loop: batch 1 only
    rows = {r["row"]: r for r in result["tables"]["1"]}
    assert rows["chained"]["proposer"] == "chained heads" and rows["medusa+nodes5"]["proposer"] == "medusa heads"
    assert rows["eagle3+tree5"]["proposer"] == "EAGLE-3" and rows["dflash"]["proposer"] == "DFlash"
    assert rows["chained"]["training_minutes"] == 2.5 and rows["medusa"]["training_minutes"] is None
    assert rows["dflash"]["training_minutes"] == pytest.approx(1.5) and rows["eagle3"]["steps"] == 7
    assert rows[GENERATE]["speedup_over_hf_generate"] == pytest.approx(1.0)
    # the proposers' own parameters, never the base's: Medusa's heads 2 and 3 are one D x D block and bias each
    d = json.loads((checkpoint / "config.json").read_text())["hidden_size"]
    assert rows["medusa"]["parameters"] == 2 * (d * d + d)
    assert rows["dflash"]["parameters"] > 0 and rows["chained"]["parameters"] > 0
    saved = json.loads(out.read_text())
    assert saved["runs"]["eagle3"]["minutes_from"] == "the checkpoint's training clock"
    assert saved["runs"]["eagle3"]["k"] == 3 and saved["runs"]["dflash"]["k"] is None
    assert "| eagle3+tree5 | EAGLE-3 |" in capsys.readouterr().out


def test_a_run_proposes_as_its_proposer_spelling_says_and_the_old_command_still_runs(runs, capsys):
    pairs = [f"heads4={runs / 'chained'}@tree:4", f"lookup={runs / 'chained'}@prompt-lookup:2:3",
             f"e3={runs / 'eagle3.ckpt'}@dynamic:5"]
    argv = [x for pair in pairs for x in ("--run", pair)]
    argv = [*argv, "--input", str(runs / "prompts.jsonl"), "--max-new-tokens", str(N), "--warmup", "0",
            "--batch-sizes", "1", "--device", "cpu", "--peers", "generate"]
    result = bench(argv)
    assert result["methods"] == [GENERATE, LOOKUP, "heads4", "lookup", "e3", OURS_LOOKUP]
    assert all(result["batch_sizes"]["1"][r]["differs_from_hf_generate"] == 0 for r in ("heads4", "lookup", "e3"))
    assert result["runs"]["e3"]["spelling"] == "dynamic:5" and result["runs"]["e3"]["proposer"] == "EAGLE-3"
    capsys.readouterr()
    with pytest.raises(SystemExit, match="a DFlash checkpoint's drafter proposes blocks"):
        bench(["--run", f"d={runs / 'dflash.ckpt'}@dynamic:5", *argv[6:]])
    with pytest.raises(SystemExit, match="^bench: --peers ctranslate2 with --run: CTranslate2 peers are for seq2seq"):
        bench([*argv, "--peers", "ctranslate2"])
    capsys.readouterr()
    old = bench_drafters([*args_of(runs, "chained"), "--batch-sizes", "1", "--warmup", "0"])
    assert old["methods"] == [GENERATE, LOOKUP, "chained", OURS_LOOKUP] and old["prompt_lookup_num_tokens"] == 3
    assert old["inputs"] == len(PROMPTS) and list(old["batch_sizes"]) == ["1"]
    err = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]  # less transformers' bars
    assert len(err) == 1 and err[0].startswith(DEPRECATED) and "--peers generate,prompt-lookup:2:3" in err[0], err


def test_runs_of_another_base_bad_pairs_and_unknown_names_are_one_line(runs, checkpoint, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(checkpoint, other)
    weights = safetensors_torch.load_file(other / "model.safetensors")
    key = next(k for k in weights if k.endswith("mlp.up_proj.weight"))
    weights[key] = weights[key] + 1e-3
    safetensors_torch.save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    save_heads(LMModule(str(other), k=3, max_new_tokens=N).eval(), tmp_path / "moved")
    base = new_args(runs, "chained")
    with pytest.raises(SystemExit, match=rf"--run moved=.*: its base is not run chained's \(other weights \({key}\)\)"):
        bench([*base, "--run", f"moved={tmp_path / 'moved'}"])
    with pytest.raises(SystemExit, match="--run takes NAME=VALUE, got 'chained'"):
        bench([*base, "--run", "chained"])
    with pytest.raises(SystemExit, match="--run: the name 'chained' is given twice"):
        bench([*base, "--run", f"chained={runs / 'medusa'}"])
    with pytest.raises(SystemExit, match="--minutes names no --run: medusa"):
        bench([*base, "--minutes", "medusa=3"])
    with pytest.raises(SystemExit, match="--run: the name 'hf_generate' is taken by a row of the table"):
        bench([*base, "--run", f"hf_generate={runs / 'medusa'}"])
    with pytest.raises(SystemExit, match="--run: the name 'a\\+b' is taken by a row"):
        bench([*base, "--run", f"a+b={runs / 'medusa'}"])
    with pytest.raises(SystemExit, match="--batch-sizes and --limit take integers >= 1"):
        bench([*base, "--batch-sizes", "0"])
    with pytest.raises(SystemExit, match="--run eagle3=.*--tree-nodes auto picks a tree of the heads"):
        bench([*new_args(runs, "eagle3"), "--tree-nodes", "auto"])
    with pytest.raises(SystemExit, match="--k chained=two: not an integer"):
        bench([*base, "--k", "chained=two"])
    with pytest.raises(SystemExit, match=r"--run chained=.*--k must lie in \[1, 3\].*got 9"):
        bench([*base, "--k", "chained=9"])
    with pytest.raises(SystemExit, match=r"--run gone=.*no checkpoint at"):
        bench([*base, "--run", f"gone={tmp_path / 'gone.ckpt'}"])


def test_a_missing_base_of_a_base_only_run_names_what_it_takes(runs, tmp_path):
    with pytest.raises(SystemExit, match=r"--run r=.*no checkpoint at .* \(or, with @greedy, @prompt-lookup or "
                                         r"@retrieval:FILE, a \.gguf or Hugging Face folder\)$"):
        bench([*new_args(runs, "medusa"), "--run", f"r={tmp_path / 'nobase'}@greedy"])
