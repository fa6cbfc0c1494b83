"""Own head priors: heads 2..k read out through their own copy of the Gaussian output's shift-and-width layer
(``head_prior: own``) or through the prior's layer detached plus their own correction (``residual``), so their
losses cannot move p_1's mean."""

import pytest
import torch

from lightning_bpd.decoding import blockwise_decode, blockwise_decode_reference
from lightning_bpd.decoding.acceptance import parse_criterion
from lightning_bpd.inference import build_runtime
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.nn.warm_start import base_detached, freeze_base, load_base_weights
from tests.inference.test_image_chain import link_by_link
from tests.models import assert_close_to_rounding, random_model
from tests.nn.test_head_centres import assert_exact_decoding_is_the_reference_and_greedy
from tests.nn.test_intensity_prior import IMAGE
from tests.nn.test_pixel_neighbours import K, sources


def own_prior_model(head_type: str = "chained", neighbours: bool = True, seed: int = 3,
                    kind: str = "own") -> BlockwiseTransformer:
    """A random Gaussian-output image model whose heads' shift-and-width layer differs from p_1's."""
    model = random_model(k=K, vocab=20, seed=seed, window=16, intensity_prior=2.0, intensity_output="gaussian",
                         head_type=head_type, head_centres="own", head_neighbours=neighbours, head_prior=kind,
                         conditioning="bilinear", **IMAGE)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if "neighbours" in name else 0.1))
        torch.nn.init.normal_(model.prior.adapt.weight, std=0.05, generator=g)
    return model


