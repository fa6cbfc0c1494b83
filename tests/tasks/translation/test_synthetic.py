"""Tests for the synthetic English->German smoke-test corpus (lightning_bpd.tasks.translation.synthetic)."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from lightning_bpd.tasks.translation import synthetic as syn
from lightning_bpd.tasks.translation.synthetic import NP, PP, Clause, render_clause_de, render_clause_en
from lightning_bpd.tasks.translation.synthetic_lexicon import (
    ADJECTIVES,
    ADVERBS,
    BASE_NOUN_COUNT,
    COMPOUND_NOUNS,
    FINITE_FORMS,
    FINITE_FORMS_SUB,
    FRONTABLE_ADVERBS,
    NOUNS,
    VERB_BY_DE,
    Adv,
    en_3sg,
    make_compound,
)

SUBORDINATORS = ("weil", "dass", "wenn", "obwohl", "während", "bevor")


def _adv(de: str) -> Adv:
    return next(a for a in ADVERBS if a.de == de)


def _words(sentence: str) -> list[str]:
    """Tokens of a generated sentence without the final period and commas."""
    assert sentence.endswith(".")
    return sentence[:-1].replace(",", "").split()


@pytest.fixture(scope="module")
def examples() -> list[syn.Example]:
    return syn.generate_examples(3000, seed=0)


def test_deterministic_by_seed_and_prefix_stable() -> None:
    a, b, c = syn.generate_pairs(300, seed=1), syn.generate_pairs(300, seed=1), syn.generate_pairs(300, seed=2)
    assert a == b
    assert a != c and len(set(a) & set(c)) < 30
    assert syn.generate_pairs(40, seed=1) == a[:40]
    assert syn.generate_pairs(0) == []
    assert all(isinstance(en, str) and isinstance(de, str) for en, de in a)


def test_does_not_use_global_random_state() -> None:
    random.seed(123)
    state = random.getstate()
    first = syn.generate_pairs(50, seed=7)
    assert random.getstate() == state
    random.seed(999)
    assert syn.generate_pairs(50, seed=7) == first


def test_lexicon_size_and_entries() -> None:
    assert syn.LEXICON_SIZE >= 300
    assert BASE_NOUN_COUNT >= 200 and len(ADJECTIVES) >= 50
    assert all(n.gender in ("m", "f", "n") and n.de[0].isupper() for n in NOUNS.values())
    assert NOUNS["woman"].gender == "f" and NOUNS["book"].gender == "n" and NOUNS["table"].gender == "m"


def test_surface_form(examples: list[syn.Example]) -> None:
    pairs = [(e.en, e.de) for e in examples]
    assert len(set(pairs)) == len(pairs)
    for en, de in pairs:
        for s in (en, de):
            assert s[0].isupper() and s.endswith(".") and not s.endswith(" .")
            assert "  " not in s and " ," not in s and s == s.strip()
            assert syn.MIN_WORDS <= len(s.split()) <= syn.MAX_WORDS
    assert {e.kind for e in examples} == {"simple", "adv_first", "sub_after", "sub_before", "relative", "coord"}


def test_verb_second_after_fronted_adverb(examples: list[syn.Example]) -> None:
    fronted = [e for e in examples if e.kind == "adv_first"]
    assert len(fronted) > 100
    for e in fronted:
        words = _words(e.de)
        assert words[0].lower() in FRONTABLE_ADVERBS, e.de
        assert words[1] in FINITE_FORMS, e.de  # the finite verb is the 2nd token, the subject follows


def test_verb_final_in_subordinate_and_relative_clauses(examples: list[syn.Example]) -> None:
    subs = [e for e in examples if e.kind in ("sub_after", "relative")]
    assert len(subs) > 300
    for e in subs:
        assert _words(e.de)[-1] in FINITE_FORMS_SUB, e.de
        if e.kind == "sub_after":
            assert re.search(rf", ({'|'.join(SUBORDINATORS)}) ", e.de), e.de
        else:
            assert re.search(r", (der|die|das|den) ", e.de), e.de


def test_fronted_subordinate_clause_then_verb_first(examples: list[syn.Example]) -> None:
    fronted = [e for e in examples if e.kind == "sub_before"]
    assert len(fronted) > 100
    for e in fronted:
        sub, main = e.de[:-1].split(", ", 1)
        assert sub.split()[0].lower() in SUBORDINATORS and sub.split()[-1] in FINITE_FORMS_SUB, e.de
        assert main.split()[0] in FINITE_FORMS, e.de


def test_separable_prefix_at_end_of_main_clause(examples: list[syn.Example]) -> None:
    separable = [e for e in examples if e.kind in ("simple", "adv_first") and e.verb and e.verb.prefix]
    assert len(separable) > 20
    for e in separable:
        words = _words(e.de)
        assert words[-1] == e.verb.prefix, e.de
        assert e.verb.de_finite(False, joined=True) not in words and e.verb.de_finite(True, joined=True) not in words


def test_handbuilt_clauses_word_order() -> None:
    woman, teacher = NP(NOUNS["woman"]), NP(NOUNS["teacher"])
    call = Clause(woman, VERB_BY_DE["anrufen"], acc=teacher)
    assert render_clause_de(call) == "die Frau ruft den Lehrer an"
    assert render_clause_de(call, "sub") == "die Frau den Lehrer anruft"
    assert render_clause_en(call) == "the woman calls the teacher"
    call_pl = Clause(NP(NOUNS["woman"], plural=True), VERB_BY_DE["anrufen"], acc=teacher)
    assert render_clause_de(call_pl) == "die Frauen rufen den Lehrer an"
    assert render_clause_de(call_pl, "sub") == "die Frauen den Lehrer anrufen"
    assert render_clause_en(call_pl) == "the women call the teacher"
    read = Clause(NP(NOUNS["man"]), VERB_BY_DE["lesen"], acc=NP(NOUNS["book"], "indef"), adv=_adv("heute"), front=True)
    assert render_clause_de(read) == "heute liest der Mann ein Buch"
    assert render_clause_en(read) == "today the man reads a book"
    read.front = False
    assert render_clause_de(read) == "der Mann liest heute ein Buch"  # indefinite object after the adverb
    assert render_clause_de(read, "sub") == "der Mann heute ein Buch liest"
    assert render_clause_de(read, "v1") == "liest der Mann heute ein Buch"
    definite = Clause(NP(NOUNS["man"]), VERB_BY_DE["lesen"], acc=NP(NOUNS["book"]), adv=_adv("oft"))
    assert render_clause_de(definite) == "der Mann liest das Buch oft"
    assert render_clause_en(definite) == "the man often reads the book"
    give = Clause(NP(NOUNS["man"]), VERB_BY_DE["geben"], acc=NP(NOUNS["book"], "indef"), dat=NP(NOUNS["child"]))
    assert render_clause_de(give) == "der Mann gibt dem Kind ein Buch"
    assert render_clause_en(give) == "the man gives the child a book"
    helps = Clause(NP(NOUNS["child"]), VERB_BY_DE["helfen"], dat=NP(NOUNS["woman"]))
    assert render_clause_de(helps) == "das Kind hilft der Frau" and render_clause_en(helps) == "the child helps the woman"
    big = Clause(NP(NOUNS["house"], plural=True), adj=ADJECTIVES["big"])
    assert render_clause_de(big) == "die Häuser sind groß" and render_clause_en(big) == "the houses are big"
    assert render_clause_de(Clause(NP(NOUNS["dog"]), VERB_BY_DE["schlafen"]), "sub") == "der Hund schläft"


@pytest.mark.parametrize(
    ("noun", "det", "plural", "adjs", "case", "expected"),
    [
        ("man", "def", False, (), "nom", "der Mann"),
        ("man", "def", False, (), "acc", "den Mann"),
        ("man", "def", False, (), "dat", "dem Mann"),
        ("woman", "def", False, (), "dat", "der Frau"),
        ("child", "def", False, (), "acc", "das Kind"),
        ("child", "def", True, (), "dat", "den Kindern"),
        ("man", "indef", False, ("old",), "nom", "ein alter Mann"),
        ("man", "indef", False, ("old",), "acc", "einen alten Mann"),
        ("man", "indef", False, ("old",), "dat", "einem alten Mann"),
        ("book", "indef", False, ("small",), "acc", "ein kleines Buch"),
        ("book", "def", False, ("small",), "nom", "das kleine Buch"),
        ("woman", "my", False, ("tired",), "nom", "meine müde Frau"),
        ("water", "none", False, ("cold",), "nom", "kaltes Wasser"),
        ("water", "none", False, ("cold",), "dat", "kaltem Wasser"),
        ("dog", "none", True, ("black",), "nom", "schwarze Hunde"),
        ("dog", "none", True, ("black",), "dat", "schwarzen Hunden"),
        ("dog", "two", True, ("small",), "acc", "zwei kleine Hunde"),
        ("dog", "no", False, (), "acc", "keinen Hund"),
        ("car", "this", False, ("red",), "dat", "diesem roten Auto"),
        ("house", "our", False, (), "dat", "unserem Haus"),
        ("book", "many", True, ("old",), "dat", "vielen alten Büchern"),
        ("student", "def", False, (), "nom", "der Student"),
        ("student", "def", False, (), "acc", "den Studenten"),
        ("tower", "indef", False, ("tall",), "nom", "ein hoher Turm"),
        ("house", "def", False, ("big", "old"), "dat", "dem großen alten Haus"),
    ],
)
def test_article_and_adjective_agreement(noun, det, plural, adjs, case, expected) -> None:
    np = NP(NOUNS[noun], det, plural, tuple(ADJECTIVES[a] for a in adjs))
    assert syn.render_np_de(np, case) == expected


def test_english_noun_phrases_and_verbs() -> None:
    assert syn.render_np_en(NP(NOUNS["man"], "indef", adjs=(ADJECTIVES["old"],))) == "an old man"
    assert syn.render_np_en(NP(NOUNS["umbrella"], "indef")) == "an umbrella"
    assert syn.render_np_en(NP(NOUNS["dog"], "indef", adjs=(ADJECTIVES["angry"],))) == "an angry dog"
    assert syn.render_np_en(NP(NOUNS["apple"], "indef", adjs=(ADJECTIVES["red"],))) == "a red apple"
    assert syn.render_np_en(NP(NOUNS["child"], "this", plural=True)) == "these children"
    assert syn.render_np_en(NP(NOUNS["water"], "none", adjs=(ADJECTIVES["cold"],))) == "cold water"
    assert [en_3sg(v) for v in ("watch TV", "carry", "go shopping", "play", "kiss", "fly", "read")] == [
        "watches TV", "carries", "goes shopping", "plays", "kisses", "flies", "reads"]
    assert VERB_BY_DE["haben"].en3 == "has"


def test_generated_english_articles_match_next_word(examples: list[syn.Example]) -> None:
    for e in examples:
        for art, word in re.findall(r"\b(a|an|A|An) (\w+)", e.en):
            assert (art.lower() == "an") == (word[0].lower() in "aeiou"), e.en


def test_prepositions_and_contractions() -> None:
    assert syn.render_pp_de(PP("mit", "with", "dat", NP(NOUNS["dog"]))) == "mit dem Hund"
    assert syn.render_pp_de(PP("mit", "with", "dat", NP(NOUNS["woman"], "indef"))) == "mit einer Frau"
    assert syn.render_pp_de(PP("in", "in", "dat", NP(NOUNS["house"]))) == "im Haus"
    assert syn.render_pp_de(PP("in", "in", "acc", NP(NOUNS["house"]))) == "ins Haus"
    assert syn.render_pp_de(PP("in", "in", "dat", NP(NOUNS["house"], "indef"))) == "in einem Haus"
    assert syn.render_pp_de(PP("zu", "to", "dat", NP(NOUNS["school"]))) == "zur Schule"
    assert syn.render_pp_de(PP("für", "for", "acc", NP(NOUNS["man"]))) == "für den Mann"
    assert syn.render_pp_de(PP("auf", "on", "acc", NP(NOUNS["table"]))) == "auf den Tisch"
    assert syn.render_pp_de(PP("auf", "on", "dat", NP(NOUNS["table"]))) == "auf dem Tisch"


def test_compounds() -> None:
    book = make_compound("school", "book")
    assert (book.de, book.de_pl, book.gender, book.en, book.en_pl) == (
        "Schulbuch", "Schulbücher", "n", "school book", "school books")
    table = make_compound("kitchen", "table")
    assert (table.de, table.gender) == ("Küchentisch", "m")
    assert make_compound("apple", "juice").mass
    assert syn.render_np_de(NP(make_compound("school", "bag"), "indef"), "acc") == "eine Schultasche"
    assert syn.render_np_en(NP(make_compound("apple", "tree"), "indef")) == "an apple tree"
    assert len(COMPOUND_NOUNS) >= 50


def test_compounds_in_generated_pairs(examples: list[syn.Example]) -> None:
    forms = {}
    for n in COMPOUND_NOUNS.values():
        for f in (n.de, n.de_pl, n.de_form(True, "dat")):
            forms[f] = (n.en, n.en_pl)
    hits = 0
    for e in examples:
        for word in _words(e.de):
            if word in forms:
                hits += 1
                assert forms[word][0] in e.en.lower() or forms[word][1] in e.en.lower(), (e.en, e.de)
    assert hits >= 50


def _read_lines(path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and "\r" not in text
    return text[:-1].split("\n")


def test_write_corpus_splits_disjoint_aligned_and_idempotent(tmp_path) -> None:
    sizes = {"train": 300, "val": 40, "test": 40}
    root = syn.write_corpus(tmp_path / "syn", seed=3, sizes=sizes)
    assert root == tmp_path / "syn"
    lines = {}
    for split, n in sizes.items():
        en, de = _read_lines(root / f"{split}.en"), _read_lines(root / f"{split}.de")
        assert len(en) == len(de) == n
        assert all(line.strip() for line in en + de)
        lines[split] = (en, de)
    for side in (0, 1):
        sets = [set(lines[s][side]) for s in sizes]
        assert sum(len(s) for s in sets) == len(set().union(*sets))  # no sentence shared between splits
    meta = json.loads((root / "SYNTHETIC.json").read_text(encoding="utf-8"))
    assert meta["seed"] == 3 and meta["sizes"] == sizes

    mtimes = {p.name: p.stat().st_mtime_ns for p in root.iterdir()}
    syn.write_corpus(root, seed=3, sizes=sizes)
    assert {p.name: p.stat().st_mtime_ns for p in root.iterdir()} == mtimes  # nothing regenerated

    (root / "train.en").write_text("corrupted\n", encoding="utf-8")
    syn.write_corpus(root, seed=3, sizes=sizes)
    assert _read_lines(root / "train.en") == lines["train"][0]

    syn.write_corpus(root, seed=4, sizes=sizes)
    assert _read_lines(root / "val.de") != lines["val"][1]

    other = syn.write_corpus(tmp_path / "other", seed=3, sizes={"train": 100, "val": 40, "test": 40})
    assert _read_lines(other / "val.en") == lines["val"][0] and _read_lines(other / "test.de") == lines["test"][1]


def test_write_corpus_default_sizes_and_speed(tmp_path) -> None:
    start = time.perf_counter()
    root = syn.write_corpus(tmp_path, seed=0)
    elapsed = time.perf_counter() - start
    for split, n in {"train": 20000, "val": 500, "test": 500}.items():
        assert len(_read_lines(root / f"{split}.en")) == len(_read_lines(root / f"{split}.de")) == n
    assert elapsed < 15.0  # typically ~2 s; generous bound for shared CI machines


def test_write_corpus_rejects_bad_sizes(tmp_path) -> None:
    with pytest.raises(ValueError, match="invalid split"):
        syn.write_corpus(tmp_path, sizes={"train": -1})
    with pytest.raises(ValueError, match="invalid split"):
        syn.write_corpus(tmp_path, sizes={"../x": 5})


def test_zipf_word_frequencies() -> None:
    from collections import Counter

    def top_share(pairs, n=100):
        counts = Counter(w for en, de in pairs for w in f"{en} {de}".lower().split())
        return sum(sorted(counts.values(), reverse=True)[:n]) / sum(counts.values())

    uniform = syn.generate_pairs(600, seed=5)
    assert syn.generate_pairs(600, seed=5, zipf=0.0) == uniform  # 0 is the original corpus
    skewed = syn.generate_pairs(600, seed=5, zipf=1.5)
    assert skewed == syn.generate_pairs(600, seed=5, zipf=1.5) and skewed != uniform
    assert top_share(skewed) > top_share(uniform) + 0.1  # a few frequent words carry most of the text
    with pytest.raises(ValueError, match=r"zipf exponent must lie in \[0, 4\]"):
        syn.generate_pairs(5, zipf=-1)
