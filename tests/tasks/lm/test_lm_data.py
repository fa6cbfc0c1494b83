"""The language-modelling data (issue 46): a folder of text or source files -> splits, packed sequences, held-out
prompts; binary and non-UTF-8 files skipped with a count; an empty folder one clear line."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("transformers")

from lightning_bpd.tasks.lm import LMDataModule
from lightning_bpd.tasks.lm.files import hash_split, split_files
from tests.tasks.lm.tiny_lm import EOS, PAD, tokenizer, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    tokenizer().save_pretrained(folder)
    return folder


def data_module(root, tok_dir, **kwargs) -> LMDataModule:
    return LMDataModule(root=str(root), tokenizer_path=f"hf:{tok_dir}", **{"seq_len": 16, **kwargs})


def test_packed_sequences_hold_every_token_once(tmp_path, tok_dir):
    root = write_corpus(tmp_path / "data")
    dm = data_module(root, tok_dir)
    tok = dm.tokenizer
    texts = [(root / "train" / f"mod_{i}.py").read_text() for i in range(4)]
    stream = [t for text in texts for t in [*tok(text)["input_ids"], EOS]]  # each file: BOS ... EOS
    assert stream[0] == tok.bos_token_id and stream.count(EOS) == 4
    ds = dm.dataset("train")
    rows = [ds[i] for i in range(len(ds))]
    assert all(r["src"].shape == (16,) and r["tgt"].shape == (16,) for r in rows)
    assert all(r["src"][1:].tolist() == r["tgt"][:-1].tolist() for r in rows)  # tgt: the next tokens
    targets = [t for r in rows for t in r["tgt"].tolist()]
    assert targets[: len(stream) - 1] == stream[1:] and set(targets[len(stream) - 1:]) <= {PAD}
    assert [r["src"][0].item() for r in rows] == stream[: len(stream) - 1 : 16]
    assert sum(r["length"] for r in rows) == len(stream) - 1 and all(r["length"] == 16 for r in rows[:-1])
    batch = next(iter(dm.train_dataloader()))
    assert batch["src"].shape == (8, 16) and batch["index"].shape == (8,)


def test_without_split_folders_a_file_keeps_its_hashed_split(tmp_path):
    root = write_corpus(tmp_path / "data", splits=False, files=40)
    files = split_files(root, 0.2, 0.2)
    assert sum(map(len, files.values())) == 40 and all(files.values())
    for split, paths in files.items():
        assert all(hash_split(p.relative_to(root).as_posix(), 0.2, 0.2) == split for p in paths)
    (root / "sub").mkdir()
    (root / "sub" / "new.py").write_text("x = 1\n")
    (root / ".hidden").write_text("left out\n")
    again = split_files(root, 0.2, 0.2)
    assert {s: [p for p in ps if p.parent == root] for s, ps in again.items()} == files  # none of them moved
    assert sum(map(len, again.values())) == 41


def test_binary_and_non_utf8_files_are_skipped_with_a_count(tmp_path, tok_dir, caplog):
    root = write_corpus(tmp_path / "data")
    (root / "train" / "image.bin").write_bytes(bytes(range(256)))
    (root / "train" / "latin1.txt").write_bytes("caf\xe9 cr\xe8me\n".encode("latin-1"))
    dm = data_module(root, tok_dir)
    with caplog.at_level(logging.WARNING, logger="lightning_bpd"):
        texts = dm.split_texts("train")
    assert texts.skipped == 2 and len(texts.texts) == 4
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["data: train split: skipped 2 of 6 files that are binary or not UTF-8"]


def test_an_empty_folder_is_one_clear_line(tmp_path, tok_dir):
    (tmp_path / "empty").mkdir()
    for root, match in ((tmp_path / "empty", "holds no files"), (tmp_path / "missing", "is not a folder")):
        with pytest.raises(ValueError, match=match) as err:
            data_module(root, tok_dir).check_data("fit")
        assert "\n" not in str(err.value)
    binary = tmp_path / "binary"
    (binary / "train").mkdir(parents=True)
    (binary / "train" / "a.bin").write_bytes(b"\0\1\2")
    with pytest.raises(ValueError, match="the train split has no UTF-8 text: 1 file.*1 skipped") as err:
        data_module(binary, tok_dir).check_data("fit")
    assert "\n" not in str(err.value)


def test_held_out_prompts_are_whole_lines_followed_by_their_reference(tmp_path, tok_dir):
    root = write_corpus(tmp_path / "data")
    dm = data_module(root, tok_dir, prompt_tokens=40, reference_lines=2)
    prompts, references = dm.eval_prompts("val", None)
    texts = [(root / "val" / f"mod_{i}.py").read_text() for i in range(2)]
    assert len(prompts) >= 4 and len(prompts) == len(references)
    for prompt, reference in zip(prompts, references):
        assert prompt.endswith("\n") and len(dm.tokenizer(prompt)["input_ids"]) <= 40
        assert reference.count("\n") == 2 and any(prompt + reference in text for text in texts)
        assert any(text.startswith(prompt) or f"\n{prompt}" in text for text in texts)  # starts at a line
    assert dm.eval_prompts("val", 3) == (prompts[:3], references[:3])
