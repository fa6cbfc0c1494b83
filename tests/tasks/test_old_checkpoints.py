"""Checkpoints of the flat layout (every option a top-level hyperparameter, before ``architecture`` and ``training``)
load strictly with :func:`lightning_bpd.load_model`, into the model they were trained as, decode as it does, and
give their options to a ``--ckpt_path`` run of the CLI."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest
import pytorch_lightning as pl
import torch

from lightning_bpd.checkpoints import load_model
from lightning_bpd.commands.cli import BPDCLI, CONF_DIR, to_plain
from lightning_bpd.decoding import blockwise_decode, greedy_decode
from lightning_bpd.tasks.superres import SuperResolutionModule
from lightning_bpd.tasks.training_options import TrainingOptions
from lightning_bpd.tasks.translation import TranslationConfig, TranslationModule
from tests.task_modules import superres_config

# What the CLI saved for a tiny run of each task (every argument of the old __init__, plus jsonargparse's keys).
CLI_KEYS = {"_class_path": None, "_instantiator": "pytorch_lightning.cli.instantiate_module"}
OLD_TRANSLATION = {
    "vocab_size": 40, "d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 64,
    "dropout": 0.0, "k": 3, "head_hidden": 16, "identity_first": True, "loss_mode": "mean", "freeze_base": True,
    "init_from": "runs/base/last.ckpt", "lr": 0.002, "warmup_steps": 60, "label_smoothing": 0.1, "weight_decay": 0.0,
    "max_len_a": 1.2, "max_len_b": 7, "seed": 3, "loss_fraction": 0.25, "head1_weight": 0.0, "head_type": "chained",
    "head_loss_decay": 0.8, "base_lr_scale": 1.0, "frozen_cache_gb": 2.0, "draft_vocab": None, "head_targets": "own",
    "detach_heads": "none",
}
NEW_TRANSLATION = {
    "architecture": TranslationConfig(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=2, n_encoder_layers=1,
                                      n_decoder_layers=1, d_ff=64, dropout=0.0, k=3, head_hidden=16, identity_first=True,
                                      head_type="chained"),
    "training": TrainingOptions(loss_mode="mean", freeze_base=True, init_from="runs/base/last.ckpt", lr=0.002,
                                warmup_steps=60, seed=3, loss_fraction=0.25, head_loss_decay=0.8, frozen_cache_gb=2.0,
                                head_targets="own"),
    "max_len_a": 1.2, "max_len_b": 7,
}
OLD_SUPERRES = {
    "d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "dropout": 0.0, "window": 16,
    "k": 3, "head_hidden": 8, "identity_first": False, "loss_mode": "mean", "freeze_base": False, "init_from": None,
    "lr": 0.002, "warmup_steps": 100, "label_smoothing": 0.0, "weight_decay": 0.0, "seed": 0, "loss_fraction": 1.0,
    "head1_weight": 0.0, "head_type": "chained", "head_loss_decay": 1.0, "base_lr_scale": 1.0, "frozen_cache_gb": 4.0,
    "tie_output": False, "positions": "grid", "scale_positions": True, "direct_conditioning": True,
    "conditioning": "bicubic", "smooth_intensities": True, "source_output": True, "input_noise": 0.3,
    "input_noise_kind": "shuffle", "intensity_sigma": 0.0, "intensity_prior": 15.0, "intensity_output": "gaussian",
    "head_centres": "own", "head_neighbours": True, "head_prior": "shared", "head_targets": "data", "detach_heads": "none",
    "train_readout": False,
}
NEW_SUPERRES = {
    "architecture": superres_config({"conditioning": "bicubic", "intensity_prior": 15.0, "intensity_output": "gaussian",
                                     "head_neighbours": True}, d_model=16, n_heads=2, n_encoder_layers=1,
                                    n_decoder_layers=1, d_ff=32, dropout=0.0, window=16, k=3, head_hidden=8,
                                    head_type="chained"),
    "training": TrainingOptions(loss_mode="mean", lr=0.002, warmup_steps=100, label_smoothing=0.0, input_noise=0.3),
    "intensity_sigma": 0.0, "smooth_intensities": True,
}


def save_old(path, module: pl.LightningModule, hparams: dict) -> None:
    """``module``'s weights under ``hparams``, as the old code's ``fit`` saved them."""
    cls = type(module)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": pl.__version__,
                "lightning_bpd_class": f"{cls.__module__}.{cls.__qualname__}"}, path)


def assert_decodes_alike(ours, theirs, src: torch.Tensor, max_len: int, criteria: list[str]) -> None:
    """Greedy and blockwise decoding (each criterion) give the same tokens and blocks with both modules."""
    assert torch.equal(greedy_decode(ours.model, src, max_len).tokens, greedy_decode(theirs.model, src, max_len).tokens)
    for spec in criteria:
        a = blockwise_decode(ours.model, src, ours.make_criterion(spec), max_len=max_len)
        b = blockwise_decode(theirs.model, src, theirs.make_criterion(spec), max_len=max_len)
        assert torch.equal(a.tokens, b.tokens) and a.block_sizes == b.block_sizes, spec


def trained_like(module: pl.LightningModule) -> pl.LightningModule:
    """``module`` with weights that make its heads disagree with p_1 now and then (a fresh head agrees rarely)."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in module.model.named_parameters():
            if name.startswith("head.") and param.dim() == 2:
                param.add_(torch.randn(param.shape, generator=g) * 0.3)
    return module.eval()


