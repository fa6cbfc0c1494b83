"""End to end: `python -m lightning_bpd fit` on tiny synthetic data, W&B offline read-back, resume,
decode and load_model, and the one-line errors for bad input."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lightning_bpd.commands.cli import REPO_ROOT, main
from lightning_bpd.evaluation import EvalBatch
from tests.task_modules import translation_module
from tests.wandb_reader import find_run_file, history, rows_with

TINY = [
    "--model.init_args.architecture.d_model=32", "--model.init_args.architecture.n_heads=2", "--model.init_args.architecture.d_ff=64",
    "--model.init_args.architecture.n_encoder_layers=1", "--model.init_args.architecture.n_decoder_layers=1",
    "--model.init_args.architecture.head_hidden=16", "--model.init_args.training.warmup_steps=2",
    "--data.init_args.vocab_size=120", "--data.init_args.max_tokens=600",
    "--data.init_args.synthetic_sizes={train: 300, val: 12, test: 12}",
    "--trainer.val_check_interval=3", "--trainer.log_every_n_steps=1",
    "--decode_eval.subset=6", "--decode_eval.num_samples=2",
]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A 6-step k=3 run (resumed from step 3) in a temporary working directory."""
    root = tmp_path_factory.mktemp("fit")
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    mp.setenv("WANDB_MODE", "offline")
    mp.setenv("WANDB_SILENT", "true")
    first = main(["fit", *TINY, "--model.init_args.architecture.k=3", "--trainer.max_steps=3", "--run_dir=runs/a"])
    cli = main(["fit", *TINY, "--model.init_args.architecture.k=3", "--trainer.max_steps=6", "--run_dir=runs/b",
                "--ckpt_path=runs/a/last.ckpt", "--decode_eval.tree_nodes=[0,4,12]"])
    yield root, first, cli
    mp.undo()


def test_fit_saves_config_and_checkpoints_and_resumes(fitted):
    root, first, cli = fitted
    assert first.trainer.global_step == 3
    assert cli.trainer.global_step == 6  # continued from step 3, not restarted
    for run in ("a", "b"):
        assert (root / "runs" / run / "config.yaml").is_file()
        assert (root / "runs" / run / "last.ckpt").is_file()
    saved = (root / "runs/b/config.yaml").read_text()
    # the vocabulary sizes linked from the tokenizer are in the saved config (as numbers, not null), which rebuilds
    # the same model
    architecture = yaml.safe_load(saved)["model"]["init_args"]["architecture"]
    vocab = cli.datamodule.vocab_size
    assert f"src_vocab_size: {vocab}\n" in saved and f"tgt_vocab_size: {vocab}\n" in saved
    assert architecture["k"] == 3
    assert architecture["src_vocab_size"] == architecture["tgt_vocab_size"] == vocab == cli.model.model.config.tgt_vocab_size


def test_a_vocab_size_given_that_is_not_the_tokenizers_is_one_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["fit", *TINY, "--model.init_args.architecture.src_vocab_size=50",
              "--model.init_args.architecture.tgt_vocab_size=50", "--trainer.max_steps=1", "--trainer.logger=false",
              "--run_dir=runs/v"])
    assert str(err.value).startswith("error: tokenizer has ") and "the model was built for 50" in str(err.value)


def test_a_trainer_setting_lightning_refuses_is_one_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["fit", *TINY, "--trainer.max_time=00:00:7:00", "--trainer.logger=false", "--run_dir=runs/t"])
    assert str(err.value).startswith("error: ") and "is not a valid duration" in str(err.value)


def test_wandb_offline_run_has_the_callback_values(fitted):
    root, _, cli = fitted
    callback = next(cb for cb in cli.trainer.callbacks if type(cb).__name__ == "DecodeEval")
    expected = callback.last_metrics
    assert expected["examples"] == 6
    rows_with(root / "runs/b", "val/exact/mean_accepted_block_size")  # wait for W&B's writer
    rows = history(find_run_file(root / "runs/b"))
    logged = [r for r in rows if "val/exact/mean_accepted_block_size" in r][-1]
    for key in ("greedy/bleu", "exact/bleu", "exact/mean_accepted_block_size", "top2/mean_accepted_block_size",
                "exact/speedup", "exact/matches_greedy", "exact+nodes0/mean_accepted_block_size",
                "exact+nodes4/mean_accepted_block_size", "exact+nodes12/mean_accepted_block_size"):
        assert logged[f"val/{key}"] == pytest.approx(expected[key], rel=1e-6, abs=1e-6)
    assert logged["val/exact/matches_greedy"] == 1.0  # exact acceptance reproduces greedy
    assert logged["val/exact+nodes12/matches_greedy"] == logged["val/exact+nodes4/matches_greedy"] == 1.0  # trees too
    assert expected["exact+nodes0/mean_accepted_block_size"] == expected["exact/mean_accepted_block_size"]
    assert "greedy/bleu_vs_greedy" not in expected and "top2/bleu_vs_greedy" in expected
    assert any("train/head1_loss" in r or "train/head2_loss" in r for r in rows)


