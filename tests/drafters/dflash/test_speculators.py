"""DFlash drafter export (lightning_bpd/drafters/dflash/speculators.py, ``export-heads --format speculators|dflash-zlab``): both
layouts' config.json and safetensors, the exported tensors are the drafter's, the z-lab export read back drafts as the
drafter does, bad input is one line; slow: speculators' own DFlashDraftModel (in a separate virtual environment)
loads the speculators export and computes the drafter's hidden states and logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from safetensors.torch import load_file

from lightning_bpd.commands.cli import main
from lightning_bpd.decoding import Exact, decode
from lightning_bpd.drafters.dflash.module import DFlashModule
from lightning_bpd.drafters.dflash.proposer import DFlash
from lightning_bpd.drafters.dflash.speculators import (
    SPECULATORS_VERSION,
    read_zlab,
    speculators_config,
    write_speculators,
    write_zlab,
)
from tests.tasks.lm.tiny_lm import PAD, PROMPTS

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random Llama (2 layers, hidden 32, 4 heads, 2 KV heads) with its tokenizer."""
    from tests.tasks.lm.tiny_lm import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("lm") / "llama")


def trained(checkpoint: Path, **kwargs) -> DFlashModule:
    """A DFlashModule whose drafter's parameters are all moved off their initial values (norms included)."""
    module = DFlashModule(str(checkpoint), **{"num_layers": 2, "block_size": 4, "target_layer_ids": [0, 1], **kwargs})
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in module.drafter.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return module.eval()


def save_ckpt(module: pl.LightningModule, path: Path) -> Path:
    """``module`` as a fit run's last.ckpt holds it (what ``load_model`` reads)."""
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                  "pytorch-lightning_version": pl.__version__}
    module.on_save_checkpoint(checkpoint)
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module")
def run(checkpoint, tmp_path_factory) -> Path:
    return save_ckpt(trained(checkpoint), tmp_path_factory.mktemp("run") / "last.ckpt")


DRAFTER_SHAPES = {"fc.weight": (32, 64), "hidden_norm.weight": (32,), "norm.weight": (32,),
                  **{f"layers.{i}.{name}": shape for i in range(2) for name, shape in (
                      ("input_layernorm.weight", (32,)), ("post_attention_layernorm.weight", (32,)),
                      ("self_attn.q_proj.weight", (32, 32)), ("self_attn.k_proj.weight", (16, 32)),
                      ("self_attn.v_proj.weight", (16, 32)), ("self_attn.o_proj.weight", (32, 32)),
                      ("self_attn.q_norm.weight", (8,)), ("self_attn.k_norm.weight", (8,)),
                      ("mlp.gate_proj.weight", (64, 32)), ("mlp.up_proj.weight", (64, 32)),
                      ("mlp.down_proj.weight", (32, 64)))}}


