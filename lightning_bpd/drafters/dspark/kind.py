"""The DSpark kind as the registry sees it (:mod:`~lightning_bpd.drafters.registry`): its proposer (blocks of token 1
and up to K drafts), its exports (speculators' ``dspark`` layout, llama.cpp's GGUFs: ``--spec-type draft-dspark``)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.common.kind import DrafterKind, Spelling


@dataclass(frozen=True)
class DSparkKind(DrafterKind):
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

    def export(self, module: Any, ckpt: str | Path, out: str | Path, layout: str, float32_target: bool = False
               ) -> Path:
        """``speculators`` (vLLM; llama.cpp's converter reads it too) or ``llamacpp`` (drafter.gguf and target.gguf);
        the record ``export_heads.json`` beside."""
        from lightning_bpd.drafters.common.llamacpp import llamacpp_serving, write_llamacpp
        from lightning_bpd.drafters.dspark.speculators import write_speculators

        if layout not in self.formats:
            raise ValueError(f"{ckpt}: a DSpark drafter run: use --format speculators (vLLM) or llamacpp (llama.cpp), "
                             f"not {layout}")
        config, target = module.drafter.config, module.hparams.pretrained
        serve = {}
        if layout == "llamacpp":
            folder = write_llamacpp(module, out, float32_target or None)
            serve = llamacpp_serving(module, folder, self.llamacpp_spec_type, config.block_size + 1)  # n-max K
        else:
            folder = write_speculators(module, out)
        (folder / "export_heads.json").write_text(json.dumps(
            {"ckpt": str(Path(ckpt).resolve()), "target": target, "format": layout, "block_size": config.block_size,
             "target_layer_ids": list(config.target_layer_ids), "mask_token_id": config.mask_token_id,
             "markov_rank": config.markov_rank, "confidence_head": config.enable_confidence_head, **serve},
            indent=2) + "\n")
        print(f"export-heads: the DSpark drafter of {ckpt} ({config.num_layers} layers, block {config.block_size}, "
              f"Markov rank {config.markov_rank}, target {target}) in {folder} ({layout})", file=sys.stderr)
        return folder


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
