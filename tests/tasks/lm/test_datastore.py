"""The retrieval datastore in the commands: ``datastore`` writes a split's tokens as the target's tokenizer reads
them; ``decode --proposer retrieval:FILE`` continues as greedy (a datastore of the model's own text gets accepted);
``bench --run NAME=CKPT@retrieval:FILE`` has a row equal to generate; bad input is one line."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import lightning_bpd
from lightning_bpd.commands.bench import main as bench
from lightning_bpd.commands.datastore import main as datastore
from lightning_bpd.commands.decode import main as decode_main
from lightning_bpd.commands.proposer_option import proposer_arg
from lightning_bpd.decoding import greedy_decode
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.lm.datastore import FORMAT, load_datastores, read_record
from lightning_bpd.tasks.translation.hf_module import save_heads

pytestmark = pytest.mark.usefixtures("one_thread")
LINES = ["import os\n", "import sys\n", "def add(a, b):\n", "    return a + b\n", "class Stack:\n",
         "    def push(self, x):\n", "        self.items.append(x)\n", "x = 1\n", "y = [1, 2, 3]\n"]
N = 12  # new tokens


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory) -> Path:
    """``heads`` (a k=2 heads run of the tiny Llama), ``data`` (a folder of source files), ``prompts.jsonl`` (its
    first prompt windows), ``greedy.json`` (the model's greedy completions of them), ``store.pt`` (a datastore of the
    folder's text) and ``greedy.pt`` (the same and the model's own greedy continuations of its prompt windows)."""
    root = tmp_path_factory.mktemp("datastore")
    save_heads(LMModule(str(checkpoint), k=2, max_new_tokens=N).eval(), root / "heads")
    data = root / "data"
    data.mkdir()
    for i in range(6):
        (data / f"file{i}.py").write_text("".join(LINES[(i + j) % len(LINES)] for j in range(24)))
    from lightning_bpd.tasks.lm.datamodule import LMDataModule

    dm = LMDataModule(str(data), str(checkpoint), val_fraction=0, test_fraction=0, prompt_tokens=24)
    prompts = dm.eval_prompts("train", 4)[0]
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    loaded = lightning_bpd.load_model(root / "heads")
    texts = loaded.detokenize(greedy_decode(loaded.model, loaded.encode_prompts(prompts), N).sequences())
    (root / "greedy.json").write_text(json.dumps(texts))
    common = ["--pretrained", str(checkpoint), "--data-root", str(data), "--val-fraction", "0", "--test-fraction", "0"]
    datastore([*common, "--out", str(root / "store.pt")])
    datastore([*common, "--out", str(root / "greedy.pt"), "--greedy", "8", "--prompt-tokens", "24",
               "--max-new-tokens", str(N),
               "--batch-size", "3"])
    return root


def test_the_datastore_holds_the_split_as_the_tokenizer_reads_it(built, checkpoint, capsys):
    record = read_record(built / "store.pt")
    assert record["format"] == FORMAT and record["tokens"].dtype == torch.int32
    assert record["data"]["split"] == "train" and record["tokenizer"]["size"] > 0
    store, greedy = load_datastores(built / "store.pt")
    assert len(store) == record["tokens"].numel() > 6 * 24 and greedy is None


def run_decode(root: Path, capsys, *extra: str) -> tuple[list[str], float]:
    out = root / "out.jsonl"
    decode_main(["--ckpt", str(root / "heads"), "--input", str(root / "prompts.jsonl"), "--out", str(out),
                 "--device", "cpu", "--max-new-tokens", str(N), *extra])
    stats = capsys.readouterr().err.strip().splitlines()[-1]
    block = float(re.search(r"mean_accepted_block_size=([0-9.]+)", stats).group(1))
    return [json.loads(line)["completion"] for line in out.read_text().splitlines()], block


def test_decode_with_retrieval_continues_as_greedy(built, capsys):
    want = json.loads((built / "greedy.json").read_text())
    got, block = run_decode(built, capsys, "--proposer", f"retrieval:{built / 'greedy.pt'}:6:4")
    assert got == want
    assert block > 3.0, "the model's own continuations are in the datastore: they get accepted"
    got, plain = run_decode(built, capsys, "--proposer", f"retrieval:{built / 'store.pt'}", "--batch-size", "3")
    assert got == want and plain < block


def test_bench_has_a_retrieval_row_equal_to_generate(built, checkpoint):
    result = bench(["--run", f"r={built / 'heads'}@retrieval:{built / 'greedy.pt'}:6:4",
                    "--run", f"bare={checkpoint}@retrieval:{built / 'greedy.pt'}:6:4", "--input",
                    str(built / "prompts.jsonl"), "--max-new-tokens", str(N), "--warmup", "0", "--batch-sizes", "1",
                    "2", "--device", "cpu", "--peers", "generate"])
    for bs in ("1", "2"):
        assert result["batch_sizes"][bs]["r"]["differs_from_hf_generate"] == 0
        assert result["batch_sizes"][bs]["bare"]["differs_from_hf_generate"] == 0  # the base folder, no run
    assert result["batch_sizes"]["1"]["r"]["mean_accepted_block_size"] > 3.0
    assert result["runs"]["r"]["spelling"] == f"retrieval:{built / 'greedy.pt'}:6:4"
    assert result["runs"]["r"]["proposer"] == "retrieval" and result["runs"]["r"]["parameters"] == 0


def test_bench_at_int8_compares_every_row_with_our_own_greedy(built, checkpoint):
    """``--run NAME=BASE@greedy``: our runtime's greedy at ``--precision``, the reference of an int8 table (whose rows
    cannot be generate's float32 text): every row of ours is counted against it too."""
    from lightning_bpd.kernels import int8

    if not int8.available():
        pytest.skip("no int8 kernel")
    result = bench(["--run", f"g={checkpoint}@greedy", "--run", f"r={checkpoint}@retrieval:{built / 'greedy.pt'}:6:4",
                    "--input", str(built / "prompts.jsonl"), "--max-new-tokens", str(N), "--warmup", "0",
                    "--batch-sizes", "1", "2", "--device", "cpu", "--precision", "int8", "--peers", "generate"])
    for bs in ("1", "2"):
        rows = {r["row"]: r for r in result["tables"][bs]}
        assert rows["g"]["tokens_per_call"] == 1.0 and rows["g"]["proposer"] == "greedy (ours)"
        assert rows["r"]["differs_from_own_greedy"] == 0 and rows["prompt_lookup"]["differs_from_own_greedy"] == 0
        assert "differs_from_own_greedy" not in rows["g"] and "differs_from_own_greedy" not in rows["hf_generate"]
    assert result["runs"]["g"]["parameters"] == 0 and result["options"]["precision"] == "int8"


