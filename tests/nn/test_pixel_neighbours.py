"""Pixel neighbours (``head_neighbours``): chain links read the decoded intensities around their own pixel."""

import pytest
import torch

from lightning_bpd.decoding import blockwise_decode, blockwise_decode_reference, greedy_decode, head_agreement
from lightning_bpd.decoding.acceptance import parse_criterion
from lightning_bpd.inference import build_runtime
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer
from lightning_bpd.nn.pixel_neighbours import PENDING, PixelNeighbours, neighbour_offsets
from lightning_bpd.nn.warm_start import freeze_base
from tests.models import assert_close_to_rounding, random_model
from tests.nn.test_head_centres import assert_exact_decoding_is_the_reference_and_greedy
from tests.nn.test_intensity_prior import IMAGE

K = 4
SHAPE = IMAGE["tgt_image_shape"]  # (8, 8, 3): a row is 24 intensities


def neighbour_model(head_type: str = "chained", output: str = "gaussian", seed: int = 3, k: int = K):
    model = random_model(k=k, vocab=20, seed=seed, window=16, intensity_prior=2.0, intensity_output=output,
                         head_type=head_type, head_centres="own", head_neighbours=True, conditioning="bilinear", **IMAGE)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():  # links that move the proposals (a fresh reader adds exactly zero)
        for name, p in model.head.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (0.3 if "neighbours" in name else 0.1))
        if output == "gaussian":
            torch.nn.init.normal_(model.prior.adapt.weight, std=0.05, generator=g)
    return model


def sources(batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 20, (batch, 12), generator=torch.Generator().manual_seed(seed))


def test_carried_values_are_the_decoded_neighbours_pending_ones_or_the_own_input():
    """Brute force over every position and head of an 8x8x3 raster: a neighbour inside the image that was
    decoded before the position carries its decoded intensity, one still to come is PENDING, one outside the
    image carries the head's own input intensity; the input values are the inputs under the neighbours."""
    reader = PixelNeighbours(SHAPE, K, 8, 4).double()
    length = 8 * 8 * 3
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 10, (2, length), generator=g)
    decoded = torch.cat([torch.full((2, 1), 99), tokens], dim=1)  # BOS, then y_0 ..
    inputs = torch.rand(2, length, generator=g, dtype=torch.float64) * 2 - 1
    positions = torch.arange(length).expand(2, -1)

    def u(ids):
        return ids.double() / 10

    value, under = reader.split(reader.carried(decoded, positions, inputs, u))  # (2, L, k, n) each
    for p in range(0, length, 5):
        for j in range(K):
            q = min(p + j, length - 1)
            row, col = q // 24, q % 24 // 3
            for n, (delta, dr, dc) in enumerate(neighbour_offsets(SHAPE)):
                inside = 0 <= row + dr < 8 and 0 <= col + dc < 8
                if not inside:
                    want_v = want_u = inputs[:, q]
                else:
                    want_u = inputs[:, q + delta]
                    want_v = u(tokens[:, q + delta]) if q + delta < p else torch.full((2,), PENDING, dtype=torch.float64)
                assert torch.equal(value[:, p, j, n], want_v) and torch.equal(under[:, p, j, n], want_u), (p, j, n)


def test_fill_sets_only_the_pending_neighbours_a_head_token_is():
    reader = PixelNeighbours(SHAPE, K, 8, 4).double()
    carried = torch.full((1, reader.width), PENDING, dtype=torch.float64)
    out = reader.fill(carried, torch.tensor([0.25], dtype=torch.float64), 0)  # head 0's token, at t
    value, _ = reader.split(out)
    # the left neighbour (offset -3) of head 3 is t: only that slot is filled
    assert value[0, 3, 0] == 0.25 and int((value != PENDING).sum()) == 1
    with pytest.raises(RuntimeError, match="not proposed yet"):
        reader.features(carried, 3, torch.zeros(1, dtype=torch.float64))


@pytest.mark.parametrize(("head_type", "output"), [
    ('chained', 'categorical'),
    pytest.param('chained', 'gaussian', marks=pytest.mark.slow),
    pytest.param('chained_attn', 'categorical', marks=pytest.mark.slow),
    ('chained_attn', 'gaussian')])  # the rest of the product: -m slow
