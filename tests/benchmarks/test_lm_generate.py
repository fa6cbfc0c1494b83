"""``bench --ckpt CKPT --peers generate,...`` (once ``bench-generate``) on a language-modelling checkpoint (issue 46, item 7): generate greedy, prompt lookup, assisted
generation with a draft model and ours on the same prompts, on a tiny random Llama; the one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.benchmarks.ctranslate2_hf import cut
from lightning_bpd.benchmarks.lm_generate import ASSISTED, GENERATE, LOOKUP, OURS, load_assistant
from lightning_bpd.benchmarks.lm_prompts import data_settings
from lightning_bpd.commands.bench import build_parser, generate_args
from lightning_bpd.commands.bench import main as bench
from lightning_bpd.commands.bench_generate_lm import OURS_LOOKUP, main_lm
from lightning_bpd.commands.bench_peers import PeerChoice
from lightning_bpd.commands.export_base import export_base
from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.tasks.lm import LMDataModule, LMModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.hf.tiny_checkpoint import write_checkpoint as write_marian
from tests.tasks.lm.tiny_lm import tiny_llama, tokenizer, write_checkpoint, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["def f_1(x, y):\n", "    return", "for items in range(3):\n        total = total * items\n",
           "def f_2(key, value):\n    key = key + 4\n", "x"]
N = 8  # new tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """A k=3 chained heads folder on a tiny Llama (heads scrambled), a draft Llama with the same tokenizer, and the
    prompts as JSON Lines."""
    root = tmp_path_factory.mktemp("lmbench")
    base = write_checkpoint(root / "llama")
    module = LMModule(str(base), k=3, head_type="chained", max_new_tokens=N).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    save_heads(module, root / "heads")
    write_checkpoint(root / "draft", seed=1)
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    return root


def run(root: Path, *extra: str) -> dict:
    out = root / "record.json"
    result = bench(["--ckpt", str(root / "heads"), "--batch-sizes", "1", "3", "--warmup", "1", "--device", "cpu",
                    "--max-new-tokens", str(N), "--json", str(out), *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    return result


def test_every_method_on_the_same_prompts_equals_generate(tiny, capsys):
    result = run(tiny, "--input", str(tiny / "prompts.jsonl"), "--peers",
                 f"generate,prompt-lookup:2:3,assisted:{tiny / 'draft'}")
    assert result["methods"] == [GENERATE, LOOKUP, ASSISTED, OURS, OURS_LOOKUP] and result["inputs"] == len(PROMPTS)
    assert result["max_new_tokens"] == N and result["assistant"]["layers"] == 2 and result["k"] == 3
    one, three = result["batch_sizes"]["1"], result["batch_sizes"]["3"]
    for name in (LOOKUP, ASSISTED, OURS, OURS_LOOKUP):  # all exact: the same tokens as generate greedy, row by row
        assert one[name]["differs_from_hf_generate"] == 0 and one[name]["sentences"] == len(PROMPTS)
    assert one[GENERATE]["tokens"] == one[OURS]["tokens"] > 0
    assert three[OURS]["differs_from_hf_generate"] == three[OURS_LOOKUP]["differs_from_hf_generate"] == 0
    assert three[GENERATE]["sentences"] == len(PROMPTS)
    assert "batch_size = 1" in three[LOOKUP]["skipped"] and "batch_size = 1" in three[ASSISTED]["skipped"]
    mine = one[OURS]
    assert set(mine["speedup_over"]) == {GENERATE, LOOKUP, ASSISTED, OURS_LOOKUP} and mine["mean_accepted_block_size"] >= 1
    assert mine["speedup_over"][GENERATE] == pytest.approx(one[GENERATE]["seconds"] / mine["seconds"])
    assert one[GENERATE]["speedup_over_hf_generate"] == 1.0
    # generate's rows are its own new tokens: ours, decoded here, and the base's generate agree with them
    module = lightning_bpd.load_model(tiny / "heads")
    src = module.encode_prompts(PROMPTS)
    out = module.model.base.generate(input_ids=src, attention_mask=(src != 0).long(), do_sample=False,
                                     max_new_tokens=N, pad_token_id=0)
    assert cut(out[:, src.shape[1]:].tolist(), 2) == blockwise_decode(module.model, src, Exact(), N).sequences()
    table = capsys.readouterr().out
    assert "hf_assisted" in table and "skipped" in table


def test_prompts_from_the_held_out_split(tiny, tmp_path):
    data = write_corpus(tmp_path / "code")
    result = run(tiny, "--data-root", str(data), "--split", "val", "--limit", "4", "--prompt-tokens", "24",
                 "--tree-nodes", "4", "--draft-vocab", f"60:{data / 'train' / 'mod_0.py'}")
    held_out = LMDataModule(root=str(data), tokenizer_path=str(tiny / "llama"), prompt_tokens=24)
    assert result["inputs"] == min(4, len(held_out.eval_prompts("val", None)[0])) > 0
    assert result["methods"] == [GENERATE, LOOKUP, OURS, f"{OURS}+nodes4", OURS_LOOKUP] and result["options"]["draft_vocab"] == 60
    for report in result["batch_sizes"].values():
        assert report[OURS]["differs_from_hf_generate"] == report[f"{OURS}+nodes4"]["differs_from_hf_generate"] == 0


def test_data_settings_come_from_the_checkpoint(tmp_path):
    torch.save({"datamodule_hyper_parameters": {"suffixes": [".py"], "prompt_tokens": 40, "seq_len": 9}},
               tmp_path / "last.ckpt")
    assert data_settings(tmp_path / "last.ckpt") == {"suffixes": [".py"], "prompt_tokens": 40}
    assert data_settings(tmp_path) == {}  # a heads folder: the flags and defaults


def test_an_exported_lm_run_or_its_checkpoint_is_an_assistant(tiny, tmp_path):
    module = lightning_bpd.load_model(tiny / "heads")
    out = export_base(tiny / "heads", tmp_path / "export")  # e.g. the recipe's export_draft stage
    draft = load_assistant(out, module, PROMPTS, "cpu")
    ours = module.model.base.state_dict()
    assert all(torch.equal(value, ours[key]) for key, value in draft.state_dict().items()) and not draft.training


def test_a_draft_run_checkpoint_is_an_assistant_and_names_its_data_split(tiny, tmp_path):
    from tests.tasks.lm.test_lm_fit import fit

    data = write_corpus(tmp_path / "code")
    fit(tiny / "draft", data, tmp_path / "run", "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
        "--model.init_args.k=1", "--model.init_args.head_type=paper", "--model.init_args.training.freeze_base=false",
        "--data.init_args.prompt_tokens=33")  # the recipe's draft: a whole model trained, k = 1
    module = lightning_bpd.load_model(tiny / "heads")
    draft = load_assistant(tmp_path / "run" / "last.ckpt", module, PROMPTS, "cpu")
    assert draft.config.num_hidden_layers == 2 and not draft.training
    settings = data_settings(tmp_path / "run" / "last.ckpt")  # what --data-root splits by
    assert settings["prompt_tokens"] == 33 and settings["val_fraction"] == 0.05


def one_line_exit(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as err:
        bench(argv)
    message = str(err.value)
    assert message.startswith("bench: ") and "\n" not in message
    return message


def test_bad_input_is_one_line(tiny, tmp_path, monkeypatch):
    base = ["--ckpt", str(tiny / "heads"), "--device", "cpu", "--batch-sizes", "1"]
    prompts = ["--input", str(tiny / "prompts.jsonl")]
    other = tmp_path / "other_tokenizer"
    tok = tokenizer(extra=3)
    tiny_llama(len(tok)).save_pretrained(other)
    tok.save_pretrained(other)
    assert "its tokenizer is not the checkpoint's" in one_line_exit([*base, *prompts, "--peers", f"assisted:{other}"])
    marian = write_marian(tmp_path / "marian")
    assert "a seq2seq checkpoint (marian)" in one_line_exit([*base, *prompts, "--peers", f"assisted:{marian}"])
    assert "not a Hugging Face model directory" in one_line_exit([*base, *prompts, "--peers", f"assisted:{tmp_path}"])
    assert "--input FILE.jsonl" in one_line_exit(base)
    assert "--peers llamacpp" in one_line_exit([*base, *prompts, "--peers", "ctranslate2"])
    monkeypatch.setitem(__import__("sys").modules, "llama_cpp", None)  # as if not installed
    assert "llama_cpp is not installed" in one_line_exit([*base, *prompts, "--peers", "llamacpp"])


def test_our_own_base_is_refused_in_one_line(tmp_path):
    tokenizer().save_pretrained(tmp_path / "bpe")
    from lightning_bpd.tasks.training_options import TrainingOptions

    own = LMModule(own={"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64, "tokenizer": str(tmp_path / "bpe")},
                   training=TrainingOptions(freeze_base=False))
    with pytest.raises(SystemExit) as err:
        main_lm(own, generate_args(build_parser().parse_args(["--ckpt", "own.ckpt", "--input", "unused.jsonl"]),
                                   PeerChoice()))
    assert str(err.value).startswith("bench: own.ckpt: a run of our own decoder-only base")
    assert len(own.draft_vocab_ids(PROMPTS, 10)) == 10  # its draft vocabulary: no generation rules, its EOS
