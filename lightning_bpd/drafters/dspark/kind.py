"""The DSpark kind as the registry sees it (:mod:`~lightning_bpd.drafters.registry`): its proposer (blocks of token 1
and up to K drafts), its exports (speculators' ``dspark`` layout, llama.cpp's GGUFs: ``--spec-type draft-dspark``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.common.kind import Spelling
from lightning_bpd.drafters.dflash.kind import DFlashKind


@dataclass(frozen=True)
class DSparkKind(DFlashKind):
    def default_k(self, module: Any) -> int:
        """Token 1 and the drafter's K drafts (anchor-first: every slot drafts)."""
        return int(module.drafter.config.block_size) + 1

    def load_drafter(self, path: str | Path) -> Any:
        from lightning_bpd.drafters.dspark.module import load_drafter

        return load_drafter(path)

    def prepare(self, drafter: Any, model: Any, what: str = "the drafter") -> Any:
        from lightning_bpd.drafters.dflash.module import drafter_for
        from lightning_bpd.drafters.dspark.module import check_dspark_fits

        check_dspark_fits(drafter, model, what)
        return drafter_for(drafter, model)

    def build(self, prepared: Any, spelling: Spelling, k: int | None = None) -> Any:
        """The DSpark proposer of blocks of ``k`` tokens (token 1 and ``k - 1`` drafts; None: all the drafter's)."""
        from lightning_bpd.drafters.dspark.proposer import DSpark

        if spelling.form != "chain":
            raise self.refuse(spelling)
        return DSpark(prepared, None if k is None else k - 1)

    def write_gguf(self, module: Any, path: Path, target: str, own_gguf: bool, name: str) -> None:
        from lightning_bpd.drafters.dspark.gguf import write_dspark_gguf

        write_dspark_gguf(module, path, target if own_gguf else None, name=f"{name}-dspark")

    formats_help = "speculators (vLLM) or llamacpp (llama.cpp)"

    def writers(self) -> dict[str, Any]:
        from lightning_bpd.drafters.dspark.speculators import write_speculators

        return {"speculators": write_speculators}  # llama.cpp's converter reads it too

    def record(self, config: Any) -> dict[str, Any]:
        return {**super().record(config), "markov_rank": config.markov_rank,
                "confidence_head": config.enable_confidence_head}

    def described(self, config: Any) -> str:
        return f"{super().described(config)}, Markov rank {config.markov_rank}"


KIND = DSparkKind(
    name="dspark",
    title="DSpark",
    module_class_path="lightning_bpd.drafters.dspark.module.DSparkModule",
    speculators_type="dspark",
    llamacpp_spec_type="draft-dspark",
    formats=("speculators", "llamacpp"),
    trees=False,
    proposes="blocks",
)
