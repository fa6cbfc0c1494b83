"""``python -m lightning_bpd bench --ckpt CKPT --peers generate,...`` (once ``bench-generate``, which still runs with one
deprecation line): our exact decoding of a tiny Hugging Face heads checkpoint against the base's greedy ``generate``
and prompt-lookup ``generate`` (and CTranslate2, when installed)."""

from __future__ import annotations

import json
import sys

import pytest
import pytorch_lightning as pl
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from lightning_bpd.benchmarks import ctranslate2_hf
from lightning_bpd.commands.bench import main as bench
from lightning_bpd.commands.bench_generate import GENERATE, LOOKUP, METHODS, OURS, OURS_LOOKUP, cut, hf_generate
from lightning_bpd.decoding import greedy_decode
from lightning_bpd.kernels import int8
from lightning_bpd.tasks.translation.hf_module import HFTranslationModule, save_heads
from tests.hf.tiny_checkpoint import sentence_pairs, write_checkpoint, write_pad_last_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

N = 7  # sentences: batches of 3 leave a ragged last one


def hf_bench(argv: list[str]) -> dict:
    """``bench`` against the base's ``generate`` (its rows and transformers' prompt lookup's always run)."""
    return bench([*argv, "--peers", "generate"])


def heads_folder(root, checkpoint):
    """A k=3 heads folder (save_heads) on ``checkpoint``, with randomized heads, and a source file of N sentences."""
    module = HFTranslationModule(str(checkpoint), k=3, head_type="paper", max_len_a=1.0, max_len_b=6).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    save_heads(module, root / "heads")
    (root / "src.en").write_text("\n".join(en for en, _ in sentence_pairs(N, seed=4)) + "\n")
    return root


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfgen")
    return heads_folder(root, write_checkpoint(root / "marian"))


def run(root, *extra: str) -> dict:
    out = root / "record.json"
    result = hf_bench(["--ckpt", str(root / "heads"), "--input", str(root / "src.en"), "--batch-sizes", "1", "3",
                       "--limit", str(N), "--warmup", "1", "--device", "cpu", "--json", str(out), *extra])
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    return result


def test_the_record_has_the_three_methods_on_the_same_sentences(tiny, capsys):
    result = run(tiny, "--peers", "prompt-lookup:2:4")
    assert result["methods"] == [*METHODS, OURS_LOOKUP] and result["inputs"] == N and result["precision"] == "float32"
    assert result["prompt_lookup_num_tokens"] == 4 and result["generate_dtype"] == "torch.float32"
    one, three = result["batch_sizes"]["1"], result["batch_sizes"]["3"]
    assert list(one) == [*METHODS, OURS_LOOKUP]
    for report in (one, three):
        ran = {name: r for name, r in report.items() if "skipped" not in r}
        assert {r["sentences"] for r in ran.values()} == {N}
        mine = ran[OURS]
        assert set(mine["speedup_over"]) == set(ran) - {OURS}
        assert ran[OURS_LOOKUP]["differs_from_hf_generate"] == 0  # our prompt lookup at batch 1 and 3: generate's
        for name, r in ran.items():
            assert r["ms_per_output_token"] == pytest.approx(1000 * r["seconds"] / r["tokens"])
            assert r["tokens_per_second"] == pytest.approx(r["tokens"] / r["seconds"])
            if name != OURS:
                assert r["exact_speedup"] == pytest.approx(r["seconds"] / mine["seconds"])
                assert mine["speedup_over"][name] == r["exact_speedup"]
            if name != GENERATE:
                assert r["differs_from_hf_generate"] == len(r["differing_sentences"])
        # exact decoding in float32 is greedy = generate's greedy: same sentences, same tokens
        assert mine["differs_from_hf_generate"] == 0 and mine["tokens"] == ran[GENERATE]["tokens"]
        assert mine["model_calls"] > 0 and mine["mean_accepted_block_size"] >= 1
    # prompt lookup is lossless for greedy: the tiny model's outputs are generate's
    assert one[LOOKUP]["differs_from_hf_generate"] == 0
    # transformers' assisted generation takes one row only: recorded, not timed, at batch 3
    assert "batch_size = 1" in three[LOOKUP]["skipped"] and list(three[LOOKUP]) == ["skipped"]
    table = capsys.readouterr().out
    assert "hf_prompt_lookup" in table and "skipped" in table


