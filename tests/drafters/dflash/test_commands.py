"""A trained DFlash drafter in the commands: ``decode`` continues prompts with the target, the drafter proposing
(and ``--proposer dflash:CKPT`` on a heads checkpoint of the same base); ``bench-generate`` has a ``dflash`` row equal
to generate; ``DecodeEval`` decodes ``exact`` with the drafter; bad input is one line."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.benchmarks.lm_generate import GENERATE, LOOKUP
from lightning_bpd.callbacks.decode_eval import build_methods, run_decode_eval
from lightning_bpd.commands.bench import main as bench
from lightning_bpd.commands.bench_generate_lm import OURS_LOOKUP
from lightning_bpd.commands.decode import main as decode_main
from lightning_bpd.decoding import greedy_decode
from lightning_bpd.drafters.dflash.module import check_drafter_fits, load_drafter
from lightning_bpd.drafters.dflash.network import DFlashDrafter
from lightning_bpd.drafters.dflash.proposer import DFlash
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.drafters.dflash.tiny import PROMPTS, write_dflash

pytestmark = pytest.mark.usefixtures("one_thread")
DFLASH = "dflash"  # the row of a DFlash run (the row of a drafter kind is its registry name)
N = 12  # new tokens


@pytest.fixture(scope="module")
def fitted(checkpoint, tmp_path_factory) -> Path:
    """A folder with ``dflash.ckpt`` (a fitted drafter on the tiny Llama ``checkpoint``), ``heads`` (a k=3 heads folder
    on the same base) and ``prompts.jsonl``."""
    root = tmp_path_factory.mktemp("dflash")
    write_dflash(root / "dflash.ckpt", checkpoint)
    save_heads(LMModule(str(checkpoint), k=3, max_new_tokens=N).eval(), root / "heads")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root


def greedy_texts(ckpt: Path) -> list[str]:
    module = lightning_bpd.load_model(ckpt)
    return module.detokenize(greedy_decode(module.model, module.encode_prompts(PROMPTS), N).sequences())


def run_decode(root: Path, capsys, *extra: str, ckpt: str = "dflash.ckpt") -> tuple[list[str], float]:
    """decode's completions and the mean accepted block size of its stats line."""
    out = root / "out.jsonl"
    decode_main(["--ckpt", str(root / ckpt), "--input", str(root / "prompts.jsonl"), "--out", str(out),
                 "--device", "cpu", "--max-new-tokens", str(N), *extra])
    stats = capsys.readouterr().err.strip().splitlines()[-1]
    assert stats.startswith(f"prompts={len(PROMPTS)} iterations=")  # a language model's inputs are prompts
    block = float(re.search(r"mean_accepted_block_size=([0-9.]+)", stats).group(1))
    return [json.loads(line)["completion"] for line in out.read_text().splitlines()], block


def test_decode_a_dflash_checkpoint_continues_as_greedy_with_the_drafter(fitted, capsys):
    want = greedy_texts(fitted / "dflash.ckpt")
    got, block = run_decode(fitted, capsys)  # exact by default, the drafter proposing
    assert got == want and block > 2.5  # blocks of 4: the fitted drafter is accepted (the target alone: 1)
    got, block = run_decode(fitted, capsys, "--proposer", "dflash", "--k", "2")
    assert got == want and 1.5 < block <= 2.0
    got, _ = run_decode(fitted, capsys, "--criterion", "top2")  # another deterministic rule
    assert len(got) == len(PROMPTS)
    got, block = run_decode(fitted, capsys, "--criterion", "greedy")
    assert got == want and block == 1.0
    _, block = run_decode(fitted, capsys, "--precision", "float64")  # the drafter cast to the runtime's dtype
    assert block > 2.5


def test_decode_a_heads_checkpoint_with_the_drafter_of_its_base(fitted, capsys):
    want = greedy_texts(fitted / "heads")
    got, block = run_decode(fitted, capsys, "--proposer", f"dflash:{fitted / 'dflash.ckpt'}", ckpt="heads")
    assert got == want and block > 2.5


def test_decode_samples_losslessly_with_the_drafter(fitted, capsys):
    """Speculative sampling with the drafter's distributions: a completion per prompt, seeded and reproducible."""
    got, block = run_decode(fitted, capsys, "--criterion", "sample_t1", "--seed", "3")
    again, _ = run_decode(fitted, capsys, "--criterion", "sample_t1", "--seed", "3")
    assert len(got) == len(PROMPTS) and got == again and block >= 1.0


