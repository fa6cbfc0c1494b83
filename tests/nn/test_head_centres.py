"""Own centres (``head_centres="own"``): head i's intensity prior sits on the input under the pixel it predicts."""

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, blockwise_decode_reference, greedy_decode, head_agreement
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.tasks.superres.module import LEGACY_HEADS, SuperResolutionModule
from tests.models import assert_close_to_rounding, random_model
from tests.nn.test_intensity_prior import IMAGE
from tests.task_modules import superres_module

K = 4


def image_model(head_centres: str = "own", head_type: str = "paper", output: str = "categorical", sigma: float = 2.0,
                seed: int = 3):
    return random_model(k=K, vocab=20, seed=seed, window=16, intensity_prior=sigma, intensity_output=output,
                        head_type=head_type, head_centres=head_centres, conditioning="bilinear", **IMAGE)


def sources(batch: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 20, (batch, 12), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_with_a_narrow_prior_each_head_proposes_the_input_under_its_own_pixel(head_type):
    """A prior a tenth of a level wide outweighs the random network, so head i's argmax at position t is the
    conditioning intensity under the pixel it is centred on: t + i with own centres, t (every head alike,
    heads 2..k blind to their pixel) with the original design."""
    src = sources()
    tgt_in = torch.randint(3, 20, (3, 40), generator=torch.Generator().manual_seed(2))
    cond = None
    for centres in ["own", "first"]:
        model = image_model(centres, head_type, sigma=0.1)
        cond = model.image.conditioning_ids(src) if cond is None else cond  # (3, 192)
        hidden = model(src, tgt_in)  # (3, 40, D [+ k])
        assert hidden.shape[-1] == 32 + (K if centres == "own" else 0)
        prev = torch.stack([cond[:, j + 1 : j + 41] for j in range(K - 1)], dim=-1) if head_type != "paper" else None
        source = model.chain_source(model.encode(src))
        top = model.logits_heads(hidden, range(K), prev, source).argmax(-1)  # (3, 40, k)
        for i in range(K):
            want = cond[:, i : i + 40] if centres == "own" else cond[:, :40]
            assert torch.equal(top[..., i], want), (centres, i)


@pytest.mark.parametrize(("head_type", "output"), [
    ('paper', 'categorical'),
    pytest.param('paper', 'gaussian', marks=pytest.mark.slow),
    pytest.param('chained', 'categorical', marks=pytest.mark.slow),
    ('chained', 'gaussian'),
    ('chained_attn', 'categorical'),
    pytest.param('chained_attn', 'gaussian', marks=pytest.mark.slow)])  # the rest of the product: -m slow
def test_own_centres_decode_exactly_like_the_reference_and_greedy(head_type, output):
    """The cached decoder with own centres equals the uncached reference (tokens and block sizes), and
    exact acceptance reproduces greedy decoding (float64)."""
    model = image_model("own", head_type, output)
    if output == "gaussian":
        with torch.no_grad():
            torch.nn.init.normal_(model.prior.adapt.weight, std=0.05)
    assert_exact_decoding_is_the_reference_and_greedy(model, sources())


def assert_exact_decoding_is_the_reference_and_greedy(model, src: torch.Tensor, max_len: int = 192) -> None:
    """Cached exact blockwise decoding of ``src`` equals the uncached reference (tokens and block sizes) and
    greedy decoding, and some block is longer than 1; through a runtime's fast proposals."""
    out = blockwise_decode(build_runtime(model), src, Exact(), max_len)
    ref = blockwise_decode_reference(model, src, Exact(), max_len)
    assert torch.equal(out.tokens, ref.tokens) and out.block_sizes == ref.block_sizes
    assert torch.equal(out.tokens, greedy_decode(model, src, max_len).tokens)
    assert max(max(sizes) for sizes in out.block_sizes) > 1


@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
def test_a_chain_step_by_step_equals_the_teacher_forced_chain(head_type):
    """Decoding's link-by-link chain (states carrying their centres) gives the logits that the teacher-forced
    :meth:`logits_heads` gives for the same tokens."""
    model = image_model("own", head_type, "gaussian")
    src, tgt_in = sources(2), torch.randint(3, 20, (2, 30), generator=torch.Generator().manual_seed(4))
    context = model.encode(src)
    hidden = model.decode_full(tgt_in, context)[:, 7]  # (2, D + k): one position per row
    tokens = torch.randint(3, 20, (2, K - 1), generator=torch.Generator().manual_seed(5))
    source = model.chain_source(context)
    whole = model.logits_heads(hidden, range(K), tokens, source)  # (2, k, V)
    z = z_draft = hidden
    runtime = build_runtime(model)
    assert_close_to_rounding(model.logits_first(hidden), whole[:, 0])
    for i in range(1, K):
        z, logits = model.chain_step(z, tokens[:, i - 1], i, source)
        z_draft, token = runtime.chain_draft(z_draft, tokens[:, i - 1], i, source)  # the proposal path
        assert z.shape == z_draft.shape == hidden.shape
        assert_close_to_rounding(logits, whole[:, i])
        assert torch.equal(token, logits.argmax(-1))


def test_bfloat16_proposals_with_own_centres_stay_exact():
    """The proposal copy (bfloat16 heads and output layer) marks its states in the prior's precision; the
    float64 verification keeps the output greedy's."""
    for head_type in ["paper", "chained"]:
        model = image_model("own", head_type, "gaussian")
        src = sources()
        greedy = greedy_decode(model, src, 192).tokens
        out = blockwise_decode(build_runtime(model, InferenceOptions(proposal_precision="bfloat16")), src, Exact(), 192)
        assert torch.equal(out.tokens, greedy) and max(max(s) for s in out.block_sizes) > 1


def test_head_agreement_reads_models_with_own_centres():
    model = image_model("own", "chained", sigma=0.1)
    src = sources()
    out = greedy_decode(model, src, 192)
    agree, scored = head_agreement(model, src, out.tokens, out.lengths)
    assert agree.shape == (K,) and float(scored[1]) > 0 and 0.0 <= float(agree[1] / scored[1]) <= 1.0


def test_checkpoints_from_before_the_option_keep_their_heads_centred_on_p1():
    assert SuperResolutionModule.legacy_hparams({"tie_output": False})["head_centres"] == "first"
    assert "head_centres" not in SuperResolutionModule.legacy_hparams({"head_centres": "own"})
    assert LEGACY_HEADS == {"head_centres": "first", "head_neighbours": False}
    with pytest.raises(ValueError, match="head_centres must be one of"):
        superres_module(image={"head_centres": "mine"})
    with pytest.raises(ValueError, match="head_centres must be one of"):
        image_model("nearest")
