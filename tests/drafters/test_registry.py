"""The registry of drafter kinds: a kind by name, a module's kind from its class (never isinstance), and checkpoints
written before kinds were folders load under their older class paths."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd import load_model
from lightning_bpd.class_paths import MOVED, current
from lightning_bpd.drafters import registry
from lightning_bpd.drafters.registry import kind, kind_of, kinds

pytest.importorskip("transformers")


def test_every_registered_kind_names_its_module_and_the_moved_ones_their_old_paths():
    for k in kinds():
        assert k.name in registry.REGISTERED and kind(k.name) is k
        cls = k.module_class()
        assert cls.drafter_kind == k.name and f"{cls.__module__}.{cls.__qualname__}" == k.module_class_path
    assert {current(old) for old in MOVED} == {kind(n).module_class_path for n in ("dflash", "eagle3")}
    assert current("lightning_bpd.tasks.lm.module.LMModule") == "lightning_bpd.tasks.lm.module.LMModule"


def test_an_unknown_kind_is_one_line_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"no drafter kind 'medusa9': the registered kinds are dflash, eagle3"):
        kind("medusa9")


def test_the_kind_of_a_module_comes_from_its_class_and_heads_runs_have_none():
    class Stranger:
        drafter_kind = "not-registered"

    assert kind_of(object()) is None and kind_of(Stranger()) is None
    assert kind_of(kind("dflash").module_class().__new__(kind("dflash").module_class())).name == "dflash"


def test_older_config_class_paths_still_resolve():
    from lightning_bpd.tasks import lm

    assert lm.DFlashModule is kind("dflash").module_class() and lm.Eagle3Module is kind("eagle3").module_class()
    with pytest.raises(AttributeError):
        lm.NoSuchModule  # noqa: B018


def test_a_checkpoint_written_under_the_old_class_path_loads_and_decodes(checkpoint, tmp_path):
    from lightning_bpd.drafters.dflash.module import DFlashModule, load_drafter
    from tests.drafters.dflash.tiny import save_dflash

    torch.manual_seed(0)
    path = save_dflash(DFlashModule(str(checkpoint), block_size=4, anchors=4, max_new_tokens=4), tmp_path / "a.ckpt")
    ckpt = torch.load(path, weights_only=False)
    ckpt["lightning_bpd_class"] = "lightning_bpd.tasks.lm.dflash_module.DFlashModule"  # as fit wrote it before
    torch.save(ckpt, path)
    module = load_model(path)
    assert kind_of(module).name == "dflash"
    drafter = load_drafter(path)  # the drafter alone (--proposer dflash:CKPT)
    assert all(torch.equal(a, b) for a, b in zip(drafter.state_dict().values(), module.drafter.state_dict().values()))
