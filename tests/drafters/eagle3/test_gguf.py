"""The EAGLE-3 drafter as llama.cpp's GGUF (lightning_bpd/drafters/eagle3/gguf.py, ``export-heads --format
llamacpp`` on an EAGLE-3 run): read back with gguf's reader, its keys, values and tensors are the drafter's, in the
converter's order, ``d2t`` as absolute target ids; what llama.cpp cannot run is one line; slow: llama.cpp's own
converter (from the build-llamacpp folder) makes the same file, byte for byte, of our speculators export. A target of
49,152 tokens (SmolLM2's; the converter's Granite special case: ``add_bos_token`` false) exports; slow: as the
converter writes it, and llama.cpp runs it."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from lightning_bpd.commands.cli import main
from lightning_bpd.drafters.common.gguf import GRANITE_VOCAB
from lightning_bpd.drafters.eagle3.gguf import gguf_tensor_name, write_eagle3_gguf
from lightning_bpd.drafters.eagle3.module import Eagle3Module
from lightning_bpd.drafters.eagle3.network import Eagle3Drafter
from lightning_bpd.drafters.eagle3.speculators import write_speculators
from lightning_bpd.hf.gguf_llama import interleave_rotary
from tests.drafters.dflash.test_gguf import converted, fields, same_tensors
from tests.drafters.dflash.test_speculators import save_ckpt
from tests.llamacpp_build import llamacpp_source
from tests.tasks.lm.tiny_lm import BOS, EOS, PAD

pytestmark = pytest.mark.usefixtures("one_thread")

# the keys llama.cpp's converter (llama-cpp-python 0.3.36) writes for a speculators eagle3 folder with a Llama target
# whose byte-level BPE tokenizer adds BOS, in its order
KEYS = ["GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "eagle3.target_layers",
        "eagle3.target_hidden_size", "eagle3.norm_before_residual", "eagle3.norm_before_fc", "general.type",
        "general.name", "general.size_label", "eagle3.block_count", "eagle3.context_length",
        "eagle3.embedding_length", "eagle3.feed_forward_length", "eagle3.attention.head_count",
        "eagle3.attention.head_count_kv", "eagle3.rope.freq_base", "eagle3.attention.layer_norm_rms_epsilon",
        "eagle3.attention.key_length", "eagle3.attention.value_length", "general.file_type", "eagle3.vocab_size",
        "eagle3.rope.dimension_count", "general.quantization_version", "tokenizer.ggml.model", "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token"]
TENSORS = ["token_embd.weight", "fc.weight", "enc.output_norm.weight", "blk.0.attn_norm_2.weight",
           "blk.0.attn_norm.weight", "blk.0.ffn_down.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
           "blk.0.ffn_norm.weight", "blk.0.attn_k.weight", "blk.0.attn_output.weight", "blk.0.attn_q.weight",
           "blk.0.attn_v.weight", "output.weight", "output_norm.weight", "d2t"]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """A tiny random 4-layer Llama with its tokenizer: llama.cpp's eagle3 fuses exactly 3 target layers."""
    from tests.tasks.lm.tiny_lm import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("lm") / "llama", layers=4)


def drafter_module(target: Path, draft_vocab: int | None = 40, layers: tuple[int, ...] = (0, 1, 2),
                   **flags) -> Eagle3Module:
    """An Eagle3Module on ``target`` whose drafter's parameters (not its embeddings) are moved off their initial
    values, with a draft vocabulary of ``draft_vocab`` random ids (None: the whole vocabulary)."""
    module = Eagle3Module(str(target), target_layer_ids=list(layers), block_size=4, draft_vocab=draft_vocab, **flags)
    g = torch.Generator().manual_seed(3)
    if draft_vocab:
        module.set_draft_vocab(torch.randint(0, 1000, (module.drafter.config.vocab_size,), generator=g))
    with torch.no_grad():
        for name, p in module.drafter.named_parameters():
            if name != "embed_tokens.weight":
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return module.eval()


