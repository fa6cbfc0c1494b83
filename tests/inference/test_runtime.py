"""The inference runtime: built once from explicit options, no process-wide precision state."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.products import Int8Products, WideProducts
from lightning_bpd.nn import int8
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
    assert len(runtime.products.packed) == len(linears) > 0


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


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_the_runtime_declares_every_optional_member_as_its_snapshots(head_type):
    """The decoding core reads the optional members directly (no probing): the runtime has each of them, the
    snapshot's own, and not through ``__getattr__``."""
    runtime = build_runtime(float32_model(seed=3, head_type=head_type))
    for name in OptionalCapabilities.__annotations__:
        assert name in dir(type(runtime)) or name in vars(runtime), name
        assert getattr(runtime, name) == getattr(runtime.model, name), name
    assert runtime.chained_heads == (head_type == "chained_attn") and runtime.vocab_size == 40
