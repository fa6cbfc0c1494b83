"""What each package may import (docs/design.md, Layout): ``nn/`` holds what training needs and imports nothing of
``inference/``; the decoding core reads models through its protocol and imports only the argmax and the loss's
shifts of ``nn/``. Read from the sources (no imports run)."""

from __future__ import annotations

import ast
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


# Still to move (issue 45 item 2, lean steps): our model installs the runtime's TorchScript lean functions itself.
LEAN_STEPS = {("nn/model.py", "lightning_bpd.nn.lean_step")}


def test_nn_imports_nothing_of_inference():
    wrong = {(path, name) for path, names in imported("nn").items() for name in names
             if name.startswith("lightning_bpd.inference")}
    assert wrong <= LEAN_STEPS, sorted(wrong - LEAN_STEPS)


def test_the_decoding_core_imports_only_the_argmax_and_the_loss_of_nn():
    allowed = {"lightning_bpd.nn.argmax", "lightning_bpd.nn.loss"}
    wrong = {(path, name) for path, names in imported("decoding").items() for name in names
             if name.startswith(("lightning_bpd.nn", "lightning_bpd.inference")) and name not in allowed}
    assert not wrong, sorted(wrong)