def test_bleu_vs_greedy_scores_outputs_against_greedys_own(fitted):
    _, _, cli = fitted
    module = cli.model
    lines = ["der Lehrer liest ein gutes Buch im Garten .", "der Hund schläft vor dem großen Haus ."]
    ids = [list(x) for x in module.tokenizer.encode_batch(lines)]
    batches = [EvalBatch(src=torch.zeros(2, 1, dtype=torch.long), max_len=9, references=lines)]
    assert module.decode_eval_metrics(ids, batches, greedy=ids)["bleu_vs_greedy"] == pytest.approx(100.0)
    other = module.decode_eval_metrics(ids, batches, greedy=ids[::-1])["bleu_vs_greedy"]
    assert 0.0 <= other < 50.0
    assert "bleu_vs_greedy" not in module.decode_eval_metrics(ids, batches)


def test_decode_command_and_load_model(fitted, capsys):
    root, _, _ = fitted
    ckpt = root / "runs/b/last.ckpt"
    src = root / "input.en.gz"
    with gzip.open(src, "wt") as f:
        f.write("The teacher reads a book.\nThe dog sleeps.\n\n")
    outs = {}
    for criterion in ("greedy", "exact", "top2"):
        out = root / f"out.{criterion}.de"
        main(["decode", "--ckpt", str(ckpt), "--input", str(src), "--output", str(out), "--criterion", criterion])
        outs[criterion] = out.read_text().split("\n")[:-1]
        assert len(outs[criterion]) == 3
        assert outs[criterion][2] == "" and outs[criterion][0]  # an empty line in, an empty line out
    assert outs["exact"] == outs["greedy"]
    assert "mean_accepted_block_size=" in capsys.readouterr().err
    import lightning_bpd

    module = lightning_bpd.load_model(ckpt)
    assert module.model.k == 3 and module.tokenizer.vocab_size == module.model.config.tgt_vocab_size


def test_decode_max_new_tokens_caps_every_translation(fitted, capsys):
    """``decode --max-new-tokens N`` equals the decoders' own cap of N tokens; a cap below 1 is one line."""
    import lightning_bpd
    from lightning_bpd.decoding import Exact, blockwise_decode

    root, _, _ = fitted
    ckpt = root / "runs/b/last.ckpt"
    sentences = ["The teacher reads a book.", "The dog sleeps."]
    (root / "cap.en").write_text("\n".join(sentences) + "\n")
    module = lightning_bpd.load_model(ckpt)
    for cap in (1, 3):
        main(["decode", "--ckpt", str(ckpt), "--input", str(root / "cap.en"), "--criterion", "exact",
              "--max-new-tokens", str(cap)])
        want = blockwise_decode(module.model, module.encode_sources(sentences), Exact(), cap).sequences()
        assert all(len(row) <= cap for row in want)
        assert capsys.readouterr().out.splitlines() == module.detokenize(want)
    with pytest.raises(SystemExit, match="decode: --max-new-tokens must be >= 1, got 0"):
        main(["decode", "--ckpt", str(ckpt), "--input", str(root / "cap.en"), "--max-new-tokens", "0"])


def test_bench_command_writes_json(fitted, capsys):
    import json

    root, _, _ = fitted
    src = root / "bench.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\nThe woman sings.\n")
    out = root / "bench.json"
    main(["bench", "--ckpt", str(root / "runs/b/last.ckpt"), "--input", str(src), "--criteria", "exact", "top2",
          "--batch-sizes", "1", "2", "--inputs", "4", "--warmup", "1", "--json", str(out)])
    result = json.loads(out.read_text())
    for bs in ("1", "2"):
        r = result["batch_sizes"][bs]
        assert set(r) == {"greedy", "exact", "top2"}
        assert r["exact"]["equals_greedy"] is True
        assert r["exact"]["efficiency"] == pytest.approx(r["exact"]["speedup"] / r["exact"]["mean_accepted_block_size"])
        assert r["greedy"]["speedup"] == 1.0
        assert r["greedy"]["call_cost_vs_baseline"] == 1.0
        per_call = r["exact"]["ms_per_call"] / r["greedy"]["ms_per_call"]
        assert r["exact"]["call_cost_vs_baseline"] == pytest.approx(per_call)
        assert r["exact"]["speedup"] == pytest.approx(per_call ** -1 * r["greedy"]["model_calls"] / r["exact"]["model_calls"])
    assert result["device_name"].endswith("threads)")
    assert "speedup" in capsys.readouterr().out


@pytest.mark.parametrize("options", [["--precision", "bf16", "--stop-below", "0.3"],
                                     ["--proposal-precision", "bfloat16", "--stop-below", "0.5"],
                                     ["--precision", "int8", "--proposal-precision", "int8", "--stop-below", "0.3"],
                                     ["--screened-argmax", "--reference-steps", "--proposal-precision", "int8",
                                      "--stop-below", "0.5"]],
                         ids=["bf16-with-stop", "fp32-with-bf16-proposals", "int8", "screened-reference-steps"])
def test_bench_and_decode_in_reduced_precision_with_a_confidence_stop(fitted, options):
    """The options reach the runtime and the record; with float32 verification exact output stays greedy's
    (in bfloat16 a near-tie can break differently in the verify pass: bench reports it per run; int8 is
    batch-invariant by construction)."""
    import json

    from lightning_bpd.kernels import int8

    if "int8" in options and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    check_precision_options(fitted, options, json)


