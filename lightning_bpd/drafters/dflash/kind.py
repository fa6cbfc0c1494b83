"""The DFlash kind as the registry sees it (:mod:`~lightning_bpd.drafters.registry`): its proposer (blocks), its
exports (speculators' ``dflash`` layout, z-lab's, llama.cpp's GGUFs)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.common.kind import DrafterKind, Spelling, article


@dataclass(frozen=True)
class DFlashKind(DrafterKind):
    def default_k(self, module: Any) -> int:
        return int(module.drafter.config.block_size)

    def load_drafter(self, path: str | Path) -> Any:
        from lightning_bpd.drafters.dflash.module import load_drafter

        return load_drafter(path)

    def prepare(self, drafter: Any, model: Any, what: str = "the drafter") -> Any:
        from lightning_bpd.drafters.dflash.module import check_drafter_fits, drafter_for

        check_drafter_fits(drafter, model, what)
        return drafter_for(drafter, model)

    def build(self, prepared: Any, spelling: Spelling, k: int | None = None) -> Any:
        from lightning_bpd.drafters.dflash.proposer import DFlash

        if spelling.form != "chain":
            raise self.refuse(spelling)
        return DFlash(prepared, k)

    def write_gguf(self, module: Any, path: Path, target: str, own_gguf: bool, name: str) -> None:
        from lightning_bpd.drafters.dflash.gguf import write_dflash_gguf

        write_dflash_gguf(module, path, target if own_gguf else None, name=f"{name}-dflash")

    # ---- what a DFlash-backbone kind's export says (DSpark's kind overrides these) -------------------------------
    formats_help = "speculators (vLLM), dflash-zlab or llamacpp (llama.cpp)"

    def writers(self) -> dict[str, Any]:
        """The writer of each layout but ``llamacpp``: ``(module, out) -> folder``."""
        from lightning_bpd.drafters.dflash.speculators import write_speculators, write_zlab

        return {"speculators": write_speculators, "dflash-zlab": write_zlab}

    def record(self, config: Any) -> dict[str, Any]:
        """The drafter's fields in ``export_heads.json``."""
        return {"block_size": config.block_size, "target_layer_ids": list(config.target_layer_ids),
                "mask_token_id": config.mask_token_id}

    def described(self, config: Any) -> str:
        """The drafter's shape in export-heads' closing line."""
        return f"{config.num_layers} layers, block {config.block_size}"

    def export(self, module: Any, ckpt: str | Path, out: str | Path, layout: str, float32_target: bool = False
               ) -> Path:
        """One of :attr:`formats` (``llamacpp``: drafter.gguf and target.gguf, llama.cpp drafting
        :meth:`default_k` tokens a step); the record ``export_heads.json`` beside, a warning where vLLM may refuse
        the last layer."""
        from lightning_bpd.drafters.common.llamacpp import llamacpp_serving, write_llamacpp

        if layout not in self.formats:
            raise ValueError(f"{ckpt}: {article(self.title)} {self.title} drafter run: use --format "
                             f"{self.formats_help}, not {layout}")
        config, target = module.drafter.config, module.hparams.pretrained
        serve = {}
        if layout == "llamacpp":
            folder = write_llamacpp(module, out, float32_target or None)
            serve = llamacpp_serving(module, folder, self.llamacpp_spec_type, self.default_k(module))
        else:
            folder = self.writers()[layout](module, out)
        (folder / "export_heads.json").write_text(json.dumps(
            {"ckpt": str(Path(ckpt).resolve()), "target": target, "format": layout, **self.record(config), **serve},
            indent=2) + "\n")
        last = module.model.n_layers - 1
        if layout == "speculators" and last in config.target_layer_ids:
            print(f"export-heads: warning: target layer {last} is the target's last: vLLM captures the input of a "
                  f"layer (aux_hidden_state_layer_ids {[i + 1 for i in config.target_layer_ids]}), so aux id "
                  f"{last + 1} may be refused (unverified)", file=sys.stderr)
        print(f"export-heads: the {self.title} drafter of {ckpt} ({self.described(config)}, target {target}) in "
              f"{folder} ({layout})", file=sys.stderr)
        return folder


KIND = DFlashKind(
    name="dflash",
    title="DFlash",
    module_class_path="lightning_bpd.drafters.dflash.module.DFlashModule",
    speculators_type="dflash",
    llamacpp_spec_type="draft-dflash",
    formats=("speculators", "dflash-zlab", "llamacpp"),
    trees=False,
    proposes="blocks",
)
