"""``bench --peers ctranslate2``: CTranslate2 float32 and int8 greedy beside our methods, on a tiny checkpoint."""

from __future__ import annotations

import json
import sys

import pytest
import pytorch_lightning as pl
import torch

from lightning_bpd.commands.bench import main as bench
from lightning_bpd.tasks.translation.tokenizer import Tokenizer
from tests.task_modules import translation_module

SENTENCES = ["The teacher reads a book.", "The dog sleeps.", "A man runs in the park.", "The woman sings.",
             "Two children play with a red ball near the water."]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, one_thread):
    """A random k=2 translation checkpoint (vocabulary ~60, d_model 32, 1+1 layers) and a source file."""
    root = tmp_path_factory.mktemp("ct2")
    corpus = [f"{s} {w}" for s in SENTENCES for w in ("one", "two", "three", "four")]
    tok = Tokenizer.train(corpus * 5, root / "spm", vocab_size=60)
    torch.manual_seed(0)
    module = translation_module(src_vocab_size=tok.vocab_size, tgt_vocab_size=tok.vocab_size, d_model=32, n_heads=2,
                                n_encoder_layers=1, n_decoder_layers=1, d_ff=64, k=2, head_hidden=16, max_len_a=1.0,
                                max_len_b=4)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": pl.__version__, "tokenizer_proto": tok.to_bytes(),
                "lightning_bpd_class": "lightning_bpd.tasks.translation.module.TranslationModule"}, root / "tiny.ckpt")
    src = root / "src.en"
    src.write_text("\n".join(SENTENCES) + "\n")
    return root


def run_bench(tiny, *extra: str) -> dict:
    out = tiny / "bench.json"
    bench(["--ckpt", str(tiny / "tiny.ckpt"), "--input", str(tiny / "src.en"), "--criteria", "exact",
           "--batch-sizes", "1", "2", "--inputs", "5", "--warmup", "1", "--device", "cpu", "--json", str(out), *extra])
    return json.loads(out.read_text())


def test_bench_times_ctranslate2_float32_and_int8_on_the_same_sentences(tiny, capsys):
    ctranslate2 = pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    result = run_bench(tiny, "--peers", "ctranslate2")
    peers = result["peers"]
    assert peers["ctranslate2_version"] == ctranslate2.__version__ and peers["device"] == "cpu"
    vocab = Tokenizer.load(tiny / "spm.model").vocab_size
    assert peers["shape"] == {"vocab": vocab, "d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "heads": 2,
                              "d_ff": 64, "max_positions": 4096}
    for bs in ("1", "2"):
        ours = result["batch_sizes"][bs]
        assert set(peers["batch_sizes"][bs]) == {"ctranslate2_float32", "ctranslate2_int8"}
        for r in peers["batch_sizes"][bs].values():
            assert r["ms_per_output_token"] > 0 and r["tokens_per_second"] > 0 and r["seconds"] > 0
            assert r["ms_per_output_token"] == pytest.approx(1000 * r["seconds"] / r["tokens"])
        for r in ours.values():
            assert r["ms_per_output_token"] == pytest.approx(1000 / r["tokens_per_second"])
    # batch 1: the peer decoded exactly greedy's tokens (one greedy iteration per token)
    greedy_tokens = result["batch_sizes"]["1"]["greedy"]["iterations"]
    assert peers["batch_sizes"]["1"]["ctranslate2_int8"]["tokens"] == greedy_tokens
    # batch 2: every row forced to its batch's longest greedy output, so at least greedy's tokens
    r = peers["batch_sizes"]["2"]["ctranslate2_float32"]
    assert r["forced_tokens"] == result["batch_sizes"]["2"]["greedy"]["iterations"] <= r["tokens"]
    table = capsys.readouterr().out
    assert "ms/tok" in table and "ct2_float32" in table and "ct2_int8" in table


def test_ctranslate2_output_lengths_equal_the_forced_lengths(one_thread):
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from lightning_bpd.benchmarks.ctranslate2_peer import MarianShape, build_ctranslate2_peers, source_tokens

    shape = MarianShape(vocab=40, d_model=16, encoder_layers=1, decoder_layers=1, heads=2, d_ff=32, max_positions=64)
    peers = build_ctranslate2_peers(shape, threads=1)
    assert [p.name for p in peers] == ["ctranslate2_float32", "ctranslate2_int8"]
    src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0], [3, 2, 0, 0]])
    sources = source_tokens(src, pad_id=0)
    assert sources == [["w5", "w6", "w7", "</s>"], ["w8", "w9", "</s>"], ["<unk>", "</s>"]]
    for peer in peers:
        for length in (1, 7, 30):
            assert peer.translate(sources, length)[0] == [length] * 3
        assert peer.run(sources, [3, 9, 5]) == [9, 9, 9]
        assert peer.report()["tokens"] == 27 and peer.report()["forced_tokens"] == 17  # 3 rows x the longest


def test_a_missing_peer_package_is_a_skipped_row_with_the_install_hint(tiny, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # import ctranslate2 -> ImportError
    result = run_bench(tiny, "--peers", "ctranslate2")
    reason = result["peers"]["skipped"]
    assert "ctranslate2" in reason and "pip install -e '.[peers]'" in reason and "\n" not in reason
    for bs in ("1", "2"):
        assert result["peers"]["batch_sizes"][bs] == {"ctranslate2_float32": {"skipped": reason},
                                                     "ctranslate2_int8": {"skipped": reason}}
        assert result["batch_sizes"][bs]["exact"]["equals_greedy"] is True
    assert "ct2_int8           skipped: the ctranslate2 package is not installed" in capsys.readouterr().out


def test_a_peer_that_fails_while_decoding_is_dropped_with_its_reason(tiny, monkeypatch):
    """The int8 peer raises on its second batch: its rows give the reason, float32 and our methods are timed."""
    pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from lightning_bpd.benchmarks.ctranslate2_peer import CTranslate2Peer

    translate, calls = CTranslate2Peer.translate, {"n": 0}

    def flaky(self, sources, length):
        if self.quantization == "int8":
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("int8 kernel refused")
        return translate(self, sources, length)

    monkeypatch.setattr(CTranslate2Peer, "translate", flaky)
    result = run_bench(tiny, "--peers", "ctranslate2")
    for bs in ("1", "2"):
        peers = result["peers"]["batch_sizes"][bs]
        assert peers["ctranslate2_int8"] == {"skipped": "RuntimeError: int8 kernel refused"}
        assert peers["ctranslate2_float32"]["tokens"] > 0
        assert result["batch_sizes"][bs]["exact"]["equals_greedy"] is True


def test_without_peers_the_record_has_none(tiny):
    result = run_bench(tiny)
    assert "peers" not in result and result["batch_sizes"]["1"]["exact"]["equals_greedy"] is True
