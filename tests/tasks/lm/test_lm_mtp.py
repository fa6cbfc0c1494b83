"""``conf/lm/mtp_scratch.yaml`` (issue 46): multi-token prediction from scratch, a random Llama from
``make-base --arch llama`` and its k = 4 heads trained together from the first step, every head's loss each step with
p_1's own next-token loss kept in the objective."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

from lightning_bpd.commands.cli import main
from lightning_bpd.tasks.lm import LMModule
from tests.tasks.lm.test_lm_fit import fit, logged
from tests.tasks.lm.tiny_lm import write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code", files=6)


@pytest.fixture(scope="module")
def random_llama(data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "make_base"
    main(["make-base", "--arch", "llama", "--data", str(data), "--out", str(out), "--vocab", "300", "--shape", "tiny"])
    return out


def test_mtp_from_scratch_moves_base_and_heads_with_p1_in_the_objective(random_llama, data, tmp_path):
    run = tmp_path / "run"
    cli = fit(random_llama, data, run, "--trainer.max_steps=4", "--trainer.limit_val_batches=0",
              "--trainer.log_every_n_steps=1", config="mtp_scratch.yaml")
    module = cli.model
    options = module.options
    assert not options.freeze_base and options.loss_mode == "mean" and options.head1_weight == 0.5
    assert options.base_lr_scale == 1.0 and module.model.k == 4 and not module.model.frozen
    fresh = LMModule(str(random_llama), k=4, training=options).model  # the same seeded random init
    trained = module.model
    base = {key: value for key, value in fresh.base.state_dict().items()}
    assert all(not torch.equal(value, trained.base.state_dict()[key]) for key, value in base.items()
               if key.endswith("proj.weight"))  # every projection of every layer learnt
    assert all(not torch.equal(a, b) for a, b in zip(fresh.head.parameters(), trained.head.parameters()))
    metrics = logged(run)  # the last step: its loss is 0.5 * p_1's + 0.5 * the mean of heads 2..4's
    later = [metrics[f"train/head{i}_loss"] for i in (2, 3, 4)]
    assert metrics["train/loss"] == pytest.approx(0.5 * metrics["train/head1_loss"] + 0.5 * sum(later) / 3, rel=1e-5)
    assert metrics["train/ppl"] == pytest.approx(math.exp(metrics["train/head1_loss"]), rel=1e-5)


def base_gradient(module: LMModule, heads: list[int]) -> float:
    """The summed |gradient| of the base's weights after one blockwise loss of ``heads`` on random tokens."""
    module.zero_grad()
    src = torch.randint(3, module.model.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    module.blockwise_step(src[:, :-1], src[:, 1:], heads, head1_weight=0.5 if 0 in heads else 0.0).loss.backward()
    return sum(float(p.grad.abs().sum()) for name, p in module.model.named_parameters()
               if not name.startswith("head.") and p.grad is not None)


def test_p1_loss_drives_the_base(random_llama):
    """With heads 2..4 reading the base detached (detach_heads: base), the base learns from p_1's own loss alone: a
    gradient with p_1 in the objective, none without."""
    from dataclasses import replace

    from lightning_bpd.tasks.lm.module import TRAINING

    training = replace(TRAINING, freeze_base=False, head1_weight=0.5, detach_heads="base")
    module = LMModule(str(random_llama), k=4, training=training).train()
    assert base_gradient(module, [0, 1, 2, 3]) > 0
    assert base_gradient(module, [1, 2, 3]) == 0
