"""The LM task's contract (issue 46): ``fit --config conf/lm/frozen_heads.yaml`` on a tiny random Llama and its own
byte-level BPE tokenizer, the base bit-identical after it; ``load_model(ckpt)`` with ``encode_prompts`` and
``detokenize`` equal to ``generate``; ``decode --max-new-tokens`` reading JSON Lines."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.tasks.lm import LMModule
from tests.tasks.lm.tiny_lm import EOS, PAD, write_corpus, write_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--trainer.max_steps=6", "--trainer.val_check_interval=6", "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false", "--decode_eval.subset=4", "--decode_eval.batch_size=4",
        "--data.init_args.seq_len=64", "--data.init_args.batch_size=4", "--data.init_args.prompt_tokens=40",
        "--model.init_args.max_new_tokens=8", "--model.init_args.training.warmup_steps=2"]
PROMPTS = ["def f_1(x, y):\n    x = x + 3\n", "for", "    return total\n\ndef f_2(items, key):\n"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code")


def fit(checkpoint: Path, data: Path, run: Path, *more: str, config: str = "frozen_heads.yaml"):
    logger = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": str(run)}})
    return main(["fit", "--config", str(CONF_DIR / "lm" / config), f"--model.init_args.pretrained={checkpoint}",
                 f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, f"--trainer.logger={logger}", *more])


def logged(run: Path) -> dict[str, float]:
    """The last value of every metric of the run's CSV log."""
    out: dict[str, float] = {}
    for row in csv.DictReader((next(run.rglob("metrics.csv"))).open()):
        out.update({key: float(value) for key, value in row.items() if value})
    return out


def generated(module: LMModule, prompts: list[str], n: int) -> list[str]:
    src = module.encode_prompts(prompts)
    out = module.model.base.generate(input_ids=src, attention_mask=(src != module.model.pad_id).long(),
                                     do_sample=False, num_beams=1, max_new_tokens=n, pad_token_id=module.model.pad_id)
    return module.tokenizer.batch_decode(out[:, src.shape[1]:], skip_special_tokens=True)


def perplexity(module: LMModule, dm) -> float:
    """exp of the base's own mean loss per target token over the val split."""
    total, count = 0.0, 0
    for batch in dm.val_dataloader():
        logits = module.model.base(input_ids=batch["src"]).logits  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["tgt"].flatten(), reduction="sum",
                                                 ignore_index=module.model.pad_id)
        total, count = total + float(loss), count + int((batch["tgt"] != module.model.pad_id).sum())
    return math.exp(total / count)


def test_fit_then_load_model_and_decode(checkpoint, data, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    cli = fit(checkpoint, data, run)
    trained = cli.model
    assert trained.global_step == 6 and trained.model.k == 4 and trained.model.head_type == "chained"
    assert trained.frozen_states is not None and trained.frozen_states.hits > 0  # head steps skipped the base
    fresh = LMModule(str(checkpoint))
    ours = trained.model.base.state_dict()
    assert all(torch.equal(value, ours[key]) for key, value in fresh.model.base.state_dict().items())
    assert any(not torch.equal(a, b) for a, b in zip(fresh.model.head.parameters(), trained.model.head.parameters()))
    metrics = logged(run)
    with torch.no_grad():
        assert metrics["val/ppl"] == pytest.approx(perplexity(trained, cli.datamodule), rel=1e-4)
    assert metrics["val/exact/matches_greedy"] == 1.0 and metrics["val/examples"] == 4
    assert metrics["val/exact/mean_accepted_block_size"] >= 1.0 and metrics["val/greedy/model_calls"] > 0
    assert 0 <= metrics["val/exact/chrf"] <= 100

    module = lightning_bpd.load_model(run / "last.ckpt")  # the contract other tools call
    assert isinstance(module, LMModule) and module.model.k == 4
    out = blockwise_decode(module.model, module.encode_prompts(PROMPTS), Exact(), max_len=10)
    texts = module.detokenize(out.sequences())
    assert texts == generated(module, PROMPTS, 10) and any(texts)

    lines = [json.dumps({"prompt": p}) for p in PROMPTS]
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    capsys.readouterr()
    main(["decode", "--ckpt", str(run / "last.ckpt"), "--max-new-tokens", "10", "--device", "cpu"])
    result = capsys.readouterr()
    assert [json.loads(line) for line in result.out.splitlines()] == [{"completion": t} for t in texts]
    assert "mean_accepted_block_size" in result.err
    assert module.rank_agreement is not None and module.rank_agreement.shape == (3, 8)  # the decode eval's table
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    main(["decode", "--ckpt", str(run / "last.ckpt"), "--max-new-tokens", "10", "--tree-nodes", "6", "--batch-size",
          "2", "--device", "cpu"])  # a tree built from it, two batches: the same completions, in order
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [{"completion": t} for t in texts]


def test_medusa_heads_train_on_the_frozen_base(checkpoint, data, tmp_path):
    cli = fit(checkpoint, data, tmp_path / "run", "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
              "--model.init_args.head_type=medusa", "--model.init_args.training.head_targets=own")
    fresh = LMModule(str(checkpoint), head_type="medusa")
    trained = cli.model.model
    assert trained.head_type == "medusa" and trained.frozen
    assert all(torch.equal(value, trained.base.state_dict()[key]) for key, value in fresh.model.base.state_dict().items())
    moved = [not torch.equal(a, b) for a, b in zip(fresh.model.head.parameters(), trained.head.parameters())]
    assert len(moved) == 2 * 3 and all(moved)  # every head's residual block (W and b) trained


def test_the_test_command_decodes_the_test_prompts(checkpoint, data, tmp_path):
    run = tmp_path / "run"
    fit(checkpoint, data, run, "--trainer.max_steps=2", "--trainer.limit_val_batches=0")
    cli = main(["test", "--config", str(CONF_DIR / "lm" / "frozen_heads.yaml"), f"--data.init_args.root={data}",
                f"--model.init_args.pretrained={checkpoint}", f"--ckpt_path={run / 'last.ckpt'}",
                f"--run_dir={tmp_path / 'test'}", *FAST, "--trainer.logger=false"])
    metrics = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "DecodeEval").last_metrics
    assert metrics["exact/matches_greedy"] == 1.0 and metrics["examples"] > 0
    assert math.isfinite(float(cli.trainer.callback_metrics["test/ppl"]))


