"""Medusa heads on a causal base written in vLLM's Medusa layout and read back: the export reproduces the heads'
logits (vLLM proposes each head's top-1 on a GPU server; here the round trip is what can be checked)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.hf.medusa_export import read_vllm_medusa, vllm_medusa_logits, write_vllm_medusa
from tests.hf.test_causal import VOCAB, scramble_head, tiny_lm
from tests.models import assert_close_to_rounding

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("layers", [1, 2])
def test_the_export_reproduces_the_heads_logits(tmp_path, layers):
    model = HFCausalBlockwise(tiny_lm("qwen3"), k=4, head_type="medusa", medusa_layers=layers)
    scramble_head(model)
    folder = write_vllm_medusa(model, tmp_path / "medusa")
    config, state = read_vllm_medusa(folder)
    assert {key: config[key] for key in ("model_type", "hidden_size", "vocab_size", "num_heads", "num_hidden_layers",
                                         "medusa_fc_bias", "original_lm_head")} == {
        "model_type": "medusa", "hidden_size": 32, "vocab_size": VOCAB, "num_heads": 3, "num_hidden_layers": layers,
        "medusa_fc_bias": True, "original_lm_head": True}
    h = torch.randn(5, 7, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    want = model.logits_heads(h, range(1, 4))  # (5, 7, 3, V): heads 2..4
    assert_close_to_rounding(vllm_medusa_logits(config, state, h), want)  # the LM head on other shapes
    assert not torch.equal(want[..., 0, :], want[..., 1, :])  # scrambled heads differ


def test_bad_input_is_one_line(tmp_path):
    paper = HFCausalBlockwise(tiny_lm("llama"), k=3)
    with pytest.raises(ValueError, match="takes medusa heads, not 'paper' ones"):
        write_vllm_medusa(paper, tmp_path / "x")
    with pytest.raises(ValueError, match="k = 1 has no medusa heads"):
        write_vllm_medusa(HFCausalBlockwise(tiny_lm("llama"), k=1, head_type="medusa"), tmp_path / "x")
    with pytest.raises(ValueError, match="no config.json"):
        read_vllm_medusa(tmp_path)
    folder = write_vllm_medusa(HFCausalBlockwise(tiny_lm("llama"), k=2, head_type="medusa"), tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_heads": 2}))
    with pytest.raises(ValueError, match="weights missing: blocks.1.layers.0.bias"):
        read_vllm_medusa(folder)
