"""The conditioning diagnostic and the nearest-neighbour baseline."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.tasks.superres.input_use import conditioning_diagnostic, nearest_upsample
from lightning_bpd.tasks.superres.module import GREY_ID
from tests.task_modules import superres_module

TINY = {"d_model": 16, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1, "d_ff": 32, "window": 16}


def pairs(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(src (n, 192), tgt (n, 3072)) tokens of random images."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 259, (n, 192), generator=g), torch.randint(3, 259, (n, 3072), generator=g)


def test_nearest_upsample_repeats_each_pixel_over_its_block():
    low = torch.arange(2 * 2 * 3, dtype=torch.uint8).reshape(1, 2, 2, 3)
    up = nearest_upsample(low, 4)
    assert up.shape == (1, 8, 8, 3)
    assert torch.equal(up[0, 5, 2], low[0, 1, 0]) and torch.equal(up[0, 3, 7], low[0, 0, 1])


def test_a_model_that_ignores_its_source_has_no_gap():
    torch.manual_seed(0)
    model = superres_module(**TINY, tie_output_to_source=False, share_embeddings=True,
                            image={"direct_conditioning": False}).model.eval()
    with torch.no_grad():
        for layer in model.decoder.layers:  # cross-attention contributes nothing: the source is unread
            layer.cross_attn.o_proj.weight.zero_()
            layer.cross_attn.o_proj.bias.zero_()
    src, tgt = pairs(3)
    d = conditioning_diagnostic(model, src, tgt, GREY_ID, batch_size=2)
    assert d["cond/gap_rolled"] == pytest.approx(0.0, abs=1e-6)
    assert d["cond/gap_constant"] == pytest.approx(0.0, abs=1e-6)
    assert d["cond/loss_true"] > 0
    expected_truth = float((tgt[:, 1:] == tgt[:, :-1]).sum()) / tgt.numel()
    assert d["cond/repeat_share_truth"] == pytest.approx(expected_truth)


def test_direct_conditioning_reads_the_source_without_cross_attention():
    torch.manual_seed(0)
    model = superres_module(**TINY).model.eval()
    with torch.no_grad():
        for layer in model.decoder.layers:
            layer.cross_attn.o_proj.weight.zero_()
            layer.cross_attn.o_proj.bias.zero_()
    d = conditioning_diagnostic(model, *pairs(3), GREY_ID)
    assert abs(d["cond/gap_rolled"]) > 1e-4 and abs(d["cond/gap_constant"]) > 1e-4


def test_tied_output_repeats_its_input_at_initialization_and_untied_does_not():
    """The issue's finding: with the shared, tied embedding the top prediction copies the input token."""
    src, tgt = pairs(2)
    shares = {}
    for tie in (True, False):
        torch.manual_seed(0)
        model = superres_module(d_model=64, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, window=16,
                                tie_output=tie, tie_output_to_source=False, share_embeddings=True,
                                image={"direct_conditioning": False}, smooth_intensities=False).model.eval()
        shares[tie] = conditioning_diagnostic(model, src, tgt, GREY_ID)["cond/repeat_share"]
    assert shares[True] > 0.9 and shares[False] < 0.1


def test_one_image_cannot_be_rolled():
    model = superres_module(**TINY).model.eval()
    with pytest.raises(ValueError, match="at least 2 images"):
        conditioning_diagnostic(model, *pairs(1), GREY_ID)


def test_smooth_intensity_init_keeps_the_untied_output_from_repeating_its_input():
    """Neighbouring intensities start alike, and the output layer's smooth basis is rotated away from the
    decoder's input embedding, so the untrained model does not copy its last token: with an untied
    output layer, and with the default source_output (the output is the source embedding)."""
    cos = torch.nn.functional.cosine_similarity
    for source_output in (False, True):
        torch.manual_seed(0)
        untied = {} if source_output else {"tie_output_to_source": False, "share_embeddings": True}
        module = superres_module(d_model=64, n_heads=4, n_encoder_layers=1, n_decoder_layers=1, d_ff=64, window=16,
                                 **untied)
        out = module.model.output_layer()[0].detach()[3:]  # (256, D)
        emb = module.model.tgt_embed.weight.detach()[3:]  # (256, D)
        assert cos(emb[100], emb[101], dim=0) > 0.8 and cos(out[100], out[101], dim=0) > 0.8
        assert abs(float(cos(emb[100], out[100], dim=0))) < 0.5
        assert conditioning_diagnostic(module.model.eval(), *pairs(2), GREY_ID)["cond/repeat_share"] < 0.1