def test_heads_read_out_through_their_own_layer_and_p1_through_the_priors():
    """Changing the heads' layer changes heads 2..k's logits and leaves p_1's; slot 0 of ``logits_heads`` is
    ``logits_first``; a model whose heads' layer equals the prior's reads out as a shared-prior model does."""
    model = own_prior_model()
    src = sources(2)
    tgt_in = torch.randint(3, 20, (2, 40), generator=torch.Generator().manual_seed(4))
    prev = torch.randint(3, 20, (2, 40, K - 1), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        hidden = model.decode_full(tgt_in, model.encode(src))
        before = model.logits_heads(hidden, range(K), prev)  # (2, 40, K, V)
        assert_close_to_rounding(before[..., 0, :], model.logits_first(hidden))  # 4x the rows through the output layer
        model.head.prior_adapt.weight.mul_(2.0)
        after = model.logits_heads(hidden, range(K), prev)
        assert torch.equal(after[..., 0, :], before[..., 0, :])
        assert not torch.equal(after[..., 1:, :], before[..., 1:, :])
        shared = random_model(k=K, vocab=20, seed=3, window=16, intensity_prior=2.0, intensity_output="gaussian",
                              head_type="chained", head_centres="own", head_neighbours=True, conditioning="bilinear",
                              **IMAGE)
        state = {key: value for key, value in model.state_dict().items() if not key.startswith("head.prior_adapt")}
        shared.load_state_dict(state)
        model.head.prior_adapt.load_state_dict(model.prior.adapt.state_dict())
        torch.testing.assert_close(model.logits_heads(hidden, range(K), prev), shared.logits_heads(hidden, range(K), prev),
                                   rtol=0, atol=0)


@pytest.mark.parametrize(("head_type", "kind"), [
    ('chained', 'own'),
    pytest.param('chained', 'residual', marks=pytest.mark.slow),
    pytest.param('chained_attn', 'own', marks=pytest.mark.slow),
    ('chained_attn', 'residual')])  # the rest of the product: -m slow
def test_decoding_with_an_own_head_prior_is_the_reference_and_greedy(head_type, kind):
    """Exact blockwise decoding equals the uncached reference and greedy; eps=2 equals the reference; the whole
    scripted chain proposes what the links one by one propose (it takes the heads' layer, not the prior's)."""
    model = own_prior_model(head_type, kind=kind)
    src = sources()
    assert_exact_decoding_is_the_reference_and_greedy(model, src)
    eps = parse_criterion("eps2")
    assert blockwise_decode(model, src, eps, 192).block_sizes == blockwise_decode_reference(model, src, eps, 192).block_sizes
    tgt_in = torch.randint(3, 20, (3, 100), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        context = model.encode(src)
        source = model.chain_source(context)
        hidden = model.decode_full(tgt_in, context)
        runtime = build_runtime(model)
        for t in range(0, 100, 9):
            whole = runtime.chain_drafts(hidden[:, t], tgt_in[:, t], K, source)
            assert whole is not None and torch.equal(whole, link_by_link(runtime, hidden[:, t], tgt_in[:, t], K, source))


def test_the_chain_step_by_step_equals_the_teacher_forced_chain():
    model = own_prior_model("chained_attn")
    src = sources(2)
    tgt_in = torch.randint(3, 20, (2, 60), generator=torch.Generator().manual_seed(4))
    context = model.encode(src)
    source = model.chain_source(context)
    with torch.no_grad():
        for t in (7, 30, 52):
            hidden = model.decode_full(tgt_in, context)[:, t]
            tokens = torch.randint(3, 20, (2, K - 1), generator=torch.Generator().manual_seed(t))
            whole = model.logits_heads(hidden, range(K), tokens, source)
            z = hidden
            for i in range(1, K):
                z, logits = model.chain_step(z, tokens[:, i - 1], i, source)
                assert_close_to_rounding(logits, whole[:, i])  # logits ~1e3: 1e-12 was an ulp


@pytest.mark.parametrize("kind", ["own", "residual"])
def test_heads_losses_reach_their_own_layer_and_not_the_priors(kind):
    """With the base detached (``detach_heads: base``) a loss on heads 2..k trains the heads' layer, not the
    prior's; without the detach it reaches the decoder but still not the prior's layer."""
    model = own_prior_model(kind=kind).train()
    src = sources(2)
    tgt_in = torch.randint(3, 20, (2, 30), generator=torch.Generator().manual_seed(4))
    prev = torch.randint(3, 20, (2, 30, K - 1), generator=torch.Generator().manual_seed(6))
    for detached in (True, False):
        model.zero_grad(set_to_none=True)
        hidden = model.decode_full(tgt_in, model.encode(src))
        if detached:
            with base_detached(model):
                logits = model.logits_heads(hidden.detach(), range(1, K), prev)
        else:
            logits = model.logits_heads(hidden, range(1, K), prev)
        logits.logsumexp(-1).sum().backward()
        assert model.prior.adapt.weight.grad is None
        assert model.head.prior_adapt.weight.grad is not None and model.head.prior_adapt.weight.grad.abs().sum() > 0
        reached = model.decoder.layers[0].ff.net[0].weight.grad
        assert (reached is None) == detached


def test_the_heads_layer_is_a_head_weight_that_starts_as_the_bases():
    """A frozen base trains it with the heads; a base checkpoint warm-starts it as a copy of the prior's layer."""
    model = own_prior_model()
    freeze_base(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert "head.prior_adapt.weight" in trainable and all(name.startswith("head.") for name in trainable)
    base = random_model(k=1, vocab=20, seed=7, window=16, intensity_prior=2.0, intensity_output="gaussian",
                        head_centres="own", head_prior="own", conditioning="bilinear", **IMAGE)
    with torch.no_grad():
        torch.nn.init.normal_(base.prior.adapt.weight, std=0.05)
    fresh = load_base_weights(model, base.state_dict())
    assert "head.prior_adapt.weight" in fresh
    assert torch.equal(model.head.prior_adapt.weight, base.prior.adapt.weight)
    assert torch.equal(model.head.prior_adapt.bias, base.prior.adapt.bias)


def test_bad_head_prior_options_are_one_clear_error():
    base = dict(src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=4, k=K, intensity_prior=2.0,
                head_type="chained", head_centres="own", **IMAGE)
    with pytest.raises(ValueError, match="head_prior must be one of"):
        ModelConfig.from_dict({**base, "head_prior": "mine"})
    with pytest.raises(ValueError, match="needs intensity_output 'gaussian' and head_centres 'own'"):
        ModelConfig.from_dict({**base, "head_prior": "own"})  # categorical output
    with pytest.raises(ValueError, match="head_prior 'residual' gives the heads"):
        ModelConfig.from_dict({**base, "head_prior": "residual"})
    with pytest.raises(ValueError, match="needs intensity_output 'gaussian' and head_centres 'own'"):
        ModelConfig.from_dict({**base, "head_prior": "own", "intensity_output": "gaussian", "head_centres": "first"})
    k1 = BlockwiseTransformer(ModelConfig.from_dict({**base, "k": 1, "head_prior": "own"}))  # a base ignores it
    assert k1.image.head_shift() is None


def test_a_residual_head_prior_follows_the_priors_layer_plus_its_correction():
    """It starts at zero, so the heads read out as a shared-prior model's; a change of the prior's layer moves
    heads 2..k along with p_1; its correction moves heads 2..k alone; a warm start leaves it at zero."""
    model = own_prior_model(kind="residual")
    with torch.no_grad():
        model.head.prior_adapt.weight.zero_()
        model.head.prior_adapt.bias.zero_()
    src = sources(2)
    tgt_in = torch.randint(3, 20, (2, 40), generator=torch.Generator().manual_seed(4))
    prev = torch.randint(3, 20, (2, 40, K - 1), generator=torch.Generator().manual_seed(6))
    shared = random_model(k=K, vocab=20, seed=3, window=16, intensity_prior=2.0, intensity_output="gaussian",
                          head_type="chained", head_centres="own", head_neighbours=True, conditioning="bilinear", **IMAGE)
    shared.load_state_dict({key: v for key, v in model.state_dict().items() if not key.startswith("head.prior_adapt")})
    with torch.no_grad():
        hidden = model.decode_full(tgt_in, model.encode(src))
        start = model.logits_heads(hidden, range(K), prev)
        torch.testing.assert_close(start, shared.logits_heads(hidden, range(K), prev), rtol=0, atol=0)
        model.prior.adapt.weight.mul_(2.0)
        follows = model.logits_heads(hidden, range(K), prev)
        assert not torch.equal(follows[..., 0, :], start[..., 0, :]) and not torch.equal(follows[..., 1:, :],
                                                                                          start[..., 1:, :])
        model.head.prior_adapt.weight.normal_(std=0.05)
        corrected = model.logits_heads(hidden, range(K), prev)
        assert torch.equal(corrected[..., 0, :], follows[..., 0, :])
        assert not torch.equal(corrected[..., 1:, :], follows[..., 1:, :])
    base = random_model(k=1, vocab=20, seed=7, window=16, intensity_prior=2.0, intensity_output="gaussian",
                        head_centres="own", conditioning="bilinear", **IMAGE)
    with torch.no_grad():
        torch.nn.init.normal_(base.prior.adapt.weight, std=0.05)
    fresh = BlockwiseTransformer(ModelConfig.from_dict({**shared.config.__dict__, "head_prior": "residual"})).double()
    assert "head.prior_adapt.weight" in load_base_weights(fresh, base.state_dict())
    assert not fresh.head.prior_adapt.weight.any() and not fresh.head.prior_adapt.bias.any()
    assert torch.equal(fresh.image.head_shift()[0], base.prior.adapt.weight)