def test_the_spelling_reads_the_tree_size_after_the_path():
    choice = proposer_arg("retrieval:runs/a:b.pt:12:8")
    assert (choice.kind, choice.ckpt, choice.tree_size) == ("retrieval", "runs/a:b.pt", (12, 8, 0))
    assert proposer_arg("retrieval:s.pt:4").tree_size == (4, 6, 0) and proposer_arg("retrieval:s.pt").tree_size == (8, 6, 0)
    assert proposer_arg("retrieval:s.pt:8:6:16").tree_size == (8, 6, 16)
    with pytest.raises(Exception, match="INPUTS >= 0"):
        proposer_arg("retrieval:s.pt:8:6:-1")


def test_bad_input_is_one_line(built, checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit, match="^datastore: --data-root .*missing: not a folder"):
        datastore(["--pretrained", str(checkpoint), "--data-root", str(tmp_path / "missing"), "--out",
                   str(tmp_path / "s.pt")])
    with pytest.raises(SystemExit, match="^datastore: --out .*: a folder, not a file"):
        datastore(["--pretrained", str(checkpoint), "--data-root", str(built / "data"), "--out", str(tmp_path)])
    bad = tmp_path / "bad.pt"
    bad.write_bytes((built / "store.pt").read_bytes()[:100])  # truncated
    with pytest.raises(SystemExit, match=r"^decode: .*bad\.pt: not a readable datastore \("):
        run_decode(built, capsys, "--proposer", f"retrieval:{bad}")
    with pytest.raises(SystemExit, match=r"^decode: .*nothing\.pt: no such datastore file"):
        run_decode(built, capsys, "--proposer", f"retrieval:{tmp_path / 'nothing.pt'}")
    record = read_record(built / "store.pt")
    record["tokenizer"]["fingerprint"] = "0" * 16
    torch.save(record, tmp_path / "other.pt")
    with pytest.raises(SystemExit, match=r"^decode: .*other\.pt: a datastore of another tokenizer"):
        run_decode(built, capsys, "--proposer", f"retrieval:{tmp_path / 'other.pt'}")
    with pytest.raises(SystemExit, match="exact acceptance, not top2"):
        run_decode(built, capsys, "--proposer", f"retrieval:{built / 'store.pt'}", "--criterion", "top2")
    assert not list(tmp_path.glob("*.tmp"))