def test_a_flat_translation_checkpoint_loads_into_the_model_it_was_trained_as(tmp_path):
    torch.manual_seed(0)
    original = trained_like(TranslationModule(**NEW_TRANSLATION))
    save_old(tmp_path / "old.ckpt", original, {**OLD_TRANSLATION, **CLI_KEYS, "_class_path": "lightning_bpd.tasks."
                                               "translation.TranslationModule"})
    loaded = load_model(tmp_path / "old.ckpt")
    assert type(loaded) is TranslationModule and not loaded.training
    assert asdict(loaded.model.config) == asdict(NEW_TRANSLATION["architecture"])
    assert loaded.options == NEW_TRANSLATION["training"]
    assert (loaded.max_len_a, loaded.max_len_b) == (1.2, 7)
    assert loaded.state_dict().keys() == original.state_dict().keys()
    assert all(torch.equal(value, original.state_dict()[key]) for key, value in loaded.state_dict().items())
    src = torch.randint(4, 40, (3, 9), generator=torch.Generator().manual_seed(2))
    assert_decodes_alike(loaded, original, src, 20, ["exact", "top2"])
    # the new checkpoint of it holds the grouped options, which rebuild the same module
    assert loaded.hparams["architecture"] == asdict(NEW_TRANSLATION["architecture"])
    again = TranslationModule.init_args_of_checkpoint(dict(loaded.hparams))
    assert asdict(again.pop("architecture")) == asdict(NEW_TRANSLATION["architecture"])
    assert again == {key: value for key, value in NEW_TRANSLATION.items() if key != "architecture"}


def test_a_flat_superres_checkpoint_loads_into_the_model_it_was_trained_as(tmp_path):
    torch.manual_seed(0)
    original = trained_like(SuperResolutionModule(**NEW_SUPERRES)).double()
    save_old(tmp_path / "old.ckpt", original, {**OLD_SUPERRES, **CLI_KEYS, "_class_path": "lightning_bpd.tasks."
                                               "superres.SuperResolutionModule"})
    loaded = load_model(tmp_path / "old.ckpt").double()
    assert asdict(loaded.model.config) == asdict(NEW_SUPERRES["architecture"])
    assert loaded.options == NEW_SUPERRES["training"]
    assert all(torch.equal(value, original.state_dict()[key]) for key, value in loaded.state_dict().items())
    src = torch.randint(3, 259, (2, 192), generator=torch.Generator().manual_seed(2))
    assert_decodes_alike(loaded, original, src, 96, ["exact", "eps2"])


def test_a_flat_checkpoint_without_the_newer_options_is_the_original_design(tmp_path):
    """Options newer than a checkpoint are as it was trained: the image design and head centres of before them."""
    newer = ("tie_output", "positions", "scale_positions", "direct_conditioning", "source_output", "conditioning",
             "intensity_prior", "intensity_output", "head_centres", "head_neighbours", "head_prior", "input_noise",
             "input_noise_kind", "head_targets", "detach_heads", "train_readout", "head_type")
    flat = {key: value for key, value in OLD_SUPERRES.items() if key not in newer}
    expected = superres_config({"scale_positions": False, "direct_conditioning": False, "head_centres": "first"},
                               d_model=16, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, dropout=0.0,
                               window=16, k=3, head_hidden=8, tie_output=True, tie_output_to_source=False,
                               share_embeddings=True, src_positions="image", tgt_positions="image")
    torch.manual_seed(0)
    original = SuperResolutionModule(expected, NEW_SUPERRES["training"])
    save_old(tmp_path / "old.ckpt", original, flat)
    loaded = load_model(tmp_path / "old.ckpt")
    assert asdict(loaded.model.config) == asdict(expected)
    assert loaded.options == replace(NEW_SUPERRES["training"], input_noise=0.0)


def test_a_flat_checkpoint_with_an_option_no_module_has_is_one_error(tmp_path):
    torch.manual_seed(0)
    module = TranslationModule(**NEW_TRANSLATION)
    save_old(tmp_path / "odd.ckpt", module, {**OLD_TRANSLATION, "beam_width": 4})
    with pytest.raises(ValueError, match=r"hyperparameters \['beam_width'\] are no options of TranslationModule"):
        load_model(tmp_path / "odd.ckpt")


class ParseWithCheckpoint(BPDCLI):
    """The CLI's parse of a subcommand, its ``--ckpt_path`` checkpoint's options merged in; nothing built or run."""

    def before_instantiate_classes(self) -> None:
        pass

    def instantiate_classes(self) -> None:
        pass

    def _run_subcommand(self, subcommand: str | None) -> None:
        pass


def test_a_ckpt_path_of_the_flat_layout_gives_the_run_its_grouped_options(tmp_path):
    """``validate --ckpt_path old.ckpt`` (or a resumed ``fit``) runs the model the checkpoint was trained as."""
    torch.manual_seed(0)
    save_old(tmp_path / "old.ckpt", SuperResolutionModule(**NEW_SUPERRES), OLD_SUPERRES)
    cli = ParseWithCheckpoint(model_class=None, datamodule_class=None, subclass_mode_model=True,
                              subclass_mode_data=True, parser_kwargs={"parser_mode": "omegaconf"}, args=[
                                  "validate", "--config", str(CONF_DIR / "superres/celeba_base.yaml"),
                                  "--ckpt_path", str(tmp_path / "old.ckpt")],
                              auto_configure_optimizers=False, load_from_checkpoint_support=False)
    init_args = to_plain(cli.config.validate.model.init_args)
    assert init_args["architecture"] == asdict(NEW_SUPERRES["architecture"])
    assert init_args["training"] == asdict(NEW_SUPERRES["training"])

