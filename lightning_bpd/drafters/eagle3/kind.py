"""The EAGLE-3 kind as the registry sees it (:mod:`~lightning_bpd.drafters.registry`)."""

from __future__ import annotations

from lightning_bpd.drafters.common.kind import DrafterKind

KIND = DrafterKind(
    name="eagle3",
    title="EAGLE-3",
    module_class_path="lightning_bpd.drafters.eagle3.module.Eagle3Module",
    legacy_class_paths=("lightning_bpd.tasks.lm.eagle3_module.Eagle3Module", "lightning_bpd.tasks.lm.Eagle3Module"),
    speculators_type="eagle3",
    llamacpp_spec_type="draft-eagle3",
)
