"""The intensity prior: a Gaussian around the input intensity, carried by two reserved hidden coordinates."""

import math

import pytest
import torch

from lightning_bpd.decoding import (
    Exact,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    greedy_decode_reference,
)
from lightning_bpd.nn.intensity_prior import IntensityPrior
from tests.models import random_model

IMAGE = {"src_image_shape": (2, 2, 3), "tgt_image_shape": (8, 8, 3), "eos_id": None, "src_positions": "grid",
         "tgt_positions": "grid", "tie_output": False, "tie_output_to_source": True, "share_embeddings": False,
         "direct_conditioning": True}


def test_the_prior_adds_a_gaussian_around_the_centre_to_the_logits():
    """Reserved coordinates (u(c), -1/2) times the fixed columns: -precision / 2 (u(v) - u(c))^2 plus a
    constant per position; ids that are no intensity score below every intensity."""
    prior = IntensityPrior(vocab_size=12, offset=3, levels=9, sigma=2.0).double()
    assert prior.sigma == pytest.approx(2.0)
    ids = torch.tensor([[3, 7, 11]])  # (1, 3): the lowest, the middle and the highest intensity
    centre = prior.centres(ids)
    torch.testing.assert_close(centre, torch.tensor([[-1.0, 0.0, 1.0]], dtype=torch.float64))
    hidden = prior.mark(torch.randn(1, 3, 5, dtype=torch.float64), centre)  # (1, 3, 5)
    logits = (hidden[..., -2:] @ prior.columns().T).detach()  # (1, 3, V): the prior's share of the logits
    levels = torch.arange(9, dtype=torch.float64)
    for t, c in enumerate([0, 4, 8]):
        gauss = -((levels - c) ** 2) / (2 * 2.0**2)  # in intensity levels, sigma 2
        shift = logits[0, t, 3:] - gauss
        torch.testing.assert_close(shift, shift[:1].expand(9), rtol=0, atol=1e-6)  # equal up to a constant (float32 init)
        assert float(logits[0, t, :3].max()) < float(logits[0, t, 3:].min())


def test_a_narrow_prior_makes_greedy_decoding_return_the_conditioning_intensities():
    """With a width of a tenth of a level the prior outweighs the random network: greedy decoding (cached,
    and the uncached reference) writes the input intensity that direct conditioning adds at each pixel."""
    model = random_model(k=2, vocab=20, intensity_prior=0.1, conditioning="bilinear", **IMAGE)
    src = torch.randint(3, 20, (2, 12), generator=torch.Generator().manual_seed(0))
    out = greedy_decode(model, src, 192)
    assert torch.equal(out.tokens, model.image.conditioning_ids(src))
    assert torch.equal(out.tokens, greedy_decode_reference(model, src, 192).tokens)


@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_blockwise_decoding_with_a_prior_equals_the_reference(head_type):
    model = random_model(k=3, vocab=20, seed=3, window=16, intensity_prior=2.0, head_type=head_type, **IMAGE)
    src = torch.randint(3, 20, (3, 12), generator=torch.Generator().manual_seed(1))
    out = blockwise_decode(model, src, Exact(), 192)
    ref = blockwise_decode_reference(model, src, Exact(), 192)
    assert torch.equal(out.tokens, ref.tokens) and out.block_sizes == ref.block_sizes


def test_the_precision_is_learned_and_the_output_layer_keeps_its_other_columns():
    model = random_model(k=1, vocab=20, intensity_prior=4.0, **IMAGE)
    weight, _ = model.output_layer()
    torch.testing.assert_close(weight[:, :-2], model.src_embed.weight[:, :-2], rtol=0, atol=0)
    assert model.prior.log_precision.requires_grad
    assert model.prior.log_precision.item() == pytest.approx(2 * math.log(8 / 4.0))  # 17 levels: half = 8
    src = torch.randint(3, 20, (2, 12))
    tgt_in = torch.randint(3, 20, (2, 30))
    model.logits_first(model(src, tgt_in)).logsumexp(-1).sum().backward()
    assert model.prior.log_precision.grad is not None and float(model.prior.log_precision.grad) != 0.0


