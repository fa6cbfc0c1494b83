"""``export-base`` writes a Marian as opus-mt lays it out (``<pad>`` the last id), so that CTranslate2 converts it:
the same model up to two ids' names, and CTranslate2's greedy output equals transformers'."""

from __future__ import annotations

import json
import shutil

import pytest
import pytorch_lightning as pl
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from transformers import AutoTokenizer, MarianMTModel

from lightning_bpd.commands.export_base import export_base
from lightning_bpd.hf.pad_last import move_pad_last, swap_ids
from lightning_bpd.tasks.translation.hf_module import HFTranslationModule
from tests.hf.tiny_checkpoint import PAD, sentence_pairs, write_checkpoint, write_pad_last_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCES = [en for en, _ in sentence_pairs(5, seed=3)]
MAX_NEW = 10


def fit_checkpoint(root, start_row: float = 0.0):
    """A Lightning checkpoint of a k=2 run on a tiny random Marian (pad id 2); ``start_row`` fills ``<pad>``'s
    embedding row, as training through the tied output projection does."""
    init = write_checkpoint(root / "init")
    marian = MarianMTModel.from_pretrained(init)
    marian.generation_config.bad_words_ids = [[PAD]]  # as make-base writes it
    marian.save_pretrained(init)
    module = HFTranslationModule(str(init), k=2, max_len_a=1.0, max_len_b=6).eval()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in module.model.base.named_parameters():  # unit gain, so that each source reads its own
            if param.dim() == 2 and "embed_positions" not in name:  # (the sinusoids are remade on loading)
                param.copy_(torch.randn(param.shape, generator=g) * param.shape[-1] ** -0.5)
        module.model.base.get_input_embeddings().weight[PAD].fill_(start_row)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams),
                "pytorch-lightning_version": pl.__version__,
                "lightning_bpd_class": "lightning_bpd.tasks.translation.hf_module.HFTranslationModule"},
               root / "last.ckpt")
    return module


def greedy(folder, sources=SOURCES) -> list[list[str]]:
    """transformers' greedy output tokens (``<pad>`` banned, decoder start dropped, cut before EOS)."""
    tok = AutoTokenizer.from_pretrained(folder)
    model = MarianMTModel.from_pretrained(folder).eval()
    batch = tok(sources, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=MAX_NEW, min_length=0,
                             bad_words_ids=[[tok.pad_token_id]])
    rows = []
    for row in out[:, 1:].tolist():
        row = row[: row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
        rows.append(tok.convert_ids_to_tokens(row))
    return rows


def test_the_export_puts_pad_last_and_is_the_same_model(tmp_path):
    module = fit_checkpoint(tmp_path, start_row=0.25)
    old = module.tokenizer.hf
    vocab = len(old)
    out = export_base(tmp_path / "last.ckpt", tmp_path / "export")
    record = json.loads((out / "export_base.json").read_text())["pad_moved_last"]
    moved = old.convert_ids_to_tokens(vocab - 1)
    assert record["pad"] == [PAD, vocab - 1] and record["swapped_with"] == moved
    assert record["start_row_norm"] == pytest.approx(0.25 * module.model.base.config.d_model ** 0.5, rel=1e-6)
    new = AutoTokenizer.from_pretrained(out)
    assert (new.pad_token_id, new.eos_token_id, new.convert_ids_to_tokens(PAD)) == (vocab - 1, 0, moved)
    ids = old(SOURCES + [moved])["input_ids"]
    assert new(SOURCES + [moved])["input_ids"] == [swap_ids(row, PAD, vocab - 1) for row in ids]
    exported = MarianMTModel.from_pretrained(out).eval()
    assert exported.config.pad_token_id == exported.config.decoder_start_token_id == vocab - 1
    assert exported.generation_config.bad_words_ids == [[vocab - 1]]
    assert exported.get_output_embeddings().weight.data_ptr() == exported.get_input_embeddings().weight.data_ptr()
    perm = swap_ids(list(range(vocab)), PAD, vocab - 1)
    batch = old(SOURCES, return_tensors="pt", padding=True)
    decoder = torch.tensor([[PAD, 5, 9, 11]] * len(SOURCES))
    with torch.no_grad():
        want = module.model.base(**batch, decoder_input_ids=decoder).logits[..., perm]
        got = exported(input_ids=torch.tensor(perm)[batch["input_ids"]], attention_mask=batch["attention_mask"],
                       decoder_input_ids=torch.tensor(perm)[decoder]).logits
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    before = tmp_path / "before"
    module.model.base.save_pretrained(before)
    old.save_pretrained(before)
    assert greedy(out) == greedy(before)


def test_the_exported_marian_converts_and_ctranslate2_greedy_equals_transformers(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    fit_checkpoint(tmp_path)  # the start row is zero, as CTranslate2's decoder start
    out = export_base(tmp_path / "last.ckpt", tmp_path / "export")
    ctranslate2.converters.TransformersConverter(str(out)).convert(str(tmp_path / "ct2"))
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    tok = AutoTokenizer.from_pretrained(out)
    sources = [tok.convert_ids_to_tokens(ids) for ids in tok(SOURCES)["input_ids"]]
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=MAX_NEW, min_decoding_length=0)
    assert [r.hypotheses[0] for r in results] == greedy(out)


def test_a_pad_last_directory_is_left_alone_and_a_slow_tokenizer_is_one_error(tmp_path):
    folder = write_pad_last_checkpoint(tmp_path / "opus")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert move_pad_last(folder) is None
    assert before == {p.name: p.read_bytes() for p in folder.iterdir()}
    other = tmp_path / "slow"
    shutil.copytree(write_checkpoint(tmp_path / "pad2"), other)
    (other / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match="no tokenizer.json"):
        move_pad_last(other)


def test_export_base_refuses_an_out_it_would_destroy_in_one_line(tmp_path):
    """``--out`` that is the run's own base (model.pretrained), a folder holding a model export-base did not write,
    an existing file (a note, the checkpoint itself) or lies under a file: one line, nothing there changed; a new
    folder and an earlier export of ours are written."""
    from lightning_bpd.commands.export_base import main as export_main

    fit_checkpoint(tmp_path)
    init = tmp_path / "init"
    before = {p.name: p.read_bytes() for p in init.iterdir()}
    other = tmp_path / "other"
    write_checkpoint(other)
    (tmp_path / "afile.txt").write_text("notes\n")
    ckpt = str(tmp_path / "last.ckpt")
    for out, says in [(init, "is the base this run started from (model.pretrained): give a new --out"),
                      (other, "holds a model export-base did not write (config.json, "),
                      (tmp_path / "afile.txt", "is a file, not a folder: give a new --out"),
                      (tmp_path / "last.ckpt", "is a file, not a folder: give a new --out"),
                      (tmp_path / "afile.txt" / "sub", "afile.txt is a file, not a folder: give another --out")]:
        with pytest.raises(SystemExit) as exc:
            export_main(["--ckpt", ckpt, "--out", str(out)])
        assert str(exc.value).startswith(f"export-base: --out {out}") and says in str(exc.value), exc.value
        assert "\n" not in str(exc.value)
    assert {p.name: p.read_bytes() for p in init.iterdir()} == before
    assert not (other / "export_base.json").exists() and (tmp_path / "afile.txt").read_text() == "notes\n"
    export_main(["--ckpt", ckpt, "--out", str(tmp_path / "export")])
    export_main(["--ckpt", ckpt, "--out", str(tmp_path / "export")])  # again into its own export: allowed
    assert (tmp_path / "export" / "export_base.json").is_file()
