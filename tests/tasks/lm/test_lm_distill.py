"""``distill`` on a language model (issue 46): its own greedy continuations of line-aligned training prefixes as a data
folder (``train/`` prefix + continuation per file, ``val/`` and ``test/`` the original held-out files), sharded and
resumable, that ``conf/lm/self_distilled.yaml`` trains heads on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import main
from lightning_bpd.tasks.lm import LMDataModule
from lightning_bpd.tasks.translation.hf_module import save_heads
from tests.tasks.lm.test_lm_fit import fit, generated
from tests.tasks.lm.tiny_lm import write_corpus

pytestmark = pytest.mark.usefixtures("one_thread")

NEW = 12
DISTILL = ["--beam", "1", "--prompt-tokens", "40", "--new-tokens", str(NEW), "--shard-size", "7", "--batch-size", "4"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("data") / "code", files=3)


@pytest.fixture(scope="module")
def run(checkpoint, data, tmp_path_factory) -> Path:
    """The last.ckpt of a 3-step fit of k = 4 chained heads on the frozen tiny Llama (the run names its data)."""
    folder = tmp_path_factory.mktemp("run")
    fit(checkpoint, data, folder, "--trainer.max_steps=3", "--trainer.limit_val_batches=0")
    return folder / "last.ckpt"


@pytest.fixture(scope="module")
def distilled(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("distill") / "out"
    main(["distill", "--ckpt", str(run), "--out", str(out), *DISTILL])
    return out


def samples(out: Path) -> list[dict]:
    return [s for shard in sorted((out / "shards").glob("train.*.json"))
            for s in json.loads(shard.read_text())["samples"]]


def test_the_folder_holds_greedy_continuations_of_prefixes_tiling_the_training_files(run, data, distilled):
    record = json.loads((distilled / "distill.json").read_text())
    assert record["decoder"] == "exact" and record["k"] == 4 and record["new_tokens"] == NEW
    assert record["windows_left_out"] == 0 and record["source_files"] == 3
    got = samples(distilled)
    assert record["prefixes"] == record["windows"] == len(got) == record["files"]["train"] > 3 * 2  # several a file
    assert record["files"] == {"train": len(got), "val": 2, "test": 2} and record["tokens"] > 0
    for source in sorted((data / "train").iterdir()):  # whole lines within the budget, tiling each file
        windows = sorted((s["window"], s["text"]) for s in got if s["name"] == source.name)
        assert "".join(text for _, text in windows) == source.read_text()
    module = lightning_bpd.load_model(run)
    prefixes = [s["text"] for s in got]
    assert max(len(ids) for ids in module.tokenizer(prefixes)["input_ids"]) <= 40
    assert [s["continuation"] for s in got] == generated(module, prefixes, NEW)  # generate's greedy text
    for s in got:  # train/: one file per prefix, prefix + continuation, the source's suffix kept
        stem = Path(s["name"]).stem
        assert (distilled / "train" / f"{stem}.{s['window']:04d}.py").read_text() == s["text"] + s["continuation"]
    for split in ("val", "test"):  # the original held-out files, byte for byte
        assert {p.name: p.read_bytes() for p in (distilled / split).iterdir()} == \
            {p.name: p.read_bytes() for p in (data / split).iterdir()}
    dm = LMDataModule(root=str(distilled), tokenizer_path=module.hparams.pretrained)
    assert len(dm.split_texts("train").texts) == len(got)
    assert dm.split_texts("val").names == ["val/mod_0.py", "val/mod_1.py"]


def test_greedy_and_a_base_alone_give_the_same_folder(run, checkpoint, data, distilled, tmp_path):
    main(["distill", "--ckpt", str(run), "--out", str(tmp_path / "greedy"), *DISTILL, "--decoder", "greedy"])
    assert samples(tmp_path / "greedy") == samples(distilled)  # exact blockwise = greedy, by contract
    assert json.loads((tmp_path / "greedy" / "distill.json").read_text())["decoder"] == "greedy"
    base = tmp_path / "base"  # a k = 1 run: the base trained alone, one step
    fit(checkpoint, data, base, "--trainer.max_steps=1", "--trainer.limit_val_batches=0", "--model.init_args.k=1",
        "--model.init_args.training.freeze_base=false", "--model.init_args.training.frozen_cache_gb=0")
    main(["distill", "--ckpt", str(base / "last.ckpt"), "--out", str(tmp_path / "k1"), *DISTILL, "--limit", "5"])
    k1 = samples(tmp_path / "k1")
    assert len(k1) == 5 and {s["name"] for s in k1} == {f"mod_{i}.py" for i in range(3)}  # spread over the files
    record = json.loads((tmp_path / "k1" / "distill.json").read_text())
    assert record["decoder"] == "greedy" and record["prefixes"] == 5 and record["windows"] == len(samples(distilled))
    module = lightning_bpd.load_model(base / "last.ckpt")
    assert [s["continuation"] for s in k1] == generated(module, [s["text"] for s in k1], NEW)


def test_a_killed_run_resumes_at_its_missing_shards(run, distilled, tmp_path, capsys):
    out = tmp_path / "out"
    main(["distill", "--ckpt", str(run), "--out", str(out), *DISTILL])
    shards = sorted((out / "shards").glob("train.*.json"))
    assert len(shards) >= 3
    shards[1].unlink()
    (out / "distill.json").unlink()
    capsys.readouterr()
    main(["distill", "--ckpt", str(run), "--out", str(out), *DISTILL])
    assert "shard 1 done" in (err := capsys.readouterr().err) and "shard 0 done" not in err
    assert samples(out) == samples(distilled)
    with pytest.raises(SystemExit, match=r"^distill: .* made with other new_tokens: give another"):
        main(["distill", "--ckpt", str(run), "--out", str(out), *DISTILL, "--new-tokens", "5"])


def test_bad_input_is_one_line(run, checkpoint, data, tmp_path):
    def refused(*argv: str) -> str:
        with pytest.raises(SystemExit) as err:
            main(["distill", *argv])
        message = str(err.value.code)
        assert message.startswith("distill: ") and "\n" not in message
        return message

    out = ["--out", str(tmp_path / "out")]
    assert "use --beam 1" in refused("--ckpt", str(run), *out)
    assert "exceeds the model's context (128" in refused("--ckpt", str(run), *out, *DISTILL, "--new-tokens", "90")
    assert "overlaps the data folder" in refused("--ckpt", str(run), "--out", str(data / "distilled"), *DISTILL)
    heads = save_heads(lightning_bpd.load_model(run), tmp_path / "heads")
    assert "give --data-root" in refused("--ckpt", str(heads), *out, *DISTILL)
    (tmp_path / "taken" / "train").mkdir(parents=True)
    assert "that no distill run made" in refused("--ckpt", str(run), "--out", str(tmp_path / "taken"), *DISTILL)
    assert "not a checkpoint" in refused("--ckpt", str(checkpoint), *out, *DISTILL)
    assert not (tmp_path / "out").exists()


def test_self_distilled_config_trains_frozen_heads_on_the_folder(checkpoint, distilled, tmp_path):
    """conf/lm/self_distilled.yaml: the heads train on the distilled train/ towards the base's own argmax, the base
    stays bit-identical, and the decode eval reads the original held-out files."""
    import torch

    from lightning_bpd.tasks.lm import LMModule
    from tests.tasks.lm.test_lm_fit import logged

    run = tmp_path / "run"
    cli = fit(checkpoint, distilled, run, "--trainer.max_steps=3", "--trainer.val_check_interval=3",
              config="self_distilled.yaml")
    assert cli.model.options.head_targets == "own" and cli.model.model.frozen
    assert cli.datamodule.split_texts("val").names == ["val/mod_0.py", "val/mod_1.py"]
    fresh = LMModule(str(checkpoint))
    trained = cli.model.model
    ours = trained.base.state_dict()
    assert all(torch.equal(value, ours[key]) for key, value in fresh.model.base.state_dict().items())
    assert any(not torch.equal(a, b) for a, b in zip(fresh.model.head.parameters(), trained.head.parameters()))
    assert logged(run)["val/exact/matches_greedy"] == 1.0


def test_our_own_base_is_distilled_with_its_tokenizer(data, tmp_path):
    """A run of our own decoder-only base (conf/lm/own_base.yaml) names its tokenizer directory, not a pretrained one:
    its continuations are its own greedy outputs."""
    from lightning_bpd.commands.cli import CONF_DIR
    from lightning_bpd.decoding import greedy_decode
    from tests.tasks.lm.test_lm_fit import FAST
    from tests.tasks.lm.tiny_lm import tokenizer

    tokenizer().save_pretrained(tmp_path / "tok")
    run = tmp_path / "run"
    main(["fit", "--config", str(CONF_DIR / "lm" / "own_base.yaml"), f"--data.init_args.tokenizer_path={tmp_path / 'tok'}",
          f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, "--trainer.max_steps=2",
          "--trainer.limit_val_batches=0", "--trainer.logger=false", "--model.init_args.own.d_model=32",
          "--model.init_args.own.n_heads=4", "--model.init_args.own.n_layers=2", "--model.init_args.own.d_ff=64"])
    main(["distill", "--ckpt", str(run / "last.ckpt"), "--out", str(tmp_path / "out"), *DISTILL, "--limit", "6"])
    got = samples(tmp_path / "out")
    module = lightning_bpd.load_model(run / "last.ckpt")
    out = greedy_decode(module.model, module.encode_prompts([s["text"] for s in got]), NEW)
    assert len(got) == 6 and [s["continuation"] for s in got] == module.detokenize(out.sequences())
    assert all(s["continuation"] for s in got)
