"""Self-distilled image targets: ``distill`` on a super-resolution base, resumable, and ``fit`` on them."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd import load_model
from lightning_bpd.commands.cli import REPO_ROOT
from lightning_bpd.commands.cli import main as cli_main
from lightning_bpd.commands.distill import main as distill_main
from lightning_bpd.tasks.superres.datamodule import SuperResolutionDataModule
from lightning_bpd.tasks.superres.self_distilled import TARGETS, greedy_images, load_targets, shard_file
from tests.tasks.superres.test_superres_pipeline import TINY

BASE = [a for a in TINY if not a.startswith(("--model.init_args.architecture.k=", "--data.init_args.synthetic_sizes"))] + [
    "--model.init_args.architecture.k=1", "--data.init_args.synthetic_sizes={train: 7, val: 2, test: 2}",
    "--trainer.max_steps=1", "--decode_eval.criteria=[]", "--trainer.logger=false",
]


@pytest.fixture(scope="module")
def base_ckpt(tmp_path_factory):

    root = tmp_path_factory.mktemp("distill")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("WANDB_MODE", "offline")
        cli_main(["fit", *[a.replace("conf/", f"{REPO_ROOT}/conf/") for a in BASE], "--run_dir=runs/base"])
    return root, root / "runs/base/last.ckpt"


def test_distill_writes_the_bases_greedy_images_and_resumes_at_the_missing_shard(base_ckpt, monkeypatch, capsys):
    root, ckpt = base_ckpt
    monkeypatch.chdir(root)
    out = root / "targets"
    distill_main(["--ckpt", str(ckpt), "--out", str(out), "--beam", "1", "--batch-size", "2", "--shard-size", "3"])
    saved = torch.load(out / TARGETS, weights_only=True)["high"]  # (7, 32, 32, 3) uint8
    assert saved.shape == (7, 32, 32, 3) and saved.dtype == torch.uint8
    assert [shard_file(out, i).is_file() for i in range(4)] == [True, True, True, False]
    module = load_model(ckpt)
    data = SuperResolutionDataModule(synthetic_sizes={"train": 7, "val": 2, "test": 2}, batch_size=4)
    low, gold = data.split_images("train")
    assert torch.equal(saved, greedy_images(module.model, low, 7))  # the base's own greedy outputs, in order
    assert not torch.equal(saved, gold)

    # a killed run: the last shard and the merged file are gone; only that shard is decoded again
    first = shard_file(out, 0).stat().st_mtime_ns
    shard_file(out, 2).unlink()
    (out / TARGETS).unlink()
    distill_main(["--ckpt", str(ckpt), "--out", str(out), "--batch-size", "2", "--shard-size", "3", "--beam", "1"])
    assert shard_file(out, 0).stat().st_mtime_ns == first and shard_file(out, 2).is_file()
    assert torch.equal(torch.load(out / TARGETS, weights_only=True)["high"], saved)
    assert "distilled 7 training faces" in capsys.readouterr().err

    # fit reads them as the training targets; validation stays gold
    distilled = SuperResolutionDataModule(synthetic_sizes={"train": 7, "val": 2, "test": 2}, distilled=str(out))
    assert torch.equal(distilled.split_images("train")[1], saved)
    assert torch.equal(distilled.split_images("val")[1], data.split_images("val")[1])
    cli_main(["fit", *[a.replace("conf/", f"{REPO_ROOT}/conf/") for a in BASE],
              f"--data.init_args.distilled={out}", "--run_dir=runs/on_distilled"])
    assert (root / "runs/on_distilled/last.ckpt").is_file()


def test_distilled_targets_of_other_faces_or_none_are_one_clear_error(base_ckpt, monkeypatch, capsys, tmp_path):
    root, ckpt = base_ckpt
    monkeypatch.chdir(root)
    out = tmp_path / "few"
    distill_main(["--ckpt", str(ckpt), "--out", str(out), "--beam", "1", "--shard-size", "10"])
    other = SuperResolutionDataModule(synthetic_sizes={"train": 5, "val": 2, "test": 2}, distilled=str(out))
    with pytest.raises(ValueError, match="other training faces"):
        other.split_images("train")
    low, _ = SuperResolutionDataModule(synthetic_sizes={"train": 7, "val": 2, "test": 2}).split_images("train")
    with pytest.raises(ValueError, match="other training faces"):
        load_targets(out, low.flip(0))  # the same faces in another order
    with pytest.raises(SystemExit, match="use --beam 1"):
        distill_main(["--ckpt", str(ckpt), "--out", str(out), "--beam", "4"])

    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *[a.replace("conf/", f"{REPO_ROOT}/conf/") for a in BASE],
                  f"--data.init_args.distilled={tmp_path / 'nothing'}", "--run_dir=runs/never"])
    err = str(exit_info.value.code) + capsys.readouterr().err
    assert "data.distilled: no" in err and "Traceback" not in err
    assert not (root / "runs/never").exists()


def test_distill_limit_decodes_the_first_faces_and_fit_trains_on_them_with_the_same_limit(base_ckpt, monkeypatch,
                                                                                          tmp_path, capsys):
    root, ckpt = base_ckpt
    monkeypatch.chdir(root)
    out = tmp_path / "first4"
    distill_main(["--ckpt", str(ckpt), "--out", str(out), "--beam", "1", "--shard-size", "3", "--limit", "4"])
    saved = torch.load(out / TARGETS, weights_only=True)["high"]
    low, _ = SuperResolutionDataModule(synthetic_sizes={"train": 7, "val": 2, "test": 2}).split_images("train")
    assert saved.shape[0] == 4 and torch.equal(saved, greedy_images(load_model(ckpt).model, low[:4], 4))
    limited = SuperResolutionDataModule(synthetic_sizes={"train": 7, "val": 2, "test": 2}, limits={"train": 4},
                                        distilled=str(out))
    assert torch.equal(limited.split_images("train")[1], saved)
    with pytest.raises(ValueError, match="other training faces"):  # without the limit: one clear error
        SuperResolutionDataModule(synthetic_sizes={"train": 7, "val": 2, "test": 2},
                                  distilled=str(out)).split_images("train")
    with pytest.raises(SystemExit, match="--limit must be >= 1"):
        distill_main(["--ckpt", str(ckpt), "--out", str(out), "--beam", "1", "--limit", "0"])
