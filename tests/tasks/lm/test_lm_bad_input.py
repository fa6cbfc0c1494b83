"""Bad input to the LM task is one clear line (issue 46): a directory that is no checkpoint, a seq2seq checkpoint,
no tokenizer, a tokenizer of another vocabulary, an empty data folder, malformed JSON on decode's stdin, a prompt
longer than the model's context."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.hf.tiny_checkpoint import write_checkpoint as write_marian
from tests.tasks.lm.tiny_lm import write_checkpoint, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def heads(tmp_path_factory) -> Path:
    """Heads saved on their own on a tiny Llama of 64 positions: an LM checkpoint for decode."""
    root = tmp_path_factory.mktemp("lm")
    return save_heads(LMModule(str(write_checkpoint(root / "llama", positions=64)), max_new_tokens=4), root / "heads")


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_bad_checkpoints_are_one_clear_line(tmp_path):
    (tmp_path / "empty").mkdir()
    for folder, match in ((tmp_path / "empty", "not a Hugging Face checkpoint"),
                          (tmp_path / "missing", "not a directory"),
                          (write_marian(tmp_path / "marian"), "encoder-decoder .*seq2seq.*not a causal LM"),
                          (write_checkpoint(tmp_path / "bare", with_tokenizer=False), "no tokenizer beside"),
                          (write_checkpoint(tmp_path / "bigger", vocab_extra=5), "vocab_size mismatch"),
                          (write_checkpoint(tmp_path / "smaller", vocab_extra=-5), "more than the model's vocabulary")):
        with pytest.raises(ValueError, match=match) as err:
            LMModule(str(folder))
        one_line(err)
    with pytest.raises(ValueError, match="is a folder, not a checkpoint") as err:
        lightning_bpd.load_model(tmp_path / "empty")
    one_line(err)


@pytest.mark.parametrize("bad", ["empty", "marian"])
def test_fit_refuses_bad_input_in_one_error_line(tmp_path, bad):
    checkpoint = write_checkpoint(tmp_path / "llama")
    data = write_corpus(tmp_path / "data")
    if bad == "empty":
        data = tmp_path / "empty"
        data.mkdir()
    else:
        checkpoint = write_marian(tmp_path / "marian")
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(CONF_DIR / "lm" / "frozen_heads.yaml"),
              f"--model.init_args.pretrained={checkpoint}", f"--data.init_args.root={data}",
              f"--run_dir={tmp_path / 'run'}", "--trainer.logger=false"])
    message = one_line(err)
    assert message.startswith("error: ")
    assert ("holds no files" in message) if bad == "empty" else ("encoder-decoder" in message)
    assert not (tmp_path / "run" / "last.ckpt").exists()


@pytest.mark.parametrize(("stdin", "match"), [
    ('{"prompt": "x = 1"}\n{"prompt": "y\n', "^decode: stdin line 2: not valid JSON"),
    ('{"prompt": "x = 1"}\n\n["x"]\n', '^decode: stdin line 3: expected an object with a string "prompt"'),
    ('{"prompt": "' + "x = 1\\n" * 40 + '"}\n', (r"^decode: line 1: the prompt has \d+ tokens, which with --max-new-"
                                                 r"tokens 4 exceeds the model's context \(64 positions\)")),
])
def test_decode_refuses_bad_input_in_one_line(heads, monkeypatch, capsys, stdin, match):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    with pytest.raises(SystemExit, match=match) as err:
        main(["decode", "--ckpt", str(heads), "--device", "cpu"])
    one_line(err)
    assert capsys.readouterr().out == ""


def test_decode_writes_one_line_per_prompt_in_order(heads, monkeypatch, capsys):
    prompts = ["def f(x):\n", "", "x", "for i in range(3):\n    y = y + i\n"]  # "" is the tokenizer's BOS alone
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps({"prompt": p}) + "\n" for p in prompts)))
    main(["decode", "--ckpt", str(heads), "--criterion", "greedy", "--batch-size", "3", "--device", "cpu"])
    module = lightning_bpd.load_model(heads)
    expected = []
    for prompt in prompts:
        src = module.encode_prompts([prompt])  # (1, P)
        out = module.model.base.generate(input_ids=src, do_sample=False, max_new_tokens=4, pad_token_id=0)
        expected += module.tokenizer.batch_decode(out[:, src.shape[1]:], skip_special_tokens=True)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"completion": t} for t in expected]


def test_bench_of_an_lm_checkpoint_without_prompts_is_one_line(heads):
    """bench times an LM checkpoint against its base's generate (what bench-generate did): it needs prompts."""
    with pytest.raises(SystemExit, match=r"bench: give one of --input FILE.jsonl .* and --data-root DIR") as err:
        main(["bench", "--ckpt", str(heads), "--device", "cpu"])
    one_line(err)


def test_a_held_out_prompt_that_spells_the_pad_token_is_left_out(heads, tmp_path):
    from types import SimpleNamespace

    from lightning_bpd.tasks.lm import LMDataModule

    root = write_corpus(tmp_path / "data")
    val = root / "val" / "mod_0.py"
    val.write_text("x = '<pad>'\n" + val.read_text())  # the tokenizer reads "<pad>" as the pad id
    module = lightning_bpd.load_model(heads)
    dm = LMDataModule(root=str(root), tokenizer_path=json.loads((heads / "heads.json").read_text())["base"],
                      prompt_tokens=40)
    prompts, _ = dm.eval_prompts("val", None)
    assert "<pad>" in prompts[0]
    module._trainer = SimpleNamespace(datamodule=dm)
    batches = module.decode_eval_batches("val", None, 4)
    assert [s for b in batches for s in b.sources] == prompts[1:]
    assert all(int(b.src.ne(module.model.pad_id).sum(dim=1).min()) > 0 for b in batches)


def test_decode_refuses_an_out_that_is_a_folder_or_the_input(heads, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "x = 1"}) + "\n")
    before = prompts.read_bytes()
    with pytest.raises(SystemExit, match=r"^decode: --out .* is a folder: give the output file's path$"):
        main(["decode", "--ckpt", str(heads), "--input", str(prompts), "--out", str(tmp_path), "--device", "cpu"])
    with pytest.raises(SystemExit, match=r"^decode: --out .*prompts\.jsonl is the --input file, which writing would"):
        main(["decode", "--ckpt", str(heads), "--input", str(prompts), "--out", str(prompts), "--device", "cpu"])
    assert prompts.read_bytes() == before
    with pytest.raises(SystemExit, match=r"^decode: --out .*missing/out\.jsonl: No such file or directory$"):
        main(["decode", "--ckpt", str(heads), "--input", str(prompts), "--out", str(tmp_path / "missing" / "out.jsonl"),
              "--device", "cpu"])