def test_export_heads_llamacpp_writes_the_converters_keys_and_our_tensors(target, tmp_path, capsys):
    module = drafter_module(target)
    run = save_ckpt(module, tmp_path / "last.ckpt")
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    err = capsys.readouterr().err
    assert "--spec-type draft-eagle3 --spec-draft-n-max 3" in err and "(llamacpp)" in err
    values, reader = fields(tmp_path / "out" / "drafter.gguf")
    assert list(values) == KEYS
    c, tokenizer = module.drafter.config, module.tokenizer
    want = {"general.architecture": "eagle3", "eagle3.target_layers": [1, 2, 3], "eagle3.target_hidden_size": 32,
            "eagle3.norm_before_residual": True, "eagle3.norm_before_fc": True, "general.type": "model",
            "general.name": "llama-eagle3", "eagle3.block_count": 1, "eagle3.context_length": 128,
            "eagle3.embedding_length": 32, "eagle3.feed_forward_length": 64, "eagle3.attention.head_count": 4,
            "eagle3.attention.head_count_kv": 2, "eagle3.attention.key_length": 8,
            "eagle3.attention.value_length": 8, "general.file_type": 0, "eagle3.vocab_size": c.vocab_size,
            "eagle3.rope.dimension_count": 8, "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
            "tokenizer.ggml.bos_token_id": BOS, "tokenizer.ggml.eos_token_id": EOS,
            "tokenizer.ggml.padding_token_id": PAD, "tokenizer.ggml.add_bos_token": True}
    assert {key: values[key] for key in want} == want
    assert values["eagle3.rope.freq_base"] == pytest.approx(c.rope_theta)
    assert values["eagle3.attention.layer_norm_rms_epsilon"] == pytest.approx(c.rms_norm_eps)
    assert values["tokenizer.ggml.tokens"][:3] == [tokenizer.convert_ids_to_tokens(i) for i in range(3)]

    assert [t.name for t in reader.tensors] == TENSORS
    state = module.drafter.state_dict()
    by_name = {gguf_tensor_name(k): v for k, v in state.items() if k not in ("d2t", "t2d")}
    for t in reader.tensors[:-1]:
        want_weight = by_name[t.name]
        if t.name in ("blk.0.attn_q.weight", "blk.0.attn_k.weight"):  # llama.cpp ropes adjacent pairs
            want_weight = interleave_rotary(want_weight, c.num_heads if "attn_q" in t.name else c.num_kv_heads)
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape[::-1]) == list(want_weight.shape), t.name  # GGUF lists dims fastest first
        assert np.array_equal(np.asarray(t.data).reshape(want_weight.shape), want_weight.numpy()), t.name
    d2t = reader.tensors[-1]
    assert d2t.tensor_type == gguf.GGMLQuantizationType.I64
    assert np.array_equal(np.asarray(d2t.data), module.drafter.t2d.nonzero().flatten().numpy())  # absolute ids
    assert np.array_equal(np.asarray(d2t.data), (state["d2t"] + torch.arange(40)).numpy())
    target_values, target_reader = fields(tmp_path / "out" / "target.gguf")
    assert target_values["general.architecture"] == "llama"
    assert target_values["tokenizer.ggml.tokens"] == values["tokenizer.ggml.tokens"]
    assert "token_embd.weight" in [t.name for t in target_reader.tensors]
    record = json.loads((tmp_path / "out" / "export_heads.json").read_text())
    assert record["format"] == "llamacpp" and record["block_size"] == 4 and record["draft_vocab_size"] == 40


def test_a_whole_vocabulary_drafter_has_no_d2t(target, tmp_path):
    module = drafter_module(target, draft_vocab=None, norm_before_fc=False)
    values, reader = fields(write_eagle3_gguf(module.drafter, tmp_path / "d.gguf", target))
    names = [t.name for t in reader.tensors]
    assert "d2t" not in names and "enc.output_norm.weight" not in names and len(names) == len(TENSORS) - 2
    assert values["eagle3.norm_before_fc"] is False and values["general.name"] == "llama-eagle3"