def check_precision_options(fitted, options, json):
    root, _, _ = fitted
    ckpt = str(root / "runs/b/last.ckpt")
    src = root / "bench_prec.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\n")
    out = root / "bench_prec.json"
    main(["bench", "--ckpt", ckpt, "--input", str(src), "--criteria", "exact", "--batch-sizes", "1", "3",
          "--inputs", "3", "--warmup", "0", "--json", str(out), *options])
    result = json.loads(out.read_text())
    precision = options[options.index("--precision") + 1] if "--precision" in options else "float32"
    assert result["precision"] == {"bf16": "bfloat16"}.get(precision, precision)
    assert result["stop_below"] == float(options[-1])
    proposals = options[options.index("--proposal-precision") + 1] if "--proposal-precision" in options else None
    assert result["proposal_precision"] == proposals
    assert result["screened_argmax"] == ("--screened-argmax" in options)
    assert result["lean_steps"] == ("--reference-steps" not in options)
    exact_in_fp32 = precision in ("float32", "int8")
    for bs in ("1", "3"):
        assert result["batch_sizes"][bs]["exact"]["equals_greedy"] in ((True,) if exact_in_fp32 else (True, False))
    texts = {}
    user = ["--precision", precision]  # decode keeps the user's options; the timing experiments stay in bench
    for criterion in ("greedy", "exact"):
        dest = root / f"prec.{criterion}.de"
        main(["decode", "--ckpt", ckpt, "--input", str(src), "--output", str(dest), "--criterion", criterion, *user])
        texts[criterion] = dest.read_text()
    assert texts["greedy"].count("\n") == texts["exact"].count("\n") == 3
    assert texts["exact"] == texts["greedy"] or not exact_in_fp32
    with pytest.raises(SystemExit, match="unknown precision 'half'"):
        main(["bench", "--ckpt", ckpt, "--input", str(src), "--precision", "half"])


LATIN1 = "The dog sleeps.\nThe café is open.\n".encode("latin1")  # byte 23 (line 2) is 0xe9
NOT_UTF8 = "line 2 (byte offset 23{}) has byte 0xe9 (invalid continuation byte); re-encode it as UTF-8, e.g. "


def test_input_that_is_not_utf8_is_one_line(fitted, monkeypatch):
    """decode (a file, a .gz file, stdin) and bench --input: which input, its line and byte offset, how to fix it."""
    root, _, _ = fitted
    ckpt = str(root / "runs/b/last.ckpt")
    monkeypatch.chdir(root)
    Path("latin1.en").write_bytes(LATIN1)
    with gzip.open("latin1.en.gz", "wb") as f:
        f.write(LATIN1)
    file_fix = "iconv -f latin1 -t utf-8 latin1.en > latin1.en.utf8 (if it is Latin-1)"
    gz_fix = "zcat latin1.en.gz | iconv -f latin1 -t utf-8 | gzip > latin1.en.utf8.gz (if it is Latin-1)"
    for args, message in [
        (["decode", "--ckpt", ckpt, "--input", "latin1.en"],
         "decode: 'latin1.en' is not UTF-8: " + NOT_UTF8.format("") + file_fix),
        (["decode", "--ckpt", ckpt, "--input", "latin1.en.gz"],
         "decode: 'latin1.en.gz' is not UTF-8: " + NOT_UTF8.format(" of the gunzipped text") + gz_fix),
        (["bench", "--ckpt", ckpt, "--input", "latin1.en.gz"],
         "bench: 'latin1.en.gz' is not UTF-8: " + NOT_UTF8.format(" of the gunzipped text") + gz_fix),
    ]:
        with pytest.raises(SystemExit) as err:
            main(args)
        assert str(err.value) == message
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(LATIN1)))
    with pytest.raises(SystemExit) as err:
        main(["decode", "--ckpt", ckpt])
    assert str(err.value) == ("decode: standard input is not UTF-8: " + NOT_UTF8.format("")
                              + "pipe it through iconv -f latin1 -t utf-8 (if it is Latin-1)")


def test_decode_of_stdin_that_is_not_utf8_in_a_subprocess(fitted):
    """The reported case (``decode < latin1.txt`` ended in a TypeError traceback): one line, exit status 1."""
    root, _, _ = fitted
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "lightning_bpd", "decode", "--ckpt", str(root / "runs/b/last.ckpt")],
                          input=LATIN1, cwd=root, env=env, capture_output=True, timeout=300, check=False)
    stderr = proc.stderr.decode()
    assert proc.returncode == 1 and proc.stdout == b""
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["decode: standard input is not UTF-8: " + NOT_UTF8.format("")
                                           + "pipe it through iconv -f latin1 -t utf-8 (if it is Latin-1)"]


@pytest.mark.parametrize("args, message", [
    (["--model.init_args.not_a_key=1"], ("error: model.init_args.not_a_key: unknown option 'not_a_key' "
                                         "(python -m lightning_bpd fit --help lists every option)")),
    (["--model.init_args.architecture.k=abc"], ("error: model.init_args.architecture.k: Expected a <class 'int'>. "
                                                "Got value: abc")),
    (["--model.init_args.training.lrr=1"], "error: model.init_args.training.lrr: unknown option 'lrr' (python -m"),
    (["--model.init_args.architecture.lr=1"], ("error: model.init_args.architecture.lr: unknown option 'lr' (did you "
                                               "mean model.init_args.training.lr?)")),
    (["--model.init_args.lr=1"], "error: model.init_args.lr: unknown option 'lr' (did you mean model.init_args.training.lr?)"),
    (["--model.init_args.vocab_size=1"], ("error: model.init_args.vocab_size: unknown option 'vocab_size' (did you mean "
                                          "model.init_args.architecture.src_vocab_size and tgt_vocab_size")),
    (["--trainer.max_stepz=3"], "error: unrecognized arguments: --trainer.max_stepz=3"),
])
def test_unknown_config_key_is_one_clear_error(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["fit", *args])
    assert str(exit_.value).startswith(message)
    assert "usage:" not in capsys.readouterr().err  # the one line, no usage dump before it


