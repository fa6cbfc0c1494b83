"""The inference runtime: built once from explicit options, no process-wide precision state."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.product_kinds import Int8Products, PackedProducts, WideProducts
from lightning_bpd.kernels import int8, onednn
from lightning_bpd.nn.products import FLOAT
from tests.models import float32_model, random_sources

MAX_LEN = 12


def decode_both(model, src):
    with torch.no_grad():
        return greedy_decode(model, src, MAX_LEN).sequences(), blockwise_decode(model, src, Exact(), MAX_LEN).sequences()


@pytest.mark.skipif(not int8.available(), reason="needs torch's fbgemm/x86 quantized engine")
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_a_float32_and_an_int8_runtime_decode_interleaved_as_they_do_alone(head_type):
    model = float32_model(seed=3, head_type=head_type)
    src = random_sources(5, vocab=40, seed=2)
    alone_f = decode_both(build_runtime(model, InferenceOptions()), src)
    alone_i = decode_both(build_runtime(model, InferenceOptions(precision="int8")), src)
    fp, i8 = build_runtime(model, InferenceOptions()), build_runtime(model, InferenceOptions(precision="int8"))
    for _ in range(2):  # interleaved, call by call
        assert decode_both(i8, src) == alone_i
        assert decode_both(fp, src) == alone_f
    with torch.no_grad():  # interleaved inside one decode: step by step, the int8 one after each float32 one
        ctx_f, ctx_i = fp.encode(src), i8.encode(src)
        cache_f, cache_i = fp.new_cache(src.shape[0], 4), i8.new_cache(src.shape[0], 4)
        bos = torch.full((src.shape[0], 1), model.bos_id)
        h_f, h_i = fp.decode_step(bos, ctx_f, cache_f), i8.decode_step(bos, ctx_i, cache_i)
        ref_f = model.decode_step(bos, model.encode(src), model.new_cache(src.shape[0], 4))
    assert torch.equal(h_f, ref_f)  # the float32 runtime multiplies as the model does
    assert not torch.equal(h_i, ref_f)  # the int8 one does not
    # exact decoding reproduces each runtime's own greedy
    assert alone_i[0] == alone_i[1] and alone_f[0] == alone_f[1]


def test_a_runtime_leaves_the_model_and_its_products_alone():
    model = float32_model(seed=4)
    before = {n: p.detach().clone() for n, p in model.state_dict().items()}
    runtime = build_runtime(model, InferenceOptions(precision="float32-invariant"))
    assert isinstance(runtime.products, WideProducts)
    assert all(m.products is FLOAT for m in model.modules() if hasattr(type(m), "products"))
    assert all(m.products is runtime.products for m in runtime.model.modules() if hasattr(type(m), "products"))
    assert runtime.model is not model and runtime.precision == "float32-invariant"
    src = random_sources(3, vocab=40, seed=5)
    greedy, exact = decode_both(runtime, src)
    assert greedy == exact
    assert all(torch.equal(before[n], p) for n, p in model.state_dict().items())
    assert model.training == float32_model(seed=4).training  # its mode untouched


@pytest.mark.skipif(not int8.available(), reason="needs torch's fbgemm/x86 quantized engine")
def test_the_int8_runtime_packs_every_linear_when_it_is_built():
    model = float32_model(seed=6)
    runtime = build_runtime(model, InferenceOptions(precision="int8"))
    assert isinstance(runtime.products, Int8Products)
    linears = [m for m in runtime.model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(runtime.products.copies) == len(linears) + 1 > 1  # and the (tied) vocabulary projection


def test_a_model_decodes_directly_in_its_own_dtype_with_plain_products():
    model = float32_model(seed=7).double()
    runtime = build_runtime(model, InferenceOptions(precision="float32"))
    assert runtime.model.tgt_embed.weight.dtype == torch.float32 and model.tgt_embed.weight.dtype == torch.float64
    src = random_sources(2, vocab=40, seed=8)
    greedy, exact = decode_both(model, src)
    assert greedy == exact


@pytest.mark.parametrize("options, message", [
    ({"precision": "fp16"}, "unknown precision"),
    ({"proposal_precision": "int4"}, "unknown precision"),
    ({"stop_below": 1.5}, "stop_below"),
])
def test_bad_options_are_one_clear_error(options, message):
    with pytest.raises(ValueError, match=message):
        InferenceOptions(**options)


def test_options_are_frozen():
    options = InferenceOptions(precision="fp32i")
    assert options.precision == "float32-invariant"
    with pytest.raises(AttributeError):
        options.precision = "int8"  # type: ignore[misc]


needs_onednn = pytest.mark.skipif(not onednn.available(), reason="needs torch's oneDNN packed-linear ops")


@needs_onednn
def test_the_packed_runtime_multiplies_like_float32_up_to_rounding_and_its_lean_step_like_its_modules():
    model = float32_model(seed=9, head_type="chained_attn")
    src = random_sources(4, vocab=40, seed=9)
    runtime = build_runtime(model, InferenceOptions(precision="float32-packed"))
    assert isinstance(runtime.products, PackedProducts) and runtime.precision == "float32-packed"
    tokens = torch.randint(3, 40, (4, 5), generator=torch.Generator().manual_seed(9))
    outs = {}
    with torch.no_grad():
        for name, m in (("plain", model), ("packed", runtime.model)):
            for lean in (True, False):
                m.use_lean_steps(lean)
                context = m.encode(src)
                cache = m.new_cache(4, 12)
                outs[name, lean] = torch.cat([m.decode_step(tokens[:, :1], context, cache),
                                              m.decode_step(tokens[:, 1:], context, cache)], dim=1)
                m.use_lean_steps(True)
        heads = runtime.logits_heads(outs["packed", True][:, -1], range(4), tokens[:, :3],
                                     runtime.chain_source(runtime.encode(src)))
    assert torch.equal(outs["packed", True], outs["packed", False])  # the same kernels in the same order
    assert not torch.equal(outs["packed", True], outs["plain", True])  # other kernels than MKL's
    torch.testing.assert_close(outs["packed", True], outs["plain", True], rtol=1e-4, atol=1e-4)
    assert heads.shape == (4, 4, 40)


@needs_onednn
@pytest.mark.hardware
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_exact_equals_greedy_in_float32_packed(head_type):
    """What the precision rests on (a property of oneDNN's kernels on this CPU, checked in tests/kernels/test_onednn.py):
    exact blockwise decoding reproduces the packed runtime's greedy decoding, batched and row by row."""
    model = float32_model(seed=10, head_type=head_type)
    model.eos_id = 5
    runtime = build_runtime(model, InferenceOptions(precision="float32-packed"))
    src = random_sources(8, vocab=40, seed=10)
    with torch.no_grad():
        greedy = greedy_decode(runtime, src, 24).sequences()
        assert blockwise_decode(runtime, src, Exact(), 24).sequences() == greedy
        assert [blockwise_decode(runtime, row[None], Exact(), 24).sequences()[0] for row in src] == greedy


def unwrapped(member):
    """A runtime's member without its no-grad wrapper (``torch.no_grad()(fn).__wrapped__``)."""
    return getattr(member, "__wrapped__", member)


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_the_runtime_declares_every_optional_member_as_its_snapshots(head_type):
    """The decoding core reads the optional members directly (no probing): the runtime has each of them, the
    snapshot's own (called without gradients), and not through ``__getattr__``."""
    model = float32_model(seed=3, head_type=head_type)
    runtime = build_runtime(model)
    fast = {"argmax_first", "draft_tokens", "draft_ranks", "chain_draft", "chain_drafts", "chain_ranks"}  # the proposer's
    # the fast paths this head type must offer (the others are None): the proposer's own methods
    chained = ("chain_draft", "chain_drafts", "chain_ranks")
    offers = {"argmax_first", *(chained if head_type == "chained_attn" else ("draft_tokens", "draft_ranks"))}
    assert runtime.proposer is not None
    for name in OptionalCapabilities.__annotations__:
        assert name in dir(type(runtime)) or name in vars(runtime), name
        if name in fast:
            assert getattr(model, name) is None  # the model itself offers only its reference path
            offered = getattr(runtime, name)
            if name in offers:
                assert offered is not None and unwrapped(offered) == getattr(runtime.proposer, name), name
            else:
                assert offered is None, name
        else:
            assert unwrapped(getattr(runtime, name)) == getattr(runtime.model, name), name
    assert (runtime.draft_tokens is None) == (runtime.chain_draft is not None) == (head_type == "chained_attn")
    assert (runtime.draft_ranks is None) == (runtime.chain_ranks is not None) == (head_type == "chained_attn")
    assert runtime.chained_heads == (head_type == "chained_attn") and runtime.vocab_size == 40
