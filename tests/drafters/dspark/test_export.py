"""DSpark drafter export (lightning_bpd/drafters/dspark/speculators.py, ``export-heads --format speculators``): the
``dspark`` config with every flag written, the drafter's tensors under speculators' names, the folder read back
drafts as the drafter does, bad input is one line; slow: speculators' own DSparkDraftModel (in the separate virtual
environment of the DFlash export's test) loads the export and computes our hidden states, logits and confidences."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file

from lightning_bpd.commands.cli import main
from lightning_bpd.decoding import Exact, decode
from lightning_bpd.drafters.dspark.module import DSparkModule
from lightning_bpd.drafters.dspark.proposer import DSpark
from lightning_bpd.drafters.dspark.speculators import read_speculators, speculators_config, write_speculators
from tests.drafters.dspark.tiny import save_module
from tests.tasks.lm.tiny_lm import PAD, PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


def trained(checkpoint: Path, **kwargs) -> DSparkModule:
    """A DSparkModule whose drafter's parameters are all moved off their initial values (norms, heads included)."""
    module = DSparkModule(str(checkpoint), **{"num_layers": 2, "block_size": 4, "target_layer_ids": [0, 1],
                                              "markov_rank": 8, **kwargs})
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in module.drafter.named_parameters():
            p.add_(torch.randn(p.shape, generator=g) * (0.5 if "_head" in name else 0.1))
    return module.eval()


def test_export_heads_writes_the_speculators_dspark_layout_that_reads_back(checkpoint, tmp_path, capsys):
    module = trained(checkpoint)
    run = save_module(module, tmp_path / "last.ckpt")
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "spec"), "--format", "speculators"])
    assert "the DSpark drafter" in capsys.readouterr().err
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    vocab = module.model.vocab_size
    assert config["architectures"] == ["DSparkDraftModel"] and config["speculators_model_type"] == "dspark"
    assert {k: config[k] for k in ("sample_from_anchor", "markov_rank", "markov_head_type", "enable_confidence_head",
                                   "confidence_head_with_markov", "block_size", "draft_vocab_size",
                                   "aux_hidden_state_layer_ids", "mask_token_id")} == {
        "sample_from_anchor": True, "markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "block_size": 4, "draft_vocab_size": vocab,
        "aux_hidden_state_layer_ids": [1, 2], "mask_token_id": PAD}
    spec = config["speculators_config"]
    assert spec["algorithm"] == "dspark" and spec["proposal_methods"][0]["speculative_tokens"] == 4
    assert config["transformer_layer_config"]["vocab_size"] == vocab
    state = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert set(state) == set(module.drafter.state_dict())  # no embed_tokens / lm_head / d2t / t2d
    assert tuple(state["markov_head.markov_w1.weight"].shape) == (vocab, 8)
    assert tuple(state["markov_head.markov_w2.weight"].shape) == (vocab, 8)
    assert tuple(state["confidence_head.proj.weight"].shape) == (1, 32 + 8)
    assert all(torch.equal(state[k], v) for k, v in module.drafter.state_dict().items())
    record = json.loads((tmp_path / "spec" / "export_heads.json").read_text())
    assert record["format"] == "speculators" and record["markov_rank"] == 8

    back = read_speculators(tmp_path / "spec")
    assert back.config == module.drafter.config
    src = module.encode_prompts(PROMPTS)
    with torch.no_grad():
        want = decode(module.model, src, Exact(), DSpark(module.drafter), max_len=12)
        got = decode(module.model, src, Exact(), DSpark(back), max_len=12)
    assert got.sequences() == want.sequences() and got.block_sizes == want.block_sizes