def test_speculators_layout(run, checkpoint, tmp_path, capsys):
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "spec"), "--format", "speculators"])
    err = capsys.readouterr().err
    assert "DFlash drafter" in err and "(speculators)" in err
    assert "target layer 1 is the target's last" in err  # aux id 2 = the 2-layer target's output: a warning
    module = DFlashModule.load_from_checkpoint(run, map_location="cpu")
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    vocab = module.model.vocab_size
    assert config["architectures"] == ["DFlashDraftModel"] and config["speculators_model_type"] == "dflash"
    assert config["speculators_version"] == SPECULATORS_VERSION
    assert (config["block_size"], config["draft_vocab_size"], config["target_hidden_size"]) == (4, vocab, 32)
    assert config["aux_hidden_state_layer_ids"] == [1, 2] and config["mask_token_id"] == PAD
    assert not config["sample_from_anchor"] and not config["sliding_window_non_causal"]
    spec = config["speculators_config"]
    assert spec["algorithm"] == "dflash" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert spec["verifier"] == {"name_or_path": str(checkpoint.resolve()), "architectures": ["LlamaForCausalLM"]}
    layer = config["transformer_layer_config"]
    assert {k: layer[k] for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                  "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                                  "vocab_size", "max_position_embeddings", "rope_theta", "rms_norm_eps")} == {
        "model_type": "qwen3", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "hidden_act": "silu", "vocab_size": vocab,
        "max_position_embeddings": 128, "rope_theta": module.drafter.config.rope_theta,
        "rms_norm_eps": module.drafter.config.rms_norm_eps}
    assert layer["layer_types"] == ["full_attention"] * 2 and not layer["use_sliding_window"]
    assert layer["sliding_window"] is None
    state = load_file(str(tmp_path / "spec" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in state.items()} == DRAFTER_SHAPES  # no embed/lm_head, no d2t/t2d
    assert all(torch.equal(state[k], v) for k, v in module.drafter.state_dict().items())
    record = json.loads((tmp_path / "spec" / "export_heads.json").read_text())
    assert record["format"] == "speculators" and record["target_layer_ids"] == [0, 1]


def test_zlab_layout_reads_back_and_drafts_the_same(run, checkpoint, tmp_path, capsys):
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "zlab"), "--format", "dflash-zlab"])
    assert "(dflash-zlab)" in capsys.readouterr().err
    module = DFlashModule.load_from_checkpoint(run, map_location="cpu").eval()
    config = json.loads((tmp_path / "zlab" / "config.json").read_text())
    assert config["architectures"] == ["DFlashDraftModel"] and config["model_type"] == "qwen3"
    assert (config["num_target_layers"], config["block_size"], config["num_hidden_layers"]) == (2, 4, 2)
    assert config["dflash_config"] == {"target_layer_ids": [0, 1], "mask_token_id": PAD, "block_size": 4}
    assert (config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"],
            config["intermediate_size"], config["vocab_size"]) == (32, 4, 2, 8, 64, module.model.vocab_size)
    assert "speculators_config" not in config and "auto_map" not in config
    state = load_file(str(tmp_path / "zlab" / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in state.items()} == DRAFTER_SHAPES
    assert all(torch.equal(state[k], v) for k, v in module.drafter.state_dict().items())

    back = read_zlab(tmp_path / "zlab")
    assert back.config == module.drafter.config
    g = torch.Generator().manual_seed(0)
    features, embeds = torch.randn(2, 12, 64, generator=g), torch.randn(2, 3, 4, 32, generator=g)
    anchors = torch.tensor([[1, 4, 8], [2, 3, 6]])
    positions = anchors[..., None] + torch.arange(4)
    with torch.no_grad():
        assert torch.equal(back.train_forward(features, embeds, anchors, positions),
                           module.drafter.train_forward(features, embeds, anchors, positions))
        src = module.encode_prompts(PROMPTS)
        want = decode(module.model, src, Exact(), DFlash(module.drafter), max_len=12)
        got = decode(module.model, src, Exact(), DFlash(back), max_len=12)
    assert got.sequences() == want.sequences() and got.block_sizes == want.block_sizes


def test_writers_take_a_drafter_and_its_target_directory(checkpoint, tmp_path):
    module = trained(checkpoint, num_layers=1, target_layer_ids=[0])
    a = json.loads((write_speculators(module, tmp_path / "a") / "config.json").read_text())
    b = json.loads((write_speculators(module.drafter, tmp_path / "b", target=checkpoint) / "config.json").read_text())
    assert b["speculators_config"]["verifier"]["name_or_path"] == str(checkpoint)  # the target as given
    b["speculators_config"]["verifier"]["name_or_path"] = a["speculators_config"]["verifier"]["name_or_path"]
    assert a == b and a["aux_hidden_state_layer_ids"] == [1]
    write_zlab(module.drafter, tmp_path / "z", target=checkpoint)
    assert read_zlab(tmp_path / "z").config == module.drafter.config
    with pytest.raises(ValueError, match="give target="):
        speculators_config(module.drafter)
    with pytest.raises(ValueError, match="not a directory"):
        speculators_config(module.drafter, target=tmp_path / "nowhere")


def error_line(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as err:
        main(argv)
    message = str(err.value.code)
    assert message.startswith("export-heads: ") and "\n" not in message and "Traceback" not in message
    return message


def test_bad_input_is_one_line(run, checkpoint, tmp_path):
    from lightning_bpd.tasks.lm import LMModule
    from lightning_bpd.tasks.translation.hf_module import save_heads

    out = ["--out", str(tmp_path / "out")]
    assert "use --format speculators (vLLM), dflash-zlab or llamacpp (llama.cpp), not vllm-medusa" in error_line(
        ["export-heads", "--ckpt", str(run), *out, "--format", "vllm-medusa"])
    assert "not heads" in error_line(["export-heads", "--ckpt", str(run), *out])  # the default --format heads
    heads = save_heads(LMModule(str(checkpoint), k=3), tmp_path / "heads")
    for layout in ("speculators", "dflash-zlab", "llamacpp"):
        message = error_line(["export-heads", "--ckpt", str(heads), *out, "--format", layout])
        assert f"--format {layout} takes the checkpoint of a DFlash drafter run" in message and "LMModule" in message
    assert not (tmp_path / "out").exists()

    folder = write_zlab(trained(checkpoint), tmp_path / "zlab")
    (folder / "model.safetensors").rename(tmp_path / "weights")
    with pytest.raises(ValueError, match=r"no model.safetensors \(a z-lab DFlash folder"):
        read_zlab(folder)
    (tmp_path / "weights").rename(folder / "model.safetensors")
    config = json.loads((folder / "config.json").read_text())
    shape_line = r"gate_proj.weight has shape \(64, 32\), config.json says \(48, 32\)"
    for change, match in (({"architectures": ["Qwen3ForCausalLM"]}, "not \\['DFlashDraftModel'\\]"),
                          ({"speculators_model_type": "dflash"}, "a speculators export"),
                          ({"layer_types": ["sliding_attention", "full_attention"]}, "sliding-window layers"),
                          ({"dflash_config": {"mask_token_id": 0}}, "no 'target_layer_ids'"),
                          ({"intermediate_size": 48}, shape_line)):
        (folder / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(ValueError, match=match) as err:
            read_zlab(folder)
        assert "\n" not in str(err.value)


# ---- slow: speculators' own DFlash model on the export --------------------------------------------------------------

VENV = Path(__file__).resolve().parents[2] / ".cache" / "speculators-venv"
SPECULATORS_PINS = [f"speculators=={SPECULATORS_VERSION}", f"hs-connectors=={SPECULATORS_VERSION}"]
EXTRA_DEPS = ["openai", "loguru", "pydantic-settings", "datasets>=4.0.0,<=5.1.0"]  # what its imports need on a CPU

RUN_SPECULATORS = r"""
import sys, torch
from speculators.models.dflash import DFlashDraftModel, DFlashSpeculatorConfig
export, inputs, out = sys.argv[1:]
config = DFlashSpeculatorConfig.from_pretrained(export)
config.transformer_layer_config._attn_implementation = "eager"
model = DFlashDraftModel.from_pretrained(export, config=config).eval()
assert type(model).__name__ == "DFlashDraftModel" and model._attn_impl == "eager", model._attn_impl
x = torch.load(inputs)
with torch.no_grad():
    hidden, logits, _, _, anchors = model._backbone_forward(
        x["features"], x["input_ids"], x["loss_mask"], torch.zeros(1, x["features"].shape[1], 32),
        torch.zeros_like(x["input_ids"]), max_anchors=int(x["loss_mask"].sum()))
torch.save({"hidden": hidden, "logits": logits, "anchors": anchors}, out)
"""


def speculators_python() -> Path:
    """The python of ``.cache/speculators-venv`` (made on first use): speculators and hs-connectors without their
    pinned dependencies, the few their imports need, and this environment's torch/transformers through a .pth file;
    skip when it cannot be made (no network)."""
    python = VENV / "bin" / "python"
    if python.exists() and subprocess.run([python, "-c", "import speculators.models.dflash"],
                                          check=False, capture_output=True).returncode == 0:
        return python
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True)
        purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        import sysconfig

        Path(purelib, "_lightning_bpd_parent.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, "--no-deps", *SPECULATORS_PINS], check=True, capture_output=True, timeout=600)
        subprocess.run([*pip, *EXTRA_DEPS], check=True, capture_output=True, timeout=900)
        subprocess.run([python, "-c", "import speculators.models.dflash"], check=True, capture_output=True)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"no speculators environment ({err}; stderr: {getattr(err, 'stderr', b'')[-300:]!r})")
    return python


@pytest.mark.slow
def test_speculators_dflash_model_computes_our_drafts(checkpoint, tmp_path):
    python = speculators_python()
    module = trained(checkpoint)
    folder = write_speculators(module, tmp_path / "spec")
    t, bk = 20, 4
    src = torch.randint(3, 200, (1, t), generator=torch.Generator().manual_seed(5))
    features, _ = module.target_pass(src)
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
    assert theirs["anchors"].tolist() == [a + j for a in anchors[0].tolist() for j in range(bk)]
    with torch.no_grad():
        embeds, positions, _, _, _ = module.blocks(src, anchors, torch.zeros_like(src), torch.tensor([t]))
        ours = module.drafter.train_forward(features, embeds, anchors, positions)  # (1, M, Bk, H)
        logits = module.model.logits_first(ours)
    hidden = theirs["hidden"].view(ours.shape)
    assert torch.allclose(hidden, ours, rtol=1e-4, atol=1e-5 * float(ours.abs().max())), \
        float((hidden - ours).abs().max())
    their_logits = theirs["logits"].view(logits.shape)
    assert torch.allclose(their_logits, logits, rtol=1e-4, atol=1e-5 * float(logits.abs().max()))
    assert torch.equal(their_logits.argmax(-1), logits.argmax(-1))  # the same drafts


CONVERT_ZLAB = r"""
import json, sys
from speculators.convert.dflash import DFlashConverter
zlab, target, out = sys.argv[1:]
DFlashConverter().convert(zlab, out, base_model=target, validate=True)
"""


@pytest.mark.slow
def test_speculators_converter_turns_our_zlab_export_into_our_speculators_export(checkpoint, tmp_path):
    """speculators' own z-lab converter on our dflash-zlab export: its config (the +1 of the layer ids included) and
    weights are those of our speculators export (a target layer below the last: the converter drops the last)."""
    python = speculators_python()
    module = trained(checkpoint, num_layers=1, target_layer_ids=[0])
    write_zlab(module, tmp_path / "zlab")
    ours = json.loads((write_speculators(module, tmp_path / "spec") / "config.json").read_text())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([python, "-c", CONVERT_ZLAB, str(tmp_path / "zlab"), str(checkpoint),
                           str(tmp_path / "converted")], check=False, capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads((tmp_path / "converted" / "config.json").read_text())
    for key in ("architectures", "speculators_model_type", "draft_vocab_size", "block_size",
                "aux_hidden_state_layer_ids", "mask_token_id", "sample_from_anchor", "sliding_window_non_causal"):
        assert theirs[key] == ours[key], key
    assert theirs["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3
    assert theirs["speculators_config"]["algorithm"] == "dflash"
    layer = theirs["transformer_layer_config"]
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "head_dim", "vocab_size", "rms_norm_eps"):
        assert layer[key] == ours["transformer_layer_config"][key], key
    state = load_file(str(tmp_path / "converted" / "model.safetensors"))
    assert set(state) == set(module.drafter.state_dict())  # no embed_tokens / lm_head saved (0.9.0)
    assert all(torch.equal(state[k], v) for k, v in module.drafter.state_dict().items())
