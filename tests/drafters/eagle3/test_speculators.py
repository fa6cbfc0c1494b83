"""EAGLE-3 drafter export (lightning_bpd/drafters/eagle3/speculators.py): speculators' eagle3 config.json and safetensors, the
read-back is bitwise the drafter, bad input is one line; slow: speculators' own Eagle3DraftModel (in the separate
virtual environment of tests/drafters/dflash/test_speculators.py) loads the export and computes our logits at every step of the
training-time test."""

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

from lightning_bpd.drafters.eagle3.network import Eagle3Config, Eagle3Drafter, vocab_mapping
from lightning_bpd.drafters.eagle3.speculators import (
    SPECULATORS_VERSION,
    read_speculators,
    serving_notes,
    speculators_config,
    write_speculators,
)

pytestmark = pytest.mark.usefixtures("one_thread")

V, H, LAYERS = 96, 32, 8


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A tiny random 8-layer Llama (hidden 32, 4 heads, 2 KV heads, vocabulary 96), its weights only."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, rope_theta=10000.0)
    folder = tmp_path_factory.mktemp("target") / "llama"
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def drafter_for(target: Path, seed: int = 3, draft_vocab: int | None = 40, **overrides) -> Eagle3Drafter:
    """An EAGLE-3 drafter of ``target``: the target's embeddings, every other parameter random (norms included),
    a draft vocabulary of ``draft_vocab`` tokens (None: the whole vocabulary)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = Eagle3Config.from_target(AutoConfig.from_pretrained(target), draft_vocab_size=draft_vocab,
                                      target_layer_ids=overrides.pop("target_layer_ids", [1, 3, 4]), **overrides)
    drafter = Eagle3Drafter(config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in drafter.named_parameters():
            if name != "embed_tokens.weight":
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 + (1.0 if p.dim() == 1 else 0.0))
    drafter.set_embeddings(AutoModelForCausalLM.from_pretrained(target).get_input_embeddings().weight)
    if config.uses_draft_vocab:
        drafter.set_vocab_mapping(*vocab_mapping(torch.randint(0, 50, (V,), generator=g), draft_vocab))
    return drafter.eval()


def test_config_and_weights_are_speculators_layout(target, tmp_path):
    drafter = drafter_for(target, norm_before_residual=True)
    folder = write_speculators(drafter, tmp_path / "spec", target, speculative_tokens=4)
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Eagle3DraftModel"] and config["speculators_model_type"] == "eagle3"
    assert config["speculators_version"] == SPECULATORS_VERSION == "0.9.0"
    assert (config["draft_vocab_size"], config["target_hidden_size"], config["dtype"]) == (40, H, "float32")
    assert config["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]  # the stream entering layers 2, 4, 5
    assert {k: config[k] for k in ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output",
                                   "embed_requires_grad", "tie_word_embeddings")} == {
        "norm_before_residual": True, "norm_before_fc": False, "fc_norm": False, "norm_output": False,
        "embed_requires_grad": False, "tie_word_embeddings": False}
    assert config["speculators_config"] == {
        "algorithm": "eagle3", "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 4, "verifier_accept_k": 1,
                              "accept_tolerance": 0.0}],
        "verifier": {"name_or_path": str(target), "architectures": ["LlamaForCausalLM"]}}
    layer = config["transformer_layer_config"]
    assert {k: layer[k] for k in ("model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                                  "max_position_embeddings", "rope_theta", "attention_bias", "mlp_bias")} == {
        "model_type": "llama", "vocab_size": V, "hidden_size": H, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu",
        "max_position_embeddings": 128, "rope_theta": 10000.0, "attention_bias": False, "mlp_bias": False}
    assert layer["rope_parameters"] == {"rope_type": "default", "rope_theta": 10000.0}
    state = load_file(str(folder / "model.safetensors"))
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes == {"embed_tokens.weight": (V, H), "fc.weight": (H, 3 * H), "norm.weight": (H,),
                      "lm_head.weight": (40, H), "d2t": (40,), "t2d": (V,),
                      "layers.0.input_layernorm.weight": (H,), "layers.0.hidden_norm.weight": (H,),
                      "layers.0.post_attention_layernorm.weight": (H,),
                      "layers.0.self_attn.q_proj.weight": (32, 2 * H), "layers.0.self_attn.k_proj.weight": (16, 2 * H),
                      "layers.0.self_attn.v_proj.weight": (16, 2 * H), "layers.0.self_attn.o_proj.weight": (H, 32),
                      "layers.0.mlp.gate_proj.weight": (64, H), "layers.0.mlp.up_proj.weight": (64, H),
                      "layers.0.mlp.down_proj.weight": (H, 64)}
    assert state["d2t"].dtype == torch.int64 and state["t2d"].dtype == torch.bool
    assert all(torch.equal(state[k], v) for k, v in drafter.state_dict().items())
    assert serving_notes(drafter.config) == []


@pytest.mark.parametrize("overrides", [{}, {"draft_vocab": None, "norm_output": True, "norm_before_fc": True},
                                       {"family": "qwen3", "fc_norm": True}], ids=["plain", "flags", "qwen3"])
def test_read_back_is_bitwise_the_drafter(target, tmp_path, overrides):
    drafter = drafter_for(target, **overrides)
    back = read_speculators(write_speculators(drafter, tmp_path / "spec", target))
    assert back.config == drafter.config
    state, want = back.state_dict(), drafter.state_dict()
    assert set(state) == set(want) and all(torch.equal(state[k], want[k]) for k in want)
    assert not back.embed_tokens.weight.requires_grad
    features, tokens = torch.randn(2, 6, 3 * H), torch.randint(0, V, (2, 6))
    with torch.no_grad():
        assert torch.equal(back.train_forward(features, tokens, 2), drafter.train_forward(features, tokens, 2))
    if overrides:
        assert serving_notes(drafter.config)


def test_bfloat16_and_no_embeddings(target, tmp_path):
    drafter = drafter_for(target).to(torch.bfloat16)
    folder = write_speculators(drafter, tmp_path / "spec", target, ["LlamaForCausalLM"])
    assert json.loads((folder / "config.json").read_text())["dtype"] == "bfloat16"
    back = read_speculators(folder)
    assert back.fc.weight.dtype == torch.bfloat16 and back.d2t.dtype == torch.int64
    assert torch.equal(back.lm_head.weight, drafter.lm_head.weight)
    state = load_file(str(folder / "model.safetensors"))
    from safetensors.torch import save_file

    save_file({k: v for k, v in state.items() if k != "embed_tokens.weight"}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match=r"missing \['embed_tokens.weight'\] \(give embeddings=, the target's\)"):
        read_speculators(folder)
    again = read_speculators(folder, embeddings=drafter.embed_tokens.weight)
    assert torch.equal(again.embed_tokens.weight, drafter.embed_tokens.weight)


def one_line(call, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_bad_input_is_one_line(target, tmp_path):
    drafter = drafter_for(target)
    one_line(lambda: speculators_config(drafter, tmp_path / "nowhere"), "no config.json there: give "
             "verifier_architectures")
    assert speculators_config(drafter, "org/model", ["LlamaForCausalLM"])["speculators_config"]["verifier"][
        "name_or_path"] == "org/model"  # a hub id: not checked
    other = drafter_for(target, target_layer_ids=[1, 3, 7])
    other.config.target_layer_ids = (1, 3, 8)
    one_line(lambda: speculators_config(other, target), r"target_layer_ids \[1, 3, 8\] \(target layers 0..7\)")
    with pytest.raises(TypeError, match="an Eagle3Drafter is expected"):
        speculators_config(torch.nn.Linear(2, 2), target)

    folder = write_speculators(drafter, tmp_path / "spec", target)
    (folder / "model.safetensors").rename(tmp_path / "weights")
    one_line(lambda: read_speculators(folder), r"no model.safetensors \(a speculators eagle3 folder")
    (tmp_path / "weights").rename(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    layer = config["transformer_layer_config"]
    for change, match in (({"speculators_model_type": "dflash"}, "not 'eagle3'"),
                          ({"transformer_layer_config": {**layer, "model_type": "mistral"}}, "a 'mistral' decoder"),
                          ({"transformer_layer_config": {**layer, "num_hidden_layers": 2}}, "2 decoder layers"),
                          ({"transformer_layer_config": {**layer, "rope_parameters": {"rope_type": "llama3"}}},
                           "RoPE 'llama3' scaling"),
                          ({"eagle_aux_hidden_state_layer_ids": None}, "no eagle_aux_hidden_state_layer_ids"),
                          ({"eagle_aux_hidden_state_layer_ids": [0, 3, 5]}, "aux layer id 0"),
                          ({"target_hidden_size": 64}, "target_hidden_size 64 differs"),
                          ({"draft_vocab_size": 41}, r"d2t has shape \(40,\), config.json says \(41,\)"),
                          ({"fc_norm": True}, r"weights missing \['fc_norm.0.weight'"),
                          ({"transformer_layer_config": {k: v for k, v in layer.items() if k != "intermediate_size"}},
                           "no 'intermediate_size'")):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        one_line(lambda: read_speculators(folder), match)


# ---- slow: speculators' own Eagle3DraftModel on the export ----------------------------------------------------------

RUN_SPECULATORS = r"""
import sys, torch
from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
inputs, out, *exports = sys.argv[1:]
x = torch.load(inputs)
results = {}
for export in exports:
    config = Eagle3SpeculatorConfig.from_pretrained(export)
    config.transformer_layer_config._attn_implementation = "eager"
    model = Eagle3DraftModel.from_pretrained(export, config=config).eval()
    assert type(model).__name__ == "Eagle3DraftModel" and model._attn_impl == "eager", model._attn_impl
    logits, states = [], []
    model.lm_head.register_forward_hook(lambda m, a, o: logits.append(o))
    model.layers[0].register_forward_hook(lambda m, a, o: states.append(o))
    t = x["features"].shape[1]
    with torch.no_grad():
        drafts = model(hidden_states=x["features"][:, :t - 1], input_ids=x["tokens"][:, 1:],
                       document_ids=torch.zeros(1, t - 1, dtype=torch.long), ttt_steps=x["steps"])
    results[export] = {"logits": torch.stack(logits, 1), "states": torch.stack(states, 1),
                       "drafts": torch.stack(drafts, 1), "t2d": model.t2d, "d2t": model.d2t,
                       "aux": model.target_layer_ids}
