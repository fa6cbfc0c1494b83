"""The screened argmax (int8 screen, float64 candidates) against the full float64 projection, and decoding with it."""

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.decoding.reference.greedy import greedy_decode_reference
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.screened_argmax import ScreenedArgmax
from lightning_bpd.kernels import int8
from lightning_bpd.kernels.int8 import int8_linear, pack_int8
from tests.models import float32_model, random_sources
from tests.nn.test_head_centres import image_model

pytestmark = pytest.mark.skipif(not int8.available(), reason="no fbgemm/x86 quantized engine")


def vocabulary(v: int = 3000, d: int = 64, seed: int = 0, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(v, d, generator=g) * d**-0.5
    return w, (torch.randn(v, generator=g) * 0.5 if bias else None)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("peak", [0.0, 1.0, 4.0])
def test_screen_gives_the_float64_argmax(peak, bias):
    """Flat rows (hundreds of candidates) and peaked ones (one): the float64 projection's argmax every time."""
    w, b = vocabulary(bias=bias)
    screen = ScreenedArgmax(w, b)
    g = torch.Generator().manual_seed(1)
    for rows in (1, 3, 8, 33):
        x = torch.randn(rows, 64, generator=g) + peak * w[torch.randint(0, 3000, (rows,), generator=g)] * 8
        assert torch.equal(screen(x), screen.reference(x))
    assert screen.rows == 45 and screen.candidates >= 45
    if peak >= 4.0:
        assert screen.candidates == 45  # peaked rows leave the winner alone: no float64 at all
    if peak == 0.0:
        assert screen.candidates > 45 * 5  # flat rows leave many: the float64 step decides


def test_ties_go_to_the_lowest_id_and_near_ties_to_the_float64_winner():
    w, _ = vocabulary(v=500, bias=False)
    w[400] = w[7]  # an exact tie: the lower id wins, as argmax's
    w[300] = w[100]
    w[300, 0] = torch.nextafter(w[100, 0], w[100, 0] * 2)  # one ulp further from 0: a near-tie float64 resolves
    screen = ScreenedArgmax(w)
    x = torch.stack([w[7] * 10, w[100].sign()])  # rows pointing at the tied pairs (row 2: every product >= 0)
    assert screen(x).tolist() == [7, 300] == screen.reference(x).tolist()


def test_a_row_gets_the_same_token_alone_and_in_any_batch():
    """The verify pass (k rows) and the greedy step (1 row) must agree: the screen is batch-invariant."""
    w, b = vocabulary()
    screen = ScreenedArgmax(w, b)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(16, 64, generator=g) * torch.logspace(-2, 2, 16)[:, None]  # rows of very different scales
    alone = torch.cat([screen(x[i : i + 1]) for i in range(16)])
    assert torch.equal(screen(x), alone) and torch.equal(screen(x.view(4, 4, 64)).flatten(), alone)


def test_int8_product_is_close_to_float32():
    w, b = vocabulary(v=100)
    x = torch.randn(5, 64)
    out = int8_linear(x, pack_int8(w, b), 100)
    torch.testing.assert_close(out, x @ w.t() + b, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_decoding_with_the_screen_exact_equals_greedy_and_the_reference(head_type):
    model = float32_model(4, head_type)
    src = random_sources(6, vocab=40)
    plain = greedy_decode(model, src, 24)
    runtime = build_runtime(model, InferenceOptions(screened_argmax=True))
    greedy = greedy_decode(runtime, src, 24)
    assert torch.equal(greedy.tokens, greedy_decode_reference(model, src, 24).tokens)
    assert torch.equal(greedy.tokens, plain.tokens)  # no near-tie here: the float32 argmax's output
    for lazy in (False, True):
        out = blockwise_decode(runtime, src, Exact(), 24, lazy=lazy)
        assert torch.equal(out.tokens, greedy.tokens)
    assert runtime.proposer.screen is not None and runtime.proposer.screen.rows > 0
    assert max(max(sizes) for sizes in out.block_sizes) > 1


def test_the_screen_is_made_from_the_runtimes_snapshot():
    model = float32_model(4, "chained")
    h = torch.randn(3, 32)
    with torch.no_grad():
        before = build_runtime(model, InferenceOptions(screened_argmax=True)).argmax_first(h)
        model.tgt_embed.weight.mul_(-1)  # in place: the output layer (tied) flips every logit
        after = build_runtime(model, InferenceOptions(screened_argmax=True)).argmax_first(h)
    assert torch.equal(after, model.logits_first(h).argmax(-1)) and not torch.equal(before, after)


def test_image_models_with_a_prior_are_refused_with_a_clear_message():
    model = image_model("own", "chained", "gaussian")
    with pytest.raises(ValueError, match="plain vocabulary projection"):
        build_runtime(model, InferenceOptions(screened_argmax=True))
