"""``export-heads`` (issue 46): the heads of an LM run written on their own (``--format heads``, re-attached by
``load_model``) or in vLLM's Medusa layout (``--format vllm-medusa``, read back with vLLM's forward written plainly:
the heads' own logits); bad input is one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import main
from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.hf.medusa_export import read_vllm_medusa, vllm_medusa_logits
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.lm.module import TRAINING
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.models import assert_close_to_rounding
from tests.tasks.lm.test_lm_fit import fit
from tests.tasks.lm.tiny_lm import PROMPTS, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def medusa_run(checkpoint, tmp_path_factory) -> Path:
    """The last.ckpt of a 3-step fit of k = 4 medusa heads on the frozen tiny Llama."""
    root = tmp_path_factory.mktemp("run")
    fit(checkpoint, write_corpus(root / "data"), root / "run", "--trainer.max_steps=3", "--trainer.limit_val_batches=0",
        "--model.init_args.head_type=medusa", "--model.init_args.training.lr=0.01")
    return root / "run" / "last.ckpt"


def save_ckpt(module: LMModule, path: Path) -> Path:
    """``module`` as a fit run's checkpoint holds it (what ``load_model`` reads)."""
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": pl.__version__,
                "lightning_bpd_class": "lightning_bpd.tasks.lm.module.LMModule"}, path)
    return path


def test_vllm_medusa_export_reproduces_the_heads_logits(medusa_run, tmp_path, capsys):
    main(["export-heads", "--ckpt", str(medusa_run), "--out", str(tmp_path / "medusa"), "--format", "vllm-medusa"])
    assert "3 medusa heads" in capsys.readouterr().err
    module = lightning_bpd.load_model(medusa_run)
    config, state = read_vllm_medusa(tmp_path / "medusa")
    assert (config["num_heads"], config["hidden_size"], config["vocab_size"]) == (3, 32, module.model.vocab_size)
    with torch.no_grad():
        h = module.model(module.encode_prompts(PROMPTS))  # (B, P, D): the base's last hidden states
        want = module.model.logits_heads(h, range(1, 4))  # (B, P, 3, V): heads 2..4
        fresh = LMModule(module.hparams.pretrained, head_type="medusa").model.logits_heads(h, range(1, 4))
        assert_close_to_rounding(vllm_medusa_logits(config, state, h), want)
    assert not torch.allclose(fresh, want)  # the trained heads, not a fresh init, went out
    record = json.loads((tmp_path / "medusa" / "export_heads.json").read_text())
    assert record["format"] == "vllm-medusa" and record["k"] == 4


def test_heads_format_reattaches_through_load_model(medusa_run, tmp_path):
    main(["export-heads", "--ckpt", str(medusa_run), "--out", str(tmp_path / "heads")])  # --format heads: the default
    module, back = lightning_bpd.load_model(medusa_run), lightning_bpd.load_model(tmp_path / "heads")
    assert isinstance(back, LMModule) and back.model.head_type == "medusa" and back.model.k == 4
    for mine, theirs in zip(module.model.head.state_dict().values(), back.model.head.state_dict().values()):
        assert torch.equal(mine, theirs)
    src = module.encode_prompts(PROMPTS)
    assert blockwise_decode(back.model, src, Exact(), 10).sequences() == \
        blockwise_decode(module.model, src, Exact(), 10).sequences()
    main(["export-heads", "--ckpt", str(tmp_path / "heads"), "--out", str(tmp_path / "medusa"), "--format",
          "vllm-medusa"])  # a heads folder is input too
    config, state = read_vllm_medusa(tmp_path / "medusa")
    with torch.no_grad():
        h = module.model(src)
        assert_close_to_rounding(vllm_medusa_logits(config, state, h), module.model.logits_heads(h, range(1, 4)))


def error_line(argv: list[str]) -> str:
    with pytest.raises(SystemExit) as err:
        main(argv)
    message = str(err.value.code)
    assert message.startswith("export-heads: ") and "\n" not in message and "Traceback" not in message
    return message


def test_bad_input_is_one_line(checkpoint, tmp_path):
    out = ["--out", str(tmp_path / "out")]
    chained = save_heads(LMModule(str(checkpoint), k=3), tmp_path / "chained")
    assert "takes medusa heads" in error_line(["export-heads", "--ckpt", str(chained), *out, "--format", "vllm-medusa"])
    assert "no checkpoint at" in error_line(["export-heads", "--ckpt", str(tmp_path / "missing.ckpt"), *out])
    assert "not a checkpoint" in error_line(["export-heads", "--ckpt", str(checkpoint), *out])  # an HF directory
    from tests.task_modules import superres_module

    superres, other = superres_module(d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, k=2), \
        tmp_path / "superres.ckpt"
    torch.save({"state_dict": superres.state_dict(), "hyper_parameters": dict(superres.hparams),
                "lightning_bpd_class": "lightning_bpd.tasks.superres.module.SuperResolutionModule"}, other)
    assert "not a language-model run" in error_line(["export-heads", "--ckpt", str(other), *out])
    base_only = save_ckpt(LMModule(str(checkpoint), k=1, training=replace(TRAINING, freeze_base=False)),
                          tmp_path / "k1.ckpt")
    assert "no heads to export" in error_line(["export-heads", "--ckpt", str(base_only), *out])
    joint = save_ckpt(LMModule(str(checkpoint), head_type="medusa", training=replace(TRAINING, freeze_base=False)),
                      tmp_path / "joint.ckpt")
    assert "trained with the heads" in error_line(["export-heads", "--ckpt", str(joint), *out])
    tokenizer = tmp_path / "tok"
    LMModule(str(checkpoint)).tokenizer.save_pretrained(tokenizer)
    own = save_ckpt(LMModule(own={"d_model": 32, "n_heads": 4, "n_layers": 1, "d_ff": 64, "tokenizer": str(tokenizer)},
                             training=replace(TRAINING, freeze_base=False)), tmp_path / "own.ckpt")
    assert "our own decoder-only base" in error_line(["export-heads", "--ckpt", str(own), *out])
    assert not (tmp_path / "out").exists()


def test_medusa_heads_of_a_base_trained_with_them_go_out_with_a_note(checkpoint, tmp_path, capsys):
    module = LMModule(str(checkpoint), head_type="medusa", training=replace(TRAINING, freeze_base=False))
    with torch.no_grad():
        for p in module.parameters():  # the base and the heads trained together: both moved
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
    joint = save_ckpt(module, tmp_path / "joint.ckpt")
    capsys.readouterr()
    main(["export-heads", "--ckpt", str(joint), "--out", str(tmp_path / "medusa"), "--format", "vllm-medusa"])
    assert f"export-base --ckpt {joint}" in capsys.readouterr().err
    record = json.loads((tmp_path / "medusa" / "export_heads.json").read_text())
    assert record["base_trained_with_heads"] and "export-base" in record["base"]
    config, state = read_vllm_medusa(tmp_path / "medusa")
    with torch.no_grad():
        h = module.model(module.encode_prompts(PROMPTS))
        assert_close_to_rounding(vllm_medusa_logits(config, state, h), module.model.logits_heads(h, range(1, 4)))
        assert torch.equal(state["lm_heads.0.weight"], module.model.base.get_output_embeddings().weight)  # its LM head