torch.save(results, out)
"""

SLOW_VARIANTS = {"plain": {}, "residual-output-fc": {"draft_vocab": None, "norm_before_residual": True,
                                                    "norm_output": True, "norm_before_fc": True},
                 "qwen3-fc_norm": {"family": "qwen3", "fc_norm": True}}


@pytest.mark.slow
def test_speculators_eagle3_model_computes_our_logits(target, tmp_path):
    from tests.drafters.dflash.test_speculators import speculators_python

    python = speculators_python()
    steps, t = 3, 12
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, V, (1, t), generator=g)
    drafters = {name: drafter_for(target, **dict(overrides)) for name, overrides in SLOW_VARIANTS.items()}
    from transformers import AutoModelForCausalLM

    with torch.no_grad():  # the target's own features at the drafters' layers (their outputs)
        hidden = AutoModelForCausalLM.from_pretrained(target)(tokens, output_hidden_states=True).hidden_states
    features = torch.cat([hidden[i + 1] for i in (1, 3, 4)], dim=-1)  # (1, T, 3H)
    folders = [str(write_speculators(d, tmp_path / name, target)) for name, d in drafters.items()]
    torch.save({"features": features, "tokens": tokens, "steps": steps}, tmp_path / "inputs.pt")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([python, "-c", RUN_SPECULATORS, str(tmp_path / "inputs.pt"), str(tmp_path / "out.pt"),
                           *folders], check=False, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = torch.load(tmp_path / "out.pt")
    for (name, drafter), folder in zip(drafters.items(), folders):
        theirs = results[folder]
        assert theirs["aux"] == [2, 4, 5], name
        if drafter.config.uses_draft_vocab:
            assert torch.equal(theirs["t2d"], drafter.t2d) and torch.equal(theirs["d2t"], drafter.d2t), name
        with torch.no_grad():
            ours = drafter.train_forward(features, tokens, steps)[:, :, :t - 1]  # (1, S, T - 1, Vd)
        close(theirs["logits"], ours, name)
        assert torch.equal(theirs["drafts"], ours.argmax(-1)), name  # the same drafts at every step
        # the comparison has teeth: a misplaced norm (hidden_norm's weights on the embeddings) is far off
        wrong = drafter_for(target, **dict(SLOW_VARIANTS[name]))
        layer = wrong.layers[0]
        with torch.no_grad():
            layer.input_layernorm.weight, layer.hidden_norm.weight = layer.hidden_norm.weight, layer.input_layernorm.weight
            off = wrong.train_forward(features, tokens, steps)[:, :, :t - 1]
        assert not torch.allclose(theirs["logits"], off, rtol=1e-3, atol=1e-3), name
        # and the state fed back is the one speculators feeds: the other (pre- vs post-norm) agrees at step 0 only
        flipped = drafter_for(target, **{**SLOW_VARIANTS[name], "norm_output": not drafter.config.norm_output})
        with torch.no_grad():
            off = flipped.train_forward(features, tokens, steps)[:, :, :t - 1]
        close(theirs["logits"][:, 0], off[:, 0], name)
        assert not torch.allclose(theirs["logits"][:, 1:], off[:, 1:], rtol=1e-3, atol=1e-3), name


def close(theirs: torch.Tensor, ours: torch.Tensor, name: str) -> None:
    """Within 1e-5 relative of the largest magnitude."""
    assert theirs.shape == ours.shape, (name, theirs.shape, ours.shape)
    err = float((theirs - ours).abs().max())
    print(f"{name}: max |theirs - ours| = {err:.2e} of max |ours| {float(ours.abs().max()):.2f}")
    assert err <= 1e-5 * float(ours.abs().max()), (name, err)


# ---- slow: llama.cpp's converter on the export ----------------------------------------------------------------------

CONVERT_LLAMA_CPP = r"""
import runpy, sys
root, export, target, out = sys.argv[1:]
sys.path[:0] = [root, root + "/gguf-py"]
import conversion.llama
conversion.llama.LlamaModel.set_vocab = lambda self: None  # the tiny target has no tokenizer; a real one's is read
sys.argv = ["convert_hf_to_gguf.py", export, "--target-model-dir", target, "--outfile", out, "--outtype", "f32"]
runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


