"""Lightning's "Found N module(s) in eval mode at the start of training" (issue 59): not shown for a frozen base, held
in eval mode on purpose (LMModule, BlockwiseModule.hide_frozen_base_warning); still shown where another module is in
eval mode, and the filter is gone once training has started."""

from __future__ import annotations

import warnings

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from lightning_bpd.tasks.lm import LMModule

pytestmark = pytest.mark.usefixtures("one_thread")
WARNING = "in eval mode at the start of training"


def fit_warnings(module: LMModule) -> tuple[list[str], list[str]]:
    """The messages of the warnings of a one-step fit of ``module``, and the warning filters left after it."""
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, 200, (4, 17), generator=g)
    rows = [{"src": row[:-1], "tgt": row[1:]} for row in src]
    trainer = pl.Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
                         enable_model_summary=False, enable_progress_bar=False, limit_val_batches=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, DataLoader(rows, batch_size=2))
        left = [str(f[1].pattern) for f in warnings.filters if f[1] is not None]
    return [str(w.message) for w in caught], left


def test_a_frozen_base_in_eval_mode_is_not_warned_about_another_module_still_is(checkpoint):
    module = LMModule(str(checkpoint), k=2)
    assert module.freeze and not module.model.base.training and module.model.head.training
    messages, left = fit_warnings(module)
    assert not [m for m in messages if WARNING in m]
    assert not [pattern for pattern in left if "eval mode" in pattern]  # removed at on_train_start
    module = LMModule(str(checkpoint), k=2)
    module.model.head.eval()  # not the base: Lightning's warning stays
    messages, _ = fit_warnings(module)
    assert len([m for m in messages if WARNING in m]) == 1
