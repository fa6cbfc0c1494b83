"""DSpark drafter training (lightning_bpd/drafters/dspark/module.py) on the tiny Llama: the step's labels, previous
tokens and mask are anchor-first, the loss is 0.1 CE + 0.9 TV + 1.0 BCE(confidence, 1 - TV), a few steps lower it and
train the drafter alone, the feature store is read with its last hidden state (a store without it is one line), a
saved run loads back with ``load_model`` and decodes as greedy."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, decode, greedy_decode
from lightning_bpd.drafters.dflash.module import sample_anchors
from lightning_bpd.drafters.dspark.module import DSparkModule, load_drafter, slot_weights
from lightning_bpd.drafters.dspark.proposer import DSpark
from tests.drafters.dspark.tiny import fit_dspark, save_module

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_loss_is_the_papers_on_anchor_first_slots(checkpoint):
    module = DSparkModule(str(checkpoint), block_size=4, anchors=3, markov_rank=8)
    assert module.weights.tolist() == pytest.approx(slot_weights(4, 4.0).tolist()) and module.weights.shape == (4,)
    src = torch.randint(3, 200, (2, 16), generator=torch.Generator().manual_seed(1))
    both, labels = module.target_pass(src)
    last = both[..., -32:]
    logits = module.model.base(input_ids=src).logits  # (2, 16, V): the target alone, uncached
    assert torch.equal(labels, logits.argmax(-1))
    torch.testing.assert_close(module.model.logits_first(last), logits)
    out = module.step({"src": src, "length": torch.tensor([15, 9])}, torch.Generator().manual_seed(0), 0.0)
    # the same terms by hand, anchor-first: slot j at a + j predicts labels[a + j], its bias reads src[a + j]
    anchors = sample_anchors(2, 16, 4, 3, torch.Generator().manual_seed(0))
    embeds, positions, _, _, valid = module.blocks(src, anchors, labels, torch.tensor([16, 10]))
    h = module.drafter.train_forward(both[..., :-32], embeds, anchors, positions, valid)
    where = positions.flatten(1)
    prev, y = src.gather(1, where).view(positions.shape), labels.gather(1, where).view(positions.shape)
    q, conf = module.drafter.heads(h, module.model.logits_first(h), prev)
    p_t = torch.softmax(logits.gather(1, where[..., None].expand(-1, -1, logits.shape[-1])), -1).view(q.shape)
    mask = (positions < torch.tensor([16, 10])[:, None, None]).float()
    assert mask[1].sum() < mask[0].sum()  # row 1's last slots read past its data
    tv = 1 - torch.minimum(torch.softmax(q, -1), p_t).sum(-1)
    ce = torch.nn.functional.cross_entropy(q.flatten(0, 2), y.flatten(), reduction="none").view(y.shape)
    bce = torch.nn.functional.binary_cross_entropy_with_logits(conf, (1 - tv).detach(), reduction="none")
    w = slot_weights(4, 4.0)
    want = ((0.1 * ce + 0.9 * tv + bce) * w * mask).sum() / (mask.sum() + 1e-5)
    torch.testing.assert_close(out["loss"], want, rtol=1e-4, atol=1e-6)
    assert out["acc"].shape == (4,) and 1.0 <= float(out["soft_accepted"]) <= 5.0


def test_a_few_steps_lower_the_loss_and_train_the_drafter_alone(checkpoint):
    module = DSparkModule(str(checkpoint), block_size=4, anchors=8, markov_rank=8, warmup_steps=1, lr=3e-3)
    before = {k: v.clone() for k, v in module.model.base.state_dict().items()}
    assert set(module.state_dict()) == {f"drafter.{k}" for k in module.drafter.state_dict()}  # no target weights
    src = torch.randint(3, 200, (2, 32), generator=torch.Generator().manual_seed(2))
    optimizer = module.configure_optimizers()["optimizer"]
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in module.drafter.parameters()}
    losses = []
    for i in range(15):
        out = module.step({"src": src}, torch.Generator().manual_seed(0), 0.0)
        optimizer.zero_grad()
        out["loss"].backward()
        if i == 0:
            assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.drafter.parameters())
        optimizer.step()
        losses.append(float(out["loss"].detach()))
    assert all(math.isfinite(x) for x in losses) and losses[-1] < 0.7 * losses[0], losses
    assert all(torch.equal(v, module.model.base.state_dict()[k]) for k, v in before.items())


def test_the_store_is_read_with_its_last_hidden_state_and_one_without_is_one_line(checkpoint, tmp_path):
    from lightning_bpd.commands.store import main as store_main
    from lightning_bpd.tasks.lm import LMDataModule
    from tests.tasks.lm.tiny_lm import write_corpus

    data = write_corpus(tmp_path / "data")
    common = ["--pretrained", str(checkpoint), "--data-root", str(data), "--seq-len", "24", "--layers", "0",
              "--shard-size", "4", "--batch-size", "2", "--sequences", "4", "--accelerator", "cpu"]
    store_main([*common, "--out", str(tmp_path / "store")])
    store_main([*common, "--out", str(tmp_path / "nolast"), "--no-last"])
    plain = DSparkModule(str(checkpoint), block_size=4, anchors=4, markov_rank=8, target_layer_ids=[0],
                         feature_cache_gb=0)
    stored = DSparkModule(str(checkpoint), block_size=4, anchors=4, markov_rank=8, target_layer_ids=[0],
                          feature_store=str(tmp_path / "store"))
    dm = LMDataModule(str(data), f"hf:{checkpoint}", seq_len=24, batch_size=2)
    dm.setup("fit")
    dm.train_on(stored.store.indices)
    batch = next(iter(dm.train_dataloader()))
    got, labels = stored.target_outputs(batch)
    want, want_labels = plain.target_pass(batch["src"])
    assert torch.equal(labels, want_labels) and got.shape == want.shape  # features and the last hidden state
    assert torch.allclose(got.float(), want.float(), atol=0.02 * float(want.abs().max()))  # 16-bit rows
    stored.drafter.load_state_dict(plain.drafter.state_dict())
    a = stored.step(batch, torch.Generator().manual_seed(0), 0.0)
    b = plain.step(batch, torch.Generator().manual_seed(0), 0.0)
    assert math.isclose(float(a["loss"].detach()), float(b["loss"].detach()), rel_tol=0.05)
    with pytest.raises(ValueError, match="holds no last hidden state, which this model reads") as info:
        DSparkModule(str(checkpoint), block_size=4, target_layer_ids=[0], feature_store=str(tmp_path / "nolast"))
    assert "\n" not in str(info.value)


def test_bad_options_are_one_line(checkpoint):
    for kwargs, match in (({"markov_rank": 0}, "markov_rank >= 1"), ({"tv_alpha": -1.0}, "tv_alpha"),
                          ({"block_size": 1}, "block_size must be an integer >= 2")):
        with pytest.raises(ValueError, match=match) as info:
            DSparkModule(str(checkpoint), **kwargs)
        assert "\n" not in str(info.value)


def test_a_saved_run_loads_back_and_decodes_as_greedy(checkpoint, tmp_path):
    import lightning_bpd

    module = fit_dspark(checkpoint, steps=40)
    path = save_module(module, tmp_path / "last.ckpt")
    loaded = lightning_bpd.load_model(path)
    assert type(loaded) is DSparkModule and loaded.drafter.config == module.drafter.config
    assert all(torch.equal(a, b) for a, b in zip(loaded.drafter.state_dict().values(),
                                                 module.drafter.state_dict().values()))
    alone = load_drafter(path)
    assert alone.config == module.drafter.config
    with pytest.raises(ValueError, match="is not a DSpark drafter checkpoint"):
        from tests.drafters.dflash.tiny import fit_drafter, save_dflash

        load_drafter(save_dflash(fit_drafter(checkpoint, steps=1), tmp_path / "dflash.ckpt"))
    src = loaded.encode_prompts(["def f_1(x, y):\n", "    return", "for items in range(3):\n"])
    want = greedy_decode(loaded.model, src, 12).sequences()
    with torch.no_grad():
        got = decode(loaded.model, src, Exact(), DSpark(loaded.drafter), max_len=12)
        sure = decode(loaded.model, src, Exact(), DSpark(loaded.drafter, confidence_threshold=0.3), max_len=12)
    assert got.sequences() == want == sure.sequences() and max(len(r) for r in want) == 12
    assert max(max(sizes) for sizes in got.block_sizes) > 1  # trained drafts get accepted


def test_fit_with_the_config_writes_a_dspark_run(checkpoint, tmp_path):
    """``fit --config conf/lm/dspark.yaml``: a few steps log DSpark's terms, validation decodes as greedy, and the
    checkpoint holds the drafter alone and its config."""
    import csv
    import json

    from lightning_bpd.commands.cli import CONF_DIR, main
    from tests.drafters.dflash.test_module import FAST
    from tests.tasks.lm.tiny_lm import write_corpus

    run = tmp_path / "run"
    logger = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": str(run)}})
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "dspark.yaml"), f"--model.init_args.pretrained={checkpoint}",
                f"--data.init_args.root={write_corpus(tmp_path / 'data')}", f"--run_dir={run}", *FAST,
                "--model.init_args.markov_rank=8", f"--trainer.logger={logger}"])
    assert type(cli.model) is DSparkModule and cli.model.global_step == 4
    metrics: dict[str, float] = {}
    for row in csv.DictReader(next(run.rglob("metrics.csv")).open()):
        metrics.update({key: float(value) for key, value in row.items() if value})
    assert metrics["val/exact/matches_greedy"] == 1.0 and "val/acc_slot4" in metrics
    assert all(math.isfinite(metrics[f"train/{k}"]) for k in ("loss", "ce", "tv", "conf", "soft_accepted"))
    ckpt = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert set(ckpt["state_dict"]) == {f"drafter.{k}" for k in cli.model.drafter.state_dict()}
    assert ckpt["dspark_config"]["markov_rank"] == 8 and ckpt["dspark_config"]["block_size"] == 4