def test_neighbour_heads_decode_like_the_reference_and_greedy(head_type, output):
    """Cached blockwise decoding (neighbours from the cache's decoded tokens and the chain's proposals)
    equals the uncached reference (tokens and block sizes) and, exact, greedy decoding."""
    model = neighbour_model(head_type, output)
    src = sources()
    assert_exact_decoding_is_the_reference_and_greedy(model, src)
    eps = parse_criterion("eps2")  # ids are intensities shifted by the offset: the same distances
    assert blockwise_decode(model, src, eps, 192).block_sizes == blockwise_decode_reference(model, src, eps, 192).block_sizes


@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
def test_a_neighbour_chain_step_by_step_equals_the_teacher_forced_chain(head_type):
    """Decoding's link-by-link chain (filling each head's left neighbour from the proposals) gives the logits
    that the teacher-forced :meth:`logits_heads` gives for the same tokens, at positions where the left
    neighbour of a later head is inside the block."""
    model = neighbour_model(head_type)
    src = sources(2)
    tgt_in = torch.randint(3, 20, (2, 60), generator=torch.Generator().manual_seed(4))
    context = model.encode(src)
    source = model.chain_source(context)
    runtime = build_runtime(model)
    for t in (7, 30, 52):
        hidden = model.decode_full(tgt_in, context)[:, t]  # (2, D + carried)
        tokens = torch.randint(3, 20, (2, K - 1), generator=torch.Generator().manual_seed(t))
        whole = model.logits_heads(hidden, range(K), tokens, source)  # (2, k, V)
        z = z_draft = hidden
        for i in range(1, K):
            z, logits = model.chain_step(z, tokens[:, i - 1], i, source)
            z_draft, token = runtime.chain_draft(z_draft, tokens[:, i - 1], i, source)
            assert_close_to_rounding(logits, whole[:, i])  # logits ~1e3: 1e-12 was 4 ulps
            assert torch.equal(token, logits.argmax(-1))


def test_the_neighbours_move_the_proposals():
    """The same model with the neighbour readers' output zeroed proposes differently: the links read them."""
    model = neighbour_model()
    src = sources()
    out = greedy_decode(model, src, 192)
    hidden = model.decode_full(torch.cat([torch.ones(3, 1, dtype=torch.long), out.tokens[:, :-1]], 1),
                               model.encode(src))
    prev = torch.stack([out.tokens[:, j : j + 150] for j in range(1, K)], dim=-1)
    with_them = model.logits_heads(hidden[:, :150], range(K), prev, None).argmax(-1)
    with torch.no_grad():
        for link in model.image.neighbours.links:
            link[2].weight.zero_()
            link[2].bias.zero_()
    without = model.logits_heads(hidden[:, :150], range(K), prev, None).argmax(-1)
    assert torch.equal(with_them[..., 0], without[..., 0])  # p_1 is the base's
    assert not torch.equal(with_them[..., 1:], without[..., 1:])
    agree, scored = head_agreement(model, src, out.tokens, out.lengths)
    assert agree.shape == (K,) and float(scored[-1]) > 0


def test_the_neighbour_readers_are_head_weights():
    """They train with the heads on a frozen base, and a base checkpoint (no head) warm-starts them."""
    model = neighbour_model()
    freeze_base(model)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert any(name.startswith("head.neighbours.") for name in trainable)
    assert all(name.startswith("head.") for name in trainable)


def test_bad_neighbour_options_are_one_clear_error():
    base = dict(src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=4, k=K, intensity_prior=2.0,
                head_centres="own", head_neighbours=True, **IMAGE)
    with pytest.raises(ValueError, match="head_neighbours needs chained heads"):
        ModelConfig.from_dict({**base, "head_type": "paper"})
    with pytest.raises(ValueError, match="head_neighbours needs chained heads"):
        ModelConfig.from_dict({**base, "head_type": "chained", "head_centres": "first"})
    assert BlockwiseTransformer(ModelConfig.from_dict({**base, "head_type": "paper", "k": 1})).image.neighbours is None  # a base
    with pytest.raises(ValueError, match="k <= 24"):
        BlockwiseTransformer(ModelConfig.from_dict({**base, "head_type": "chained", "k": 25}))
