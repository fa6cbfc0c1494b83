"""Synthetic English->German parallel corpus generated from a small grammar: the project's built-in default data.

This is **synthetic smoke data, not a benchmark**: it exists so that the translation pipeline (tokenizer, datamodule,
training, blockwise decoding) can run end to end without downloading anything. BLEU on it says nothing about real
translation quality. The grammar covers German verb-second main clauses (also after a fronted adverb), verb-final
subordinate and relative clauses, separable verbs (``ruft ... an`` / ``..., dass sie ... anruft``), gender, number and
case agreement of articles and adjectives (weak/mixed/strong endings), weak masculine nouns, preposition contractions
(``im``, ``zum``), and compound nouns (``Schulbuch``). Output is deterministic for a seed and uses only the standard
library (a private :class:`random.Random` per call). The lexicon lives in :mod:`.synthetic_lexicon`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from itertools import accumulate
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lightning_bpd.tasks.translation import synthetic_lexicon as lex
from lightning_bpd.tasks.translation.synthetic_lexicon import (
    ADJECTIVES,
    ADVERBS,
    LEXICON_SIZE,
    NOUNS,
    VERBS,
    Adj,
    Adv,
    Noun,
    Verb,
    parse_spec,
)
from lightning_bpd.tasks.translation.text_files import file_sha256

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["LEXICON_SIZE", "generate_pairs", "write_corpus"]

T = TypeVar("T")

GENERATOR_VERSION = 1
DEFAULT_SIZES: dict[str, int] = {"train": 20000, "val": 500, "test": 500}
MIN_WORDS, MAX_WORDS = 4, 25
_CASES = {"nom": 0, "acc": 1, "dat": 2}
_DEF = (("der", "die", "das", "die"), ("den", "die", "das", "die"), ("dem", "der", "dem", "den"))
_STRONG = (("er", "e", "es", "e"), ("en", "e", "es", "e"), ("em", "er", "em", "en"))  # also der-word endings
_EIN = (("", "e", "", "e"), ("en", "e", "", "e"), ("em", "er", "em", "en"))
_WEAK = (("e", "e", "e", "en"), ("en", "e", "e", "en"), ("en", "en", "en", "en"))
_MIXED = (("er", "e", "es", "en"), ("en", "e", "es", "en"), ("en", "en", "en", "en"))
_CONTRACT = {("in", "dem"): "im", ("in", "das"): "ins", ("an", "dem"): "am", ("zu", "dem"): "zum", ("zu", "der"): "zur",
             ("von", "dem"): "vom"}
# determiner -> (German stem, English singular, English plural); "" English means "not allowed in that number"
_DETS = {
    "def": ("", "the", "the"), "this": ("dies", "this", "these"), "every": ("jed", "every", ""),
    "indef": ("ein", "a", ""), "no": ("kein", "no", "no"), "my": ("mein", "my", "my"), "his": ("sein", "his", "his"),
    "her": ("ihr", "her", "her"), "our": ("unser", "our", "our"), "none": ("", "", ""), "two": ("zwei", "", "two"),
    "three": ("drei", "", "three"), "four": ("vier", "", "four"), "many": ("viel", "", "many"),
    "some": ("einig", "", "some"),
}
_DER_WORDS, _EIN_WORDS = {"this", "every", "many", "some"}, {"indef", "no", "my", "his", "her", "our"}
_DET_WEIGHTS = {"def": 40, "indef": 25, "this": 6, "every": 3, "my": 4, "his": 4, "her": 4, "our": 3, "none": 10,
                "two": 2, "three": 2, "four": 2, "many": 3, "some": 3, "no": 8}
_INDEFINITE = {"indef", "none", "two", "three", "four", "many", "some", "no"}  # such objects follow adverbs
_AN_EXCEPTIONS = {"one", "once", "university", "uniform", "useful", "european", "unit", "user"}


@dataclass(frozen=True)
class NP:
    """A noun phrase: noun, determiner name (see ``_DETS``), number, attributive adjectives, optional PP modifier."""

    noun: Noun
    det: str = "def"
    plural: bool = False
    adjs: tuple[Adj, ...] = ()
    mod: PP | None = None


@dataclass(frozen=True)
class PP:
    """A prepositional phrase (German and English preposition, German case of the object)."""

    de: str
    en: str
    case: str
    np: NP


@dataclass
class Clause:
    """One clause. ``verb=None`` means copula + predicative ``adj``; ``rel`` marks a relative gap ("subj"/"acc")."""

    subj: NP
    verb: Verb | None = None
    adj: Adj | None = None
    acc: NP | None = None
    dat: NP | None = None
    pobj: NP | None = None
    pps: tuple[PP, ...] = ()
    adv: Adv | None = None
    manner: Adv | None = None
    front: bool = False
    rel: str = ""


@dataclass(frozen=True)
class Example:
    """A generated sentence pair with its template kind and main-clause verb (for tests and inspection)."""

    en: str
    de: str
    kind: str
    verb: Verb | None


def en_article(word: str) -> str:
    """English indefinite article before ``word`` (a/an by the first letter, with a few exceptions)."""
    w = word.lower()
    return "an" if (w[0] in "aeiou" and not w.startswith(tuple(_AN_EXCEPTIONS))) or w.startswith("hour") else "a"


_ADV_BY_KIND = {k: [a for a in ADVERBS if a.kind == k] for k in "tfmp"}
_CLAUSE_VERBS = [v for v in VERBS if v.obj_case != "that"]
_THAT_VERBS = [v for v in VERBS if v.obj_case == "that"]
_ACC_VERBS = [v for v in VERBS if v.obj_case == "acc" and not v.obj_prep]
_REL_MAIN_VERBS = [v for v in _ACC_VERBS if "P" not in v.letters]
_ADJ_LIST = list(ADJECTIVES.values())
_NOUN_LETTERS = frozenset(x for n in NOUNS.values() for x in n.letters)


def _matches(noun: Noun, spec: frozenset[str]) -> bool:
    return not noun.tags.isdisjoint(spec)


class LexiconRandom(random.Random):
    """The generator's random numbers; :meth:`pick` chooses lexical items (nouns, verbs, adjectives, adverbs).

    ``zipf`` = 0 picks uniformly (``choice``: the original corpus). With ``zipf`` = s > 0 item i of a
    candidate list (in lexicon order) is picked with weight 1 / (i + 1) ** s, as word frequencies
    fall in real text: a few words are frequent and many are rare, so a small model learns most of
    the running text from a short training run while the grammar stays the same.
    """

    def __init__(self, seed: int, zipf: float = 0.0) -> None:
        super().__init__(seed)
        if not 0.0 <= zipf <= 4.0:
            raise ValueError(f"the synthetic corpus' zipf exponent must lie in [0, 4] (0 = uniform), got {zipf}")
        self.zipf = zipf

    def pick(self, items: Sequence[T]) -> T:
        if self.zipf == 0:
            return self.choice(items)
        return self.choices(items, cum_weights=_zipf_cum_weights(len(items), self.zipf))[0]


@cache
def _zipf_cum_weights(n: int, s: float) -> list[float]:
    return list(accumulate(1.0 / (i + 1) ** s for i in range(n)))


_cache: dict[object, Any] = {}


def _cached(key: object, build: Callable[[], Any]) -> Any:
    if key not in _cache:
        _cache[key] = build()
    return _cache[key]


def _adjs_for(noun: Noun) -> list[Adj]:
    return _cached(("adj", noun.key), lambda: [a for a in _ADJ_LIST if _matches(noun, a.spec)])


def _noun(rng: LexiconRandom, spec: frozenset[str], exclude: tuple[Noun, ...] = (), letter: str = "") -> Noun:
    """Random noun matching a spec (or having a preposition letter), preferring base nouns over compounds."""
    base, comp = _cached((spec, letter), lambda: (
        [n for n in NOUNS.values() if (letter in n.letters if letter else _matches(n, spec)) and "compound" not in n.tags],
        [n for n in NOUNS.values() if (letter in n.letters if letter else _matches(n, spec)) and "compound" in n.tags]))
    for _ in range(5):
        n = rng.pick(comp if rng.random() < min(0.25, len(comp) / (len(base) + len(comp))) else base)
        if n not in exclude:
            return n
    return n


def _det_choices(mass: bool, plural: bool, neg: bool, subj: bool) -> tuple[list[str], list[int]]:
    def build() -> tuple[list[str], list[int]]:
        ok = [d for d, (_, sg, pl) in _DETS.items()
              if (pl if plural else sg or (mass and d == "none")) and not (mass and d in ("indef", "every"))
              and (d != "no" or neg) and (d != "every" or subj)]
        return ok, [_DET_WEIGHTS[d] for d in ok]
    return _cached(("det", mass, plural, neg, subj), build)


def _np(rng: LexiconRandom, noun: Noun, role: str = "subj", neg: bool = False) -> NP:
    """Random noun phrase around ``noun`` (number, determiner, 0-2 adjectives, rare PP modifier)."""
    plural = not noun.mass and rng.random() < 0.3
    det = rng.choices(*_det_choices(noun.mass, plural, neg, role == "subj"))[0]
    cands = _adjs_for(noun)
    adjs: list[Adj] = []
    for _ in range(rng.choices((0, 1, 2), (65, 28, 7))[0]):
        a = rng.pick(cands)
        if all(a.order != b.order for b in adjs):
            adjs.append(a)
    mod = None
    if role == "subj" and "per" in noun.tags and rng.random() < 0.05:
        mod = PP("mit", "with", "dat", _np(rng, _noun(rng, parse_spec("ani+por+clo")), "mod"))
    elif role == "obj" and "from" in noun.tags and rng.random() < 0.25:
        mod = PP("von", "from", "dat", _np(rng, _noun(rng, parse_spec("per")), "mod"))
    return NP(noun, det, plural, tuple(sorted(adjs, key=lambda a: a.order)), mod)


def render_np_de(np: NP, case: str) -> str:
    """German noun phrase in a case ("nom", "acc", "dat") with agreeing determiner and adjective endings."""
    c, g = _CASES[case], 3 if np.plural else "mfn".index(np.noun.gender)
    stem = _DETS[np.det][0]
    if np.det == "def":
        det, table = _DEF[c][g], _WEAK
    elif np.det in _DER_WORDS:
        det, table = stem + _STRONG[c][g], _STRONG if np.det in ("many", "some") else _WEAK
    elif np.det in _EIN_WORDS:
        det, table = stem + _EIN[c][g], _MIXED
    else:
        det, table = stem, _STRONG
    words = [det] + [a.stem + table[c][g] for a in np.adjs] + [np.noun.de_form(np.plural, case)]
    if np.mod:
        words.append(render_pp_de(np.mod))
    return " ".join(w for w in words if w)


def render_np_en(np: NP) -> str:
    """English noun phrase (a/an chosen from the following word)."""
    words = [a.en for a in np.adjs] + [np.noun.en_pl if np.plural else np.noun.en]
    det = _DETS[np.det][2 if np.plural else 1]
    det = en_article(words[0]) if np.det == "indef" else det
    out = " ".join(([det] if det else []) + words)
    return f"{out} {np.mod.en} {render_np_en(np.mod.np)}" if np.mod else out


def render_pp_de(pp: PP) -> str:
    """German PP, contracting preposition + definite article where German does (in dem -> im, zu der -> zur)."""
    art, _, rest = render_np_de(pp.np, pp.case).partition(" ")
    short = _CONTRACT.get((pp.de, art)) if pp.np.det == "def" else None
    return f"{short} {rest}" if short else f"{pp.de} {art} {rest}".strip()


def _pp(rng: LexiconRandom, letter: str, exclude: tuple[Noun, ...], case: str = "") -> PP:
    de, en, default_case = lex.PREPOSITIONS[letter]
    return PP(de, en, case or default_case, _np(rng, _noun(rng, frozenset(), exclude, letter), "pp"))


def _clause(rng: LexiconRandom, subj: NP | None = None, acc: NP | None = None) -> Clause:
    """Random clause; ``subj`` or ``acc`` fixes that argument (used for relative clauses)."""
    if acc is not None:
        verb = rng.pick(_cached(("acc", acc.noun.key), lambda: [v for v in _ACC_VERBS if _matches(acc.noun, v.obj)]))
    else:
        verbs = _CLAUSE_VERBS if subj is None else _cached(
            ("subj", subj.noun.key), lambda: [v for v in _CLAUSE_VERBS if _matches(subj.noun, v.subj)])
        verb = rng.pick(verbs) if verbs and rng.random() >= 0.1 else None
    if verb is None:  # copula + predicative adjective
        adj = rng.pick(_ADJ_LIST if subj is None else _adjs_for(subj.noun))
        subj = subj or _np(rng, _noun(rng, adj.spec))
        c = Clause(replace(subj, adjs=tuple(a for a in subj.adjs if a != adj)), adj=adj)
    else:
        subj = subj or _np(rng, _noun(rng, verb.subj, (acc.noun,) if acc else ()))
        c = Clause(subj, verb, acc=acc)
        used = (subj.noun,) + ((acc.noun,) if acc else ())
        if verb.obj_case and verb.obj_case != "that" and acc is None:
            obj = _np(rng, _noun(rng, verb.obj, used), "obj", neg="N" in verb.flags)
            c.acc, c.dat, c.pobj = (obj, None, None) if verb.obj_case == "acc" and not verb.obj_prep else (
                (None, obj, None) if not verb.obj_prep else (None, None, obj))
        used += tuple(np.noun for np in (c.acc, c.dat, c.pobj) if np)
        if "D" in verb.flags and c.dat is None and acc is None and rng.random() < 0.35:
            c.dat = _np(rng, _noun(rng, parse_spec("per"), used), "obj")
        if verb.obj_case == "that":
            return c
        if "P" in verb.letters:
            c.pps = (_pp(rng, rng.choice(verb.letters["P"]), used, "acc"),)
        else:
            opts = [x for x in verb.letters.get("L", "") + verb.letters.get("M", "") if x in _NOUN_LETTERS]
            opts += ["c", "q"] * ("C" in verb.flags) + ["b"] * ("B" in verb.flags)
            if opts and ("R" in verb.flags or rng.random() < 0.3):
                c.pps = (_pp(rng, rng.choice(opts), used),)
        if rng.random() < 0.12 and "S" not in verb.flags and not subj.noun.tags.isdisjoint(("per", "ani")):
            c.manner = rng.pick(_ADV_BY_KIND["m"])
    if rng.random() < 0.3:
        kind = rng.choices("tfp", (55, 30, 15))[0]
        kind = "t" if kind == "f" and verb is not None and "Q" in verb.flags else kind
        c.adv = rng.pick(_ADV_BY_KIND[kind])
    return c


def _rel_pronoun(np: NP, case: str) -> str:
    return _DEF[_CASES[case]][3 if np.plural else "mfn".index(np.noun.gender)]


def render_clause_de(c: Clause, order: str = "main") -> str:
    """German clause: ``main`` (verb second), ``v1`` (verb first, after a fronted clause) or ``sub`` (verb final)."""
    plural = c.subj.plural
    fin = ("sind" if plural else "ist") if c.verb is None else c.verb.de_finite(plural, joined=order == "sub")
    subj = _rel_pronoun(c.subj, "nom") if c.rel == "subj" else render_np_de(c.subj, "nom")
    objs = [(np, case) for np, case in ((c.dat, "dat"), (c.acc, "acc")) if np is not None and c.rel != case]
    # definite objects precede the adverbs of the middle field, indefinite ones follow them
    mid = [render_np_de(np, case) for np, case in objs if np.det not in _INDEFINITE]
    mid += [c.adv.de if c.adv and not c.front else "", c.manner.de if c.manner else ""]
    mid += [render_np_de(np, case) for np, case in objs if np.det in _INDEFINITE]
    if c.pobj is not None:
        mid.append(f"{c.verb.obj_prep} {render_np_de(c.pobj, c.verb.obj_case)}")
    mid += [render_pp_de(p) for p in c.pps] + [c.adj.de if c.adj else ""]
    if order == "sub":
        words = [_rel_pronoun(c.acc, "acc") if c.rel == "acc" else "", subj, *mid, fin]
    else:
        tail = [c.verb.prefix if c.verb else ""]
        head = [c.adv.de, fin, subj] if c.front else ([fin, subj] if order == "v1" else [subj, fin])
        words = head + mid + tail
    return " ".join(w for w in words if w)


def render_clause_en(c: Clause) -> str:
    """English clause (same for main and subordinate use; fronted time adverbs stay at the front)."""
    plural = c.subj.plural
    subj = ("who" if "per" in c.subj.noun.tags else "that") if c.rel == "subj" else render_np_en(c.subj)
    freq = c.adv.en if c.adv and c.adv.kind == "f" else ""
    late = c.adv.en if c.adv and c.adv.kind in "tp" and not c.front else ""
    words = ["that" if c.rel == "acc" else "", c.adv.en if c.front and c.adv.kind == "t" else "", subj]
    if c.verb is None:
        words += ["are" if plural else "is", freq, c.adj.en]
    else:
        words += [freq, c.verb.en if plural else c.verb.en3]
        words += [render_np_en(np) for np in (c.dat, c.acc if c.rel != "acc" else None, c.pobj) if np is not None]
    words += [c.manner.en if c.manner else ""] + [f"{p.en} {render_np_en(p.np)}" for p in c.pps] + [late]
    return " ".join(w for w in words if w)


def _finish(text: str) -> str:
    return text[0].upper() + text[1:] + "."


def _example(rng: LexiconRandom) -> Example:
    """One random sentence pair from one of the templates."""
    r = rng.random()
    if r < 0.46:  # simple main clause, possibly with a fronted adverb (V2 inversion)
        c = _clause(rng)
        if r >= 0.34 and not (c.adv and c.adv.kind in "tf"):
            q = c.verb is not None and "Q" in c.verb.flags
            c.adv = rng.pick(_ADV_BY_KIND["t"] if q or rng.random() < 0.6 else _ADV_BY_KIND["f"])
        c.front = c.adv is not None and c.adv.kind in "tf" and (r >= 0.34 or rng.random() < 0.3)
        return Example(render_clause_en(c), render_clause_de(c), "adv_first" if c.front else "simple", c.verb)
    if r < 0.62:  # main clause + subordinate clause (verb final)
        en_conj, de_conj = rng.choice(lex.SUBORDINATORS)
        main = Clause(_np(rng, _noun(rng, parse_spec("per"))), rng.pick(_THAT_VERBS)) if de_conj == "dass" else _clause(rng)
        sub = _clause(rng)
        return Example(f"{render_clause_en(main)} {en_conj} {render_clause_en(sub)}",
                       f"{render_clause_de(main)}, {de_conj} {render_clause_de(sub, 'sub')}", "sub_after", main.verb)
    if r < 0.72:  # fronted subordinate clause, main clause verb first
        en_conj, de_conj = rng.choice([s for s in lex.SUBORDINATORS if s[1] != "dass"])
        sub, main = _clause(rng), _clause(rng)
        return Example(f"{en_conj} {render_clause_en(sub)}, {render_clause_en(main)}",
                       f"{de_conj} {render_clause_de(sub, 'sub')}, {render_clause_de(main, 'v1')}", "sub_before",
                       main.verb)
    if r < 0.86:  # main clause whose object carries a relative clause (extraposed in German)
        verb = rng.pick(_REL_MAIN_VERBS)
        subj = _np(rng, _noun(rng, verb.subj))
        obj = _np(rng, _noun(rng, verb.obj, (subj.noun,)), "rel")
        main = Clause(subj, verb, acc=obj)
        rel_kind = "subj" if rng.random() < 0.6 else "acc"
        rel = _clause(rng, subj=obj) if rel_kind == "subj" else _clause(rng, acc=obj)
        rel.rel = rel_kind
        return Example(f"{render_clause_en(main)} {render_clause_en(rel)}",
                       f"{render_clause_de(main)}, {render_clause_de(rel, 'sub')}", "relative", verb)
    c1, c2 = _clause(rng), _clause(rng)  # coordination of two main clauses
    en_conj, de_conj = rng.choice(lex.COORDINATORS)
    sep = " " if de_conj == "und" else ", "
    return Example(f"{render_clause_en(c1)}{sep}{en_conj} {render_clause_en(c2)}",
                   f"{render_clause_de(c1)}{sep}{de_conj} {render_clause_de(c2)}", "coord", c1.verb)


def generate_examples(n: int, seed: int = 0, zipf: float = 0.0) -> list[Example]:
    """``n`` distinct annotated examples (no English or German sentence repeats), deterministic for
    ``(n, seed, zipf)``; ``zipf`` > 0 makes word frequencies Zipfian (see :class:`LexiconRandom`).

    The result for ``n`` is a prefix of the result for any larger ``n`` with the same seed.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng, out, seen_en, seen_de = LexiconRandom(seed, zipf), [], set(), set()
    for _ in range(50 * n + 1000):
        if len(out) >= n:
            break
        ex = _example(rng)
        ex = replace(ex, en=_finish(ex.en), de=_finish(ex.de))
        if ex.en in seen_en or ex.de in seen_de:
            continue
        if MIN_WORDS <= len(ex.en.split()) <= MAX_WORDS and MIN_WORDS <= len(ex.de.split()) <= MAX_WORDS:
            seen_en.add(ex.en)
            seen_de.add(ex.de)
            out.append(ex)
    if len(out) < n:
        raise RuntimeError(f"could only generate {len(out)} distinct sentence pairs out of {n} requested")
    return out


