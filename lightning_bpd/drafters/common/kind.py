"""What a drafter kind tells the commands (:mod:`~lightning_bpd.drafters.registry`): its names, its training module,
the paths older checkpoints named it by, and what a command does with it: the proposers it builds under each spelling,
its default block, its bench rows, its exports (``export-heads --format``) and its llama.cpp GGUF. A kind subclasses
:class:`DrafterKind` in its folder's ``kind.py`` and sets ``KIND``; no command or benchmark knows one kind from
another (they ask the kind of a checkpoint, :func:`~lightning_bpd.drafters.registry.kind_of`).

Imports stay inside the methods: reading the registry (``--help``, a translation run) loads no ``transformers``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Spelling:
    """A parsed proposer spelling as a drafter reads it (``--proposer``): ``form`` ``chain`` (the kind's default:
    ``heads``, ``""`` or the kind's name), ``dynamic`` (``dynamic:N[:D[:W]]``: ``numbers`` N, D, W, D and W 0 where
    not given), ``tree`` (``tree:PATHS``: ``paths``) or ``other`` (anything else: ``tree:N``, ``prompt-lookup``, ...)."""

    text: str
    form: str
    numbers: tuple[int, ...] = ()
    paths: str | None = None


def parse_spelling(text: str, name: str = "") -> Spelling:
    """``text`` (a ``--proposer`` value, or ``""``) as a drafter of kind ``name`` reads it; ValueError (one line) for a
    dynamic tree whose numbers are not integers >= 1."""
    text = text.strip()
    head, _, rest = text.partition(":")
    if text in ("", "heads", name) or (head == name and not rest):
        return Spelling(text, "chain")
    if head == "dynamic" and rest:
        try:
            numbers = tuple(int(v) for v in rest.split(":"))
        except ValueError:
            numbers = ()
        if not numbers or len(numbers) > 3 or min(numbers) < 1:
            raise ValueError(f"--proposer {text}: a dynamic tree is dynamic:N[:D[:W]], integers >= 1")
        return Spelling(text, "dynamic", (*numbers, 0, 0)[:3])
    if head == "tree" and rest and not rest.lstrip("-").isdigit() and rest != "auto" and not rest.startswith("auto:"):
        return Spelling(text, "tree", paths=rest)
    return Spelling(text, "other")


def article(title: str) -> str:
    return "an" if title[:1].upper() in "AEIOU" else "a"


@dataclass(frozen=True)
class DrafterKind:
    """``name``: the registry's key and the proposer's spelling (``--proposer dflash``); ``title``: how tables and
    messages name it; ``module_class_path``: its Lightning training module (checkpoints written before kinds were
    folders name older paths: :mod:`lightning_bpd.class_paths`); ``speculators_type``: speculators' ``speculators_model_type`` of its export;
    ``llamacpp_spec_type``: llama.cpp's ``--spec-type`` (None: llama.cpp does not run it); ``formats``: its
    ``export-heads --format`` values; ``trees``: whether its drafter grows trees (``dynamic:N[:D[:W]]``,
    ``tree:PATHS``, the benches' ``NAME+tree<N>`` rows); ``proposes``: what its drafter proposes, for messages.

    A subclass implements :meth:`default_k`, :meth:`load_drafter`, :meth:`prepare`, :meth:`build` and, for its
    formats, :meth:`export` (and :meth:`write_gguf` where llama.cpp runs it)."""

    name: str
    title: str
    module_class_path: str
    speculators_type: str | None = None
    llamacpp_spec_type: str | None = None
    formats: tuple[str, ...] = ()
    trees: bool = False
    proposes: str = "blocks"

    def module_class(self) -> type:
        """The kind's Lightning module class (imported now)."""
        module_name, _, name = self.module_class_path.rpartition(".")
        return getattr(importlib.import_module(module_name), name)

    def default_layers(self, n_layers: int) -> tuple[int, ...]:
        """The target layers a drafter of this kind reads by default on a target of ``n_layers`` layers (``store
        --layers NAME``); ValueError (one line) where it has none for that target."""
        raise ValueError(f"--layers {self.name}: {article(self.title)} {self.title} drafter has no default layers: "
                         f"give --layers (comma-separated layers in [0, {n_layers - 1}])")

    # ---- proposing ------------------------------------------------------------------------------------------------
    def default_k(self, module: Any) -> int:
        """The block a run of this kind proposes by default (token 1 and its drafts)."""
        raise NotImplementedError

    def load_drafter(self, path: str | Path) -> Any:
        """The drafter alone of a checkpoint of this kind (``--proposer NAME:CKPT``); one-line ValueError on another
        file."""
        raise NotImplementedError

    def prepare(self, drafter: Any, model: Any, what: str = "the drafter") -> Any:
        """``drafter`` checked to fit the target ``model`` and made ready to decode with it (a copy in its dtype and
        device); one-line ValueError where it does not fit."""
        raise NotImplementedError

    def build(self, prepared: Any, spelling: Spelling, k: int | None = None) -> Any:
        """The proposer of the ``prepared`` drafter (:meth:`prepare`, maybe wrapped: a timing proxy) under
        ``spelling``, proposing blocks of ``k`` (None: the drafter's default); :meth:`refuse` for a spelling it does
        not take."""
        raise NotImplementedError

    def refuse(self, spelling: Spelling) -> ValueError:
        """The one line for a spelling this kind's drafter does not take."""
        forms = f"{self.proposes} (heads or {self.name}, the default)"
        if self.trees:
            forms += ", dynamic trees (dynamic:N[:D[:W]]) or static trees (tree:PATHS)"
        return ValueError(f"--proposer {spelling.text}: {article(self.title)} {self.title} checkpoint's drafter "
                          f"proposes {forms}")

    def proposer(self, drafter: Any, model: Any, spelling: str = "", k: int | None = None,
                 what: str = "the drafter") -> Any:
        """The proposer of ``drafter`` on the target ``model`` under ``spelling`` (a ``--proposer`` value; ``""``:
        the default), blocks of ``k`` (None: the drafter's)."""
        parsed = parse_spelling(spelling, self.name)
        if parsed.form == "other":
            raise self.refuse(parsed)
        return self.build(self.prepare(drafter, model, what), parsed, k)

    def bench_rows(self, module: Any, model: Any, k: int | None = None, tree_nodes: Any = (),
                   what: str = "the drafter") -> dict[str, Any]:
        """A run's rows of ours in a bench, by name: ``NAME`` (its default proposer, blocks of ``k``, default the
        run's) and, for a kind that grows trees, ``NAME+tree<N>`` per ``tree_nodes`` N > 0 (a dynamic tree of N
        nodes, as deep as the chain's drafts, 4 wide); each checked against exact acceptance now (one line)."""
        from lightning_bpd.decoding import Exact

        self.check_tree_nodes(tree_nodes)
        prepared = self.prepare(module.drafter, model, what)
        main = self.build(prepared, Spelling("", "chain"), k or self.default_k(module))
        main.check(model, Exact())  # a k outside the drafter's block: one line now
        rows = {self.name: main}
        for n in tree_nodes:
            if n > 0:
                rows[f"{self.name}+tree{n}"] = self.build(prepared, Spelling(f"dynamic:{n}", "dynamic", (n, 0, 0)),
                                                          main.width)
        return rows

    def check_tree_nodes(self, tree_nodes: Any) -> None:
        """One line for bench ``--tree-nodes`` this kind cannot take: any, where it grows no trees; ``auto``."""
        if tree_nodes and not self.trees:
            raise ValueError(f"--tree-nodes: {article(self.title)} {self.title} checkpoint's target has no heads to "
                             f"build trees of (its drafter proposes single {self.proposes})")
        if any(isinstance(n, str) for n in tree_nodes):
            raise ValueError(f"--tree-nodes auto picks a tree of the heads' rank agreement table: "
                             f"{article(self.title)} {self.title} run takes node counts")

    # ---- exports ----------------------------------------------------------------------------------------------------
    def export(self, module: Any, ckpt: str | Path, out: str | Path, layout: str, float32_target: bool = False
               ) -> Path:
        """The drafter of the run ``module`` (read from ``ckpt``) written to ``out`` in ``layout`` (one of
        :attr:`formats`); ValueError (one line) for another layout."""
        raise NotImplementedError

    def write_gguf(self, module: Any, path: Path, target: str, own_gguf: bool, name: str) -> None:
        """The drafter of ``module`` as llama.cpp's GGUF at ``path`` (``target``: the target's Hugging Face
        directory; ``own_gguf``: the run's target is a .gguf file; ``name``: the model's stem)."""
        raise ValueError(f"llama.cpp does not run {article(self.title)} {self.title} drafter")