def test_a_gaussian_output_is_a_discretized_gaussian_around_the_predicted_mean():
    """``intensity_output: gaussian``: over the intensities the logits are exactly quadratic, peaked at
    u(c) + delta with precision P exp(-2 rho) (delta, rho from the predicted shift and width); every other
    id scores lower; an untrained model (delta = rho = 0) decodes the conditioning intensities."""
    model = random_model(k=2, vocab=20, intensity_prior=2.0, intensity_output="gaussian", conditioning="bilinear",
                         identity_first=True, **IMAGE)  # p_1 reads the decoder state itself
    src = torch.randint(3, 20, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # as initialized (random_model scrambles every matrix)
        torch.nn.init.zeros_(model.prior.adapt.weight)
        torch.nn.init.zeros_(model.prior.adapt.bias)
    assert torch.equal(greedy_decode(model, src, 192).tokens, model.image.conditioning_ids(src))
    with torch.no_grad():
        torch.nn.init.normal_(model.prior.adapt.weight, std=0.05)
        torch.nn.init.normal_(model.prior.adapt.bias, std=0.05)
    tgt_in = torch.randint(3, 20, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden = model(src, tgt_in)  # (2, 40, D)
        logits = model.logits_first(hidden)  # (2, 40, 20)
        delta, rho = model.prior.adapt(model.decoder(  # the decoder's own output before marking
            model.embed_tgt(tgt_in, torch.arange(40).expand(2, -1), model.encode(src)), model.encode(src)
        )[..., :-2]).unbind(-1)
    prior = model.prior
    centre = prior.centres(model.image.conditioning_ids(src))[:, :40] + delta  # (2, 40)
    precision = prior.log_precision.exp() * torch.exp(-2 * rho)
    u = prior.features[3:, 0]  # (17,)
    gauss = -precision[..., None] / 2 * (u - centre[..., None]) ** 2  # (2, 40, 17)
    shift = logits[..., 3:] - gauss
    torch.testing.assert_close(shift, shift[..., :1].expand_as(shift), rtol=0, atol=1e-9)
    assert bool((logits[..., :3].amax(-1) < logits[..., 3:].amin(-1)).all())
    assert torch.equal(logits[..., 3:].argmax(-1), (u - centre[..., None]).abs().argmin(-1))  # mode = nearest to mean
    out = blockwise_decode(model, src, Exact(), 192)
    assert torch.equal(out.tokens, blockwise_decode_reference(model, src, Exact(), 192).tokens)
    # in float64 the k-token verify pass and the 1-token step agree: exact acceptance is greedy (in float32
    # a mean near a half level can round either way, see README)
    assert torch.equal(out.tokens, greedy_decode(model, src, 192).tokens)


def test_bad_prior_arguments():
    with pytest.raises(ValueError, match="sigma must be > 0"):
        IntensityPrior(10, 3, 7, 0.0)
    for offset, levels in [(3, 8), (9, 1), (-1, 5)]:
        with pytest.raises(ValueError, match="do not fit"):
            IntensityPrior(10, offset, levels, 2.0)


def test_the_gaussian_argmax_is_the_intensity_nearest_its_mean():
    """``nearest`` (the chained image heads' proposals) gives the argmax of the full projection of the marked
    state, for means inside the intensity range and beyond both ends (clamped)."""
    from tests.nn.test_head_centres import image_model

    model = image_model("own", "chained", "gaussian", sigma=3.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.prior.adapt.weight.copy_(torch.randn(model.prior.adapt.weight.shape, generator=g, dtype=torch.float64))
    states = torch.randn(500, 32, generator=g, dtype=torch.float64)
    ids = torch.randint(3, 20, (500,), generator=g)
    centres = model.prior.centres(ids)
    full = model.project(model.image.readout(states, centres)).argmax(-1)
    assert torch.equal(model.prior.nearest(states, centres), full)
    assert {3, 19} <= set(full.tolist())  # both ends reached