def test_misaligned_files_and_missing_folder_fail_with_one_message(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "d").mkdir()
    (tmp_path / "d/train.en").write_text("a\nb\nc\n")
    (tmp_path / "d/train.de").write_text("x\ny\n")
    with pytest.raises(SystemExit) as err:
        main(["fit", "--data.init_args.root=d", "--trainer.max_steps=1"])
    message = str(err.value)
    assert message.startswith("error:") and "train.en" in message and "3 lines" in message and "2 lines" in message
    with pytest.raises(SystemExit) as err:
        main(["fit", "--data.init_args.root=nowhere", "--trainer.max_steps=1"])
    assert "Expected layout" in str(err.value)


def test_k_out_of_range_and_bad_checkpoint(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as err:
        main(["fit", "--model.init_args.architecture.k=17", "--trainer.max_steps=1", *TINY])
    assert "model.architecture.k must lie in [1, 16]" in str(err.value)
    with pytest.raises(SystemExit) as err:
        main(["decode", "--ckpt", "missing.ckpt"])
    assert "no checkpoint at" in str(err.value)


def test_init_from_a_checkpoint_of_another_shape(fitted, tmp_path):
    from lightning_bpd.nn.warm_start import CheckpointMismatchError

    root, _, _ = fitted
    other = translation_module({"init_from": str(root / "runs/b/last.ckpt")}, src_vocab_size=50, tgt_vocab_size=50,
                               d_model=16, n_heads=2, d_ff=32, n_encoder_layers=1, n_decoder_layers=1, k=2)
    with pytest.raises(CheckpointMismatchError, match=r"tgt_embed.weight: checkpoint \(\d+, 32\) vs model \(50, 16\)"):
        other.warm_start(str(root / "runs/b/last.ckpt"))


def test_frozen_stage_two_trains_only_the_head(fitted):
    root, _, cli = fitted
    vocab = cli.model.model.config.tgt_vocab_size
    module = translation_module({"freeze_base": True, "init_from": str(root / "runs/b/last.ckpt")},
                                src_vocab_size=vocab, tgt_vocab_size=vocab, d_model=32, n_heads=2, d_ff=64,
                                n_encoder_layers=1, n_decoder_layers=1, head_hidden=16, k=4, identity_first=True)
    module.warm_start(module.options.init_from)
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable and all(n.startswith("model.head.") for n in trainable)
    assert module.trainable_heads_skip() == [0]
    base = cli.model.model.eval()
    src = torch.randint(4, vocab, (3, 5))
    from lightning_bpd.decoding import blockwise_decode, greedy_decode

    assert torch.equal(blockwise_decode(module.model.eval(), src, max_len=10).tokens,
                       greedy_decode(base, src, 10).tokens)


def test_head1_weight_in_fine_tuning(fitted):
    root, _, cli = fitted
    vocab = cli.model.model.config.tgt_vocab_size
    shape = {"src_vocab_size": vocab, "tgt_vocab_size": vocab, "d_model": 32, "n_heads": 2, "d_ff": 64,
             "n_encoder_layers": 1, "n_decoder_layers": 1, "head_hidden": 16, "k": 4, "identity_first": True}
    base = str(root / "runs/b/last.ckpt")
    with pytest.raises(ValueError, match="frozen base does not train"):
        translation_module({"init_from": base, "freeze_base": True, "head1_weight": 0.5}, **shape)
    module = translation_module({"init_from": base, "loss_mode": "mean", "head1_weight": 0.75}, **shape)
    module.warm_start(module.options.init_from)
    src, tgt = torch.randint(4, vocab, (3, 5)), torch.randint(4, vocab, (3, 6))
    out = module.blockwise_step(src, tgt, [0, 1, 2, 3], head1_weight=0.75)
    rest = torch.stack([out.head_loss[i] for i in (2, 3, 4)]).mean()
    torch.testing.assert_close(out.loss, 0.75 * out.head_loss[1] + 0.25 * rest)


def test_warm_start_uses_the_base_tokenizer(fitted):
    from lightning_bpd.tasks.translation.tokenizer import Tokenizer

    root, _, cli_b = fitted
    base = str(root / "runs/b/last.ckpt")
    other_data = [*TINY, "--data.init_args.seed=7", "--model.init_args.architecture.k=2", f"--model.init_args.training.init_from={base}",
                  "--trainer.max_steps=1", "--trainer.logger=false"]
    # other training text, no tokenizer named: the base's is used, not one trained on this text
    cli = main(["fit", *other_data, "--run_dir=runs/same-tok"])
    assert cli.trainer.global_step == 1
    assert cli.datamodule.tokenizer.segments_like(cli_b.datamodule.tokenizer)
    # a tokenizer named that is not the base's: one message saying what to set
    other = Tokenizer.train([f"word{i} thing{i % 7} other{i % 13}" for i in range(300)], root / "other-spm",
                            vocab_size=60)
    with pytest.raises(SystemExit) as err:
        main(["fit", *other_data, f"--data.init_args.tokenizer_path={other.model_path}", "--run_dir=runs/other-tok"])
    assert "trained with another SentencePiece model" in str(err.value)
    assert f"--data.init_args.tokenizer_path={base}" in str(err.value)

def test_distill_is_resumable_and_aligned(fitted, tmp_path):
    root, _, cli = fitted
    data = cli.datamodule.data_root
    out = tmp_path / "distilled"
    args = ["distill", "--ckpt", str(root / "runs/b/last.ckpt"), "--data-root", str(data), "--out", str(out),
            "--prefix", "test", "--beam", "2", "--shard-size", "5", "--batch-size", "4"]
    main(args)
    src_lines = (data / "test.en").read_text().splitlines()
    first = (out / "test.de").read_text().splitlines()
    assert (out / "test.en").read_text().splitlines() == src_lines
    assert len(first) == len(src_lines) == 12
    # kill halfway: drop one shard and the merged file; the rerun redoes only that shard
    (out / "shards/test.00001.de").unlink()
    (out / "test.de").unlink()
    kept = (out / "shards/test.00000.de").stat().st_mtime_ns
    main(args)
    assert (out / "shards/test.00000.de").stat().st_mtime_ns == kept
    assert (out / "test.de").read_text().splitlines() == first
    assert (out / "val.en").is_file() and (out / "val.de").is_file()


def test_decode_and_bench_with_sampling_and_a_draft(fitted, capsys):
    import json

    root, _, _ = fitted
    ckpt = str(root / "runs/b/last.ckpt")
    src = root / "sample.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\n")

    def decode(*extra):
        out = root / "sample.out"
        main(["decode", "--ckpt", ckpt, "--input", str(src), "--out", str(out), *extra])
        return out.read_text().split("\n")[:-1]

    greedy = decode("--criterion", "greedy")
    # the model drafting for itself, exact acceptance: greedy's output, every block full
    assert decode("--criterion", "exact", "--proposer", f"draft:{ckpt}", "--k", "4") == greedy
    assert "mean_accepted_block_size=" in capsys.readouterr().err
    assert decode("--criterion", "draft:exact", "--draft", ckpt, "--k", "4") == greedy  # the old spelling
    assert "--draft is deprecated: use --proposer draft:CKPT" in capsys.readouterr().err
    first = decode("--criterion", "sample_t1", "--seed", "3")
    assert decode("--criterion", "sample_t1", "--seed", "3") == first and len(first) == 3
    assert len(decode("--criterion", "ancestral_t0.7")) == 3
    with pytest.raises(SystemExit, match="needs a draft model"):
        decode("--criterion", "draft:exact")

    out = root / "bench_sampling.json"
    main(["bench", "--ckpt", ckpt, "--draft", ckpt, "--input", str(src), "--criteria", "exact", "draft:exact",
          "sample_t1", "draft:sample_t1", "--k", "3", "--batch-sizes", "1", "--limit", "3", "--warmup", "0",
          "--json", str(out)])
    r = json.loads(out.read_text())["batch_sizes"]["1"]
    assert list(r) == ["greedy", "ancestral_t1_p1", "exact", "draft:exact", "sample_t1", "draft:sample_t1"]
    assert r["draft:exact"]["equals_greedy"] is True
    assert r["draft:sample_t1"]["acceptance_rate"] == pytest.approx(1.0)  # a draft identical to the target
    assert r["sample_t1"]["baseline"] == "ancestral_t1_p1" and "equals_greedy" not in r["sample_t1"]
    assert 0.0 <= r["sample_t1"]["acceptance_rate"] <= 1.0


