"""Our own decoder-only base in the LM task (issue 46, item 2): ``fit --config conf/lm/own_base.yaml`` trains a tiny
:class:`CausalTransformer` and its heads from scratch on a folder of code with a given tokenizer directory;
``load_model`` on its checkpoint decodes text, exact = greedy; bad input is one line."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import lightning_bpd
from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode, greedy_decode_reference
from lightning_bpd.nn.causal_model import CausalTransformer
from lightning_bpd.tasks.lm import LMModule
from lightning_bpd.tasks.training_options import TrainingOptions
from tests.tasks.lm.test_lm_fit import FAST, PROMPTS, logged
from tests.tasks.lm.tiny_lm import tokenizer as tiny_tokenizer
from tests.tasks.lm.tiny_lm import write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = ["--model.init_args.own.d_model=32", "--model.init_args.own.n_heads=4", "--model.init_args.own.n_layers=2",
         "--model.init_args.own.d_ff=64"]
TINY = {"d_model": 32, "n_heads": 4, "n_layers": 2, "d_ff": 64}
TRAIN = TrainingOptions(freeze_base=False, loss_mode="mean", warmup_steps=2, label_smoothing=0.0)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tok") / "bpe"
    tiny_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code")


def test_fit_from_scratch_then_load_model_and_decode(tokenizer_dir, data, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    logger = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": str(run)}})
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "own_base.yaml"), f"--data.init_args.tokenizer_path={tokenizer_dir}",
                f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, *SHAPE, f"--trainer.logger={logger}"])
    trained = cli.model
    assert isinstance(trained.model, CausalTransformer) and trained.global_step == 6 and trained.model.k == 4
    assert trained.hparams.own["tokenizer"] == str(tokenizer_dir)  # filled from data.init_args.tokenizer_path
    fresh = LMModule(own={**TINY, "tokenizer": str(tokenizer_dir)}, training=TRAIN)
    assert all(not torch.equal(a, b) for a, b in zip(fresh.model.decoder.parameters(), trained.model.decoder.parameters())
               if a.dim() == 2)  # the base trained, not only the heads
    metrics = logged(run)
    assert metrics["val/exact/matches_greedy"] == 1.0 and metrics["val/ppl"] > 1

    module = lightning_bpd.load_model(run / "last.ckpt")
    assert isinstance(module, LMModule) and isinstance(module.model, CausalTransformer)
    src = module.encode_prompts(PROMPTS)  # ragged: left-padded
    out = blockwise_decode(module.model, src, Exact(), max_len=10)
    want = greedy_decode_reference(module.model, src, 10).sequences()
    assert out.sequences() == greedy_decode(module.model, src, 10).sequences() == want
    texts = module.detokenize(out.sequences())
    assert all(isinstance(t, str) for t in texts) and any(texts)

    monkeypatch.setattr("sys.stdin", io.StringIO("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS)))
    capsys.readouterr()
    main(["decode", "--ckpt", str(run / "last.ckpt"), "--max-new-tokens", "10", "--device", "cpu"])
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"completion": t} for t in texts]

    from lightning_bpd.commands.export_base import main as export_main

    with pytest.raises(SystemExit) as exc:  # our own base has no Hugging Face directory to write
        export_main(["--ckpt", str(run / "last.ckpt"), "--out", str(tmp_path / "export")])
    assert "our own decoder-only base" in str(exc.value) and "\n" not in str(exc.value)
    assert not (tmp_path / "export").exists()


def test_frozen_heads_on_a_trained_own_base(tokenizer_dir, data, tmp_path):
    """Two stages: the base alone (k = 1) from scratch, then k = 3 heads on it frozen (``training.init_from``)."""
    common = ["--config", str(CONF_DIR / "lm" / "own_base.yaml"), f"--data.init_args.tokenizer_path={tokenizer_dir}",
              f"--data.init_args.root={data}", *FAST, *SHAPE, "--trainer.logger=false", "--trainer.max_steps=2",
              "--trainer.limit_val_batches=0"]
    base = main(["fit", *common, f"--run_dir={tmp_path / 'base'}", "--model.init_args.k=1",
                 "--model.init_args.head_type=paper"]).model.model
    heads = main(["fit", *common, f"--run_dir={tmp_path / 'heads'}", "--model.init_args.k=3", "--trainer.max_steps=7",
                  "--model.init_args.training.freeze_base=true", "--model.init_args.training.frozen_cache_gb=0.1",
                  f"--model.init_args.training.init_from={tmp_path / 'base' / 'last.ckpt'}"]).model
    trained = heads.model.state_dict()
    assert all(torch.equal(value, trained[key]) for key, value in base.state_dict().items())  # the base as trained
    assert heads.frozen_states is not None and heads.frozen_states.hits > 0  # a second epoch skipped the base


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_bad_input_is_one_line(tokenizer_dir, tmp_path):
    own = {**TINY, "tokenizer": str(tokenizer_dir)}
    with pytest.raises(ValueError) as err:
        LMModule(own={**own, "vocab_size": 100}, training=TRAIN)
    assert "more than model.init_args.own.vocab_size (100)" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(own={**own, "vocab_size": 1000}, training=TRAIN)  # not the tokenizer's size padded to 64
    assert "vocab_size mismatch" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(own=own)  # the LM task's default: a frozen base
    assert "a frozen base needs training.init_from" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(pretrained=str(tokenizer_dir), own=own, training=TRAIN)
    assert "one of them" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(own=TINY, training=TRAIN)
    assert "own.tokenizer" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(own={**own, "tokenizer": str(tmp_path / "nowhere")}, training=TRAIN)
    assert "is not a directory" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(own={**own, "layers": 3}, training=TRAIN)
    assert "unknown keys ['layers']" in one_line(err)
    with pytest.raises(ValueError) as err:
        LMModule(own=own, head_type="medusa", training=TRAIN)
    assert "paper or chained on our own base" in one_line(err)
    padded = LMModule(own={**own, "vocab_size": 320}, training=TRAIN)  # the tokenizer's 300 padded to 320
    assert padded.model.vocab_size == 320
    ckpt = tmp_path / "own.ckpt"
    torch.save({"lightning_bpd_class": "lightning_bpd.tasks.lm.module.LMModule", "hyper_parameters": padded.hparams,
                "state_dict": padded.state_dict()}, ckpt)
    with pytest.raises(ValueError) as err:
        lightning_bpd.load_model(ckpt, base=tmp_path)  # base= moves a Hugging Face base, not a tokenizer
    assert "not a run on a Hugging Face base" in one_line(err)
    assert lightning_bpd.load_model(ckpt).model.vocab_size == 320
