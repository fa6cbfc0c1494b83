"""``where_time_goes`` on a language-modelling checkpoint (issue 46): prompts from a data folder's held-out split
or JSON Lines, greedy and blockwise decodes timed by part as for translation; bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from lightning_bpd.benchmarks.where_time_goes import PARTS, main
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.tasks.lm.tiny_lm import write_checkpoint, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def lm(tmp_path_factory) -> tuple[Path, Path]:
    """k = 4 chained heads saved on their own on a tiny Llama (64 positions), and a data folder."""
    root = tmp_path_factory.mktemp("lm")
    heads = save_heads(LMModule(str(write_checkpoint(root / "llama", positions=64)), k=4, max_new_tokens=5),
                       root / "heads")
    return heads, write_corpus(root / "data")


def check_parts(report: dict, inputs: int) -> None:
    """Every method's parts add up, and its calls are the decoders' (one decode_step per greedy step; per blockwise
    iteration plus the first call on the start token)."""
    greedy, exact = report["methods"]["greedy"], report["methods"]["exact@k4"]
    for r in report["methods"].values():
        assert set(r["share"]) == {*PARTS, "loop"} and sum(r["share"].values()) == pytest.approx(1.0)
        assert sum(r["ms_per_step_by_part"].values()) == pytest.approx(r["ms_per_step"])
        assert r["calls"]["encode"] == inputs
    assert greedy["calls"]["decode_step"] == greedy["steps"] and "ceilings" not in greedy
    assert exact["calls"]["decode_step"] == exact["steps"] + inputs
    assert exact["ceilings"]["measured"] > 0 and "chain_drafts" in exact["calls"]


def test_held_out_prompts_are_timed_by_part(lm, tmp_path, capsys):
    heads, data = lm
    out = tmp_path / "where.json"
    report = main(["--ckpt", str(heads), "--data-root", str(data), "--split", "val", "--inputs", "3",
                   "--max-new-tokens", "6", "--k", "2", "4", "--json", str(out)])
    assert report["inputs"] == 3 and report["max_new_tokens"] == 6 and report["prompts_from"].endswith("(val split)")
    assert set(report["methods"]) == {"greedy", "exact@k2", "exact@k4"}
    check_parts(report, 3)
    assert report["methods"]["greedy"]["steps"] <= 3 * 6
    assert json.loads(out.read_text())["methods"].keys() == report["methods"].keys()
    printed = capsys.readouterr().out
    assert "exact@k4" in printed and "speedup over greedy" in printed


def test_json_lines_prompts_are_timed_by_part(lm, tmp_path):
    heads, _ = lm
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ["def f(x):\n", "x = 1\n", "import os\n"]))
    report = main(["--ckpt", str(heads), "--input", str(prompts), "--inputs", "2"])
    assert report["inputs"] == 2 and report["max_new_tokens"] == 5  # the module's own
    check_parts(report, 2)


def test_bad_input_is_one_line(lm, tmp_path):
    heads, data = lm
    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"prompt": "x = 1\n" * 40}) + "\n")
    for argv, match in [([], "give one of --input FILE.jsonl"),
                        (["--input", str(prompts), "--data-root", str(data)], "give one of --input FILE.jsonl"),
                        (["--input", str(prompts)], "exceeds the model's context \\(64 positions\\)"),
                        (["--data-root", str(data), "--max-new-tokens", "0"], "--max-new-tokens must be >= 1")]:
        with pytest.raises(SystemExit, match=f"^where_time_goes: .*{match}") as err:
            main(["--ckpt", str(heads), *argv])
        assert "\n" not in str(err.value)


def test_a_dflash_checkpoint_is_timed_by_part(tmp_path):
    """The drafter's parts (draft, extend, the drafts' LM head, the block's embeddings) and the verify pass with
    features: one of each per iteration after the first call, the parts adding up."""
    from tests.drafters.dflash.tiny import PROMPTS, write_dflash

    target = write_checkpoint(tmp_path / "llama")
    ckpt = write_dflash(tmp_path / "dflash.ckpt", target, steps=5)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:3]))
    report = main(["--ckpt", str(ckpt), "--input", str(prompts), "--limit", "3", "--max-new-tokens", "10"])
    assert set(report["methods"]) == {"greedy", "dflash@k4"}
    r = report["methods"]["dflash@k4"]
    assert sum(r["share"].values()) == pytest.approx(1.0) and r["calls"]["encode_features"] == 3
    drafted = r["calls"]["draft"]
    assert drafted > 0 and r["calls"]["draft_head"] == drafted == r["calls"]["embed_tokens"]
    assert r["calls"]["decode_step_features"] == r["steps"]  # one verify pass per iteration
    # the prompt's features once per decode, then each verify's accepted ones but the last (the rows are done)
    assert r["calls"]["extend"] == r["calls"]["decode_step_features"]
    assert r["ceilings"]["free_proposals"] > r["ceilings"]["measured"]


def test_an_eagle3_checkpoint_is_timed_by_part_with_chains_and_trees(tmp_path):
    """EAGLE-3 chains of 3: per iteration one verify pass with features and two calls of the drafter's layer (the
    accepted positions with token 1, then the chain's second draft); its trees of 4 nodes, 2 deep: one tree verify
    pass per iteration and one drafter call per depth."""
    from tests.drafters.dflash.tiny import PROMPTS, save_dflash
    from tests.drafters.eagle3.test_commands import fit_eagle3

    target = write_checkpoint(tmp_path / "llama")
    ckpt = save_dflash(fit_eagle3(target, steps=5), tmp_path / "eagle3.ckpt")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:3]))
    report = main(["--ckpt", str(ckpt), "--input", str(prompts), "--limit", "3", "--max-new-tokens", "10",
                   "--k", "3", "--tree-nodes", "4"])
    assert set(report["methods"]) == {"greedy", "eagle3@k3", "eagle3+tree4@k3"}
    chain, tree = report["methods"]["eagle3@k3"], report["methods"]["eagle3+tree4@k3"]
    for r in (chain, tree):
        assert sum(r["share"].values()) == pytest.approx(1.0) and r["calls"]["encode_features"] == 3
        assert r["ceilings"]["free_proposals"] > r["ceilings"]["measured"]
    verified = chain["calls"]["decode_step_features"]
    assert verified == chain["steps"] and chain["calls"]["extend"] == 2 * verified
    assert tree["calls"]["decode_tree_features"] == tree["steps"] == tree["calls"]["extend"] / 2
    with pytest.raises(SystemExit, match="--tree-nodes takes node counts >= 1, with --criterion exact"):
        main(["--ckpt", str(ckpt), "--input", str(prompts), "--tree-nodes", "0"])
    with pytest.raises(SystemExit, match="where_time_goes: an EAGLE-3 tree 3 deep .* 36 candidates, fewer than its 40"):
        main(["--ckpt", str(ckpt), "--input", str(prompts), "--k", "4", "--tree-nodes", "40"])
    with pytest.raises(SystemExit, match="--tree-nodes times an EAGLE-3 drafter's dynamic trees"):
        main(["--ckpt", str(save_heads(LMModule(str(target), k=3), tmp_path / "heads")), "--input", str(prompts),
              "--tree-nodes", "4"])