def test_bad_dflash_input_is_one_line(fitted, capsys, tmp_path, checkpoint):
    def refused(*extra: str, ckpt: str = "dflash.ckpt") -> str:
        with pytest.raises(SystemExit) as err:
            run_decode(fitted, capsys, *extra, ckpt=ckpt)
        assert "\n" not in str(err.value)
        return str(err.value)

    assert "block_size must be an integer in [2, 4]" in refused("--k", "5")
    assert "holds no DFlash drafter (LMModule)" in refused("--proposer", "dflash", ckpt="heads")
    torch.save({"lightning_bpd_class": "lightning_bpd.tasks.lm.module.LMModule", "state_dict": {}}, tmp_path / "lm.ckpt")
    assert refused("--proposer", f"dflash:{tmp_path / 'lm.ckpt'}", ckpt="heads").endswith(
        "lm.ckpt is not a DFlash drafter checkpoint (LMModule): give the .ckpt of a fit with conf/lm/dflash.yaml")
    assert "no DFlash drafter checkpoint there" in refused("--proposer", f"dflash:{fitted / 'heads'}", ckpt="heads")
    # the target moved: one line naming --base; with --base the checkpoint decodes
    ckpt = torch.load(fitted / "dflash.ckpt", map_location="cpu", weights_only=False)
    ckpt["hyper_parameters"]["pretrained"] = str(tmp_path / "moved")
    torch.save(ckpt, fitted / "moved.ckpt")
    assert refused(ckpt="moved.ckpt").endswith("not a directory (a local Hugging Face causal LM checkpoint with its "
                                               "tokenizer) nor a .gguf file; if the base (target) moved since the run, "
                                               "give --base DIR")
    got, block = run_decode(fitted, capsys, "--base", str(checkpoint), ckpt="moved.ckpt")
    assert got == greedy_texts(fitted / "dflash.ckpt") and block > 2.5


def test_a_drafter_of_another_target_is_refused(fitted):
    drafter = load_drafter(fitted / "dflash.ckpt")
    module = lightning_bpd.load_model(fitted / "heads")
    check_drafter_fits(drafter, module.model)
    other = DFlashDrafter(dataclasses.replace(drafter.config, hidden_size=64, target_layer_ids=(5,)))
    with pytest.raises(ValueError, match=r"another target: hidden_size 64 \(target 32\), target_layer_ids \[5\]"):
        check_drafter_fits(other, module.model)


def bench_run(root: Path, *extra: str) -> dict:
    out = root / "record.json"
    result = bench(["--ckpt", str(root / "dflash.ckpt"), "--batch-sizes", "1", "3", "--warmup", "1", "--device", "cpu",
                    "--max-new-tokens", str(N), "--json", str(out), "--peers", "generate,prompt-lookup:2:3", *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    return result


def test_bench_generate_on_a_dflash_checkpoint_every_row_equals_generate(fitted, capsys):
    result = bench_run(fitted, "--input", str(fitted / "prompts.jsonl"))
    assert result["methods"] == [GENERATE, LOOKUP, DFLASH, OURS_LOOKUP] and result["inputs"] == len(PROMPTS)
    assert result["k"] == 4 and result["head_type"] == "dflash" and result["drafter"]["block_size"] == 4
    for bs in ("1", "3"):
        report = result["batch_sizes"][bs]
        mine = report[DFLASH]
        assert mine["differs_from_hf_generate"] == report[OURS_LOOKUP]["differs_from_hf_generate"] == 0
        assert mine["sentences"] == len(PROMPTS) and mine["tokens"] == report[GENERATE]["tokens"] > 0
        assert mine["mean_accepted_block_size"] > 2.5 and mine["model_calls"] < report[GENERATE]["tokens"]
        assert GENERATE in mine["speedup_over"] and OURS_LOOKUP in mine["speedup_over"]
        assert mine["speedup_over_hf_generate"] > 0
    assert result["batch_sizes"]["1"][LOOKUP]["differs_from_hf_generate"] == 0
    out = capsys.readouterr().out
    assert "ours = exact with the DFlash drafter" in out and re.search(r"\n\s+3 dflash\s", out)


def test_bench_generate_on_a_dflash_checkpoint_bad_input_is_one_line(fitted, capsys):
    with pytest.raises(SystemExit, match=r"^bench: --tree-nodes: a DFlash checkpoint's target has no heads"):
        bench_run(fitted, "--input", str(fitted / "prompts.jsonl"), "--tree-nodes", "4")
    with pytest.raises(SystemExit, match=r"^bench: DFlash block_size must be an integer in \[2, 4\]"):
        bench_run(fitted, "--input", str(fitted / "prompts.jsonl"), "--k", "9")


def test_decode_eval_decodes_exact_with_the_drafter(fitted):
    module = lightning_bpd.load_model(fitted / "dflash.ckpt")
    order, methods = build_methods(module, ["exact"])
    assert order == ["greedy", "exact"] and isinstance(methods["exact"].proposer, DFlash)
    src = module.encode_prompts(PROMPTS)
    from lightning_bpd.evaluation import EvalBatch

    batch = EvalBatch(src, N, references=["x = 1"] * len(PROMPTS), sources=list(PROMPTS))
    metrics, _ = run_decode_eval(module, [batch], ["exact"])
    assert metrics["exact/matches_greedy"] == 1.0 and metrics["exact/mean_accepted_block_size"] > 2.5
    assert metrics["exact/model_calls"] < metrics["greedy/model_calls"] and "exact/speedup" in metrics
