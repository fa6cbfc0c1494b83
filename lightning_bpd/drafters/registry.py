"""The drafter kinds: one line each, name -> the module that describes its parts. Every command asks here.

A kind is a folder ``lightning_bpd/drafters/<kind>/`` whose ``kind.py`` holds ``KIND``, a
:class:`~lightning_bpd.drafters.common.kind.DrafterKind`: its training module's class, its proposers under each
spelling, its exports. Nothing is imported until a kind is asked for (a translation run never loads ``transformers``).
A checkpoint's kind is read from its module's ``drafter_kind`` (:func:`kind_of`), never by ``isinstance``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_bpd.drafters.common.kind import DrafterKind

REGISTERED: dict[str, str] = {
    "dflash": "lightning_bpd.drafters.dflash.kind",
    "eagle3": "lightning_bpd.drafters.eagle3.kind",
    "dspark": "lightning_bpd.drafters.dspark.kind",
}


def kind(name: str) -> DrafterKind:
    """The registered kind ``name``; one-line ValueError naming the registered ones otherwise."""
    if name not in REGISTERED:
        raise ValueError(f"no drafter kind {name!r}: the registered kinds are {', '.join(REGISTERED)}")
    return importlib.import_module(REGISTERED[name]).KIND


def kinds() -> list[DrafterKind]:
    """Every registered kind, in registration order."""
    return [kind(name) for name in REGISTERED]


def kind_of(module: Any) -> DrafterKind | None:
    """The kind of a loaded checkpoint's module (its class's ``drafter_kind``), or None: not a drafter's run (heads,
    a translation or super-resolution run)."""
    name = getattr(type(module), "drafter_kind", None)
    return kind(name) if isinstance(name, str) and name in REGISTERED else None