def test_greedy_adds_the_targets_own_continuations_after_their_prompts(built, checkpoint):
    record, plain = read_record(built / "greedy.pt"), read_record(built / "store.pt")
    data = record["data"]
    assert data["greedy"] == 8 and data["text_tokens"] == plain["tokens"].numel()
    assert record["tokens"].numel() == data["text_tokens"] + data["greedy_tokens"]
    assert torch.equal(record["tokens"][: data["text_tokens"]], plain["tokens"])
    text, greedy = load_datastores(built / "greedy.pt")
    assert len(text) == data["text_tokens"] and len(greedy) == data["greedy_tokens"]
    assert load_datastores(built / "store.pt")[1] is None
    module = lightning_bpd.load_model(built / "heads")
    prompt = json.loads((built / "prompts.jsonl").read_text().splitlines()[0])["prompt"]  # window 0: always drawn
    src = module.encode_prompts([prompt])
    want = src[0].tolist() + greedy_decode(module.model, src, N).sequences()[0]
    got = record["tokens"][data["text_tokens"] :].tolist()
    assert got[: len(want)] == want and got[len(want)] == module.tokenizer.eos_token_id


def test_out_of_range_spellings_are_one_line():
    for spelling, match in (("retrieval:s.pt:1:2:3:4", "at most three numbers after its file"),
                            ("retrieval:s.pt:8:100000000", "NODES 8 and DEPTH 100000000: at most 1024 and 256"),
                            ("retrieval:s.pt:2000", "NODES 2000 and DEPTH 6: at most 1024")):
        with pytest.raises(argparse.ArgumentTypeError, match=match) as err:
            proposer_arg(spelling)
        assert "\n" not in str(err.value)
    assert proposer_arg("retrieval:s.pt:1024:256").tree_size == (1024, 256, 0)


def test_out_never_replaces_a_file_that_is_not_a_datastore(built, checkpoint, tmp_path):
    common = ["--pretrained", str(checkpoint), "--data-root", str(built / "data"), "--val-fraction", "0",
              "--test-fraction", "0"]
    for victim in (built / "data" / "file0.py", checkpoint / "config.json"):
        before = victim.read_bytes()
        with pytest.raises(SystemExit, match=r"^datastore: --out .*: an existing file that is not a datastore"):
            datastore([*common, "--out", str(victim)])
        assert victim.read_bytes() == before
    again = tmp_path / "again.pt"
    again.write_bytes((built / "store.pt").read_bytes())
    datastore([*common, "--out", str(again)])  # a datastore is made again in place
    assert read_record(again)["tokens"].tolist() == read_record(built / "store.pt")["tokens"].tolist()
