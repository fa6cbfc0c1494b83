"""The EAGLE-3 kind as the registry sees it (:mod:`~lightning_bpd.drafters.registry`): its proposers (chains,
EAGLE-2 dynamic trees, static trees), its exports (speculators' ``eagle3`` layout, llama.cpp's GGUFs)."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_bpd.drafters.common.kind import DrafterKind, Spelling


@dataclass(frozen=True)
class Eagle3Kind(DrafterKind):
    def default_k(self, module: Any) -> int:
        return int(module.block_size)

    def default_layers(self, n_layers: int) -> tuple[int, ...]:
        """EAGLE-3's low, middle and high layers (a target of >= 7 layers)."""
        from lightning_bpd.drafters.eagle3.network import default_eagle3_layers

        if n_layers < 7:
            raise ValueError(f"--layers eagle3: EAGLE-3's default layers need a target of >= 7 layers, this one has "
                             f"{n_layers}: give --layers (comma-separated layers in [0, {n_layers - 1}])")
        return tuple(default_eagle3_layers(n_layers))

    def load_drafter(self, path: str | Path) -> Any:
        from lightning_bpd.drafters.eagle3.module import load_eagle3_drafter

        return load_eagle3_drafter(path)

    def prepare(self, drafter: Any, model: Any, what: str = "the drafter") -> Any:
        from lightning_bpd.drafters.eagle3.module import check_eagle3_fits, drafter_for

        check_eagle3_fits(drafter, model, what)
        return drafter_for(drafter, model)

    def build(self, prepared: Any, spelling: Spelling, k: int | None = None) -> Any:
        """A chain of ``k`` (default 8); ``dynamic:N[:D[:W]]``: EAGLE-2's dynamic tree (D default the chain's
        drafts); ``tree:PATHS``: a static tree of the drafter's ranks."""
        from lightning_bpd.drafters.eagle3.proposer import Eagle3

        chain = Eagle3(prepared) if k is None else Eagle3(prepared, k)
        if spelling.form == "chain":
            return chain
        if spelling.form == "dynamic":
            from lightning_bpd.decoding.trees.tree import DynamicTree
            from lightning_bpd.drafters.eagle3.tree import Eagle3Tree

            nodes, depth, width = spelling.numbers
            return Eagle3Tree(prepared, spec=DynamicTree(nodes, depth or chain.block_size - 1, *([width] if width
                                                                                                  else [])))
        if spelling.form == "tree":
            from lightning_bpd.decoding import parse_tree
            from lightning_bpd.drafters.eagle3.tree import Eagle3StaticTree

            try:
                tree = parse_tree(spelling.paths)
            except ValueError as err:  # parse_tree's line names --tree: name this option
                raise ValueError(f"--proposer {spelling.text}: {str(err).split(': ', 1)[-1]}") from None
            return Eagle3StaticTree(prepared, tree=tree)
        raise self.refuse(spelling)

    def write_gguf(self, module: Any, path: Path, target: str, own_gguf: bool, name: str) -> None:
        from lightning_bpd.drafters.eagle3.gguf import write_eagle3_gguf

        write_eagle3_gguf(module.drafter, path, target, module.tokenizer, name=f"{name}-eagle3")

    def export(self, module: Any, ckpt: str | Path, out: str | Path, layout: str, float32_target: bool = False
               ) -> Path:
        """speculators' ``eagle3`` layout or llama.cpp's GGUFs (``llamacpp``), the serving notes on stderr;
        ValueError (one line) for a target that is no Hugging Face directory nor .gguf file or (``llamacpp``) a
        drafter llama.cpp cannot run."""
        from lightning_bpd.drafters.common.llamacpp import llamacpp_serving, target_gguf, write_llamacpp
        from lightning_bpd.drafters.eagle3.speculators import serving_notes, write_speculators
        from lightning_bpd.hf.gguf_target import resolve_pretrained

        if layout not in self.formats:
            raise ValueError(f"{ckpt}: an EAGLE-3 drafter run: use --format speculators (vLLM; llama.cpp converts "
                             f"it) or llamacpp (llama.cpp's GGUFs), not {layout}")
        config, target = module.drafter.config, module.hparams.pretrained
        if not Path(target).is_dir() and target_gguf(module) is None:
            raise ValueError(f"{ckpt}: the drafter's target is {target}, not a Hugging Face directory nor a .gguf "
                             f"file: --format {layout} reads its config and tokenizer there (train the drafter on an "
                             "exported base)")
        serve = {}
        if layout == "llamacpp":
            folder = write_llamacpp(module, out, float32_target or None)
            serve = llamacpp_serving(module, folder, self.llamacpp_spec_type, module.block_size)
        else:  # a .gguf target: its dequantized folder is the verifier
            folder = write_speculators(module.drafter, out, resolve_pretrained(target),
                                       speculative_tokens=module.block_size - 1)
        (folder / "export_heads.json").write_text(json.dumps(
            {"ckpt": str(Path(ckpt).resolve()), "target": target, "format": layout, "block_size": module.block_size,
             "target_layer_ids": list(config.target_layer_ids), "draft_vocab_size": config.draft_vocab_size,
             **serve}, indent=2) + "\n")
        for note in serving_notes(config):
            print(f"export-heads: note: {note}", file=sys.stderr)
        last = module.model.n_layers - 1
        if last in config.target_layer_ids:
            print(f"export-heads: warning: target layer {last} is the target's last: vLLM and llama.cpp capture the "
                  f"input of a layer (eagle_aux_hidden_state_layer_ids {[i + 1 for i in config.target_layer_ids]}), "
                  f"so aux id {last + 1} is the output after the final norm there, or refused (unverified)",
                  file=sys.stderr)
        print(f"export-heads: the EAGLE-3 drafter of {ckpt} (target layers {list(config.target_layer_ids)}, draft "
              f"vocabulary {config.draft_vocab_size}, chains of {module.block_size}, target {target}) in {folder} "
              f"({layout})", file=sys.stderr)
        return folder


KIND = Eagle3Kind(
    name="eagle3",
    title="EAGLE-3",
    module_class_path="lightning_bpd.drafters.eagle3.module.Eagle3Module",
    speculators_type="eagle3",
    llamacpp_spec_type="draft-eagle3",
    formats=("speculators", "llamacpp"),
    trees=True,
    proposes="chains",
)
