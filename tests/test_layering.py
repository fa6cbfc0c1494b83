"""What each package may import (docs/design.md, Layout): ``nn/`` holds what training needs and imports nothing of
``inference/``; the decoding core reads models through its protocol and imports only the argmax and the loss's
shifts of ``nn/``; the import graph between the package's modules has no circles and at most one import runs up a
layer. Read from the sources (no imports run)."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

import lightning_bpd

ROOT = Path(lightning_bpd.__file__).parent


def imported(package: str) -> dict[str, set[str]]:
    """Every ``lightning_bpd`` module that a module of ``package`` imports, anywhere in it (functions included)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
        found[str(path.relative_to(ROOT))] = {n for n in names if n.startswith("lightning_bpd.")}
    return found


def test_nn_imports_nothing_of_inference():
    wrong = {(path, name) for path, names in imported("nn").items() for name in names
             if name.startswith("lightning_bpd.inference")}
    assert not wrong, sorted(wrong)


def test_the_decoding_core_imports_only_the_argmax_and_the_loss_of_nn():
    allowed = {"lightning_bpd.nn.argmax", "lightning_bpd.nn.loss"}
    wrong = {(path, name) for path, names in imported("decoding").items() for name in names
             if name.startswith(("lightning_bpd.nn", "lightning_bpd.inference")) and name not in allowed}
    assert not wrong, sorted(wrong)


# ---- the import graph (issue 52 item 5) ------------------------------------------------------------------------------

# Layers, bottom to top: a module may import its own layer and those below it. Package folders by name; the modules
# at the package root by file (the package itself, ``lightning_bpd/__init__.py``, is the front door: ``load_model``).
LAYERS = {
    "kernels": 0, "version": 0, "deprecated_options": 0, "class_paths": 0,
    "nn": 1,
    "decoding": 2,
    "inference": 3,
    "hf": 4,
    "tasks": 5, "evaluation": 5, "callbacks": 5, "benchmarks": 5, "checkpoints": 5, "records": 5, "config_bases": 5,
    "commands": 6, "__init__": 6, "__main__": 6,
}

# A drafter kind's folder (``drafters/<kind>/``, and ``drafters/common/``) holds a file of each layer, named for it:
# the network (nn), the proposer (decoding), the exports (hf; GGUF writers with the benchmarks' GGUF code), the
# Lightning module and what the registry reads (tasks). The package files of the folders import nothing.
DRAFTER_FILES = {
    "network": 1, "layers": 1, "cache": 1, "config": 1,
    "proposer": 2, "proposing": 2, "tree": 2,
    "speculators": 4,
    "gguf": 5, "llamacpp": 5, "module": 5, "trainer": 5, "target": 5, "kind": 5, "registry": 5,
}
TORCH_ONLY = {"network", "layers", "cache", "config", "proposer", "proposing", "tree"}

# The one import allowed to run up a layer: the commands' option parsing (``options_from_args``, the one road from
# a command to a runtime's options) counts ``--draft-vocab N:TEXT``'s text with the task module's tokenizer through
# ``tasks.inputs.draft_vocab_ids`` (which reads the file with the translation task's ``read_lines``).
UP_LAYER = {("lightning_bpd.inference.arguments", "lightning_bpd.tasks.inputs")}