def test_bench_runs_each_method_at_several_k(fitted):
    import json

    root, _, _ = fitted
    src = root / "bench_ks.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\n")
    out = root / "bench_ks.json"
    main(["bench", "--ckpt", str(root / "runs/b/last.ckpt"), "--input", str(src), "--criteria", "exact",
          "--k", "1", "3", "--batch-sizes", "2", "--inputs", "2", "--warmup", "0", "--json", str(out)])
    result = json.loads(out.read_text())
    r = result["batch_sizes"]["2"]
    assert list(r) == ["greedy", "exact@k1", "exact@k3"] and result["k"] == [1, 3]
    assert r["exact@k1"]["mean_accepted_block_size"] == 1.0 and r["exact@k1"]["block_size"] == 1
    assert r["exact@k3"]["block_size"] == 3 and r["exact@k3"]["equals_greedy"] is True


def test_frozen_steps_benchmark(fitted, tmp_path):
    import json

    from lightning_bpd.benchmarks.frozen_steps import main as frozen_steps

    root, _, cli = fitted
    data_root = cli.datamodule.data_root
    out = tmp_path / "frozen.json"
    result = frozen_steps(["--ckpt", str(root / "runs/a/last.ckpt"), "--data-root", str(data_root), "--k", "3",
                           "--head-type", "chained", "--head-hidden", "16", "--max-tokens", "600", "--batches", "2",
                           "--repeats", "1", "--json", str(out)])
    assert json.loads(out.read_text())["speedup"] == pytest.approx(result["speedup"])
    for variant in ("base", "fine-tuned", "recomputed", "cached"):
        assert result[variant]["steps_per_minute"] > 0
    assert result["loss_mode"] == "mean" and result["cached_vs_base"] > 0