def test_a_drafter_with_its_target_directory_and_bad_input(checkpoint, tmp_path):
    module = trained(checkpoint, num_layers=1, target_layer_ids=[0], enable_confidence_head=False)
    a = speculators_config(module)
    b = speculators_config(module.drafter, target=checkpoint)
    b["speculators_config"]["verifier"]["name_or_path"] = a["speculators_config"]["verifier"]["name_or_path"]
    assert a == b and a["enable_confidence_head"] is False and a["sample_from_anchor"] is True
    folder = write_speculators(module.drafter, tmp_path / "s", target=checkpoint)
    assert read_speculators(folder).confidence_head is None
    config = json.loads((folder / "config.json").read_text())
    for change, match in (({"speculators_model_type": "dflash"}, "not 'dspark'"),
                          ({"markov_head_type": "rnn"}, "only vanilla heads"),
                          ({"sample_from_anchor": False}, "only vanilla heads, anchor-first"),
                          ({"markov_rank": 9}, r"markov_w1.weight has shape \(\d+, 8\), config.json says")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=match) as err:
            read_speculators(folder)
        assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match="a DSparkModule or a DSparkDrafter"):
        speculators_config(object())
    run = save_module(module, tmp_path / "last.ckpt")
    with pytest.raises(SystemExit) as err:
        main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "dflash-zlab"])
    assert "use --format speculators (vLLM) or llamacpp" in str(err.value.code) and "\n" not in str(err.value.code)


# ---- slow: speculators' own DSpark model on the export -------------------------------------------------------------

RUN_SPECULATORS = r"""
import sys, torch
from speculators.models.dspark import DSparkDraftModel, DSparkSpeculatorConfig
export, inputs, out = sys.argv[1:]
config = DSparkSpeculatorConfig.from_pretrained(export)
config.transformer_layer_config._attn_implementation = "eager"
model = DSparkDraftModel.from_pretrained(export, config=config).eval()
assert type(model).__name__ == "DSparkDraftModel" and config.sample_from_anchor and config.enable_confidence_head
x = torch.load(inputs)
with torch.no_grad():
    hidden, logits, _, _, anchors = model._backbone_forward(
        x["features"], x["input_ids"], x["loss_mask"], torch.zeros(1, x["features"].shape[1], 32),
        torch.zeros_like(x["input_ids"]), max_anchors=int(x["loss_mask"].sum()))
    k = model.block_size
    prev = x["input_ids"][0, anchors].view(-1, k)  # as its forward: slot j reads the token at a + j
    emb = model.markov_head.prev_embeddings(prev)
    hidden = hidden.view(-1, k, hidden.shape[-1])
    logits = logits.view(-1, k, logits.shape[-1]) + model.markov_head.block_bias(
        prev_token_ids=prev, hidden_states=hidden, prev_emb=emb)
    conf = model.confidence_head(torch.cat([hidden, emb.to(hidden.dtype)], dim=-1))
torch.save({"hidden": hidden, "logits": logits, "conf": conf, "anchors": anchors}, out)
"""


@pytest.mark.slow
def test_speculators_dspark_model_computes_our_drafts(checkpoint, tmp_path):
    from tests.drafters.dflash.test_speculators import speculators_python

    python = speculators_python()
    module = trained(checkpoint)
    folder = write_speculators(module, tmp_path / "spec")
    t, k = 20, 4
    src = torch.randint(3, 200, (1, t), generator=torch.Generator().manual_seed(5))
    both, _ = module.target_pass(src)
    features = both[..., :-32]
    anchors = torch.tensor([[1, 6, 9, 13]])
    loss_mask = torch.zeros(1, t, dtype=torch.long)
    loss_mask[0, anchors[0]] = 1
    torch.save({"features": features, "input_ids": src, "loss_mask": loss_mask}, tmp_path / "inputs.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([python, "-c", RUN_SPECULATORS, str(folder), str(tmp_path / "inputs.pt"),
                           str(tmp_path / "out.pt")], check=False, capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(tmp_path / "out.pt")
    assert theirs["anchors"].tolist() == [a + j for a in anchors[0].tolist() for j in range(k)]
    with torch.no_grad():
        embeds, positions, _, _, _ = module.blocks(src, anchors, torch.zeros_like(src), torch.tensor([t]))
        h = module.drafter.train_forward(features, embeds, anchors, positions)[0]  # (M, K, H)
        prev = src[0, positions[0]]  # (M, K)
        logits, conf = module.drafter.heads(h, module.model.logits_first(h), prev)
    for name, ours in (("hidden", h), ("logits", logits), ("conf", conf)):
        got = theirs[name].view(ours.shape)
        assert torch.allclose(got, ours, rtol=1e-4, atol=1e-5 * float(ours.abs().max())), \
            (name, float((got - ours).abs().max()))
    assert torch.equal(theirs["logits"].view(logits.shape).argmax(-1), logits.argmax(-1))  # the same drafts
