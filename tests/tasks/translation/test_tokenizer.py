"""Tests for the SentencePiece Tokenizer wrapper, trained on a small synthetic corpus made in the test."""

from __future__ import annotations

import pickle
import random
from pathlib import Path

import pytest

from lightning_bpd.tasks.translation.tokenizer import Tokenizer

_EN = [
    "the",
    "a",
    "cat",
    "dog",
    "house",
    "garden",
    "small",
    "big",
    "red",
    "blue",
    "runs",
    "sleeps",
    "sees",
    "quickly",
    "today",
]
_DE = [
    "der",
    "die",
    "das",
    "katze",
    "hund",
    "haus",
    "garten",
    "klein",
    "gross",
    "rot",
    "blau",
    "läuft",
    "schläft",
    "sieht",
    "schnell",
    "heute",
]


def _corpus(n: int = 300, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = _EN if rng.random() < 0.5 else _DE
        out.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 12))))
    return out


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _corpus()


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory, corpus: list[str]) -> Tokenizer:
    prefix = tmp_path_factory.mktemp("spm") / "sub" / "joint"
    return Tokenizer.train(iter(corpus), prefix, vocab_size=120)


def test_special_ids_fixed(tok: Tokenizer) -> None:
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert tok._sp.pad_id() == 0 and tok._sp.bos_id() == 1 and tok._sp.eos_id() == 2 and tok._sp.unk_id() == 3
    assert 4 < tok.vocab_size <= 120
    assert tok.model_path is not None and tok.model_path.is_file()


def test_roundtrip_and_no_specials(tok: Tokenizer, corpus: list[str]) -> None:
    for text in corpus[:50]:
        ids = tok.encode(text)
        assert ids and all(i > 3 for i in ids)
        assert tok.decode(ids) == text
    assert tok.encode_batch(corpus[:3]) == [tok.encode(t) for t in corpus[:3]]


def test_decode_stops_at_eos_ignores_pad_bos(tok: Tokenizer) -> None:
    torch = pytest.importorskip("torch")
    a, b = tok.encode("der hund"), tok.encode("the cat")
    ids = [tok.bos_id] + a + [tok.eos_id] + b + [tok.pad_id]
    assert tok.decode(ids) == "der hund"
    assert tok.decode(torch.tensor(ids)) == "der hund"
    assert tok.decode([tok.bos_id] + a + [tok.pad_id, tok.pad_id]) == "der hund"
    assert tok.decode_batch([ids, b]) == ["der hund", "the cat"]


def test_load_and_pickle(tok: Tokenizer) -> None:
    assert tok.model_path is not None
    loaded = Tokenizer.load(tok.model_path)
    text = "die katze sieht den garten"
    assert loaded.encode(text) == tok.encode(text) and loaded.vocab_size == tok.vocab_size
    clone = pickle.loads(pickle.dumps(tok))
    assert clone.encode(text) == tok.encode(text) and clone.model_path == tok.model_path


def test_deterministic_training(tmp_path: Path, corpus: list[str]) -> None:
    t1 = Tokenizer.train(corpus, tmp_path / "one", vocab_size=100, seed=3)
    t2 = Tokenizer.train((s for s in corpus), tmp_path / "two", vocab_size=100, seed=3)
    # The .model bytes embed the model_prefix, so compare the learned pieces and scores instead.
    pieces = [(t1.id_to_piece(i), t1._sp.GetScore(i)) for i in range(t1.vocab_size)]
    assert pieces == [(t2.id_to_piece(i), t2._sp.GetScore(i)) for i in range(t2.vocab_size)]
    assert t1.encode(corpus[0]) == t2.encode(corpus[0])


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_small_corpus_large_vocab_does_not_crash(tmp_path: Path, model_type: str) -> None:
    small = _corpus(40, seed=1)
    t = Tokenizer.train(small, tmp_path / model_type, vocab_size=5000, model_type=model_type)
    assert 4 < t.vocab_size < 5000
    assert t.decode(t.encode(small[0])) == small[0]


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not found"):
        Tokenizer.load(tmp_path / "missing.model")


def test_invalid_args(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Tokenizer.train(["a b"], tmp_path / "x", vocab_size=100, model_type="word")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Tokenizer.train(["a b"], tmp_path / "x", vocab_size=4)


def test_segments_like_ignores_the_training_record(tmp_path: Path, corpus: list[str]) -> None:
    t1 = Tokenizer.train(corpus, tmp_path / "one", vocab_size=100, seed=3)
    t2 = Tokenizer.train(corpus, tmp_path / "two", vocab_size=100, seed=3)
    assert t1.to_bytes() != t2.to_bytes()  # the output name is recorded in the model
    assert t1.segments_like(t2)
    other = Tokenizer.train(_corpus(300, seed=5), tmp_path / "three", vocab_size=100, seed=3)
    assert not t1.segments_like(other)
