"""An EAGLE-3 drafter's checkpoint in the commands (issue 54): ``decode`` continues prompts as greedy with its chains
(the default) or its dynamic trees (``--proposer dynamic:N``), and ``bench-generate`` has the rows ``eagle3`` and
``eagle3+tree<N>``, every row equal to ``generate``; what they cannot do is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from lightning_bpd.benchmarks.lm_generate import GENERATE, LOOKUP
from lightning_bpd.commands.bench import main as bench
from lightning_bpd.commands.bench_generate_lm import OURS_LOOKUP
from lightning_bpd.drafters.eagle3.module import Eagle3Module
from tests.drafters.dflash.test_commands import greedy_texts, run_decode
from tests.drafters.dflash.tiny import PROMPTS, own_sequences, save_dflash

pytestmark = pytest.mark.usefixtures("one_thread")
EAGLE3 = "eagle3"  # the row of an EAGLE-3 run (the row of a drafter kind is its registry name)
N = 12


def fit_eagle3(target: Path, steps: int = 150, layers: tuple[int, ...] = (0, 1)) -> Eagle3Module:
    """An Eagle3Module on ``target`` (features of ``layers``) trained on the target's own greedy continuations of the
    prompts (chains of 4)."""
    torch.manual_seed(0)
    module = Eagle3Module(str(target), target_layer_ids=list(layers), ttt_steps=3, block_size=4, max_new_tokens=N)
    prompts = PROMPTS + [p[: len(p) // 2] for p in PROMPTS if len(p) > 3]
    src = own_sequences(module, prompts)
    optimizer = torch.optim.AdamW([p for p in module.drafter.parameters() if p.requires_grad], lr=3e-3,
                                  betas=(0.9, 0.95))
    for _ in range(steps):
        out = module.step({"src": src})
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    return module.eval()


@pytest.fixture(scope="module")
def fitted(checkpoint, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("eagle3")
    save_dflash(fit_eagle3(checkpoint), root / "eagle3.ckpt")
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root


def test_decode_an_eagle3_checkpoint_continues_as_greedy_with_chains_and_trees(fitted, capsys):
    want = greedy_texts(fitted / "eagle3.ckpt")
    got, block = run_decode(fitted, capsys, ckpt="eagle3.ckpt")  # chains of 4, exact
    assert got == want and block > 2.0
    got, tree_block = run_decode(fitted, capsys, "--proposer", "dynamic:6", ckpt="eagle3.ckpt")  # 6 nodes, 3 deep
    assert got == want and tree_block >= block - 0.5
    got, static = run_decode(fitted, capsys, "--proposer", "tree:0;1;0,0;0,1;0,0,0", ckpt="eagle3.ckpt")  # static
    assert got == want and static >= block - 0.5
    got, two = run_decode(fitted, capsys, "--k", "2", ckpt="eagle3.ckpt")
    assert got == want and 1.0 < two <= 2.0
    got, _ = run_decode(fitted, capsys, "--proposer", "prompt-lookup", ckpt="eagle3.ckpt")  # on the run's base
    assert got == want
    with pytest.raises(SystemExit, match="an EAGLE-3 checkpoint's drafter proposes chains"):
        run_decode(fitted, capsys, "--proposer", "tree:4", ckpt="eagle3.ckpt")
    with pytest.raises(SystemExit, match="is an EAGLE-3 drafter's run"):
        run_decode(fitted, capsys, "--proposer", "dflash", ckpt="eagle3.ckpt")


def test_bench_generate_on_an_eagle3_checkpoint_every_row_equals_generate(fitted, capsys):
    out = fitted / "record.json"
    result = bench(["--ckpt", str(fitted / "eagle3.ckpt"), "--batch-sizes", "1", "3", "--warmup", "1", "--device",
                    "cpu", "--max-new-tokens", str(N), "--json", str(out), "--peers", "generate,prompt-lookup:2:3",
                    "--input", str(fitted / "prompts.jsonl"), "--tree-nodes", "0", "6"])
    tree = f"{EAGLE3}+tree6"
    assert result["methods"] == [GENERATE, LOOKUP, EAGLE3, tree, OURS_LOOKUP]
    assert result["k"] == 4 and result["head_type"] == EAGLE3 and result["drafter"]["vocab_size"] > 0
    for bs in ("1", "3"):
        report = result["batch_sizes"][bs]
        for name in (EAGLE3, tree, OURS_LOOKUP):
            assert report[name]["differs_from_hf_generate"] == 0, name
        assert report[EAGLE3]["mean_accepted_block_size"] > 2.0 and tree in report[EAGLE3]["speedup_over"]
    assert "ours = exact with the EAGLE-3 drafter" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"EAGLE-3 block_size .* got 99"):
        bench(["--ckpt", str(fitted / "eagle3.ckpt"), "--batch-sizes", "1", "--device", "cpu", "--max-new-tokens",
               str(N), "--input", str(fitted / "prompts.jsonl"), "--k", "99"])