def generate_pairs(n: int, seed: int = 0, zipf: float = 0.0) -> list[tuple[str, str]]:
    """``n`` distinct (english, german) synthetic sentence pairs, deterministic for ``(n, seed, zipf)``."""
    return [(ex.en, ex.de) for ex in generate_examples(n, seed, zipf)]


def write_corpus(root: str | Path, seed: int = 0, sizes: dict[str, int] | None = None, zipf: float = 0.0) -> Path:
    """Write ``root/<split>.{en,de}`` (UTF-8, one sentence per line, aligned) plus ``root/SYNTHETIC.json``;
    ``zipf`` as in :func:`generate_examples`.

    Splits never share an English or a German sentence. Default sizes: train 20000, val 500, test 500. If the files
    already exist with the recorded content for the same seed, sizes and generator version, nothing is rewritten.
    Returns ``root``.
    """
    root = Path(root)
    sizes = dict(DEFAULT_SIZES if sizes is None else sizes)
    for split, size in sizes.items():
        if not split or "/" in split or "\\" in split or split.startswith(".") or not isinstance(size, int) or size < 0:
            raise ValueError(f"invalid split {split!r} with size {size!r}: need a plain name and an int >= 0")
    meta_path = root / "SYNTHETIC.json"
    meta = {"generator": "lightning_bpd.tasks.translation.synthetic", "version": GENERATOR_VERSION, "seed": seed,
            "sizes": sizes, "note": "synthetic smoke-test data, not a benchmark"}
    if zipf:
        meta["zipf"] = zipf
    if meta_path.is_file():
        try:
            old = json.loads(meta_path.read_text(encoding="utf-8"))
            hashes = old.pop("sha256")
            if old == meta and all(file_sha256(root / name) == h for name, h in hashes.items()):
                return root
        except (ValueError, KeyError, AttributeError, OSError):
            pass
    pairs = generate_pairs(sum(sizes.values()), seed, zipf)
    root.mkdir(parents=True, exist_ok=True)
    meta["sha256"], start = {}, 0
    # evaluation splits first, so that changing the train size leaves val/test unchanged
    for split in [s for s in ("test", "val") if s in sizes] + sorted(set(sizes) - {"test", "val"}):
        chunk, start = pairs[start:start + sizes[split]], start + sizes[split]
        for lang, idx in (("en", 0), ("de", 1)):
            path = root / f"{split}.{lang}"
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(p[idx] + "\n" for p in chunk), encoding="utf-8", newline="\n")
            tmp.replace(path)
            meta["sha256"][path.name] = file_sha256(path)
    meta_path.write_text(json.dumps(meta, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return root