def test_a_sequence_longer_than_the_context_is_one_error_line(checkpoint, data, tmp_path):
    with pytest.raises(SystemExit, match=r"^error: data.seq_len 200 is longer than the model's context \(128"):
        fit(checkpoint, data, tmp_path / "run", "--data.init_args.seq_len=200")


def test_finetune_config_trains_the_base(checkpoint, data, tmp_path):
    run = tmp_path / "run"
    cli = fit(checkpoint, data, run, "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
              "--trainer.log_every_n_steps=1", config="finetune.yaml")
    fresh = LMModule(str(checkpoint)).model.base.state_dict()
    trained = cli.model.model.base.state_dict()
    assert any(not torch.equal(value, trained[key]) for key, value in fresh.items())
    assert not cli.model.model.frozen
    metrics = logged(run)  # p_1 trains: its perplexity, of the last step's batch
    assert metrics["train/ppl"] == pytest.approx(math.exp(metrics["train/head1_loss"]), rel=1e-5)


def test_wandb_offline_run_has_the_decode_values(checkpoint, data, tmp_path, monkeypatch):
    """The default logger of conf/lm (W&B, offline) gets what DecodeEval measured, the perplexity and the samples."""
    from tests.wandb_reader import find_run_file, history, rows_with

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "frozen_heads.yaml"), f"--model.init_args.pretrained={checkpoint}",
                f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, "--decode_eval.num_samples=2"])
    expected = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "DecodeEval").last_metrics
    rows_with(run, "val/exact/mean_accepted_block_size")  # wait for W&B's writer
    rows = history(find_run_file(run))
    logged = {key: value for row in rows for key, value in row.items()}
    for key in ("exact/mean_accepted_block_size", "exact/model_calls", "exact/matches_greedy", "greedy/chrf",
                "exact/speedup", "greedy/new_tokens"):
        assert logged[f"val/{key}"] == pytest.approx(expected[key], rel=1e-6, abs=1e-6)
    assert logged["val/exact/matches_greedy"] == 1.0 and math.isfinite(logged["val/ppl"])
    tokens = expected["exact/new_tokens"] * expected["examples"]
    assert logged["val/exact/tokens_per_second"] == pytest.approx(tokens / expected["exact/seconds"], rel=1e-6)
    assert logged["val/samples/nrows"] == 2  # the sample table: prompt, reference, greedy, exact, its blocks


def test_a_model_that_pads_with_its_eos(data, tmp_path):
    """GPT-2 without a pad id pads with its EOS: the windows' padding becomes the model's pad id (ignored by the loss),
    and the contract holds as on Llama."""
    checkpoint = write_gpt2(tmp_path / "gpt2")
    cli = fit(checkpoint, data, tmp_path / "run")
    assert cli.model.model.pad_id == EOS and cli.datamodule.pad_id == PAD
    batch = next(iter(cli.datamodule.val_dataloader()))
    last = cli.datamodule.dataset("val")[len(cli.datamodule.dataset("val")) - 1]
    assert last["length"] < 64 and set(last["tgt"][last["length"]:].tolist()) == {PAD}
    padded = cli.model.model_padded({k: v[None] if torch.is_tensor(v) else torch.tensor([v]) for k, v in last.items()})
    assert set(padded["tgt"][0, last["length"]:].tolist()) == {EOS} and batch["tgt"].shape[1] == 64
    module = lightning_bpd.load_model(tmp_path / "run" / "last.ckpt")
    out = blockwise_decode(module.model, module.encode_prompts(PROMPTS), Exact(), max_len=10)
    assert module.detokenize(out.sequences()) == generated(module, PROMPTS, 10)