def test_a_draft_vocabulary_of_the_command_line_reaches_the_runtime_only(fitted):
    """``--draft-vocab N --draft-vocab-from TEXT`` becomes InferenceOptions.draft_vocab: the runtime proposes from it,
    the trained model is not changed (issue 45 item 3)."""
    import argparse

    import lightning_bpd
    from lightning_bpd.inference import build_runtime
    from lightning_bpd.inference.arguments import options_from_args

    root, _, _ = fitted
    module = lightning_bpd.load_model(root / "runs/b/last.ckpt")
    text = root / "dv_targets.de"
    text.write_text("Der Hund schläft.\nDer Lehrer liest ein Buch.\n")
    args = argparse.Namespace(precision=None, draft_vocab=12, draft_vocab_from=str(text))
    options = options_from_args(args, module)
    assert len(options.draft_vocab) == 12 and module.model.eos_id in options.draft_vocab
    runtime = build_runtime(module.model, options)
    assert runtime.draft_vocab.ids.tolist() == sorted(options.draft_vocab)
    assert module.model.draft_vocab is None and module.model.config.draft_vocab in (None, 0)
    with pytest.raises(ValueError, match="--draft-vocab needs"):
        options_from_args(argparse.Namespace(draft_vocab=12, draft_vocab_from=None), module)


def test_draft_vocabulary_from_the_training_targets_and_in_bench(fitted, tmp_path):
    import json

    from lightning_bpd.nn.draft_ids import ids_from_counts

    root, _, _ = fitted
    cli = main(["fit", *TINY, "--model.init_args.architecture.k=3", "--model.init_args.architecture.head_type=chained",
                "--model.init_args.architecture.draft_vocab=30", "--trainer.max_steps=2", "--trainer.logger=false",
                "--run_dir=runs/draft-vocab"])
    model, data = cli.model.model, cli.datamodule
    counts = data.dataset("train").target_counts(model.config.tgt_vocab_size)
    assert torch.equal(model.draft_vocab.ids, ids_from_counts(counts, 30, always=[model.eos_id]))
    reloaded = __import__("lightning_bpd").load_model(root / "runs/draft-vocab/last.ckpt")
    assert torch.equal(reloaded.model.draft_vocab.ids, model.draft_vocab.ids)  # saved with the model
    # bench gives an existing checkpoint a draft vocabulary counted in a text file; outputs stay greedy's
    src, tgt = root / "dv.en", data.data_root / "train.de"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\n")
    out = tmp_path / "dv.json"
    main(["bench", "--ckpt", str(root / "runs/b/last.ckpt"), "--input", str(src), "--criteria", "exact",
          "--batch-sizes", "1", "--inputs", "2", "--warmup", "0", "--draft-vocab", "25", "--draft-vocab-from",
          str(tgt), "--json", str(out)])
    result = json.loads(out.read_text())
    assert result["draft_vocab"] == 25 and result["batch_sizes"]["1"]["exact"]["equals_greedy"] is True
    with pytest.raises(SystemExit, match="--draft-vocab needs"):
        main(["bench", "--ckpt", str(root / "runs/b/last.ckpt"), "--input", str(src), "--draft-vocab", "25"])

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_decode_with_a_tree_of_candidates_returns_greedys_output(fitted):
    root, _, _ = fitted
    ckpt = str(root / "runs/b/last.ckpt")
    src = root / "tree.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\n")
    texts = {}
    for name, extra in [("greedy", ["--criterion", "greedy"]), ("tree", ["--proposer", "tree:0;1;0,0;1,0"]),
                        ("old", ["--tree", "0;1;0,0;1,0"])]:
        dest = root / f"tree.{name}.de"
        main(["decode", "--ckpt", ckpt, "--input", str(src), "--out", str(dest), *extra])
        texts[name] = dest.read_text()
    assert texts["tree"] == texts["greedy"] == texts["old"] and texts["tree"].count("\n") == 3
    with pytest.raises(SystemExit, match=r"^decode: --proposer tree:0;1,1: tree paths: \(1, 1\) needs its parent \(1,\)"):
        main(["decode", "--ckpt", ckpt, "--input", str(src), "--proposer", "tree:0;1,1"])
    with pytest.raises(SystemExit, match=r"^decode: a tree 3 deep needs k >= 4 heads, decoding with k=3$"):
        main(["decode", "--ckpt", ckpt, "--input", str(src), "--proposer", "tree:path:3"])


def test_bench_times_trees_beside_the_single_path(fitted):
    import json

    root, _, _ = fitted
    src = root / "tree_bench.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\n")
    out = root / "tree_bench.json"
    main(["bench", "--ckpt", str(root / "runs/b/last.ckpt"), "--input", str(src), "--criteria", "exact", "greedy",
          "--trees", "0;1;0,0;1,0", "path:1", "dynamic:4:2:2", "--batch-sizes", "2", "--inputs", "3", "--warmup", "0",
          "--json", str(out)])
    result = json.loads(out.read_text())
    report = result["batch_sizes"]["2"]
    assert set(report) == {"greedy", "exact", "exact+tree4", "exact+tree1", "exact+dynamic4x2x2"}
    assert report["exact+tree4"]["equals_greedy"] and report["exact+tree1"]["equals_greedy"]
    assert report["exact+dynamic4x2x2"]["equals_greedy"]
    assert report["exact+tree4"]["block_size"] == 3 and report["exact+tree1"]["block_size"] == 2
    assert result["trees"] == ["0;1;0,0;1,0", "path:1", "dynamic:4:2:2"]