def test_generate_outputs_are_cut_like_ours(tiny):
    """Without the decoder start token, cut after the first EOS: greedy_decode's sequences, row by row."""
    module = HFTranslationModule.from_heads(tiny / "heads")
    src = module.encode_sources([en for en, _ in sentence_pairs(4, seed=2)])
    n = module.max_decode_len(src)
    assert hf_generate(module.model, src, n) == greedy_decode(module.model, src, n).sequences()
    assert cut([[5, 0, 7, 0], [5, 6], [0, 2]], 0) == [[5, 0], [5, 6], [0]]


@pytest.mark.skipif(not int8.available(), reason="needs torch's fbgemm/x86 quantized engine")
def test_an_int8_runtime_is_compared_too(tiny):
    result = hf_bench(["--ckpt", str(tiny / "heads"), "--input", str(tiny / "src.en"), "--batch-sizes", "3",
                       "--limit", str(N), "--warmup", "0", "--device", "cpu", "--precision", "int8"])
    mine = result["batch_sizes"]["3"][OURS]
    assert result["precision"] == "int8" and mine["sentences"] == N
    assert 0 <= mine["differs_from_hf_generate"] <= N  # int8 products against float32 generate: counted, not assumed


def test_a_draft_vocabulary_and_int8_proposals_keep_exact_decoding_exact(tiny):
    """The heads propose from the target side's most frequent tokens (counted with the checkpoint's tokenizer),
    in int8 where the CPU has it: the outputs stay generate's, and the record says what ran."""
    (tiny / "tgt.de").write_text("\n".join(de for _, de in sentence_pairs(40, seed=6)) + "\n")
    extra = ["--draft-vocab", f"20:{tiny / 'tgt.de'}"]
    if int8.available():
        extra += ["--proposal-precision", "int8"]
    result = run(tiny, *extra)
    assert result["options"]["draft_vocab"] == 20 and result["options"]["lean_steps"]
    assert result["options"]["proposal_precision"] == ("int8" if int8.available() else None)
    for report in result["batch_sizes"].values():
        assert report[OURS]["differs_from_hf_generate"] == 0


def one_line_exit(capsys, argv) -> str:
    with pytest.raises(SystemExit) as err:
        hf_bench(argv)
    message = str(err.value)
    assert message.startswith("bench: ") and "\n" not in message
    return message


def test_bad_input_is_one_error_line(tiny, tmp_path, capsys):
    from lightning_bpd.tasks.translation.tokenizer import Tokenizer
    from tests.task_modules import translation_module

    common = ["--input", str(tiny / "src.en"), "--device", "cpu"]
    assert "unknown precision" in one_line_exit(capsys, ["--ckpt", str(tiny / "heads"), "--precision", "int9", *common])
    assert "no checkpoint" in one_line_exit(capsys, ["--ckpt", str(tmp_path / "missing.ckpt"), *common])
    assert "must be >= 1" in one_line_exit(capsys, ["--ckpt", str(tiny / "heads"), "--batch-sizes", "0", *common])
    assert "--k must lie in [1, 3]" in one_line_exit(capsys, ["--ckpt", str(tiny / "heads"), "--k", "4", *common])
    # a checkpoint of our own Transformer: no generate to compare with
    corpus = [f"{en} {w}" for en, _ in sentence_pairs(20, seed=1) for w in ("one", "two")]
    tok = Tokenizer.train(corpus, tmp_path / "spm", vocab_size=40)
    module = translation_module(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=16, n_heads=2,
                                n_encoder_layers=1, n_decoder_layers=1, d_ff=32, k=2, head_hidden=16)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": pl.__version__, "tokenizer_proto": tok.to_bytes(),
                "lightning_bpd_class": "lightning_bpd.tasks.translation.module.TranslationModule"}, tmp_path / "own.ckpt")
    message = one_line_exit(capsys, ["--ckpt", str(tmp_path / "own.ckpt"), *common])
    assert "a run of our own base, which has no transformers generate" in message


