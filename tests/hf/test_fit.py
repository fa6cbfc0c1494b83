"""The fit contract of Hugging Face models (issue 40): ``fit --config conf/hf/frozen_heads.yaml`` on a tiny random
Marian and its own tokenizer, then ``load_model``, ``decode --ckpt``; heads saved on their own; bad input."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

import lightning_bpd
from lightning_bpd.commands.cli import CONF_DIR, main
from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode, parse_criterion
from lightning_bpd.tasks.translation.hf_module import HEADS_JSON, HFTranslationModule, save_heads
from lightning_bpd.tasks.translation.hf_tokenizer import HFTokenizer
from tests.hf.tiny_checkpoint import sentence_pairs, write_checkpoint, write_data, write_decoder_only

pytestmark = pytest.mark.usefixtures("one_thread")

FAST = ["--trainer.max_steps=6", "--trainer.val_check_interval=6", "--trainer.logger=false",
        "--trainer.accelerator=cpu", "--trainer.enable_progress_bar=false", "--decode_eval.subset=4",
        "--decode_eval.batch_size=4", "--data.init_args.max_tokens=200", "--model.init_args.k=4",
        "--model.init_args.training.warmup_steps=2"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("hf") / "marian")


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_data(tmp_path_factory.mktemp("data") / "corpus")


def base_state(module: HFTranslationModule) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in module.model.base.state_dict().items()}


def test_fit_then_load_model_and_decode(checkpoint, data, tmp_path, capsys):
    """The contract other tools call: fit -> last.ckpt -> load_model (model, encode_sources, detokenize) -> decode."""
    start = time.perf_counter()
    run = tmp_path / "run"
    logger = json.dumps({"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": str(run)}})
    cli = main(["fit", "--config", str(CONF_DIR / "hf" / "frozen_heads.yaml"), f"--model.init_args.pretrained={checkpoint}",
                f"--data.init_args.root={data}", f"--run_dir={run}", *FAST, f"--trainer.logger={logger}"])
    trained = cli.model
    assert trained.global_step == 6
    assert trained.frozen_states is not None and trained.frozen_states.hits > 0  # head steps skipped the base
    fresh = HFTranslationModule(str(checkpoint), k=4)
    assert all(torch.equal(value, trained.model.base.state_dict()[key]) for key, value in base_state(fresh).items())
    assert any(not torch.equal(a, b) for a, b in zip(fresh.model.head.parameters(), trained.model.head.parameters()))

    module = lightning_bpd.load_model(run / "last.ckpt")
    assert isinstance(module, HFTranslationModule) and module.model.k == 4
    assert torch.equal(module.rank_agreement, trained.rank_agreement)  # the last validation's, for --tree-nodes
    assert module.rank_agreement.shape == (3, 8)
    assert module.model.head_type == "chained_attn"
    sentences = [en for en, _ in sentence_pairs(3, seed=9)]
    src = module.encode_sources(sentences)  # (3, S): the checkpoint's own ids, EOS appended, padded with its pad
    assert (src == module.model.eos_id).sum(dim=1).tolist() == [1, 1, 1]
    assert module.detokenize([row.tolist() for row in src]) == sentences  # EOS ends each row, pads are left out
    greedy = greedy_decode(module.model, src, module.max_decode_len(src))
    exact = blockwise_decode(module.model, src, Exact(), module.max_decode_len(src))
    assert exact.sequences() == greedy.sequences()

    (tmp_path / "in.en").write_text("\n".join(sentences) + "\n")
    capsys.readouterr()
    main(["decode", "--ckpt", str(run / "last.ckpt"), "--input", str(tmp_path / "in.en"), "--criterion", "exact",
          "--device", "cpu"])
    out = capsys.readouterr()
    assert out.out.splitlines() == module.detokenize(greedy.sequences())
    assert "mean_accepted_block_size" in out.err
    assert time.perf_counter() - start < 60

    moved = tmp_path / "moved"
    checkpoint.rename(moved)  # the base directory has moved since the run: load_model(ckpt, base=) finds it
    try:
        with pytest.raises(ValueError, match="not a directory"):
            lightning_bpd.load_model(run / "last.ckpt")
        again = lightning_bpd.load_model(run / "last.ckpt", base=moved)
        assert again.hparams.pretrained == str(moved)
        assert all(torch.equal(a, b) for a, b in zip(again.model.state_dict().values(), module.model.state_dict().values()))
    finally:
        moved.rename(checkpoint)


def test_a_checkpoint_of_the_flat_layout_loads_into_the_heads_it_trained(checkpoint, tmp_path):
    """A run of before the ``training`` group saved every option at the top (and the CLI's ``vocab_size`` link)."""
    from lightning_bpd.tasks.training_options import TrainingOptions
    from tests.tasks.test_old_checkpoints import save_old

    flat = {"pretrained": str(checkpoint), "k": 3, "head_type": "chained", "head_hidden": 24, "freeze_base": True,
            "loss_mode": "mean", "lr": 0.002, "warmup_steps": 50, "label_smoothing": 0.1, "weight_decay": 0.0,
            "max_len_a": 1.2, "max_len_b": 6, "seed": 0, "loss_fraction": 1.0, "head1_weight": 0.0,
            "head_loss_decay": 1.0, "base_lr_scale": 1.0, "frozen_cache_gb": 4.0, "head_targets": "data",
            "init_from": None, "vocab_size": 41, "_instantiator": "pytorch_lightning.cli.instantiate_module",
            "_class_path": "lightning_bpd.tasks.translation.hf_module.HFTranslationModule"}
    torch.manual_seed(0)
    original = HFTranslationModule(str(checkpoint), k=3, head_type="chained", head_hidden=24,
                                   training=TrainingOptions(freeze_base=True, loss_mode="mean", lr=0.002, warmup_steps=50),
                                   max_len_a=1.2, max_len_b=6).eval()
    with torch.no_grad():
        for p in original.model.head.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
    save_old(tmp_path / "old.ckpt", original, flat)
    module = lightning_bpd.load_model(tmp_path / "old.ckpt")
    assert (module.model.k, module.model.head_type, module.model.head_hidden) == (3, "chained", 24)
    assert module.options == original.options and (module.max_len_a, module.max_len_b) == (1.2, 6)
    assert all(torch.equal(value, original.state_dict()[key]) for key, value in module.state_dict().items())
    src = module.encode_sources([en for en, _ in sentence_pairs(3, seed=4)])
    for spec in ("exact", "top2"):
        ours = blockwise_decode(module.model, src, parse_criterion(spec), module.max_decode_len(src))
        theirs = blockwise_decode(original.model, src, parse_criterion(spec), original.max_decode_len(src))
        assert ours.sequences() == theirs.sequences() and ours.block_sizes == theirs.block_sizes


def test_finetune_config_trains_the_base(checkpoint, data, tmp_path):
    cli = main(["fit", "--config", str(CONF_DIR / "hf" / "finetune.yaml"), f"--model.init_args.pretrained={checkpoint}",
                f"--data.init_args.root={data}", f"--run_dir={tmp_path / 'run'}", *FAST,
                "--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--model.init_args.training.head_targets=own"])
    fresh = HFTranslationModule(str(checkpoint), k=4)
    trained = cli.model.model.base.state_dict()
    assert any(not torch.equal(value, trained[key]) for key, value in base_state(fresh).items())
    with pytest.raises(ValueError, match="fine-tuned"):
        save_heads(cli.model, tmp_path / "heads")
    # Marian's decoder starts from a zero vector (<pad>'s row; CTranslate2 converts it so): it stays zero, the
    # other rows of the tied embedding and output projection train
    start = fresh.model.bos_id
    before, after = fresh.model.base.get_input_embeddings().weight, cli.model.model.base.get_input_embeddings().weight
    assert not before[start].any() and not after[start].any()
    assert not torch.equal(before, after)


def test_a_marian_start_row_that_is_not_zero_trains_as_any_row(checkpoint, tmp_path):
    import shutil

    from transformers import AutoModelForSeq2SeqLM

    from lightning_bpd.tasks.training_options import TrainingOptions

    base = AutoModelForSeq2SeqLM.from_pretrained(checkpoint)
    start = base.config.decoder_start_token_id
    with torch.no_grad():
        base.get_input_embeddings().weight[start] = 0.5  # a user's checkpoint trained otherwise
    shutil.copytree(checkpoint, tmp_path / "moved")
    base.save_pretrained(tmp_path / "moved")
    for folder, kept in [(checkpoint, True), (tmp_path / "moved", False)]:
        module = HFTranslationModule(str(folder), k=2, training=TrainingOptions(freeze_base=False))
        weight = module.model.base.get_input_embeddings().weight
        (module.model.base.get_output_embeddings().weight.sum() * 2).backward()
        assert bool(weight.grad[start].eq(0).all()) == kept and bool(weight.grad[start + 1].ne(0).all())



def scrambled(checkpoint: Path, head_type: str) -> HFTranslationModule:
    module = HFTranslationModule(str(checkpoint), k=3, head_type=head_type, head_hidden=24).eval()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in module.model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_heads_saved_on_their_own_come_back_identical(checkpoint, tmp_path, head_type):
    module = scrambled(checkpoint, head_type)
    folder = save_heads(module, tmp_path / "heads")
    assert sorted(p.name for p in folder.iterdir()) == [HEADS_JSON, "heads.safetensors"]
    back = lightning_bpd.load_model(folder)  # the base directory named in heads.json
    again = lightning_bpd.load_model(folder, base=checkpoint)  # or another path to it
    assert isinstance(back, HFTranslationModule) and back.model.k == 3 and back.model.head_hidden == 24
    src = module.encode_sources([en for en, _ in sentence_pairs(4, seed=3)])
    ctx = module.model.encode(src)
    tgt_in = torch.cat([torch.full((4, 1), module.model.bos_id), src[:, :5].clamp(min=3)], dim=1)
    h = module.model.decode_full(tgt_in, ctx)
    prev = torch.randint(3, 40, (4, 6, 2), generator=torch.Generator().manual_seed(1))
    source = module.model.chain_source(ctx)
    expected = module.model.logits_heads(h, None, prev, source)
    for other in (back, again):
        assert torch.equal(other.model.logits_heads(h, None, prev, source), expected)
        n = module.max_decode_len(src)
        for rule in (Exact(), parse_criterion("top2")):
            assert blockwise_decode(other.model, src, rule, n).sequences() == blockwise_decode(module.model, src, rule,
                                                                                              n).sequences()


def test_decode_reads_heads_saved_on_their_own(checkpoint, tmp_path, capsys):
    module = scrambled(checkpoint, "chained_attn")
    folder = save_heads(module, tmp_path / "heads")
    sentences = [en for en, _ in sentence_pairs(3, seed=4)]
    (tmp_path / "in.en").write_text("\n".join(sentences) + "\n")
    capsys.readouterr()
    main(["decode", "--ckpt", str(folder), "--input", str(tmp_path / "in.en"), "--criterion", "top2", "--device", "cpu"])
    src = module.encode_sources(sentences)
    expected = blockwise_decode(module.model, src, parse_criterion("top2"), module.max_decode_len(src)).sequences()
    assert capsys.readouterr().out.splitlines() == module.detokenize(expected)


def test_heads_refuse_another_base(checkpoint, tmp_path):
    folder = save_heads(scrambled(checkpoint, "chained"), tmp_path / "heads")
    other = write_checkpoint(tmp_path / "other", seed=1)
    with pytest.raises(ValueError, match="not the base the heads"):
        lightning_bpd.load_model(folder, base=other)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


def test_bad_checkpoints_are_one_clear_line(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint") as err:
        HFTranslationModule(str(tmp_path / "empty"))
    one_line(err)
    with pytest.raises(ValueError, match="decoder-only") as err:
        HFTranslationModule(str(write_decoder_only(tmp_path / "gpt2")))
    one_line(err)
    with pytest.raises(ValueError, match="no tokenizer beside the checkpoint") as err:
        HFTranslationModule(str(write_checkpoint(tmp_path / "bare", tokenizer=False)))
    one_line(err)
    with pytest.raises(ValueError, match="vocab_size mismatch") as err:
        HFTranslationModule(str(write_checkpoint(tmp_path / "bigger", vocab_extra=5)))
    one_line(err)


@pytest.mark.parametrize("k", [0, 17])
def test_k_out_of_range(checkpoint, k):
    with pytest.raises(ValueError, match=r"model.k must lie in \[1, 16\]") as err:
        HFTranslationModule(str(checkpoint), k=k)
    one_line(err)


def test_a_bad_pretrained_path_in_fit_is_one_error_line(data, tmp_path):
    with pytest.raises(SystemExit, match="^error: .*not a directory"):
        main(["fit", "--config", str(CONF_DIR / "hf" / "frozen_heads.yaml"),
              f"--model.init_args.pretrained={tmp_path / 'missing'}", f"--data.init_args.root={data}",
              f"--run_dir={tmp_path / 'run'}", *FAST])


def test_the_data_reads_the_checkpoints_own_ids(checkpoint, data):
    from lightning_bpd.tasks.translation import TranslationDataModule

    dm = TranslationDataModule(root=str(data), tokenizer_path=f"hf:{checkpoint}", max_tokens=200)
    assert isinstance(dm.tokenizer, HFTokenizer)
    batch = next(iter(dm.val_dataloader()))
    tok = dm.tokenizer
    rows = batch["tgt"].tolist()
    assert all(row.count(tok.eos_id) == 1 for row in rows)
    targets = dm.split_texts("val")[1]
    assert dm.tokenizer.decode_batch(rows) == [targets[i] for i in batch["index"].tolist()]
    assert (batch["src"] == tok.pad_id).any()  # padded with the checkpoint's pad id (2), not ours (0)


def test_frozen_steps_benchmark_on_a_hf_base(tmp_path):
    """``frozen_steps --pretrained``: the three variants (fine-tuned base, frozen base recomputed, frozen base read
    from the state cache) of a HF base train on the same batches and are timed into the record."""
    import json

    from lightning_bpd.benchmarks.frozen_steps import main as frozen_steps
    from tests.hf.tiny_checkpoint import write_checkpoint, write_data

    base = write_checkpoint(tmp_path / "base")
    data = write_data(tmp_path / "data")
    out = tmp_path / "frozen.json"
    result = frozen_steps(["--pretrained", str(base), "--data-root", str(data), "--k", "3", "--head-type", "chained",
                           "--head-hidden", "16", "--max-tokens", "200", "--batches", "2", "--repeats", "1",
                           "--loss-mode", "random", "--json", str(out)])
    record = json.loads(out.read_text())
    assert record["pretrained"] == str(base) and record["loss_mode"] == "random"
    for variant in ("base", "fine-tuned", "recomputed", "cached"):
        assert result[variant]["steps_per_minute"] > 0
    assert record["cached_vs_base"] == pytest.approx(result["cached"]["seconds_per_step"] / result["base"]["seconds_per_step"])


def test_frozen_steps_bad_input_is_one_line(tmp_path):
    from lightning_bpd.benchmarks.frozen_steps import main as frozen_steps
    from tests.hf.tiny_checkpoint import write_data

    data = write_data(tmp_path / "data")
    with pytest.raises(SystemExit, match="frozen_steps: Data folder .* does not exist"):
        frozen_steps(["--pretrained", str(tmp_path / "base"), "--data-root", str(tmp_path / "missing")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="frozen_steps: .*no tokenizer beside the checkpoint"):
        frozen_steps(["--pretrained", str(tmp_path / "empty"), "--data-root", str(data)])


def test_saved_heads_keep_their_rank_agreement_table_for_decode_tree_nodes(checkpoint, tmp_path, capsys):
    from lightning_bpd.decoding.trees.budget import KEY, measure_rank_agreement
    from lightning_bpd.evaluation import EvalBatch

    module = scrambled(checkpoint, "chained_attn")
    sentences = [en for en, _ in sentence_pairs(3, seed=4)]
    src = module.encode_sources(sentences)
    n = module.max_decode_len(src)
    module.rank_agreement = measure_rank_agreement(module.model, [EvalBatch(src, n)])
    folder = save_heads(module, tmp_path / "heads")
    assert json.loads((folder / HEADS_JSON).read_text())[KEY] == module.rank_agreement.tolist()
    back = lightning_bpd.load_model(folder)
    assert torch.equal(back.rank_agreement, module.rank_agreement)
    (tmp_path / "in.en").write_text("\n".join(sentences) + "\n")
    capsys.readouterr()
    main(["decode", "--ckpt", str(folder), "--input", str(tmp_path / "in.en"), "--tree-nodes", "10", "--device", "cpu"])
    assert capsys.readouterr().out.splitlines() == module.detokenize(greedy_decode(module.model, src, n).sequences())
