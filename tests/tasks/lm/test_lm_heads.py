"""Heads of a causal LM saved on their own and re-attached (issue 46), as for seq2seq bases: ``save_heads`` then
``load_model(folder)`` gives the same logits and decodes; another base is refused in one line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import main
from lightning_bpd.decoding import Exact, blockwise_decode, parse_criterion
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.translation.hf_module import HEADS_JSON, save_heads
from tests.tasks.lm.tiny_lm import PROMPTS, write_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def scrambled(checkpoint: Path, head_type: str) -> LMModule:
    module = LMModule(str(checkpoint), k=3, head_type=head_type, head_hidden=24 if head_type != "medusa" else None,
                      max_new_tokens=12).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


@pytest.mark.parametrize("head_type", ["paper", "chained", "medusa"])
def test_heads_saved_on_their_own_come_back_identical(checkpoint, tmp_path, head_type):
    module = scrambled(checkpoint, head_type)
    folder = save_heads(module, tmp_path / "heads")
    meta = json.loads((folder / HEADS_JSON).read_text())
    assert meta["module"] == "lightning_bpd.tasks.lm.module.LMModule" and meta["max_new_tokens"] == 12
    back = lightning_bpd.load_model(folder)  # the base directory named in heads.json
    again = lightning_bpd.load_model(folder, base=checkpoint)
    src = module.encode_prompts(PROMPTS)
    h = module.model(src)  # (B, P, D)
    prev = torch.randint(3, 200, (*src.shape, 2), generator=torch.Generator().manual_seed(1))
    expected = module.model.logits_heads(h, None, prev)
    for other in (back, again):
        assert isinstance(other, LMModule) and other.model.head_type == head_type and other.max_new_tokens == 12
        assert torch.equal(other.model.logits_heads(h, None, prev), expected)
        for rule in (Exact(), parse_criterion("top2")):
            ours = blockwise_decode(other.model, src, rule, 12)
            assert ours.sequences() == blockwise_decode(module.model, src, rule, 12).sequences()


def test_decode_reads_heads_saved_on_their_own(checkpoint, tmp_path, capsys, monkeypatch):
    module = scrambled(checkpoint, "medusa")
    folder = save_heads(module, tmp_path / "heads")
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)))
    capsys.readouterr()
    main(["decode", "--ckpt", str(folder), "--criterion", "top2", "--device", "cpu"])  # the heads' max_new_tokens
    expected = blockwise_decode(module.model, module.encode_prompts(PROMPTS), parse_criterion("top2"), 12)
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert [json.loads(line)["completion"] for line in out] == module.detokenize(expected.sequences())
    stats = captured.err.strip().splitlines()[-1]  # a language model's inputs are prompts, not sentences
    assert stats.startswith(f"prompts={len(PROMPTS)} iterations=")


def test_heads_refuse_another_base(checkpoint, tmp_path):
    folder = save_heads(scrambled(checkpoint, "chained"), tmp_path / "heads")
    other = write_checkpoint(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="not the base the heads") as err:
        lightning_bpd.load_model(folder, base=other)
    assert "\n" not in str(err.value)


def test_a_fine_tuned_base_keeps_its_heads_in_the_checkpoint(checkpoint, tmp_path):
    from dataclasses import replace

    from lightning_bpd.tasks.lm.module import TRAINING

    module = LMModule(str(checkpoint), training=replace(TRAINING, freeze_base=False))
    with pytest.raises(ValueError, match="fine-tuned"):
        save_heads(module, tmp_path / "heads")
