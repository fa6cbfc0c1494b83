"""A retrieval datastore as llama.cpp's n-gram lookup cache (lightning_bpd/tasks/lm/lookup_cache.py, the
``lookup-cache`` command): the vectorized counts equal a plain loop's, the file reads back record by record as
llama.cpp's loader reads it, only n-grams llama.cpp can draft from are kept, the greedy continuations weigh as told,
and bad input is one line."""

from __future__ import annotations

import random
import struct

import numpy as np
import pytest

pytest.importorskip("transformers")

from lightning_bpd.commands.lookup_cache import main as lookup_cache
from lightning_bpd.tasks.lm.datastore import save_datastore
from lightning_bpd.tasks.lm.lookup_cache import (
    NGRAM_MAX,
    draftable,
    export_lookup_cache,
    lookup_counts,
    read_lookup_cache,
    reference_counts,
    write_lookup_cache,
)


def streams(seed: int) -> list[tuple[list[int], int]]:
    """Two short streams over a small vocabulary (repeats: n-grams with several next tokens), weights 1 and 3."""
    rng = random.Random(seed)
    return [([rng.randrange(6) for _ in range(rng.randrange(0, 80))], 1),
            ([rng.randrange(6) for _ in range(rng.randrange(0, 50))], 3)]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("prune", [True, False])
def test_the_counts_are_a_plain_loops(seed, prune):
    parts = streams(seed)
    for n in range(1, NGRAM_MAX + 1):
        got = lookup_counts([(np.array(s, dtype=np.int64), w) for s, w in parts], n, prune).as_dict()
        assert got == reference_counts(parts, n, prune)


def test_only_what_llama_cpp_can_draft_from_is_kept():
    """llama.cpp's strict thresholds (common/ngram-cache.cpp): a 1-gram needs 4 observations and 75% for one token, a
    2-gram 3 and 66%, 3- and 4-grams 2 and 66%."""
    assert draftable(1, [3, 1]) and not draftable(1, [2, 1]) and not draftable(1, [2, 2])
    assert draftable(2, [2, 1]) and not draftable(2, [1, 1])
    assert draftable(4, [2]) and not draftable(4, [1]) and not draftable(3, [2, 2])
    parts = [([5, 6, 7, 5, 6, 7, 5, 6, 8], 1)]
    kept = lookup_counts([(np.array(s), w) for s, w in parts], 2).as_dict()
    assert kept == {(5, 6): {7: 2, 8: 1}}  # (6, 7) -> 5 seen twice: 2 < 3 observations
    weighted = lookup_counts([(np.array(parts[0][0]), 2)], 2).as_dict()
    assert weighted[(6, 7)] == {5: 4} and weighted[(5, 6)] == {7: 4, 8: 2}


def test_the_file_reads_back_as_llama_cpps_loader_reads_it(tmp_path):
    parts = streams(11)
    tables = [lookup_counts([(np.array(s, dtype=np.int64), w) for s, w in parts], n, False)
              for n in range(1, NGRAM_MAX + 1)]
    path = write_lookup_cache(tmp_path / "c.bin", tables)
    want = {k: v for n in range(1, NGRAM_MAX + 1) for k, v in reference_counts(parts, n, False).items()}
    assert read_lookup_cache(path) == want
    # the first record, by hand: 4 int32 of the key (-1 past its end), the count of tokens, then (token, count) pairs
    first = tables[0]
    raw = path.read_bytes()
    key_and_size = struct.unpack("<5i", raw[:20])
    assert key_and_size == (int(first.keys[0, 0]), -1, -1, -1, int(first.starts[1]))
    assert struct.unpack("<2i", raw[20:28]) == (int(first.tokens[0]), int(first.counts[0]))
    path.write_bytes(raw[:-4])
    with pytest.raises(ValueError, match="truncated"):
        read_lookup_cache(path)


def test_export_weighs_the_greedy_continuations(tmp_path):
    from tests.tasks.lm.tiny_lm import tokenizer

    tok = tokenizer()
    text = [7, 8, 9, 10] * 3
    greedy = [7, 8, 9, 11]
    store = save_datastore(tmp_path / "d.pt", text + greedy, tok, {"text_tokens": len(text)})
    one = export_lookup_cache(store, tmp_path / "one.bin", tokenizer=tok)
    three = export_lookup_cache(store, tmp_path / "three.bin", greedy_weight=3)
    assert one["tokens"] == 16 and one["greedy_tokens"] == 4 and three["greedy_weight"] == 3
    assert read_lookup_cache(tmp_path / "one.bin")[(7, 8, 9)] == {10: 3, 11: 1}
    assert (7, 8, 9) not in read_lookup_cache(tmp_path / "three.bin")  # {10: 3, 11: 3}: no token at 66%
    assert read_lookup_cache(tmp_path / "one.bin")[(7, 8)] == {9: 4}
    assert read_lookup_cache(tmp_path / "three.bin")[(7, 8)] == {9: 6}  # 3 in the text, 1 x 3 in the greedy part
    assert not list(tmp_path.glob("*.tmp"))


def test_bad_input_is_one_line(tmp_path, checkpoint, capsys):
    from tests.tasks.lm.tiny_lm import tokenizer

    with pytest.raises(SystemExit, match=r"^lookup-cache: .*nope\.pt: no such datastore file"):
        lookup_cache(["--datastore", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "c.bin")])
    (tmp_path / "bad.pt").write_bytes(b"not a datastore")
    with pytest.raises(SystemExit, match=r"^lookup-cache: .*bad\.pt: not a readable datastore"):
        lookup_cache(["--datastore", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "c.bin")])
    store = save_datastore(tmp_path / "d.pt", [5, 6, 7] * 4, tokenizer(extra=3), {"text_tokens": 12})
    stored = store.read_bytes()
    with pytest.raises(SystemExit, match=r"^lookup-cache: --greedy-weight must be an integer >= 1"):
        lookup_cache(["--datastore", str(store), "--out", str(tmp_path / "c.bin"), "--greedy-weight", "0"])
    with pytest.raises(SystemExit, match=r"^lookup-cache: .*d\.pt: a datastore of another tokenizer"):
        lookup_cache(["--datastore", str(store), "--out", str(tmp_path / "c.bin"), "--pretrained", str(checkpoint)])
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit, match=r"^lookup-cache: --out .*folder is a folder: give the lookup cache's file"):
        lookup_cache(["--datastore", str(store), "--out", str(tmp_path / "folder")])
    with pytest.raises(SystemExit, match=r"^lookup-cache: --out .*d\.pt is the datastore itself"):
        lookup_cache(["--datastore", str(store), "--out", str(store)])
    both = save_datastore(tmp_path / "both.pt", [5, 6, 7] * 6, tokenizer(extra=3), {"text_tokens": 12})
    with pytest.raises(SystemExit, match=r"^lookup-cache: a count of 2,147,483,652 does not fit llama.cpp's 32-bit"):
        lookup_cache(["--datastore", str(both), "--out", str(tmp_path / "c.bin"), "--greedy-weight", str(2**30)])
    assert not (tmp_path / "c.bin").exists() and not list(tmp_path.glob("*.tmp"))
    assert not any((tmp_path / "folder").iterdir()) and store.read_bytes() == stored
    lookup_cache(["--datastore", str(store), "--out", str(tmp_path / "c.bin")])
    assert "n-grams llama.cpp can draft from" in capsys.readouterr().out
    assert read_lookup_cache(tmp_path / "c.bin")[(5, 6)] == {7: 4}
