"""Where classes named in checkpoints and configs moved: a class path written before a move -> today's.

A checkpoint records its module's class (``lightning_bpd_class``) and a run's ``config.yaml`` its ``class_path``;
both keep loading after the class moves. The drafter kinds' modules moved into their folders
(``lightning_bpd/drafters/<kind>/module.py``) in 2026-11; a kind added since has no older path."""

from __future__ import annotations

MOVED: dict[str, str] = {
    "lightning_bpd.tasks.lm.dflash_module.DFlashModule": "lightning_bpd.drafters.dflash.module.DFlashModule",
    "lightning_bpd.tasks.lm.DFlashModule": "lightning_bpd.drafters.dflash.module.DFlashModule",
    "lightning_bpd.tasks.lm.eagle3_module.Eagle3Module": "lightning_bpd.drafters.eagle3.module.Eagle3Module",
    "lightning_bpd.tasks.lm.Eagle3Module": "lightning_bpd.drafters.eagle3.module.Eagle3Module",
}


def current(class_path: str) -> str:
    """``class_path`` as today's code names it (itself, where it never moved)."""
    return MOVED.get(class_path, class_path)