def without_agreement_table(ckpt: Path, dest: Path) -> Path:
    """A copy of a checkpoint without its head rank agreement table (one of before issue 47's budgets)."""
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    del state["head_rank_agreement"]
    torch.save(state, dest)
    return dest


def test_the_test_stage_builds_its_trees_from_the_validation_table_the_checkpoint_stores(fitted):
    root, _, _ = fitted
    ckpt = root / "runs/b/last.ckpt"
    stored = torch.load(ckpt, map_location="cpu", weights_only=False)["head_rank_agreement"]
    for name, path in [("stored", ckpt), ("none", without_agreement_table(ckpt, root / "no_table.ckpt"))]:
        main(["test", "--config", str(root / "runs/b/config.yaml"), f"--ckpt_path={path}", f"--run_dir=runs/t_{name}",
              "--decode_eval.tree_nodes=[4,auto:6]", "--trainer.logger=false"])
        record = json.loads((root / f"runs/t_{name}/decode_test.json").read_text())
        metrics = record["metrics"]
        assert metrics["exact+nodes4/matches_greedy"] == metrics["exact+nodes-auto:6/matches_greedy"] == 1.0
        assert record["tree_nodes"] == [4, "auto:6"] and 0 <= metrics["exact+nodes-auto:6/nodes"] <= 6
        assert record["tree_choices"]["exact+nodes-auto:6"]["nodes"] == metrics["exact+nodes-auto:6/nodes"]
        expected = ("stored with the checkpoint (measured on validation)" if name == "stored"
                    else "measured on the first 6 validation examples (the checkpoint stores none)")
        assert record["tree_table"] == expected
    assert torch.load(ckpt, map_location="cpu", weights_only=False)["head_rank_agreement"] == stored  # untouched


def test_decode_with_a_tree_budget_built_from_the_stored_table(fitted, capsys):
    root, _, cli = fitted
    ckpt = root / "runs/b/last.ckpt"
    stored = torch.load(ckpt, map_location="cpu", weights_only=False)["head_rank_agreement"]
    assert torch.allclose(torch.tensor(stored, dtype=torch.float64), cli.model.rank_agreement)  # the last validation's
    assert len(stored) == 2 and len(stored[0]) == 8  # heads 2..3, ranks 0..7
    src = root / "budget.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\n")
    texts = {}
    for name, extra in [("greedy", ["--criterion", "greedy"]), ("nodes", ["--proposer", "tree:12"]),
                        ("path", ["--proposer", "tree:0"]), ("auto", ["--proposer", "tree:auto"]),
                        ("dynamic", ["--proposer", "dynamic:6:2:3"]), ("old", ["--tree-nodes", "12"])]:
        dest = root / f"budget.{name}.de"
        main(["decode", "--ckpt", str(ckpt), "--input", str(src), "--out", str(dest), *extra])
        texts[name] = dest.read_text()
    assert texts["nodes"] == texts["greedy"] == texts["path"] == texts["auto"] == texts["dynamic"] == texts["old"]
    assert texts["nodes"].count("\n") == 3
    assert "decode: tree-nodes auto: " in capsys.readouterr().err  # the choice and the cost curve
    with pytest.raises(SystemExit):  # argparse's one line
        main(["decode", "--ckpt", str(ckpt), "--input", str(src), "--proposer", "tree:auto:0"])
    assert "auto:M takes an integer M >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"^decode: --proposer tree:N must lie in \[0, 72\] for 2 heads of 8 measured"):
        main(["decode", "--ckpt", str(ckpt), "--input", str(src), "--proposer", "tree:73"])
    with pytest.raises(SystemExit):  # argparse's one line
        main(["decode", "--ckpt", str(ckpt), "--input", str(src), "--proposer", "tree:4", "--tree", "0"])
    assert "give one" in capsys.readouterr().err
    old = without_agreement_table(ckpt, root / "old.ckpt")
    with pytest.raises(SystemExit, match=r"^decode: --proposer tree:N 4: no head rank agreement table is stored"):
        main(["decode", "--ckpt", str(old), "--input", str(src), "--proposer", "tree:4"])


def test_bench_measures_the_table_where_a_checkpoint_has_none(fitted, capsys):
    import json

    root, _, _ = fitted
    old = without_agreement_table(root / "runs/b/last.ckpt", root / "old_bench.ckpt")
    src = root / "budget_bench.en"
    src.write_text("The teacher reads a book.\nThe dog sleeps.\nA man runs.\n")
    out = root / "budget_bench.json"
    main(["bench", "--ckpt", str(old), "--input", str(src), "--criteria", "exact", "--tree-nodes", "0", "6", "auto:6",
          "--batch-sizes", "2", "--inputs", "3", "--warmup", "0", "--json", str(out)])
    assert "measured on the 3 inputs" in capsys.readouterr().err
    result = json.loads(out.read_text())
    report = result["batch_sizes"]["2"]
    assert list(report) == ["greedy", "exact", "exact+nodes0", "exact+nodes6", "exact+nodes-auto:6"]
    assert result["tree_nodes"] == [0, 6, "auto:6"] and report["exact+nodes-auto:6"]["equals_greedy"]
    chosen = result["tree_nodes_auto"]["nodes-auto:6"]
    assert chosen["batch"] == 2 and 0 <= chosen["nodes"] <= 6 and set(chosen["cost_per_width"]) == {"1", "2", "4", "3", "7"}
    assert report["exact+nodes6"]["equals_greedy"] and report["exact+nodes0"]["equals_greedy"]
    assert report["exact+nodes0"]["mean_accepted_block_size"] == report["exact"]["mean_accepted_block_size"]