@pytest.mark.slow
def test_llama_cpp_converter_takes_the_export_as_it_is(target, tmp_path):
    """llama.cpp's ``convert_hf_to_gguf.py <export> --target-model-dir <target>`` (the source tree in
    ``$LLAMA_CPP_DIR``; skipped without it) writes an ``eagle3`` GGUF: our aux ids, target hidden size and norm flag,
    ``d2t`` as absolute target ids (= t2d's), the tensors as exported. Only the tokenizer step is stubbed (the tiny
    target has none; llama.cpp reads the target's)."""
    import sys

    root = os.environ.get("LLAMA_CPP_DIR")
    if not root or not Path(root, "convert_hf_to_gguf.py").is_file():
        pytest.skip("set LLAMA_CPP_DIR to a llama.cpp source tree (with convert_hf_to_gguf.py and conversion/)")
    gguf = pytest.importorskip("gguf")
    drafter = drafter_for(target, norm_before_residual=True)
    folder = write_speculators(drafter, tmp_path / "spec", target)
    out = tmp_path / "draft.gguf"
    done = subprocess.run([sys.executable, "-c", CONVERT_LLAMA_CPP, root, str(folder), str(target), str(out)],
                          check=False, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    reader = gguf.GGUFReader(str(out))

    def field(name: str) -> list:
        f = reader.fields[name]
        return [f.parts[i].tolist()[0] for i in f.data]

    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "eagle3"
    assert field("eagle3.target_layers") == [2, 4, 5] and field("eagle3.target_hidden_size") == [H]
    assert field("eagle3.norm_before_residual") == [True] and field("eagle3.block_count") == [1]
    tensors = {t.name: torch.from_numpy(t.data.copy()) for t in reader.tensors}
    assert torch.equal(tensors["d2t"], drafter.t2d.nonzero().flatten())
    for ours, theirs in (("fc.weight", "fc.weight"), ("embed_tokens.weight", "token_embd.weight"),
                         ("layers.0.hidden_norm.weight", "blk.0.attn_norm_2.weight"),
                         ("layers.0.input_layernorm.weight", "blk.0.attn_norm.weight"),
                         ("norm.weight", "output_norm.weight"), ("lm_head.weight", "output.weight")):
        assert torch.equal(tensors[theirs].view(drafter.state_dict()[ours].shape), drafter.state_dict()[ours]), ours
