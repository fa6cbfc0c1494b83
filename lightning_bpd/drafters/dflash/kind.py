"""The DFlash kind as the registry sees it (:mod:`~lightning_bpd.drafters.registry`)."""

from __future__ import annotations

from lightning_bpd.drafters.common.kind import DrafterKind

KIND = DrafterKind(
    name="dflash",
    title="DFlash",
    module_class_path="lightning_bpd.drafters.dflash.module.DFlashModule",
    legacy_class_paths=("lightning_bpd.tasks.lm.dflash_module.DFlashModule", "lightning_bpd.tasks.lm.DFlashModule"),
    speculators_type="dflash",
    llamacpp_spec_type="draft-dflash",
)
