"""The DFlash drafter as llama.cpp's GGUF (lightning_bpd/drafters/dflash/gguf.py, ``export-heads --format llamacpp``): read
back with gguf's reader, its keys, values and tensors are the drafter's, in the converter's order; slow: llama.cpp's
own converter (from the build-llamacpp folder) makes the same file of our z-lab export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from lightning_bpd.commands.cli import main
from lightning_bpd.drafters.dflash.gguf import gguf_tensor_name, write_dflash_gguf
from lightning_bpd.drafters.dflash.speculators import write_zlab
from tests.drafters.dflash.test_speculators import save_ckpt, trained
from tests.llamacpp_build import llamacpp_source
from tests.tasks.lm.tiny_lm import BOS, EOS, PAD

pytestmark = pytest.mark.usefixtures("one_thread")

# the keys llama.cpp's converter (llama-cpp-python 0.3.36) writes for a z-lab DFlash folder with a Llama target whose
# byte-level BPE tokenizer adds BOS, in its order
KEYS = ["GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture", "general.type", "general.name",
        "general.size_label", "dflash.block_count", "dflash.context_length", "dflash.embedding_length",
        "dflash.feed_forward_length", "dflash.attention.head_count", "dflash.attention.head_count_kv",
        "dflash.rope.freq_base", "dflash.attention.layer_norm_rms_epsilon", "dflash.attention.key_length",
        "dflash.attention.value_length", "general.file_type", "dflash.block_size", "dflash.target_layers",
        "general.quantization_version", "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type", "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
        "tokenizer.ggml.mask_token_id"]
LAYER_ORDER = ["attn_norm", "ffn_down", "ffn_gate", "ffn_up", "ffn_norm", "attn_k_norm", "attn_k", "attn_output",
               "attn_q_norm", "attn_q", "attn_v"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from tests.tasks.lm.tiny_lm import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("lm") / "llama")


def fields(path: Path) -> tuple[dict[str, Any], Any]:
    """A GGUF's keys -> values (in the file's order) and its reader."""
    reader = gguf.GGUFReader(str(path))
    return {key: field.contents() for key, field in reader.fields.items()}, reader


def test_export_heads_llamacpp_writes_the_converters_keys_and_our_tensors(checkpoint, tmp_path, capsys):
    module = trained(checkpoint, target_layer_ids=[0])  # 2 draft layers on the output of target layer 0 of 2
    run = save_ckpt(module, tmp_path / "last.ckpt")
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    err = capsys.readouterr().err
    assert "--spec-type draft-dflash --spec-draft-n-max 3" in err and "(llamacpp)" in err
    values, reader = fields(tmp_path / "out" / "drafter.gguf")
    assert list(values) == KEYS
    tokenizer, vocab = module.tokenizer, module.model.vocab_size
    want = {"general.architecture": "dflash", "general.type": "model", "dflash.block_count": 2,
            "dflash.context_length": 128, "dflash.embedding_length": 32, "dflash.feed_forward_length": 64,
            "dflash.attention.head_count": 4, "dflash.attention.head_count_kv": 2,
            "dflash.attention.key_length": 8, "dflash.attention.value_length": 8, "general.file_type": 0,
            "dflash.block_size": 4, "dflash.target_layers": [1], "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.bos_token_id": BOS, "tokenizer.ggml.eos_token_id": EOS,
            "tokenizer.ggml.padding_token_id": PAD, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.mask_token_id": module.drafter.config.mask_token_id}
    assert {key: values[key] for key in want} == want
    assert values["dflash.rope.freq_base"] == pytest.approx(module.drafter.config.rope_theta)
    assert values["dflash.attention.layer_norm_rms_epsilon"] == pytest.approx(module.drafter.config.rms_norm_eps)
    assert len(values["tokenizer.ggml.tokens"]) == vocab
    assert values["tokenizer.ggml.tokens"][:3] == [tokenizer.convert_ids_to_tokens(i) for i in range(3)]

    names = [t.name for t in reader.tensors]
    assert names == ["fc.weight", "enc.output_norm.weight",
                     *[f"blk.{i}.{n}.weight" for i in range(2) for n in LAYER_ORDER], "output_norm.weight"]
    state = module.drafter.state_dict()
    by_name = {gguf_tensor_name(k): v for k, v in state.items()}
    for t in reader.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape[::-1]) == list(by_name[t.name].shape), t.name  # GGUF lists dims fastest first
        assert np.array_equal(np.asarray(t.data).reshape(by_name[t.name].shape), by_name[t.name].numpy()), t.name
    target, target_reader = fields(tmp_path / "out" / "target.gguf")
    assert target["general.architecture"] == "llama" and target["tokenizer.ggml.tokens"] == \
        values["tokenizer.ggml.tokens"]
    assert "token_embd.weight" in [t.name for t in target_reader.tensors]
    record = json.loads((tmp_path / "out" / "export_heads.json").read_text())
    assert record["format"] == "llamacpp" and record["block_size"] == 4


def test_tensor_names_and_bad_input(checkpoint, tmp_path):
    assert gguf_tensor_name("layers.3.self_attn.o_proj.weight") == "blk.3.attn_output.weight"
    assert gguf_tensor_name("hidden_norm.weight") == "enc.output_norm.weight"
    with pytest.raises(ValueError, match="not a tensor of a DFlash drafter"):
        gguf_tensor_name("embed_tokens.weight")
    module = trained(checkpoint, num_layers=1, target_layer_ids=[0])
    with pytest.raises(ValueError, match="give target="):
        write_dflash_gguf(module.drafter, tmp_path / "d.gguf")
    values, _ = fields(write_dflash_gguf(module.drafter, tmp_path / "d.gguf", target=checkpoint))
    assert values["dflash.target_layers"] == [1] and values["dflash.block_count"] == 1
    run = save_ckpt(trained(checkpoint, target_layer_ids=[0, 1]), tmp_path / "last.ckpt")
    with pytest.raises(SystemExit) as err:  # llama.cpp has no input after the last layer to take its output from
        main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    message = str(err.value.code)
    assert "target layer 1 is the target's last" in message and "\n" not in message



def test_a_refused_llamacpp_export_leaves_nothing_behind(checkpoint, tmp_path, monkeypatch):
    from lightning_bpd.drafters.common import llamacpp
    from lightning_bpd.hf import gguf_llama

    run = save_ckpt(trained(checkpoint, target_layer_ids=[0]), tmp_path / "last.ckpt")

    def refused(out: Path) -> str:
        with pytest.raises(SystemExit) as err:
            main(["export-heads", "--ckpt", str(run), "--out", str(out), "--format", "llamacpp"])
        message = str(err.value.code)
        assert message.startswith("export-heads: ") and "\n" not in message
        return message

    (tmp_path / "file").write_text("x")  # --out a file: one line, no FileExistsError's traceback
    assert refused(tmp_path / "file") == f"export-heads: --out {tmp_path / 'file'} is a file: give a folder"
    assert "is a file: give a folder" in refused(tmp_path / "file" / "out")
    assert (tmp_path / "file").read_text() == "x"
    old = tmp_path / "old"  # an earlier export: its files stay as they were
    old.mkdir()
    (old / "drafter.gguf").write_bytes(b"earlier")
    (old / "notes.txt").write_text("mine")
    with monkeypatch.context() as patch:  # the drafter's GGUF refused: a tokenizer llama.cpp would split otherwise
        patch.setattr(gguf_llama, "is_gpt2_byte_level", lambda pre: False)
        assert "not byte-level" in refused(tmp_path / "new" / "out")
        assert "not byte-level" in refused(old)

    def no_llama(*args: object, **kwargs: object) -> None:
        raise ValueError("the target is no Llama")

    with monkeypatch.context() as patch:  # the target's GGUF refused after drafter.gguf is written
        patch.setattr(llamacpp, "write_llama_gguf", no_llama)
        assert "the target is no Llama" in refused(tmp_path / "new" / "out")
        assert "the target is no Llama" in refused(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "last.ckpt", "old"]  # no folder, no partial one
    assert {p.name: p.read_bytes() for p in old.iterdir()} == {"drafter.gguf": b"earlier", "notes.txt": b"mine"}
    main(["export-heads", "--ckpt", str(run), "--out", str(old), "--format", "llamacpp"])  # then a complete export
    assert sorted(p.name for p in old.iterdir()) == ["drafter.gguf", "export_heads.json", "notes.txt", "target.gguf"]
    assert fields(old / "drafter.gguf")[0]["general.architecture"] == "dflash"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "last.ckpt", "old"]

# ---- slow: llama.cpp's own converter on our z-lab export -----------------------------------------------------------

CONVERT = r"""
import runpy, sys
from pathlib import Path
source = Path(sys.argv[1])
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
sys.path[:0] = [str(source), str(source / "gguf-py")]
import conversion.base
# our tokenizers are trained here: the converter's table of known pre-tokenizer hashes has none of them; they are
# GPT-2's byte-level regex (gguf_llama.is_gpt2_byte_level), the name write_llama_gguf gives them too
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
runpy.run_path(str(source / "convert_hf_to_gguf.py"), run_name="__main__")
"""


def converted(folder: Path, target: Path, out: Path) -> tuple[dict[str, Any], Any]:
    """llama.cpp's converter (the build-llamacpp folder's; skipped without it) run on the export ``folder`` beside
    ``target``, float32, into ``out``: its keys -> values and its reader."""
    source = llamacpp_source()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("NO_LOCAL_GGUF", None)
    done = subprocess.run([sys.executable, "-c", CONVERT, str(source), str(folder), "--target-model-dir", str(target),
                           "--outfile", str(out), "--outtype", "f32"],
                          check=False, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return fields(out)


def same_tensors(ours: Any, theirs: Any) -> bool:
    """Whether two GGUF readers hold the same tensors: names, types, shapes, values, in the same order."""
    return [(t.name, t.tensor_type, list(t.shape)) for t in ours.tensors] == \
        [(t.name, t.tensor_type, list(t.shape)) for t in theirs.tensors] and \
        all(np.array_equal(a.data, b.data) for a, b in zip(ours.tensors, theirs.tensors, strict=True))


@pytest.mark.slow
def test_llamacpp_converter_makes_our_gguf_of_our_zlab_export(checkpoint, tmp_path):
    module = trained(checkpoint, target_layer_ids=[0])
    write_zlab(module, tmp_path / "zlab")
    theirs, theirs_reader = converted(tmp_path / "zlab", checkpoint, tmp_path / "theirs.gguf")
    ours, ours_reader = fields(write_dflash_gguf(module, tmp_path / "ours.gguf"))
    assert list(ours) == list(theirs) == KEYS  # the same keys in the same order
    differ = [key for key in ours if ours[key] != theirs[key]]
    assert differ == ["general.name"], differ  # theirs is the folder's name ("Zlab")
    assert same_tensors(ours_reader, theirs_reader)