def test_what_llama_cpp_cannot_run_is_one_line(target, tmp_path):
    assert gguf_tensor_name("layers.0.hidden_norm.weight") == "blk.0.attn_norm_2.weight"
    assert gguf_tensor_name("input_norm.weight") == "enc.output_norm.weight"
    with pytest.raises(ValueError, match="not a tensor llama.cpp's eagle3 has"):
        gguf_tensor_name("layers.0.self_attn.q_norm.weight")
    drafter = drafter_module(target, draft_vocab=None).drafter
    config = dataclasses.replace(drafter.config, family="qwen3", fc_norm=True, norm_before_fc=False)
    with pytest.raises(ValueError, match=r"qwen3 layer .*; fc_norm") as err:
        write_eagle3_gguf(Eagle3Drafter(config), tmp_path / "d.gguf", target)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="is not a directory"):
        write_eagle3_gguf(drafter, tmp_path / "d.gguf", tmp_path / "nowhere")
    run = save_ckpt(drafter_module(target, draft_vocab=None, layers=(0, 2)), tmp_path / "last.ckpt")
    with pytest.raises(SystemExit) as exit_err:
        main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    message = str(exit_err.value.code)
    assert "2 target layers (llama.cpp's eagle3 takes exactly 3)" in message and "\n" not in message
    with pytest.raises(SystemExit, match="use --format speculators .* or llamacpp"):
        main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "dflash-zlab"])


# ---- slow: llama.cpp's own converter on our speculators export -----------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("variant", ["draft vocabulary", "whole vocabulary"])
def test_llamacpp_converter_makes_our_gguf_of_our_speculators_export(target, tmp_path, variant):
    """``convert_hf_to_gguf.py <speculators export> --target-model-dir <target> --outtype f32`` (its pre-tokenizer
    hash check bypassed: our tokenizers are trained here) writes the same bytes as ours (named as it names it): with a
    draft vocabulary and both norm flags; and with the whole vocabulary, neither flag and a target whose
    tokenizer_config.json sets add_prefix_space (which its LlamaModel copies)."""
    llamacpp_source()  # skip before fitting anything without a build
    if variant == "draft vocabulary":
        drafter = drafter_module(target).drafter
    else:
        shutil.copytree(target, tmp_path / "llama")
        target = tmp_path / "llama"
        config_file = target / "tokenizer_config.json"
        config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "add_prefix_space": False}))
        drafter = drafter_module(target, draft_vocab=None, norm_before_fc=False, norm_before_residual=False).drafter
    write_speculators(drafter, tmp_path / "spec", target)
    theirs, theirs_reader = converted(tmp_path / "spec", target, tmp_path / "theirs.gguf")
    ours, ours_reader = fields(write_eagle3_gguf(drafter, tmp_path / "ours.gguf", target, name="Spec"))
    assert list(ours) == list(theirs)  # the same keys in the same order
    assert [key for key in ours if ours[key] != theirs[key]] == []
    assert ("tokenizer.ggml.add_space_prefix" in theirs) == (variant == "whole vocabulary")
    assert same_tensors(ours_reader, theirs_reader)
    assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()


# ---- a 49,152-token target (SmolLM2's vocabulary; the converter's Granite special case) -----------------------------

@pytest.fixture(scope="module")
def granite_target(tmp_path_factory) -> Callable[[bool], Path]:
    """adds_bos -> a tiny random 4-layer Llama (hidden 16) over 49,152 tokens (the tiny tokenizer with added tokens up
    to there), whose tokenizer adds BOS or (as SmolLM2's) not; each made once."""
    from tokenizers import processors
    from transformers import LlamaConfig, LlamaForCausalLM

    from tests.tasks.lm.tiny_lm import scrambled, tokenizer

    made: dict[bool, Path] = {}

    def make(adds_bos: bool) -> Path:
        if adds_bos not in made:
            folder = tmp_path_factory.mktemp("granite") / "llama"
            tok = tokenizer(extra=GRANITE_VOCAB - len(tokenizer()))
            if not adds_bos:
                tok.backend_tokenizer.post_processor = processors.TemplateProcessing(single="$A")
            torch.manual_seed(0)
            config = LlamaConfig(vocab_size=GRANITE_VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=4,
                                 num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                 pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, tie_word_embeddings=False)
            scrambled(LlamaForCausalLM(config).eval(), 0).save_pretrained(folder)
            tok.save_pretrained(folder)
            made[adds_bos] = folder
        return made[adds_bos]

    return make


