"""SuperResolutionModule hooks: the nearest-neighbour row, sample rows without W&B, checkpoints of the
original image design."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import pytorch_lightning as pl
import torch

from lightning_bpd.callbacks.decode_eval import format_summary
from lightning_bpd.checkpoints import load_model
from lightning_bpd.decoding import blockwise_decode, greedy_decode
from lightning_bpd.evaluation import EvalBatch
from lightning_bpd.tasks.superres import SuperResolutionModule
from lightning_bpd.tasks.superres.input_use import nearest_upsample, smooth_upsample
from lightning_bpd.tasks.superres.module import LEGACY_DESIGN, image_quality
from lightning_bpd.tasks.superres.pixels import image_to_tokens
from tests.task_modules import superres_config, superres_module

TINY = {"d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "window": 16}
# The image designs (architecture options; the image options under "image"): the original one, of checkpoints from
# before the options existed; the grid one with an output layer of its own; the default, whose output layer is the
# source embedding (tie_output_to_source).
ORIGINAL = {"tie_output": True, "tie_output_to_source": False, "share_embeddings": True, "src_positions": "image",
            "tgt_positions": "image", "image": {"scale_positions": False, "direct_conditioning": False,
                                                "head_centres": "first"}}
GRID_UNTIED = {"tie_output_to_source": False, "share_embeddings": True}


def eval_batches(n: int = 3) -> list[EvalBatch]:
    g = torch.Generator().manual_seed(0)
    lows = torch.randint(0, 256, (n, 8, 8, 3), generator=g, dtype=torch.uint8)
    highs = torch.randint(0, 256, (n, 32, 32, 3), generator=g, dtype=torch.uint8)
    return [EvalBatch(image_to_tokens(lows), 3072, list(highs), list(lows), list(range(n)))]


def test_extras_score_nearest_upsampling_with_the_same_code():
    module = superres_module(**TINY).eval()
    batches = eval_batches()
    extras = module.decode_eval_extras(batches)
    lows, highs = torch.stack(batches[0].sources), torch.stack(batches[0].references)
    expected = image_quality(nearest_upsample(lows, 4).permute(0, 3, 1, 2).float(), highs.permute(0, 3, 1, 2).float())
    assert extras["nearest/psnr"] == expected["psnr"] and extras["nearest/ssim"] == expected["ssim"]
    for mode in ("bilinear", "bicubic"):
        smooth = image_quality(smooth_upsample(lows, 4, mode).permute(0, 3, 1, 2), highs.permute(0, 3, 1, 2).float())
        assert extras[f"{mode}/psnr"] == smooth["psnr"] and extras[f"{mode}/ssim"] == smooth["ssim"]
    assert {"cond/loss_true", "cond/gap_rolled", "cond/gap_constant", "cond/repeat_share"} <= set(extras)
    # a no-model row in the printed table, beside the methods
    metrics = {"greedy/psnr": 9.0, "greedy/mean_accepted_block_size": 1.0, "greedy/model_calls": 3072.0,
               "greedy/seconds": 1.0, "greedy/speedup": 1.0, **extras}
    table = format_summary(metrics, ["greedy"], "psnr")
    assert "nearest (no model)" in table and "bicubic (no model)" in table and "gap_rolled=" in table


def test_sample_rows_need_no_wandb(monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails
    module = superres_module(**TINY)
    batches = eval_batches(2)
    outputs = {"greedy": [[5] * 3072, [6] * 3072], "exact": [[5] * 3072, [6] * 3072]}
    blocks = {"greedy": [[1] * 3072] * 2, "exact": [[2] * 1536] * 2}
    columns, rows = module.decode_eval_samples(outputs, blocks, batches, 2)
    assert columns == ["input", "greedy", "exact", "ground_truth", "exact_mean_block"]
    assert isinstance(rows[0][0], np.ndarray) and rows[0][0].shape == (32, 32, 3) and rows[0][-1] == 2.0


@pytest.mark.parametrize("design", ["grid_untied", "source_output", "bilinear", "prior"])
@pytest.mark.parametrize("k", [1, 3])
def test_new_designs_decode_blockwise_exactly_like_greedy(k, design):
    torch.manual_seed(0)
    options = {"grid_untied": GRID_UNTIED, "source_output": {}, "bilinear": {"image": {"conditioning": "bilinear"}},
               "prior": {"image": {"conditioning": "bilinear", "intensity_prior": 15.0}}}[design]
    module = superres_module(**TINY, k=k, head_hidden=8, **options).double().eval()
    src = torch.randint(3, 259, (2, 192))
    out = blockwise_decode(module.model, src, module.make_criterion("exact"), max_len=60)
    assert torch.equal(out.tokens, greedy_decode(module.model, src, 60).tokens)


def save_legacy_checkpoint(path) -> dict:
    """A checkpoint of the original design as written before the image options existed: its flat hyperparameters
    lack them."""
    torch.manual_seed(0)
    module = superres_module(**TINY, **ORIGINAL)
    hparams = {**TINY, "k": 1, "lr": 1e-3, "warmup_steps": 500, "smooth_intensities": True}
    assert not set(hparams) & set(LEGACY_DESIGN)
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": pl.__version__,
                "lightning_bpd_class": "lightning_bpd.tasks.superres.module.SuperResolutionModule"}, path)
    return module.state_dict()


def test_checkpoints_of_the_original_design_still_load(tmp_path):
    state = save_legacy_checkpoint(tmp_path / "old.ckpt")
    module = load_model(tmp_path / "old.ckpt")
    assert module.model.config.tie_output and module.model.config.src_positions == "image"
    for key, value in module.state_dict().items():
        assert torch.equal(value, state[key])


def test_a_checkpoint_of_another_design_fails_with_one_message(tmp_path):
    save_legacy_checkpoint(tmp_path / "old.ckpt")
    with pytest.raises(ValueError, match="another image design.*tie_output=False"):
        SuperResolutionModule.load_from_checkpoint(tmp_path / "old.ckpt", architecture=superres_config(**TINY))
    module = superres_module(**TINY)
    with pytest.raises(ValueError, match=r"init_from=.*another image design.*tie_output True vs False"):
        module.warm_start(str(tmp_path / "old.ckpt"))


def test_unknown_positions_and_conditioning_are_refused():
    with pytest.raises(ValueError, match=r"src_positions and tgt_positions must be the same, one of \('image', 'grid'\)"):
        superres_module(**TINY, src_positions="sinusoidal", tgt_positions="sinusoidal", image={"scale_positions": False})
    with pytest.raises(ValueError, match=r"conditioning must be one of \('nearest', 'bilinear', 'bicubic'\), got 'lanczos'"):
        superres_module(**TINY, image={"conditioning": "lanczos"})
    with pytest.raises(ValueError, match=r"head_prior must be one of \('shared', 'own', 'residual'\), got 'mine'"):
        superres_module(**TINY, image={"head_prior": "mine"})
    with pytest.raises(ValueError, match=r"model.architecture.eos_id is None in super-resolution, got 2"):
        superres_module(**TINY, eos_id=2)
    with pytest.raises(ValueError, match=r"model.architecture.image.tgt_image_shape is \(32, 32, 3\)"):
        superres_module(**TINY, image={"tgt_image_shape": (16, 16, 3)})


def test_source_output_starts_from_nearest_neighbour_upsampling():
    """The output layer is the source intensity embedding, and direct conditioning puts the input intensity
    under each target position on the residual stream: a fresh model's p_1 favours that intensity."""
    from lightning_bpd.nn.loss import decoder_inputs

    lows = torch.randint(0, 256, (2, 8, 8, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    up = image_to_tokens(nearest_upsample(lows, 4))  # (2, 3072)
    shares, errors = {}, {}
    for source_output in (False, True):
        torch.manual_seed(0)
        module = superres_module(d_model=64, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, window=32,
                                 dropout=0.0, **({} if source_output else GRID_UNTIED)).eval()
        with torch.no_grad():
            logits = module.model.logits_first(module.model(image_to_tokens(lows), decoder_inputs(up, module.model.bos_id)))
        shares[source_output] = float((logits.argmax(-1) == up).float().mean())
        errors[source_output] = float((logits.argmax(-1) - up).abs().float().mean())  # intensity levels
    assert module.model.src_embed is not module.model.tgt_embed and not hasattr(module.model, "out_proj")
    assert shares[True] > 0.7 and errors[True] < 5  # (grid positions at token scale dilute the vote a little)
    assert shares[False] < 0.1 and errors[False] > 40


def test_bilinear_conditioning_starts_from_bilinear_upsampling():
    """With ``conditioning: bilinear`` the input intensity on the residual stream is the bilinear
    interpolation, and the source-tied output layer votes for it: a fresh model's p_1 is (nearly)
    bilinear upsampling, which is smoother than the nearest-neighbour start."""
    from lightning_bpd.nn.loss import decoder_inputs

    lows = torch.randint(0, 256, (2, 8, 8, 3), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    smooth = image_to_tokens(smooth_upsample(lows, 4, "bilinear").to(torch.uint8))  # (2, 3072)
    torch.manual_seed(0)
    module = superres_module(d_model=64, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, window=32,
                             dropout=0.0, image={"conditioning": "bilinear"}).eval()
    with torch.no_grad():
        logits = module.model.logits_first(module.model(image_to_tokens(lows), decoder_inputs(smooth, module.model.bos_id)))
    assert float((logits.argmax(-1) == smooth).float().mean()) > 0.7
    assert float((logits.argmax(-1) - smooth).abs().float().mean()) < 5


def test_a_fresh_gaussian_model_with_bicubic_conditioning_decodes_bicubic_upsampling():
    """The Gaussian output starts centred on the conditioning intensity with no shift (its layer starts at zero),
    so a fresh model's greedy image is bicubic upsampling itself: training starts from the baseline to beat."""
    lows = torch.randint(0, 256, (1, 8, 8, 3), generator=torch.Generator().manual_seed(2), dtype=torch.uint8)
    up = torch.nn.functional.interpolate(lows.permute(0, 3, 1, 2).double(), scale_factor=4, mode="bicubic", align_corners=False)
    bicubic = image_to_tokens((up + 0.5).floor().clamp(0, 255).permute(0, 2, 3, 1).to(torch.uint8))  # (1, 3072)
    torch.manual_seed(0)
    module = superres_module(d_model=32, n_heads=2, n_encoder_layers=1, n_decoder_layers=1, d_ff=32, window=16,
                             dropout=0.0, image={"conditioning": "bicubic", "intensity_prior": 15.0,
                                                 "intensity_output": "gaussian"}).eval()
    out = greedy_decode(module.model, image_to_tokens(lows), 3072)
    assert torch.equal(out.tokens, bicubic)


@pytest.mark.parametrize("bad, message", [
    ({"tie_output": True}, "tie_output_to_source needs tie_output off and share_embeddings off"),
    ({"image": {"direct_conditioning": False}}, "tie_output_to_source needs image.direct_conditioning: true"),
])
def test_source_output_needs_an_untied_layer_and_direct_conditioning(bad, message):
    with pytest.raises(ValueError, match=message):
        superres_module(**TINY, **bad)


def test_a_base_without_source_output_cannot_warm_start_one(tmp_path):
    torch.manual_seed(0)
    base = superres_module(**TINY, **GRID_UNTIED)
    torch.save({"state_dict": base.state_dict(), "hyper_parameters": dict(base.hparams)}, tmp_path / "base.ckpt")
    with pytest.raises(ValueError, match=r"init_from=.*another image design.*tie_output_to_source False vs True"):
        superres_module(**TINY).warm_start(str(tmp_path / "base.ckpt"))
    with pytest.raises(ValueError, match=r"another image design.*tie_output_to_source"):
        superres_module(**TINY).on_load_checkpoint(torch.load(tmp_path / "base.ckpt"))


def test_a_base_without_the_intensity_prior_cannot_warm_start_one(tmp_path):
    torch.manual_seed(0)
    base = superres_module(**TINY, image={"conditioning": "bilinear"})
    torch.save({"state_dict": base.state_dict(), "hyper_parameters": dict(base.hparams)}, tmp_path / "base.ckpt")
    prior = superres_module(**TINY, image={"conditioning": "bilinear", "intensity_prior": 15.0})
    with pytest.raises(ValueError, match=r"init_from=.*another image design.*intensity_prior 0.0 vs 15.0"):
        prior.warm_start(str(tmp_path / "base.ckpt"))
    with pytest.raises(ValueError, match=r"another image design.*conditioning bilinear vs nearest"):
        superres_module(**TINY).warm_start(str(tmp_path / "base.ckpt"))
    with pytest.raises(ValueError, match=r"intensity_prior must be >= 0"):
        superres_module(**TINY, image={"intensity_prior": -2.0})


def test_the_intensity_prior_width_is_logged_while_training():
    torch.manual_seed(0)
    module = superres_module(**TINY, image={"intensity_prior": 15.0})
    logged = {}
    module.log = lambda name, value, **kwargs: logged.__setitem__(name, value)  # no trainer needed
    batch = {"src": torch.randint(3, 259, (2, 192)), "tgt": torch.randint(3, 259, (2, 3072))}
    module.training_step(batch, 0)
    assert logged["train/prior_sigma"] == pytest.approx(15.0)


def test_intensity_sigma_trains_towards_neighbouring_intensities_and_validates_plain_nll():
    torch.manual_seed(0)
    module = superres_module(**TINY, intensity_sigma=3.0)
    src, tgt = torch.randint(3, 259, (2, 192)), torch.randint(3, 259, (2, 3072))
    plain = superres_module(**TINY)
    plain.load_state_dict(module.state_dict())
    module.eval(), plain.eval()
    assert module.blockwise_step(src, tgt, [0]).loss == plain.blockwise_step(src, tgt, [0]).loss
    module.train(), plain.train()
    assert module.blockwise_step(src, tgt, [0]).loss != plain.blockwise_step(src, tgt, [0]).loss  # soft targets
    row = module.target_kernel[3 + 100]
    assert int(row.argmax()) == 103 and float(row[3 + 97 : 3 + 104].sum()) > 0.7
    with pytest.raises(ValueError, match="intensity_sigma must be >= 0"):
        superres_module(**TINY, intensity_sigma=-1.0)


GAUSSIAN_CHAIN = {**TINY, "k": 3, "head_type": "chained", "dropout": 0.0}
GAUSSIAN_IMAGE = {"intensity_prior": 15.0, "intensity_output": "gaussian", "head_neighbours": True}


def test_train_readout_fine_tunes_the_gaussian_readout_over_cached_frozen_states():
    torch.manual_seed(0)
    training = {"freeze_base": True, "init_from": "base.ckpt", "train_readout": True, "head1_weight": 0.5,
                "base_lr_scale": 0.5, "lr": 1e-3, "loss_mode": "mean"}
    module = superres_module(training, GAUSSIAN_IMAGE, **GAUSSIAN_CHAIN)
    trainable = {name for name, p in module.model.named_parameters() if p.requires_grad}
    assert {name for name in trainable if not name.startswith("head.")} == {"prior.log_precision", "prior.adapt.weight",
                                                                          "prior.adapt.bias"}
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [g["initial_lr"] for g in groups] == pytest.approx([5e-4, 1e-3])  # the readout at the base's scale
    assert module.trainable_heads_skip() == []  # p_1 trains the readout
    with torch.no_grad():  # a readout that is not the fresh one (zero shift)
        module.model.prior.adapt.weight.normal_(0, 0.1)
    module.train()
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(3, 259, (2, 192), generator=g), torch.randint(3, 259, (2, 3072), generator=g)
    index = torch.tensor([7, 8])
    cached = module.blockwise_step(src, tgt, [0, 1, 2], 0.1, torch.Generator().manual_seed(2), 0.5, index)
    cached.loss.backward()
    assert module.model.prior.adapt.weight.grad.any() and module.model.head.neighbours is not None
    assert all(p.grad is None for name, p in module.model.named_parameters() if name.startswith("decoder."))
    # the cached states do not depend on the readout: after it changes, a step from the store equals a fresh one
    with torch.no_grad():
        module.model.prior.adapt.weight.add_(0.05)
        module.model.prior.log_precision.add_(0.3)
    again = module.blockwise_step(src, tgt, [0, 1, 2], 0.1, torch.Generator().manual_seed(2), 0.5, index)
    fresh = module.blockwise_step(src, tgt, [0, 1, 2], 0.1, torch.Generator().manual_seed(2), 0.5)
    assert module.frozen_states.hits == 2 and module.frozen_states.misses == 2
    torch.testing.assert_close(again.loss, fresh.loss, rtol=0, atol=1e-6)
    assert not torch.allclose(again.loss, cached.loss)  # and the readout's change reached the loss


@pytest.mark.parametrize("training, image, message", [
    ({"freeze_base": False}, {}, "train_readout trains the base's readout beside an otherwise frozen base"),
    ({}, {"intensity_output": "categorical"}, "train_readout needs a readout that acts after the decoder states"),
    ({}, {"head_centres": "first", "head_neighbours": False},
     "train_readout needs a readout that acts after the decoder states"),
])
def test_train_readout_needs_a_frozen_base_and_a_readout_after_the_states(training, image, message):
    training = {"freeze_base": True, "init_from": "base.ckpt", "train_readout": True, **training}
    with pytest.raises(ValueError, match=message):
        superres_module(training, {**GAUSSIAN_IMAGE, **image}, **GAUSSIAN_CHAIN)
