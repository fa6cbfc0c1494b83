"""DFlash drafter training (lightning_bpd/drafters/dflash/module.py) on a tiny random Llama: the step trains the
drafter alone toward the target's own greedy tokens at the right positions, its acceptance metrics are those of exact
acceptance, ``fit --config conf/lm/dflash.yaml`` writes a checkpoint of the drafter alone that loads back and decodes
as greedy does, and training raises the accepted block size."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.decoding import Exact, decode, greedy_decode
from lightning_bpd.drafters.dflash.module import (
    DFlashModule,
    block_acceptance,
    lr_factor,
    sample_anchors,
    slot_weights,
)
from lightning_bpd.drafters.dflash.proposer import DFlash
from tests.tasks.lm.tiny_lm import PAD, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code")


def test_block_acceptance_on_a_hand_written_case():
    # 2 blocks of 3 drafted slots, vocabulary 4; predictions are the argmax of one-hot logits
    pred = torch.tensor([[[1, 2, 3], [0, 0, 1]]])  # (N=1, M=2, K=3)
    labels = torch.tensor([[[1, 2, 0], [0, 3, 1]]])
    logits = torch.nn.functional.one_hot(pred, 4).float()
    acc, accepted = block_acceptance(logits, labels)
    assert acc.tolist() == [1.0, 0.5, 0.5]
    # block 0: slots 1, 2 right then wrong -> 1 + 2; block 1: slot 1 right, slot 2 wrong (slot 3 right is not reached)
    assert float(accepted) == pytest.approx((3 + 2) / 2)
    mask = torch.tensor([[[True, True, False], [False, False, False]]])  # block 1 off, block 0's last slot off
    acc, accepted = block_acceptance(logits, labels, mask)
    assert acc.tolist() == [1.0, 1.0, 0.0] and float(accepted) == 3.0
    labels[0, 0, 0] = 3  # block 0's first slot wrong: nothing accepted past the given token
    assert float(block_acceptance(logits, labels, mask)[1]) == 1.0


def test_anchors_weights_and_schedule():
    g = torch.Generator().manual_seed(0)
    a = sample_anchors(3, 20, 4, 32, g)
    assert a.shape == (3, 16) and all(row.tolist() == list(range(1, 17)) for row in a)  # every anchor once
    a = sample_anchors(5, 40, 8, 6, g)
    assert a.shape == (5, 6) and bool((a[:, 1:] > a[:, :-1]).all()) and int(a.min()) >= 1 and int(a.max()) <= 32
    with pytest.raises(ValueError, match="no anchor"):
        sample_anchors(1, 8, 8, 4, g)
    assert slot_weights(4, 2.0).tolist() == pytest.approx([1.0, math.exp(-0.5), math.exp(-1.0)])
    assert lr_factor(0, 10, 100) == pytest.approx(0.1) and lr_factor(10, 10, 100) == pytest.approx(1.0)
    assert lr_factor(100, 10, 100) == pytest.approx(0.1) and lr_factor(40, 10, math.inf) == pytest.approx(0.5)


def test_slot_labels_are_the_target_argmax_at_anchor_plus_j_minus_one(checkpoint):
    module = DFlashModule(str(checkpoint), block_size=4, anchors=5)
    src = torch.randint(3, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    _, labels = module.target_pass(src)
    anchors = torch.tensor([[1, 5, 20], [3, 4, 7]])
    real = torch.tensor([24, 9])  # row 1: only its first 9 tokens are data
    embeds, positions, slot_labels, mask, valid = module.blocks(src, anchors, labels, real)
    n, a = 0, 5
    with torch.no_grad():
        logits = module.model.base(input_ids=src[n : n + 1, : a + 4]).logits[0]  # the target alone, uncached
    for j in (1, 2, 3):  # slot j: the target's greedy choice of the token at a + j, reading src[: a + j]
        assert int(slot_labels[n, 1, j - 1]) == int(logits[a + j - 1].argmax())
    assert positions[n, 1].tolist() == [5, 6, 7, 8]
    want = module.model.embed_tokens(torch.tensor([src[n, a].item(), *[module.hparams.mask_token_id] * 3]))
    assert torch.equal(embeds[n, 1], want)
    # row 1: anchor 7's slot 3 reads position 9, past the data; anchor 4's all fit
    assert mask[1].tolist() == [[True] * 3, [True] * 3, [True, True, False]] and bool(valid.all())


def test_a_step_trains_the_drafter_only(checkpoint):
    module = DFlashModule(str(checkpoint), block_size=4, anchors=8, feature_noise=0.1, warmup_steps=1)
    before = {k: v.clone() for k, v in module.model.base.state_dict().items()}
    assert set(module.state_dict()) == {f"drafter.{k}" for k in module.drafter.state_dict()}  # no target weights
    src = torch.randint(3, 200, (2, 32), generator=torch.Generator().manual_seed(2))
    out = module.step({"src": src}, torch.Generator().manual_seed(0), module.feature_noise)
    assert math.isfinite(float(out["loss"].detach())) and out["acc"].shape == (3,)
    out["loss"].backward()
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in module.drafter.parameters())
    assert all(p.grad is None and not p.requires_grad for p in module.model.base.parameters())
    optimizer = module.configure_optimizers()["optimizer"]  # AdamW on the drafter's parameters, all of them
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in module.drafter.parameters()}
    drafter_before = [p.clone() for p in module.drafter.parameters()]
    optimizer.step()
    assert all(torch.equal(v, module.model.base.state_dict()[k]) for k, v in before.items())
    assert all(not torch.equal(a, b) for a, b in zip(drafter_before, module.drafter.parameters()))
    assert not module.model.base.training and module.training  # the target stays in eval mode


def test_cached_target_features_give_the_step_the_uncached_target_gives(checkpoint):
    cached = DFlashModule(str(checkpoint), block_size=4, anchors=6)
    plain = DFlashModule(str(checkpoint), block_size=4, anchors=6, feature_cache_gb=0.0)
    plain.drafter.load_state_dict(cached.drafter.state_dict())
    src = torch.randint(3, 200, (3, 20), generator=torch.Generator().manual_seed(4))
    batch = {"src": src, "index": torch.tensor([7, 2, 9])}
    want = plain.step(batch, torch.Generator().manual_seed(0), 0.0)
    assert plain.feature_cache is None
    for _ in range(2):  # the first call fills the cache, the second reads it: the same loss and metrics both times
        got = cached.step(batch, torch.Generator().manual_seed(0), 0.0)
        assert torch.equal(got["loss"], want["loss"]) and torch.equal(got["acc"], want["acc"])
    assert (cached.feature_cache.misses, cached.feature_cache.hits, len(cached.feature_cache)) == (3, 3, 3)
    # a batch mixing cached and new sequences: each row's features are its own sequence's
    mixed = {"src": torch.cat([src[1:2], src[0:1] + 1]), "index": torch.tensor([2, 11])}
    features, labels = cached.target_outputs(mixed)
    want_features, want_labels = plain.target_pass(mixed["src"])
    # (rows computed alone or in a batch: equal up to the matmul's blocking)
    assert torch.allclose(features, want_features, rtol=1e-5, atol=1e-5 * float(want_features.abs().max()))
    assert torch.equal(labels, want_labels)
    cached.eval()  # validation runs the target itself
    assert cached.target_outputs(mixed)[0].shape == want_features.shape and cached.feature_cache.hits == 4


def test_bad_options_are_one_line(checkpoint, tmp_path):
    with pytest.raises(ValueError, match="block_size must be an integer >= 2"):
        DFlashModule(str(checkpoint), block_size=1)
    with pytest.raises(ValueError, match="feature_cache_gb >= 0"):
        DFlashModule(str(checkpoint), feature_cache_gb=-1)
    with pytest.raises(ValueError, match=r"target_layer_ids \[0, 2\]: each must be a decoder layer .* \[0, 1\]"):
        DFlashModule(str(checkpoint), target_layer_ids=[0, 2])
    with pytest.raises(ValueError, match="not a directory"):
        DFlashModule(str(tmp_path / "nowhere"))
    module = DFlashModule(str(checkpoint), block_size=8)
    with pytest.raises(ValueError, match="not longer than model.block_size"):
        module.step({"src": torch.full((1, 8), 5)}, torch.Generator(), 0.0)


FAST = ["--trainer.max_steps=4", "--trainer.val_check_interval=4", "--trainer.accelerator=cpu",
        "--trainer.enable_progress_bar=false", "--trainer.log_every_n_steps=1", "--data.init_args.seq_len=48",
        "--data.init_args.batch_size=4", "--data.init_args.prompt_tokens=40", "--decode_eval.subset=2",
        "--decode_eval.batch_size=2", "--model.init_args.max_new_tokens=8", "--model.init_args.warmup_steps=2",
        "--model.init_args.block_size=4", "--model.init_args.anchors=8",
        "--trainer.limit_val_batches=2"]


def logged(run: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for row in csv.DictReader(next(run.rglob("metrics.csv")).open()):
        out.update({key: float(value) for key, value in row.items() if value})
    return out


def test_a_sequence_not_longer_than_a_block_is_one_error_line(checkpoint, data, tmp_path):
    with pytest.raises(SystemExit, match=r"^error: data.seq_len 8 must exceed model.block_size 8$"):
        main(["fit", "--config", str(CONF_DIR / "lm" / "dflash.yaml"), f"--model.init_args.pretrained={checkpoint}",
              f"--data.init_args.root={data}", f"--run_dir={tmp_path / 'run'}", "--trainer.logger=false",
              "--trainer.accelerator=cpu", "--data.init_args.seq_len=8"])


def test_fit_writes_a_drafter_checkpoint_that_decodes_as_greedy(checkpoint, data, tmp_path):
    run = tmp_path / "run"
    logger = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": str(run)}})
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "dflash.yaml"), f"--model.init_args.pretrained={checkpoint}",
                f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, f"--trainer.logger={logger}"])
    trained = cli.model
    assert isinstance(trained, DFlashModule) and trained.global_step == 4
    metrics = logged(run)
    # DecodeEval: greedy and exact with the drafter proposing (not the target's heads: it has none), side by side
    assert metrics["val/exact/matches_greedy"] == 1.0 and metrics["val/exact/mean_accepted_block_size"] >= 1.0
    assert metrics["val/greedy/model_calls"] > 0 and "val/exact/speedup" in metrics
    assert metrics["val/exact/model_calls"] > 0 and not any(key.startswith("val/greedy/head") for key in metrics)
    assert 1.0 <= metrics["val/accepted"] <= 4.0 and "val/acc_slot3" in metrics and "train/acc_slot1" in metrics
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])

    ckpt = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    assert set(ckpt["state_dict"]) == {f"drafter.{k}" for k in trained.drafter.state_dict()}  # the drafter alone
    assert ckpt["dflash_config"]["block_size"] == 4 and ckpt["dflash_config"]["mask_token_id"] == PAD
    loaded = DFlashModule.load_from_checkpoint(run / "last.ckpt", map_location="cpu").eval()
    assert loaded.drafter.config == trained.drafter.config
    assert all(torch.equal(a, b) for a, b in zip(loaded.drafter.parameters(), trained.drafter.parameters()))
    import lightning_bpd

    again = lightning_bpd.load_model(run / "last.ckpt")
    assert all(torch.equal(a, b) for a, b in zip(again.drafter.parameters(), trained.drafter.parameters()))
    src = loaded.encode_prompts(["def f_1(x, y):\n", "    return", "for items in range(3):\n"])
    want = greedy_decode(loaded.model, src, 12).sequences()
    with torch.no_grad():
        got = decode(loaded.model, src, Exact(), DFlash(loaded.drafter), max_len=12)
    assert got.sequences() == want and max(len(r) for r in want) == 12


def repetitive_corpus(root: Path) -> Path:
    """One short function written over and over (the target's greedy tokens then repeat with the text)."""
    for split in ("train", "val"):
        (root / split).mkdir(parents=True)
        (root / split / "rep.py").write_text("def f_1(x, y):\n    x = x + 3\n    return x\n\n" * 60, encoding="utf-8")
    return root


def accepted_curve(checkpoint: Path, data: Path, steps: int) -> list[float]:
    """``train/accepted`` of each of ``steps`` plain AdamW steps on the training sequences of ``data``."""
    from lightning_bpd.tasks.lm import LMDataModule

    module = DFlashModule(str(checkpoint), block_size=4, anchors=16, lr=3e-3, warmup_steps=10)
    dm = LMDataModule(str(data), tokenizer_path=str(checkpoint), seq_len=48, batch_size=4)
    dm.setup("fit")
    batches = list(dm.train_dataloader())
    optimizer = torch.optim.AdamW(module.drafter.parameters(), lr=3e-3, betas=(0.9, 0.95))
    curve = []
    for i in range(steps):
        out = module.step(batches[i % len(batches)], torch.Generator().manual_seed(i), 0.0)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
        curve.append(float(out["accepted"]))
    return curve


def test_training_raises_the_accepted_block_size(checkpoint, tmp_path):
    curve = accepted_curve(checkpoint, repetitive_corpus(tmp_path / "rep"), 300)
    first, last = sum(curve[:20]) / 20, sum(curve[-20:]) / 20  # blocks of 4: 1 (nothing right) to 4 (all right)
    assert first < 1.6 and last > 3.0, (first, last)


def test_anchor_seeds_differ_across_ranks_and_steps():
    from lightning_bpd.drafters.dflash.module import anchor_seed

    seeds = {anchor_seed(step, rank, 4) for step in range(50) for rank in range(4)}
    assert len(seeds) == 200
    assert anchor_seed(7, 0, 1) == 7  # one process: the step, as before