def copied_corpus(cli, folder: Path) -> Path:
    """A copy of the run's data folder (a refused command must leave the copy as it was)."""
    import shutil

    shutil.copytree(cli.datamodule.data_root, folder)
    return folder


def test_distill_out_that_overlaps_the_data_or_is_a_file_is_one_line(fitted, tmp_path):
    """--out the data folder, inside it or above it, a file or a path under a file: one line, nothing written."""
    root, _, cli = fitted
    data = copied_corpus(cli, tmp_path / "corpus")
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    afile = tmp_path / "afile.txt"
    afile.write_text("notes\n")
    ckpt = str(root / "runs/b/last.ckpt")
    for out, message in [(data, "overlaps the data folder"), (data / "sub", "overlaps the data folder"),
                         (tmp_path, "overlaps the data folder"), (afile, "is a file: give a folder"),
                         (afile / "sub", "lies under the file")]:
        with pytest.raises(SystemExit, match=f"^distill: --out {out} {message}"):
            main(["distill", "--ckpt", ckpt, "--data-root", str(data), "--out", str(out), "--prefix", "test",
                  "--beam", "1"])
    assert {p.name: p.read_bytes() for p in data.iterdir()} == before  # the gold targets, and no shards/
    assert afile.read_text() == "notes\n"


def test_distill_refuses_to_resume_a_folder_made_with_other_settings(fitted, tmp_path):
    """The settings that shape the shards are recorded when a run starts; resuming with others is one line (the
    folder untouched), resuming with the same goes on."""
    import shutil

    root, _, cli = fitted
    data = copied_corpus(cli, tmp_path / "corpus")
    ckpt = tmp_path / "teacher.ckpt"
    shutil.copyfile(root / "runs/b/last.ckpt", ckpt)
    out = tmp_path / "d9"
    args = ["distill", "--ckpt", str(ckpt), "--data-root", str(data), "--out", str(out), "--prefix", "test",
            "--shard-size", "5", "--batch-size", "4"]
    main([*args, "--beam", "1"])
    plan = json.loads((out / "distill_plan.json").read_text())
    assert plan["beam"] == 1 and plan["ckpt"] == str(ckpt.resolve()) and plan["lines"] == 12
    made = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    other = tmp_path / "other.ckpt"
    shutil.copyfile(ckpt, other)
    for extra, message in [(["--beam", "4"], "--beam 1"), (["--beam", "1", "--shard-size", "6"], "--shard-size 5"),
                           (["--beam", "1", "--ckpt", str(other)], f"--ckpt {ckpt.resolve()}")]:
        with pytest.raises(SystemExit) as err:
            main([*args, *extra])
        assert str(err.value) == f"distill: {out} was distilled with {message}: give a new --out or the same options"
    os.utime(ckpt, ns=(0, 10**18))  # the teacher trained further at the same path
    with pytest.raises(SystemExit, match=f"was distilled with another version of --ckpt {ckpt.resolve()}"):
        main([*args, "--beam", "1"])
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == made
    # shards of a run that recorded nothing (another tool's folder): refused, not reused
    old = tmp_path / "old"
    (old / "shards").mkdir(parents=True)
    (old / "shards/test.00000.de").write_text("stale\n")
    with pytest.raises(SystemExit, match=f"distill: {old} already holds shards but no distill_plan.json"):
        main([*args[:6], str(old), *args[7:], "--beam", "1"])
    assert (old / "shards/test.00000.de").read_text() == "stale\n" and not (old / "distill_plan.json").exists()


def test_bench_json_that_would_destroy_an_input_or_fail_late_is_one_line(fitted, tmp_path):
    """bench --json an input (the --input file, the checkpoint), a folder, a path under a file or a file that is not
    a JSON record: one line before any work; an earlier bench's record is replaced."""
    root, _, _ = fitted
    ckpt = root / "runs/b/last.ckpt"
    src = tmp_path / "input.en"
    src.write_text("The dog sleeps.\nA man runs.\n")
    afile = tmp_path / "afile.txt"
    afile.write_text("notes\n")
    kept = {p: p.read_bytes() for p in (ckpt, src, afile)}
    for target, message in [(src, "is the --input file"), (ckpt, "is the --ckpt file"), (tmp_path, "is a folder"),
                            (afile / "b.json", "lies under the file"), (afile, "exists and is not a bench's JSON")]:
        with pytest.raises(SystemExit, match=f"^bench: --json {target} {message}"):
            main(["bench", "--ckpt", str(ckpt), "--input", str(src), "--json", str(target)])
    assert {p: p.read_bytes() for p in kept} == kept
    out = tmp_path / "bench.json"
    out.write_text('{"ckpt": "an earlier bench"}\n')
    main(["bench", "--ckpt", str(ckpt), "--input", str(src), "--criteria", "exact", "--batch-sizes", "1",
          "--inputs", "2", "--warmup", "0", "--json", str(out)])
    assert json.loads(out.read_text())["ckpt"] == str(ckpt)