PEER_ROWS = ["ctranslate2_float32", "ctranslate2_int8"]


def test_without_ctranslate2_the_peer_is_a_skipped_row_with_a_message(tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 raises ImportError
    result = run(tiny, "--peers", "ctranslate2", "--warmup", "0")
    assert "pip install ctranslate2" in result["peers"]["skipped"]
    for report in result["batch_sizes"].values():
        assert list(report) == [*METHODS, OURS_LOOKUP, *PEER_ROWS]
        assert all("pip install ctranslate2" in report[name]["skipped"] for name in PEER_ROWS)
        assert report[OURS]["differs_from_hf_generate"] == 0
    assert "skipped: the ctranslate2 package is not installed" in capsys.readouterr().out


def test_a_refused_conversion_is_a_reason_and_the_bench_goes_on(tiny, monkeypatch, capsys):
    def refuse(*_args, **_kwargs):
        raise ValueError("Source vocabulary 0 has size 8000 but the model expected a vocabulary of size 7999")

    monkeypatch.setattr(ctranslate2_hf, "build_ct2", refuse)
    result = run(tiny, "--peers", "ctranslate2", "--warmup", "0")
    reason = "conversion failed: ValueError: Source vocabulary 0 has size 8000"
    assert result["peers"]["failed"]["ctranslate2_int8"].startswith(reason)
    assert result["batch_sizes"]["3"]["ctranslate2_float32"]["skipped"].startswith(reason)
    assert result["batch_sizes"]["1"][OURS]["sentences"] == N
    assert "ctranslate2_int8       skipped: conversion failed" in capsys.readouterr().out


def test_a_peer_that_fails_while_decoding_is_dropped_with_its_reason(tiny, monkeypatch):
    """One peer raises on its third batch: its rows say why, the other peer and our methods are all timed."""

    class Peer:
        def __init__(self, name: str, fail_at: int | None) -> None:
            self.name, self.fail_at, self.calls, self.module = name, fail_at, 0, None

        def __call__(self, src, max_len):
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("out of memory\nmore detail")
            return hf_generate(self.module.model, src, max_len)

    def fake_build(module, quantizations, device):
        peers = [Peer("ctranslate2_float32", None), Peer("ctranslate2_int8", 3)]
        for peer in peers:
            peer.module = module
        return peers, {"quantizations": list(quantizations), "failed": {}}

    monkeypatch.setattr(ctranslate2_hf, "build_ct2", fake_build)
    result = run(tiny, "--peers", "ctranslate2", "--warmup", "1")
    reason = "failed at batch size 1: RuntimeError: out of memory"
    assert result["peers"]["failed"] == {"ctranslate2_int8": reason}
    for report in result["batch_sizes"].values():
        assert list(report) == [*METHODS, OURS_LOOKUP, *PEER_ROWS]
        assert report["ctranslate2_int8"] == {"skipped": reason}  # at batch 3 too: dropped for the rest
        assert report["ctranslate2_float32"]["sentences"] == N
        assert report["ctranslate2_float32"]["differs_from_hf_generate"] == 0
        assert set(report[OURS]["speedup_over"]) == {name for name, r in report.items() if "skipped" not in r} - {OURS}


def test_ctranslate2_greedy_of_the_converted_base(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    root = heads_folder(tmp_path, write_pad_last_checkpoint(tmp_path / "marian"))
    result = run(root, "--peers", "ctranslate2:float32")
    assert result["peers"]["ctranslate2_version"] == ctranslate2.__version__
    assert result["peers"]["converted_from"] == "the base directory"
    for bs in ("1", "3"):
        report = result["batch_sizes"][bs]
        assert list(report) == [*METHODS, OURS_LOOKUP, "ctranslate2_float32"]
        peer = report["ctranslate2_float32"]
        assert peer["sentences"] == N and peer["exact_speedup"] > 0
        assert report[OURS]["speedup_over"]["ctranslate2_float32"] == peer["exact_speedup"]
        assert peer["differs_from_hf_generate"] == 0  # the same base, greedy, in float32
        assert report[OURS]["differs_from_hf_generate"] == 0


def test_ctranslate2_converts_a_base_whose_pad_is_not_last(tiny):
    """The recipe's case: heads on a Marian with ``<pad>`` at id 2 convert from a copy with ``<pad>`` moved last;
    the tiny base's ``<pad>`` row is zero (as CTranslate2's decoder start), so its greedy equals generate's."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    result = run(tiny, "--peers", "ctranslate2")
    assert result["peers"]["ctranslate2_version"] == ctranslate2.__version__ and result["peers"]["failed"] == {}
    assert result["peers"]["converted_from"] == "the base, <pad> moved last (saved)"
    for report in result["batch_sizes"].values():
        assert list(report) == [*METHODS, OURS_LOOKUP, *PEER_ROWS]
        assert report["ctranslate2_float32"]["differs_from_hf_generate"] == 0
        assert report["ctranslate2_int8"]["sentences"] == N


def test_a_row_per_tree_budget_with_the_table_measured_on_the_inputs(tiny, capsys):
    result = run(tiny, "--tree-nodes", "0", "5", "auto:5", "--batch-sizes", "3")
    err = capsys.readouterr().err
    assert "no rank agreement table: measured on the 7 inputs" in err and "bench: tree-nodes auto: " in err
    report = result["batch_sizes"]["3"]
    trees = ["exact+nodes0", "exact+nodes5", "exact+nodes-auto:5"]
    assert result["methods"] == [*METHODS, *trees, OURS_LOOKUP] and result["tree_nodes"] == [0, 5, "auto:5"]
    assert list(report) == [*METHODS, *trees, OURS_LOOKUP] and result["tree_nodes_auto"]["nodes-auto:5"]["batch"] == 3
    for name in trees:
        assert report[name]["differs_from_hf_generate"] == 0 and report[name]["sentences"] == N
    assert report["exact+nodes0"]["mean_accepted_block_size"] == report[OURS]["mean_accepted_block_size"]


def test_the_old_command_prints_one_deprecation_line_and_benches_the_same(tiny, capsys):
    """``bench-generate`` with its own options (``--inputs``, ``--prompt-lookup-tokens``, ``--max-matching-ngram``):
    one line naming the ``bench`` command line, then the same bench and record."""
    from lightning_bpd.commands.old_benches import bench_generate

    result = bench_generate(["--ckpt", str(tiny / "heads"), "--input", str(tiny / "src.en"), "--batch-sizes", "3",
                             "--inputs", str(N), "--warmup", "0", "--device", "cpu", "--prompt-lookup-tokens", "4",
                             "--max-matching-ngram", "3"])
    err = [line for line in capsys.readouterr().err.splitlines() if "deprecated" in line]  # less transformers' bars
    assert len(err) == 1 and err[0].startswith("bench-generate is deprecated: use bench --ckpt "), err
    assert err[0].endswith("--peers generate,prompt-lookup:3:4") and "--limit 7" in err[0]
    assert result["methods"] == [*METHODS, OURS_LOOKUP] and result["inputs"] == N
    assert (result["prompt_lookup_num_tokens"], result["max_matching_ngram_size"]) == (4, 3)
    assert result["batch_sizes"]["3"][OURS]["differs_from_hf_generate"] == 0
