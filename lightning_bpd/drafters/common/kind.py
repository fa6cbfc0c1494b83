"""What a drafter kind tells the commands (:mod:`~lightning_bpd.drafters.registry`): its names, its training module
and the paths older checkpoints named it by. A kind subclasses :class:`DrafterKind` in its folder's ``kind.py``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class DrafterKind:
    """``name``: the registry's key and the proposer's spelling (``--proposer dflash``); ``title``: how tables and
    messages name it; ``module_class_path``: its Lightning training module; ``legacy_class_paths``: where checkpoints
    written before this layout found it; ``speculators_type``: speculators' ``speculators_model_type`` of its export;
    ``llamacpp_spec_type``: llama.cpp's ``--spec-type`` (None: llama.cpp does not run it)."""

    name: str
    title: str
    module_class_path: str
    legacy_class_paths: tuple[str, ...] = ()
    speculators_type: str | None = None
    llamacpp_spec_type: str | None = None

    def module_class(self) -> type:
        """The kind's Lightning module class (imported now)."""
        module_name, _, name = self.module_class_path.rpartition(".")
        return getattr(importlib.import_module(module_name), name)
