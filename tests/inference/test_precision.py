import pytest
import torch
import torch.nn.functional as F

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.decoding.proposers.heads import chain_tokens
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.precision import model_dtype, parse_precision
from lightning_bpd.kernels import int8
from lightning_bpd.kernels.fast_linear import linear
from tests.models import float32_model, random_model, random_sources


def test_parse_precision_names_and_aliases():
    assert parse_precision("bf16") == parse_precision("bfloat16") == torch.bfloat16
    assert parse_precision("FP32") == torch.float32
    with pytest.raises(ValueError, match="unknown precision 'half'.*float32, bfloat16, float64"):
        parse_precision("half")


@pytest.mark.hardware
@pytest.mark.parametrize("shape", [(768, 256), (1024, 256), (256, 1024), (8000, 256)])
def test_bfloat16_products_are_batch_invariant(shape):
    """What exact decoding in bfloat16 rests on: row r of a product of n rows is bitwise the row of a
    1-row product, for every n a verify pass (k tokens x batch) can have."""
    g = torch.Generator().manual_seed(shape[0])
    w = torch.randn(*shape, generator=g).bfloat16()
    b = torch.randn(shape[0], generator=g).bfloat16()
    x = torch.randn(96, shape[1], generator=g).bfloat16()
    one = torch.cat([F.linear(x[i : i + 1], w, b) for i in range(96)])
    for n in (2, 4, 8, 9, 16, 32, 33, 64, 96):
        assert torch.equal(linear(x[:n], w, b), one[:n]), n


def test_a_runtime_casts_its_snapshot_and_leaves_the_model_bitwise():
    model = random_model(k=3).float()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    runtime = build_runtime(model, InferenceOptions(precision="bfloat16"))
    assert model_dtype(runtime.model) == torch.bfloat16 and runtime.precision == "bfloat16"
    after = model.state_dict()
    assert all(torch.equal(before[n], after[n]) and after[n].dtype == before[n].dtype for n in before)
    assert model_dtype(build_runtime(model).model) == torch.float32


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_exact_equals_greedy_in_bfloat16(head_type):
    """Decoded in bfloat16, exact blockwise decoding reproduces bfloat16 greedy decoding token for token,
    batched and one row at a time, on a model whose argmaxes have clear margins (bfloat16 near-ties can
    break differently in the verify pass and the greedy step: the fused attention is not batch-invariant,
    see lightning_bpd.inference.precision; how often that happens on real data is measured by bench)."""
    model = random_model(k=4, vocab=40, seed=3, head_type=head_type).float()
    with torch.no_grad():
        model.tgt_embed.weight.mul_(30)  # wide logit margins
    model.eos_id = 5
    model = build_runtime(model, InferenceOptions(precision="bf16"))
    src = random_sources(8, vocab=40, seed=4)
    greedy = greedy_decode(model, src, 24)
    assert blockwise_decode(model, src, Exact(), 24).sequences() == greedy.sequences()
    assert [blockwise_decode(model, row[None], Exact(), 24).sequences()[0] for row in src] == greedy.sequences()


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_bfloat16_proposals_keep_float32_decoding_exact(head_type):
    model = random_model(k=4, vocab=40, seed=5, head_type=head_type).float()
    model.eos_id = 5
    src = random_sources(8, vocab=40, seed=6)
    greedy = greedy_decode(model, src, 24).sequences()
    full = blockwise_decode(model, src, Exact(), 24)
    runtime = build_runtime(model, InferenceOptions(proposal_precision="bfloat16"))
    assert runtime.proposer.proposal is not None and model_dtype(runtime.model) == torch.float32
    assert not any("proposal" in name for name in runtime.model.state_dict())
    cheap = blockwise_decode(runtime, src, Exact(), 24)
    assert cheap.sequences() == full.sequences() == greedy
    assert build_runtime(model, InferenceOptions(proposal_precision="float32")).proposer.proposal is None  # no copy


def test_bfloat16_chain_proposes_what_the_float32_chain_proposes_on_clear_margins():
    """The bfloat16 copy is the same function up to rounding: on a trained-like chain (clear argmaxes)
    it proposes the same tokens."""
    model = random_model(k=5, vocab=40, seed=7, head_type="chained_attn").float()
    with torch.no_grad():
        model.tgt_embed.weight.mul_(30)  # wide logit margins
    src = random_sources(6, vocab=40, seed=8)
    context = model.encode(src)
    h = model.decode_full(torch.ones(6, 1, dtype=torch.long), context)[:, -1]
    first = model.project(h).argmax(-1)
    with torch.no_grad():
        want = chain_tokens(build_runtime(model), Exact(), h, 5, first, model.chain_source(context)).tokens
        cheap = build_runtime(model, InferenceOptions(proposal_precision="bfloat16"))
        got = chain_tokens(cheap, Exact(), h, 5, first, model.chain_source(context)).tokens
    assert (got == want).float().mean() >= 0.9


@pytest.mark.skipif(not int8.available(), reason="no fbgemm/x86 quantized engine")
@pytest.mark.parametrize("draft", [False, True])
@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_int8_proposals_keep_float32_decoding_exact_and_propose_like_float32(head_type, draft):
    """int8 proposals (chain links and projection) change what is proposed only by rounding: decoding stays
    greedy's output, and the blocks stay long."""
    model = float32_model(5, head_type)
    model.eos_id = 5
    src = random_sources(8, vocab=40, seed=6)
    greedy = greedy_decode(model, src, 24).sequences()
    if draft:  # the tokens greedy emits and a few more: 20 of the 40
        used = sorted({t for row in greedy for t in row})
        model.set_draft_ids(torch.tensor(used + [t for t in range(40) if t not in used][: 20 - len(used)]))
    full = blockwise_decode(model, src, Exact(), 24)
    runtime = build_runtime(model, InferenceOptions(proposal_precision="int8"))
    assert runtime.proposer.proposal is not None and runtime.proposer.int8
    assert model_dtype(runtime.model) == torch.float32
    cheap = blockwise_decode(runtime, src, Exact(), 24)
    assert cheap.sequences() == full.sequences() == greedy
    assert cheap.mean_accepted_block_size >= 0.8 * full.mean_accepted_block_size > 1.1
    if model.chained_heads:
        assert runtime.proposer.fused.int8 and runtime.proposer.fused.links[0].int8 is not None


def test_int8_proposals_need_a_float32_model():
    model = random_model(k=2, vocab=40)  # float64
    with pytest.raises(ValueError, match="float32 model"):
        build_runtime(model, InferenceOptions(proposal_precision="int8"))
