"""The DSpark drafter as llama.cpp's GGUF (lightning_bpd/drafters/dspark/gguf.py, ``export-heads --format llamacpp``):
a ``dflash`` GGUF with DSpark's two keys and its head tensors, read back with gguf's reader; slow: llama.cpp's own
converter makes the same file of our speculators export, and llama.cpp decodes with it (``--spec-type draft-dspark``)
as it decodes alone."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")

from lightning_bpd.commands.cli import main
from lightning_bpd.drafters.dspark.gguf import dspark_tensor_name, write_dspark_gguf
from lightning_bpd.drafters.dspark.speculators import write_speculators
from tests.drafters.dflash.test_gguf import KEYS, LAYER_ORDER, converted, fields, same_tensors
from tests.drafters.dspark.test_export import trained
from tests.drafters.dspark.tiny import save_module

pytestmark = pytest.mark.usefixtures("one_thread")

# DFlash's keys, then DSpark's two after the target layers (the converter's DSparkModel.set_gguf_parameters)
DSPARK_KEYS = [*KEYS[: KEYS.index("dflash.target_layers") + 1], "dflash.sample_from_anchor",
               "dflash.has_confidence_head", *KEYS[KEYS.index("dflash.target_layers") + 1 :]]


def tensor_names(layers: int, confidence: bool = True) -> list[str]:
    return [*(["conf_proj.bias", "conf_proj.weight"] if confidence else []), "fc.weight", "enc.output_norm.weight",
            *[f"blk.{i}.{n}.weight" for i in range(layers) for n in LAYER_ORDER], "markov_w1.weight",
            "markov_w2.weight", "output_norm.weight"]


def test_export_heads_llamacpp_writes_dsparks_keys_and_tensors(checkpoint, tmp_path, capsys):
    module = trained(checkpoint, target_layer_ids=[0])
    run = save_module(module, tmp_path / "last.ckpt")
    main(["export-heads", "--ckpt", str(run), "--out", str(tmp_path / "out"), "--format", "llamacpp"])
    err = capsys.readouterr().err
    assert "--spec-type draft-dspark --spec-draft-n-max 4" in err and "(llamacpp)" in err
    values, reader = fields(tmp_path / "out" / "drafter.gguf")
    assert list(values) == DSPARK_KEYS
    assert values["general.architecture"] == "dflash" and values["dflash.block_size"] == 4
    assert values["dflash.sample_from_anchor"] is True and values["dflash.has_confidence_head"] is True
    assert values["dflash.target_layers"] == [1]
    assert [t.name for t in reader.tensors] == tensor_names(2)
    by_name = {dspark_tensor_name(k): v for k, v in module.drafter.state_dict().items()}
    for t in reader.tensors:
        assert t.tensor_type == gguf.GGMLQuantizationType.F32
        assert list(t.shape[::-1]) == list(by_name[t.name].shape), t.name  # GGUF lists dims fastest first
        assert np.array_equal(np.asarray(t.data).reshape(by_name[t.name].shape), by_name[t.name].numpy()), t.name


def test_without_a_confidence_head_and_bad_input(checkpoint, tmp_path):
    module = trained(checkpoint, num_layers=1, target_layer_ids=[0], enable_confidence_head=False)
    values, reader = fields(write_dspark_gguf(module.drafter, tmp_path / "d.gguf", target=checkpoint))
    assert values["dflash.has_confidence_head"] is False and [t.name for t in reader.tensors] == tensor_names(1, False)
    for kwargs, match in (({"target_layer_ids": [0, 1]}, "target layer 1 is the target's last"),
                          ({"target_layer_ids": [0], "confidence_head_with_markov": False}, "without the Markov")):
        with pytest.raises(ValueError, match=match) as err:
            write_dspark_gguf(trained(checkpoint, **kwargs), tmp_path / "x.gguf")
        assert "\n" not in str(err.value)


# ---- slow: llama.cpp's converter and binaries ----------------------------------------------------------------------

@pytest.mark.slow
def test_llamacpp_converter_makes_our_gguf_of_our_speculators_export(checkpoint, tmp_path):
    module = trained(checkpoint, target_layer_ids=[0])
    write_speculators(module, tmp_path / "spec")
    theirs, theirs_reader = converted(tmp_path / "spec", checkpoint, tmp_path / "theirs.gguf")
    ours, ours_reader = fields(write_dspark_gguf(module, tmp_path / "ours.gguf"))
    assert list(ours) == list(theirs) == DSPARK_KEYS
    differ = [key for key in ours if ours[key] != theirs[key]]
    assert differ == ["general.name"], differ
    assert same_tensors(ours_reader, theirs_reader)


def speculative_simple(build: Path, target: Path, prompt: Path, n: int, *extra: str) -> tuple[bytes, str]:
    binary = next(p for p in (build / "build" / "bin", build / "bin", build) if (p / "llama-speculative-simple").is_file())
    args = [str(binary / "llama-speculative-simple"), "-m", str(target), "-f", str(prompt), "--no-escape", "-n", str(n),
            "-c", "256", "-b", "256", "-t", "1", "-tb", "1", "-ctk", "f32", "-ctv", "f32", "--temp", "0", "--top-k",
            "1", "--seed", "0", "--color", "off", "--fit", "off", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(args, check=False, capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr.decode(errors="replace")


@pytest.mark.slow
def test_llama_cpp_decodes_with_our_dspark_drafter_as_it_decodes_alone(tmp_path):
    """A drafter trained on the target's own continuations drafts tokens llama.cpp accepts, and the text is the
    target's alone (both float32, greedy; the drafted run may go on past -n with a block's accepted tokens)."""
    from lightning_bpd.benchmarks.llamacpp_speculative import NEVER_DRAFTS, parse_report
    from tests.drafters.dspark.tiny import fit_dspark
    from tests.llamacpp_build import llamacpp_binaries
    from tests.tasks.lm.tiny_lm import write_checkpoint

    build = llamacpp_binaries()
    module = fit_dspark(write_checkpoint(tmp_path / "llama"), steps=150, target_layer_ids=[0])
    main(["export-heads", "--ckpt", str(save_module(module, tmp_path / "last.ckpt")), "--out", str(tmp_path / "out"),
          "--format", "llamacpp"])
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(b"def f_1(x, y):\n\n")
    target = tmp_path / "out" / "target.gguf"
    alone, _ = speculative_simple(build, target, prompt, 24, *NEVER_DRAFTS)
    drafted, log = speculative_simple(build, target, prompt, 24, "-md", str(tmp_path / "out" / "drafter.gguf"),
                                      "--spec-type", "draft-dspark", "--spec-draft-n-max", "4", "--spec-draft-n-min",
                                      "0", "--spec-draft-p-min", "0", "-td", "1", "-tbd", "1", "-ctkd", "f32",
                                      "-ctvd", "f32")
    report = parse_report(log)
    # a drafted run may commit a block's accepted tokens past -n: the text alone is where it starts
    assert alone.endswith(b"\n\n\n\n") and drafted.startswith(alone[:-4]), (alone, drafted)
    assert report.drafted > 0 and report.accepted > 0, (report, log[-1500:])
