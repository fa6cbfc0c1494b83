"""DFlash training on our own decoder-only base (issue 53 item 1): ``model.pretrained`` may be the .ckpt of a
language-modelling run on our own base; a step trains the drafter alone on that base's features and greedy tokens,
the checkpoint loads back with ``load_model`` and decodes as greedy; another kind of checkpoint is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import lightning_bpd
from lightning_bpd.decoding import Exact, decode, greedy_decode
from lightning_bpd.drafters.dflash.module import DFlashModule
from lightning_bpd.nn.causal_model import CausalTransformer
from lightning_bpd.tasks.lm import LMModule
from tests.drafters.dflash.tiny import save_dflash
from tests.tasks.lm.test_lm_own_base import TINY, TRAIN
from tests.tasks.lm.tiny_lm import tokenizer as tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def save_module(module, path: Path) -> Path:
    """``module`` written as ``fit`` writes its checkpoints."""
    ckpt = {"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}
    module.on_save_checkpoint(ckpt)
    torch.save(ckpt, path)
    return path


@pytest.fixture(scope="module")
def own_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("own")
    tiny_tokenizer().save_pretrained(folder / "bpe")
    torch.manual_seed(0)
    return save_module(LMModule(own={**TINY, "tokenizer": str(folder / "bpe")}, training=TRAIN).eval(),
                       folder / "last.ckpt")


def test_a_drafter_trains_on_our_own_base_and_decodes_as_greedy(own_run, tmp_path):
    module = DFlashModule(str(own_run), block_size=4, anchors=6, num_layers=1)
    assert isinstance(module.model, CausalTransformer) and module.drafter.config.hidden_size == TINY["d_model"]
    assert set(module.state_dict()) == {f"drafter.{k}" for k in module.drafter.state_dict()}
    src = module.encode_prompts(["def f(x):\n    return x", "import os\n"])
    src = torch.where(src == module.model.pad_id, 5, src)
    out = module.step({"src": src, "index": torch.tensor([0, 1])}, torch.Generator().manual_seed(0), 0.0)
    out["loss"].backward()
    assert all(p.grad is not None for p in module.drafter.parameters())
    assert all(p.grad is None for p in module.model.parameters())
    loaded = lightning_bpd.load_model(save_dflash(module, tmp_path / "dflash.ckpt"))
    prompts = loaded.encode_prompts(["def f(x):\n", "    return", "x = 1\n"])
    want = greedy_decode(loaded.model, prompts, 10).sequences()
    got = decode(loaded.model, prompts, Exact(), loaded.decode_eval_proposer(loaded.model), max_len=10)
    assert got.sequences() == want


def test_another_kind_of_checkpoint_is_one_line(own_run, tmp_path):
    dflash = save_dflash(DFlashModule(str(own_run), block_size=4), tmp_path / "dflash.ckpt")
    with pytest.raises(ValueError, match="is a DFlashModule checkpoint, not a language-modelling run on our own"):
        DFlashModule(str(dflash))
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="model.pretrained: .*junk.ckpt is not a readable PyTorch checkpoint"):
        DFlashModule(str(tmp_path / "junk.ckpt"))
    with pytest.raises(ValueError, match="is not a .ckpt of a run on our own decoder-only base and not a directory"):
        DFlashModule(str(tmp_path / "missing"))