# Circles still to dissolve: none (the decoding loops' circle went with the one loop, decoding/loop.py).
STILL_TO_DISSOLVE: set[frozenset[str]] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def target(name: str) -> str | None:
    """The ``lightning_bpd`` module that importing ``name`` (a module, or a name in one) runs: the longest known
    prefix."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def type_checking_only(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: annotations only, never run, so not counted."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING"):
            skipped.update(id(n) for n in node.body for n in ast.walk(n))
    return skipped


@functools.cache
def graph() -> dict[str, set[str]]:
    """Module -> the ``lightning_bpd`` modules it imports anywhere (in functions too; TYPE_CHECKING blocks not):
    ``from a.b import c`` counts as a.b.c where that is a module, else as a.b."""
    edges: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), str(path))
        skipped = type_checking_only(tree)
        found: set[str | None] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.update(target(f"{node.module}.{alias.name}") for alias in node.names
                             if node.module.split(".")[0] == "lightning_bpd")
            elif isinstance(node, ast.Import):
                found.update(target(alias.name) for alias in node.names if alias.name.split(".")[0] == "lightning_bpd")
        edges[name] = {t for t in found if t is not None and t != name}
    return edges


def circles(edges: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: set[frozenset[str]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                found.add(frozenset(part))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) > 1 and parts[1] == "drafters":
        return DRAFTER_FILES.get(parts[-1], 0)  # 0: a folder's package file
    return LAYERS["__init__" if len(parts) == 1 else parts[1]]


def test_every_module_has_a_layer():
    assert not {name for name in MODULES if name != "lightning_bpd" and name.split(".")[1] not in LAYERS
                and name.split(".")[1] != "drafters"}
    drafters = {name for name in MODULES if name.startswith("lightning_bpd.drafters.")}
    packages = {name for name in drafters if MODULES[name].name == "__init__.py"}
    assert not {name for name in drafters - packages if name.rpartition(".")[2] not in DRAFTER_FILES}
    assert not {name for name in packages if graph()[name]}, "a drafters package file imports: keep them empty"


def third_party(path: Path) -> set[str]:
    """The top-level names of what a file imports from outside the package and the standard library."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return {n for n in names if n not in sys.stdlib_module_names and n != "lightning_bpd"}


def test_a_drafters_network_and_proposer_import_torch_only():
    """The decoding core's rule holds in a kind's folder: network, cache, norms and proposers see torch alone, and a
    proposer reads the network through its methods (no import of it)."""
    wrong = {}
    for name, path in MODULES.items():
        if name.startswith("lightning_bpd.drafters.") and name.rpartition(".")[2] in TORCH_ONLY:
            outside = third_party(path) - {"torch"}
            if layer(name) == 2:
                outside |= {n for n in graph()[name] if layer(n) == 1 and not n.startswith("lightning_bpd.nn.argmax")}
            if outside:
                wrong[name] = sorted(outside)
    assert not wrong, wrong


def test_the_import_graph_has_no_circles_but_those_still_to_dissolve():
    found = circles(graph())
    assert found <= STILL_TO_DISSOLVE, sorted(sorted(c) for c in found - STILL_TO_DISSOLVE)
    assert found == STILL_TO_DISSOLVE, f"dissolved, take them out of STILL_TO_DISSOLVE: {STILL_TO_DISSOLVE - found}"


def test_at_most_one_import_runs_up_a_layer():
    up = {(a, b) for a, targets in graph().items() for b in targets if layer(b) > layer(a)}
    assert len(UP_LAYER) <= 1 and up <= UP_LAYER, sorted(up - UP_LAYER)


def test_the_graph_sees_circles_and_imports_in_functions():
    """The checks' own check: a circle closed by an import inside a function is one; a TYPE_CHECKING import is not."""
    src = {"lightning_bpd.a": "def f():\n    from lightning_bpd.b import g\n",
           "lightning_bpd.b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from lightning_bpd.c import x\n"
                              "import lightning_bpd.a\n",
           "lightning_bpd.c": "from lightning_bpd.b import y\n"}
    edges = {}
    for name, text in src.items():
        tree = ast.parse(text)
        skipped = type_checking_only(tree)
        edges[name] = {n.module if isinstance(n, ast.ImportFrom) else n.names[0].name
                       for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in skipped
                       and (n.module if isinstance(n, ast.ImportFrom) else n.names[0].name).startswith("lightning_bpd")}
    assert circles(edges) == {frozenset({"lightning_bpd.a", "lightning_bpd.b"})}
