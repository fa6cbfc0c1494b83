"""``decode`` up to the very end of the base's context (issue 46): a prompt that leaves exactly N positions is
continued by generate's N tokens, on a tiny Llama (rotary positions) and a tiny GPT-2 (absolute positions, whose
table ends there); one that leaves N - 1 is refused in one line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import main
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.tasks.lm.tiny_lm import write_checkpoint, write_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = 8
LINE = "for i in range(3):\n    y = y + i\n"


@pytest.fixture(scope="module", params=["llama", "gpt2"])
def heads(request, tmp_path_factory) -> Path:
    """k = 4 chained heads saved on their own on a tiny Llama of 64 positions or a tiny GPT-2 of 128."""
    root = tmp_path_factory.mktemp(request.param)
    base = write_checkpoint(root / "base", positions=64) if request.param == "llama" else write_gpt2(root / "base")
    return save_heads(LMModule(str(base), k=4, max_new_tokens=NEW), root / "heads")


def prompt_of(module, tokens: int) -> str:
    """A prompt of exactly ``tokens`` tokens (its BOS included), grown a character at a time."""
    text, count = "", len(module.tokenizer("")["input_ids"])
    while count < tokens:
        text += LINE[len(text) % len(LINE)]
        count = len(module.tokenizer(text)["input_ids"])
    assert count == tokens
    return text


def decode(prompt: str, heads: Path, monkeypatch, *extra: str) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps({"prompt": prompt}) + "\n"))
    main(["decode", "--ckpt", str(heads), "--max-new-tokens", str(NEW), "--device", "cpu", *extra])


@pytest.mark.parametrize("criterion", ["exact", "greedy"])
def test_a_prompt_that_leaves_exactly_n_positions_is_continued_as_generate_does(heads, monkeypatch, capsys,
                                                                                criterion):
    module = lightning_bpd.load_model(heads)
    positions = module.model.n_positions
    prompt = prompt_of(module, positions - NEW)
    src = module.encode_prompts([prompt])  # (1, P)
    assert module.max_decode_len(src) == NEW
    out = module.model.base.generate(input_ids=src, do_sample=False, max_new_tokens=NEW,
                                     pad_token_id=module.model.pad_id)
    want = module.tokenizer.batch_decode(out[:, src.shape[1]:], skip_special_tokens=True)
    decode(prompt, heads, monkeypatch, "--criterion", criterion)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"completion": want[0]}]


def test_one_position_fewer_is_refused_in_one_line(heads, monkeypatch, capsys):
    module = lightning_bpd.load_model(heads)
    positions = module.model.n_positions
    prompt = prompt_of(module, positions - NEW + 1)
    with pytest.raises(SystemExit, match=f"^decode: line 1: the prompt has {positions - NEW + 1} tokens, which with "
                                         f"--max-new-tokens {NEW} exceeds the model's context \\({positions} "
                                         "positions\\)$"):
        decode(prompt, heads, monkeypatch)
    assert capsys.readouterr().out == ""