@pytest.mark.parametrize("adds_bos", [False, True])
def test_an_eagle3_drafter_of_a_49152_token_target_exports(granite_target, tmp_path, capsys, adds_bos):
    target = granite_target(adds_bos)
    module = drafter_module(target)
    assert module.drafter.config.vocab_size == GRANITE_VOCAB
    run = save_ckpt(module, tmp_path / "last.ckpt")
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    assert "--spec-type draft-eagle3" in capsys.readouterr().err
    values, reader = fields(tmp_path / "out" / "drafter.gguf")
    assert values["eagle3.vocab_size"] == GRANITE_VOCAB and len(values["tokenizer.ggml.tokens"]) == GRANITE_VOCAB
    assert values["tokenizer.ggml.add_bos_token"] is adds_bos  # the converter's false, unless the target adds BOS
    assert [t.name for t in reader.tensors] == TENSORS
    target_values, _ = fields(tmp_path / "out" / "target.gguf")
    assert target_values["tokenizer.ggml.add_bos_token"] is adds_bos  # llama.cpp needs the two to agree


@pytest.mark.slow
@pytest.mark.parametrize("adds_bos", [False, True])
def test_llamacpp_converter_makes_our_gguf_of_a_49152_token_target(granite_target, tmp_path, adds_bos):
    """The converter's file of an EAGLE-3 export over a 49,152-token target: byte for byte ours where the target does
    not add BOS (SmolLM2); where it does, ours keeps ``add_bos_token`` true (the converter's false would make llama.cpp
    refuse the drafter beside its target) and nothing else differs."""
    llamacpp_source()
    target = granite_target(adds_bos)
    drafter = drafter_module(target).drafter
    write_speculators(drafter, tmp_path / "spec", target)
    theirs, theirs_reader = converted(tmp_path / "spec", target, tmp_path / "theirs.gguf")
    ours, ours_reader = fields(write_eagle3_gguf(drafter, tmp_path / "ours.gguf", target, name="Spec"))
    assert list(ours) == list(theirs) and theirs["tokenizer.ggml.add_bos_token"] is False
    assert [key for key in ours if ours[key] != theirs[key]] == (["tokenizer.ggml.add_bos_token"] if adds_bos else [])
    assert same_tensors(ours_reader, theirs_reader)
    if not adds_bos:
        assert (tmp_path / "ours.gguf").read_bytes() == (tmp_path / "theirs.gguf").read_bytes()


@pytest.mark.slow
def test_llama_cpp_runs_an_eagle3_drafter_of_a_49152_token_target(granite_target, tmp_path):
    """llama.cpp loads the drafter beside the float32 target of 49,152 tokens and decodes as alone."""
    from tests.benchmarks.test_llamacpp_speculative import bench_llamacpp, saved_run
    from tests.llamacpp_build import llamacpp_binaries

    build = llamacpp_binaries()
    ckpt, _ = saved_run(drafter_module(granite_target(False)), tmp_path)
    result = bench_llamacpp(ckpt, build, 12, "--batch-sizes", "1")
    agreed = result["llamacpp"]["eagle3_vs_alone"]
    assert agreed["differs_from_llamacpp_f32"] == 0 and agreed["drafted"] > 0, agreed
    assert result["batch_sizes"]["1"]["llamacpp_f32"]["differs_from_hf_generate"] == 0


@pytest.mark.slow
def test_llamacpp_converter_makes_our_dflash_gguf_of_a_49152_token_target(granite_target, tmp_path):
    """A DFlash drafter's converter (which reads a Llama target's vocabulary with ``LlamaModel.set_vocab``) writes the
    same special case: ours is its file but for the name."""
    from lightning_bpd.drafters.dflash.gguf import write_dflash_gguf
    from lightning_bpd.drafters.dflash.speculators import write_zlab
    from tests.drafters.dflash.test_speculators import trained

    llamacpp_source()
    target = granite_target(False)
    module = trained(target, target_layer_ids=[0, 1])
    write_zlab(module, tmp_path / "zlab")
    theirs, theirs_reader = converted(tmp_path / "zlab", target, tmp_path / "theirs.gguf")
    ours, ours_reader = fields(write_dflash_gguf(module, tmp_path / "ours.gguf"))
    assert list(ours) == list(theirs) and ours["tokenizer.ggml.add_bos_token"] is False
    assert [key for key in ours if ours[key] != theirs[key]] == ["general.name"]
    assert same_tensors(ours_reader, theirs_reader)
