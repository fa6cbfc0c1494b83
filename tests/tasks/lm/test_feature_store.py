"""The target-feature store (lightning_bpd/tasks/lm/feature_store.py, store_writer.py, ``python -m lightning_bpd
store``): it holds the target's own training-time values (16-bit rounded states, exact greedy labels) of the data's
windows, resumes shard by shard, feeds DFlash, EAGLE-3 and frozen heads without running the target in a training step,
and refuses a store of another target, tokenizer, data or layers in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.commands.store import main as store_main
from lightning_bpd.drafters.dflash.module import DFlashModule
from lightning_bpd.drafters.eagle3.module import Eagle3Module
from lightning_bpd.tasks.lm.datamodule import LMDataModule
from lightning_bpd.tasks.lm.feature_store import FeatureStore, shard_name
from tests.tasks.lm.tiny_lm import write_checkpoint, write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

SEQ = 32


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("lm") / "llama4", layers=4)


def make_store(target: Path, data: Path, out: Path, *extra: str) -> Path:
    store_main(["--pretrained", str(target), "--data-root", str(data), "--out", str(out), "--seq-len", str(SEQ),
                "--layers", "0,2", "--shard-size", "3", "--batch-size", "2", *extra])
    return out


@pytest.fixture(scope="module")
def store(target, data, tmp_path_factory) -> Path:
    return make_store(target, data, tmp_path_factory.mktemp("store") / "s")


def windows(target: Path, data: Path) -> LMDataModule:
    dm = LMDataModule(str(data), f"hf:{target}", seq_len=SEQ)
    return dm


def test_the_store_holds_the_targets_training_time_values(target, data, store):
    module = DFlashModule(str(target), block_size=4, target_layer_ids=[0, 2])
    s = FeatureStore(store)
    dataset = windows(target, data).dataset("train")
    assert s.indices == list(range(len(dataset))) and s.meta["n_shards"] == -(-len(dataset) // 3)
    index = torch.tensor([0, len(dataset) - 1, 3])
    src = torch.stack([dataset[int(i)]["src"] for i in index])
    features, labels = module.target_pass(src)  # (B, T, 2H), (B, T): the target's own, as training computes them
    rows = s.rows(index, [0, 2], last=True)
    assert torch.equal(rows.tokens, src) and torch.equal(rows.labels, labels)  # exact greedy labels
    assert rows.features.dtype == torch.bfloat16
    assert torch.equal(rows.features, features.to(torch.bfloat16))  # the same values, rounded to 16 bits
    last, _ = module.model.full_features(src, [0])
    assert torch.equal(rows.last, last.to(torch.bfloat16))
    assert torch.equal(s.rows(index, [2]).features, features[..., 32:].to(torch.bfloat16))  # one layer of the two


def test_a_stopped_store_resumes_at_its_missing_shards(target, data, store, tmp_path, capsys):
    out = tmp_path / "s"
    make_store(target, data, out)
    first = torch.load(out / shard_name(1), weights_only=True)
    (out / shard_name(1)).unlink()
    capsys.readouterr()
    make_store(target, data, out)
    assert "1 to compute" in capsys.readouterr().out
    again = torch.load(out / shard_name(1), weights_only=True)
    assert all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(SystemExit, match="holds another store"):
        make_store(target, data, out, "--sequences", "4")  # other options, same folder: refused, nothing lost
    assert len(list(out.glob("shard-*.pt"))) == FeatureStore(out).meta["n_shards"]


def test_a_sample_of_the_windows(target, data, tmp_path):
    out = make_store(target, data, tmp_path / "s", "--sequences", "4", "--seed", "1")
    s = FeatureStore(out)
    assert len(s.indices) == 4 and s.indices == sorted(s.indices) and s.meta["n_shards"] == 2
    dm = windows(target, data)
    from lightning_bpd.tasks.lm.feature_store import train_from_store

    train_from_store(s, dm)
    batch = next(iter(dm.train_dataloader()))
    assert sorted(batch["index"].tolist()) == s.indices  # training reads the stored windows only


def test_dflash_trains_from_the_store_without_running_the_target(target, data, store, tmp_path, monkeypatch):
    from lightning_bpd.hf.causal import HFCausalBlockwise

    calls = []
    real = HFCausalBlockwise.full_features
    monkeypatch.setattr(HFCausalBlockwise, "full_features", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    run = tmp_path / "run"
    fast = ["--trainer.max_steps=3", "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false",
            f"--data.init_args.seq_len={SEQ}", "--data.init_args.batch_size=2", "--trainer.limit_val_batches=0",
            "--trainer.num_sanity_val_steps=0", "--model.init_args.warmup_steps=1", "--model.init_args.block_size=4",
            "--model.init_args.anchors=4", "--trainer.logger=false"]
    cli = main(["fit", "--config", str(CONF_DIR / "lm" / "dflash.yaml"), f"--model.init_args.pretrained={target}",
                f"--data.init_args.root={data}", f"--run_dir={run}", "--model.init_args.target_layer_ids=[0, 2]",
                f"--model.init_args.feature_store={store}", *fast])
    assert cli.model.global_step == 3 and not calls  # three steps, no target forward
    ckpt = torch.load(run / "last.ckpt", map_location="cpu", weights_only=False)
    import lightning_bpd

    loaded = lightning_bpd.load_model(run / "last.ckpt")  # decodes without the store
    assert loaded.store is None and ckpt["hyper_parameters"]["feature_store"] == str(store)


def test_store_values_are_what_a_training_step_reads(target, data, store):
    module = DFlashModule(str(target), block_size=4, target_layer_ids=[0, 2], feature_store=str(store)).train()
    dataset = windows(target, data).dataset("train")
    batch = {"src": torch.stack([dataset[i]["src"] for i in (1, 2)]), "index": torch.tensor([1, 2])}
    features, labels = module.target_outputs(batch)
    want_f, want_l = module.target_pass(batch["src"])
    assert torch.equal(labels, want_l) and torch.equal(features, want_f.to(torch.bfloat16).to(want_f.dtype))
    eagle = Eagle3Module(str(target), target_layer_ids=[0, 2], feature_store=str(store)).train()
    out = eagle.step(batch)
    assert torch.isfinite(out["loss"])
    bad = dict(batch, src=batch["src"].flip(0))  # the index names other windows than these tokens
    with pytest.raises(ValueError, match="other tokens"):
        module.target_outputs(bad)


def test_frozen_heads_read_the_stored_last_states(target, data, store):
    from lightning_bpd.tasks.lm import LMModule

    module = LMModule(str(target), k=2, feature_store=str(store)).train()
    dataset = windows(target, data).dataset("train")
    src = torch.stack([dataset[i]["src"] for i in (0, 4)])
    got = module.decoder_states(src, src, src, torch.tensor([0, 4]))
    with torch.no_grad():
        want = module.model(src)
    assert torch.equal(got, want.to(torch.bfloat16).to(want.dtype))


def test_bad_stores_are_one_line(target, data, store, tmp_path):
    other = write_checkpoint(tmp_path / "other", layers=4, seed=5)
    with pytest.raises(ValueError, match="made by another target"):
        DFlashModule(str(other), block_size=4, target_layer_ids=[0, 2], feature_store=str(store))
    from transformers import AutoTokenizer

    retok = Path(shutil.copytree(target, tmp_path / "retok"))  # the same weights, its tokenizer's pad id another
    tok = AutoTokenizer.from_pretrained(retok)
    tok.pad_token = tok.eos_token
    tok.save_pretrained(retok)
    with pytest.raises(ValueError, match="was made with another tokenizer: make a store with the target's own"):
        DFlashModule(str(retok), block_size=4, target_layer_ids=[0, 2], feature_store=str(store))
    with pytest.raises(ValueError, match=r"holds layers \[0, 2\], not \[1\]"):
        DFlashModule(str(target), block_size=4, target_layer_ids=[0, 1], feature_store=str(store))
    with pytest.raises(ValueError, match="no feature store there"):
        DFlashModule(str(target), block_size=4, feature_store=str(tmp_path))
    no_last = make_store(target, data, tmp_path / "nolast", "--no-last")
    with pytest.raises(ValueError, match="no last hidden state"):
        Eagle3Module(str(target), target_layer_ids=[0, 2], feature_store=str(no_last))
    s = FeatureStore(store)
    with pytest.raises(ValueError, match="set data.init_args.seq_len=32"):
        s.check_windows(LMDataModule(str(data), f"hf:{target}", seq_len=24).dataset("train"))
    other_data = write_corpus(tmp_path / "code2", seed=3)
    with pytest.raises(ValueError, match="made from other data"):
        s.check_windows(LMDataModule(str(other_data), f"hf:{target}", seq_len=SEQ).dataset("train"))
    broken = tmp_path / "broken"
    broken.mkdir()
    meta = json.loads((store / "store.json").read_text())
    (broken / "store.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="unfinished"):
        FeatureStore(broken)
    for s_ in range(meta["n_shards"]):
        (broken / shard_name(s_)).write_bytes(b"not a shard")
    with pytest.raises(ValueError, match="corrupt store shard"):
        FeatureStore(broken).rows(torch.tensor([0]), [0])
    with pytest.raises(SystemExit, match="--layers 0,9"):
        make_store(target, data, tmp_path / "x", "--layers", "0,9")


@pytest.mark.parametrize("kind,sets", [("dflash", ["block_size=4", "anchors=4", "target_layer_ids=[0, 2]"]),
                                       ("eagle3", ["target_layer_ids=[0, 2]"]), ("heads", ["k=2"])])
def test_the_step_benchmark_times_both_ways(target, data, store, tmp_path, kind, sets):
    from lightning_bpd.benchmarks.store_steps import main as steps_main

    out = tmp_path / "steps.json"
    record = steps_main(["--pretrained", str(target), "--store", str(store), "--data-root", str(data), "--kind", kind,
                         "--batch-size", "2", "--steps", "1", "--json", str(out),
                         *[a for s in sets for a in ("--set", s)]])
    assert set(record["seconds_per_step"]) == {"target", "store"} and record["speedup"] > 0
    assert json.loads(out.read_text())["kind"] == kind


def test_heads_from_a_store_learn_the_bases_own_greedy_tokens(target, data, store, monkeypatch):
    from lightning_bpd.tasks.lm import LMModule

    module = LMModule(str(target), k=2, feature_store=str(store)).train()
    dataset = windows(target, data).dataset("train")
    batch = {k: torch.stack([torch.as_tensor(dataset[i][k]) for i in (0, 4)]) for k in ("src", "tgt", "length")}
    batch["index"] = torch.tensor([0, 4])
    seen = {}
    monkeypatch.setattr(type(module), "log", lambda *a, **k: None)
    real = type(module).blockwise_step
    monkeypatch.setattr(type(module), "blockwise_step",
                        lambda self, src, tgt, *a, **k: seen.setdefault("tgt", tgt) is None or real(self, src, tgt, *a, **k))
    module.training_step(batch, 0)
    with torch.no_grad():
        greedy = module.model.logits_first(module.model(batch["src"])).argmax(-1)  # (B, T): the base's own choices
    assert torch.equal(seen["tgt"], greedy) and not torch.equal(seen["tgt"], batch["tgt"])


def test_bad_store_commands_are_one_line(target, data, tmp_path):
    def refused(out: Path, *extra: str) -> str:
        with pytest.raises(SystemExit) as err:
            make_store(target, data, out, *extra)
        assert str(err.value).startswith("store: ") and "\n" not in str(err.value)
        return str(err.value)

    assert "give comma-separated layer numbers" in refused(tmp_path / "a", "--layers", ",")  # not a store of no layer
    assert "--layers eagle3" in refused(tmp_path / "a", "--layers", "eagle3")  # 4 layers: name our option
    (tmp_path / "file").write_text("x")
    assert "a file, not a folder" in refused(tmp_path / "file")
    assert "Not a directory" in refused(tmp_path / "file" / "s")  # an OSError of the folder: one line too
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "store.json").write_text("garbage")
    assert "not a readable feature store" in refused(junk)
    (junk / "store.json").write_text('{"format": "another/1"}')
    assert "no feature store of this version ('another/1'" in refused(junk)
    run = tmp_path / "run"
    run.mkdir()
    (run / "last.ckpt").write_text("x")
    assert "holds other files (last.ckpt) and no store" in refused(run)  # never mixed into a run's (or data) folder
    if not torch.cuda.is_available():
        assert "gpu" in refused(tmp_path / "g", "--accelerator", "gpu")  # Lightning's refusal, one line


def test_a_store_of_edited_data_is_not_resumed(target, data, tmp_path):
    import shutil

    edited = tmp_path / "code"
    shutil.copytree(data, edited)
    out = make_store(target, edited, tmp_path / "s", "--sequences", "4")
    (out / shard_name(1)).unlink()
    first = next(iter(sorted((edited / "train").glob("*.py"))))
    text = first.read_text()
    first.write_text(text.replace("return", "yield", 1))  # as many windows, other tokens
    with pytest.raises(SystemExit, match="holds another store .differing: data"):
        make_store(target, edited, out, "--sequences", "4")  # not completed with shards of other windows
    first.write_text(text)
    meta = json.loads((out / "store.json").read_text())
    del meta["data"]["tokens"]  # a store begun before the data digest still resumes
    (out / "store.json").write_text(json.dumps(meta))
    make_store(target, edited, out, "--sequences", "4")
    assert (out / shard_name(1)).is_file()


def test_an_accelerator_the_machine_lacks_writes_nothing(target, data, store, tmp_path, monkeypatch):
    import pytorch_lightning as pl
    from lightning_fabric.utilities.exceptions import MisconfigurationException

    def no_gpu(*args: object, **kwargs: object) -> None:  # a GPU machine refuses as a CPU one does
        raise MisconfigurationException("No supported gpu backend found!")

    monkeypatch.setattr(pl, "Trainer", no_gpu)
    for out in (tmp_path / "new", tmp_path / "deeper" / "new"):
        with pytest.raises(SystemExit) as err:
            make_store(target, data, out, "--accelerator", "gpu")
        message = str(err.value)
        assert message.startswith("store: --accelerator gpu") and "give --accelerator cpu (or auto)" in message
        assert "\n" not in message and not out.exists()  # no half-made store.json without shards
    assert not (tmp_path / "deeper").exists()
    resumed = shutil.copytree(store, tmp_path / "resumed")
    (resumed / shard_name(1)).unlink()
    before = {p.name: p.read_bytes() for p in resumed.iterdir()}
    with pytest.raises(SystemExit, match="give --accelerator cpu"):
        make_store(target, data, resumed, "--accelerator", "gpu")
    assert {p.name: p.read_bytes() for p in resumed.iterdir()} == before  # the store being resumed, as it was
