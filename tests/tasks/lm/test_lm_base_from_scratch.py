"""The code LM recipe's first stages on a tiny scale (issue 46, item 6): ``make-base --arch llama`` writes a random
Llama and a byte-level BPE learnt from the training split only; ``fit`` trains the whole base from scratch (k = 1);
``export-base`` writes it as a plain Hugging Face directory that ``generate`` reads, equal to the trained weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from transformers import AutoModelForCausalLM, AutoTokenizer

from lightning_bpd.commands.cli import main
from lightning_bpd.commands.export_base import main as export_main
from lightning_bpd.commands.make_base import main as make_main
from lightning_bpd.tasks.lm.files import training_texts
from tests.tasks.lm.test_lm_fit import FAST
from tests.tasks.lm.tiny_lm import write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")
RECIPE_BASE = Path(__file__).resolve().parents[3] / "conf" / "recipes" / "code_lm" / "base.yaml"


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code", splits=False, files=60)


@pytest.fixture(scope="module")
def init(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("init") / "llama"
    make_main(["--arch", "llama", "--data", str(data), "--out", str(out), "--vocab", "400", "--shape", "tiny"])
    return out


def test_make_base_writes_a_llama_and_a_tokenizer_of_the_training_split(data, init):
    tok = AutoTokenizer.from_pretrained(init)
    model = AutoModelForCausalLM.from_pretrained(init)
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok) <= 400
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    text = "def f_7(x, y):\n    return x  # ünïcode\n"
    ids = tok(text)["input_ids"]
    assert ids[0] == 1 and tok.decode(ids, skip_special_tokens=True) == text  # byte-level: every text round-trips
    record = json.loads((init / "make_base.json").read_text())
    assert record["arch"] == "llama" and record["parameters"] == sum(p.numel() for p in model.parameters())
    assert len(training_texts(data, 0.05, 0.05)) < 60  # the held-out files did not shape the tokenizer


def test_a_draft_model_shares_the_tokenizer(init, tmp_path):
    out = tmp_path / "draft"
    make_main(["--arch", "llama", "--tokenizer-from", str(init), "--out", str(out), "--shape", "tiny", "--seed", "1"])
    assert (out / "tokenizer.json").read_text() == (init / "tokenizer.json").read_text()


@pytest.mark.parametrize("argv, says", [
    (["--data", "/no/such/folder"], "is not a folder"),
    (["--vocab", "100"], "--vocab must be at least 259"),
    (["--shape", "huge"], "--shape must be one of"),
    (["--tokenizer-from", "/no/such/dir"], "holds no tokenizer.json"),
])
def test_bad_make_base_input_is_one_line(data, tmp_path, argv, says):
    args = ["--arch", "llama", "--out", str(tmp_path / "x")]
    if "--data" not in argv and "--tokenizer-from" not in argv:
        args += ["--data", str(data)]
    with pytest.raises(SystemExit) as exc:
        make_main(args + argv)
    assert says in str(exc.value) and "\n" not in str(exc.value)


def test_fit_from_scratch_then_export_base(data, init, tmp_path):
    run = tmp_path / "run"
    cli = main(["fit", "--config", str(RECIPE_BASE), f"--model.init_args.pretrained={init}",
                f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, "--trainer.max_time=null",
                "--trainer.max_steps=3", "--trainer.limit_val_batches=1", "--trainer.logger=false"])
    trained = cli.model.model.base
    fresh = AutoModelForCausalLM.from_pretrained(init).state_dict()
    assert all(not torch.equal(value, trained.state_dict()[key]) for key, value in fresh.items()
               if "norm" not in key)  # every matrix learnt (k = 1: the base is all there is)
    out = tmp_path / "export"
    export_main(["--ckpt", str(run / "last.ckpt"), "--out", str(out)])
    exported = AutoModelForCausalLM.from_pretrained(out).eval()
    assert all(torch.equal(value, trained.state_dict()[key]) for key, value in exported.state_dict().items())
    tok = AutoTokenizer.from_pretrained(out)
    src = tok(["def f_1(x, y):\n"], return_tensors="pt")
    ours = cli.model.model.base.eval().generate(**src, do_sample=False, max_new_tokens=6)
    assert torch.equal(exported.generate(**src, do_sample=False, max_new_tokens=6), ours)
    assert json.loads((out / "export_base.json").read_text())["pad_moved_last"] is None


def test_make_base_refuses_an_out_it_would_destroy_in_one_line(data, init, tmp_path):
    """An existing base, the --tokenizer-from model, the corpus (at, inside or around it), a folder holding files, an
    existing file or a path under one: one line each, nothing written or replaced; a recipe stage's own records in
    its folder (stage.log) do not count as files."""
    snapshot = {p.name: p.read_bytes() for p in init.iterdir()}
    corpus = sorted(str(p) for p in data.rglob("*"))
    (tmp_path / "afile.txt").write_text("notes\n")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "notes.md").write_text("mine\n")
    llama = ["--arch", "llama", "--shape", "tiny", "--vocab", "300"]
    for argv, says in [
        ([*llama, "--data-root", str(data), "--out", str(init), "--seed", "5"], "already holds files ("),
        ([*llama, "--tokenizer-from", str(init), "--out", str(init)], "is the --tokenizer-from model: give a new --out"),
        ([*llama, "--data-root", str(data), "--out", str(data)], f"is the --data-root {data}: give an --out outside"),
        ([*llama, "--data-root", str(data), "--out", str(data / "init")], "lies inside the --data-root"),
        ([*llama, "--data-root", str(data), "--out", str(data.parent)], "holds the --data-root"),
        ([*llama, "--data-root", str(data), "--out", str(tmp_path / "full")], "already holds files (notes.md)"),
        ([*llama, "--data-root", str(data), "--out", str(tmp_path / "afile.txt")], "is a file, not a folder"),
        ([*llama, "--data-root", str(data), "--out", str(tmp_path / "afile.txt" / "sub")],
         "afile.txt is a file, not a folder: give another --out"),
        (["--data-root", str(data), "--out", str(init)], "already holds files ("),  # marian too
    ]:
        with pytest.raises(SystemExit) as exc:
            make_main(argv)
        message = str(exc.value)
        assert message.startswith("make_base: --out ") and says in message and "\n" not in message, message
    assert {p.name: p.read_bytes() for p in init.iterdir()} == snapshot
    assert sorted(str(p) for p in data.rglob("*")) == corpus
    assert (tmp_path / "afile.txt").read_text() == "notes\n" and not (tmp_path / "full" / "config.json").exists()
    stage = tmp_path / "stage"
    stage.mkdir()
    (stage / "stage.log").write_text("=== recipe\n")
    make_main(["--arch", "llama", "--tokenizer-from", str(init), "--out", str(stage), "--shape", "tiny"])
    assert (stage / "config.json").is_file()


@pytest.mark.parametrize("vocab", ["-5", "0"])
@pytest.mark.parametrize("arch", ["marian", "llama"])
def test_make_base_refuses_a_vocab_below_one_in_one_line(data, tmp_path, arch, vocab):
    """--vocab -5 overflowed in the tokenizer trainer and 0 meant the default: both one line, nothing written."""
    with pytest.raises(SystemExit) as exc:
        make_main(["--arch", arch, "--data-root", str(data), "--out", str(tmp_path / "x"), "--vocab", vocab])
    assert str(exc.value) == f"make_base: --vocab must be at least 1, got {vocab}"
    assert not (tmp_path / "x").exists()
