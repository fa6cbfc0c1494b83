"""The scripted decoder step against :meth:`Decoder.step`, its reference: bitwise the same."""

import copy

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.product_kinds import Int8Products, WideProducts
from lightning_bpd.inference.product_swap import use_products
from lightning_bpd.kernels import int8
from lightning_bpd.nn.transformer import lean_applies
from tests.models import random_model, random_sources


def run_steps(model, src, chunks, crops, lean: bool, capacity: int = 40) -> list[torch.Tensor]:
    """Cached steps of ``chunks`` (token blocks (B, T)), cropping to ``crops[i]`` (or not) after step i."""
    model.use_lean_steps(lean)
    context = model.encode(src)
    cache = model.new_cache(src.shape[0], capacity=capacity)
    outs = []
    with torch.no_grad():
        for tokens, crop in zip(chunks, crops):
            assert model.decoder.lean_applies(tokens.new_zeros((), dtype=cache.k.dtype), cache) == lean
            outs.append(model.decode_step(tokens, context, cache))
            if crop is not None:
                cache.crop(torch.tensor(crop))
    model.use_lean_steps(True)
    return outs


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("batch", [2, 20])  # 20 rows: the (W @ x.T).T layout of fast_linear
def test_lean_steps_equal_the_reference_bitwise(dtype, batch):
    """Equal rows (slice writes), then ragged rows after a crop (per-row writes), 1- and k-token calls."""
    model = random_model(k=2, vocab=30, seed=7).to(dtype)
    src = random_sources(batch, vocab=30, seed=7)
    g = torch.Generator().manual_seed(7)
    chunks = [torch.randint(3, 30, (batch, t), generator=g) for t in (1, 4, 1, 3, 2)]
    lengths = [1, 5, 6, 9, 11]
    ragged = [max(1, n - r % 3) for r, n in enumerate([6] * batch)]  # rows cut back by 0..2 after step 3
    crops = [None, None, ragged, None, None]
    assert lengths[2] == 6
    lean = run_steps(model, src, chunks, crops, lean=True)
    ref = run_steps(model, src, chunks, crops, lean=False)
    for a, b in zip(lean, ref):
        assert torch.equal(a, b)


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_decoding_is_the_same_with_and_without_the_lean_step(head_type):
    model = random_model(k=4, vocab=40, seed=3, head_type=head_type).float()
    model.eos_id = 5
    src = random_sources(6, vocab=40, seed=4)
    outs = {}
    for lean in (True, False):
        model.use_lean_steps(lean)
        outs[lean] = (greedy_decode(model, src, 20), blockwise_decode(model, src, Exact(), 20))
    model.use_lean_steps(True)
    for a, b in zip(outs[True], outs[False]):
        assert torch.equal(a.tokens, b.tokens) and a.block_sizes == b.block_sizes


@pytest.mark.parametrize("precision", ["float32", "float32-invariant", "float64"])
@pytest.mark.parametrize("ring", [False, True])
def test_lean_windowed_steps_equal_the_reference_bitwise(precision, ring):
    """A local window, with a ring cache (window + margin slots, wrapped around) or a plain one, in float32,
    float32-invariant (float64 products and attention) and float64: the scripted step equals the module path bit
    for bit, equal rows and ragged."""
    model = random_model(k=2, vocab=30, seed=5, window=3)
    model = model.double() if precision == "float64" else model.float()
    src = random_sources(3, vocab=30, seed=5)
    g = torch.Generator().manual_seed(5)
    sizes = (1, 8, 1, 8, 8, 8, 3, 8, 1, 8) if ring else (1, 4, 1, 3, 4, 1, 2)
    chunks = [torch.randint(3, 30, (3, t), generator=g) for t in sizes]
    crops = [None, None, [4, 6, 5], None, [20, 22, 18] if ring else [9, 11, 12], None, None, None, None, None]
    capacity = 90 if ring else 30  # a ring when the capacity exceeds window + RING_MARGIN
    runs = build_runtime(model, InferenceOptions(precision=precision)).model
    assert (runs.new_cache(3, capacity).ring is not None) == ring
    lean = run_steps(runs, src, chunks, crops, lean=True, capacity=capacity)
    ref = run_steps(runs, src, chunks, crops, lean=False, capacity=capacity)
    for a, b in zip(lean, ref):
        assert torch.equal(a, b)
    if precision == "float32-invariant":  # and the float64 products were taken (plain float32 rounds differently)
        plain = run_steps(model, src, chunks, crops, lean=True, capacity=capacity)
        assert any(not torch.equal(a, c) for a, c in zip(lean, plain))


def test_the_reference_keeps_what_the_lean_step_does_not_take():
    x = torch.zeros(1, 1, 32, dtype=torch.float64)
    with torch.no_grad():
        plain = random_model(k=2, vocab=30)
        cache = plain.new_cache(1, 40)
        assert not plain.decoder.lean_applies(x, cache)  # a model as built runs its modules
        plain.use_lean_steps(True)  # as a runtime's snapshot does
        assert plain.decoder.lean_applies(x, cache)
        wide = use_products(copy.deepcopy(plain), WideProducts())
        assert wide.decoder.lean_applies(x, cache)  # the step takes the float64 products
        assert not lean_applies(wide.encoder, x)  # the encoder does not
        if int8.available():
            eight = use_products(copy.deepcopy(plain), Int8Products())
            assert not eight.decoder.lean_applies(x, cache)  # int8 products of a float64 model
            assert eight.decoder.lean_applies(x.float(), eight.float().new_cache(1, 40))  # float32: lean too
        cache.make_static()
        assert not plain.decoder.lean_applies(x, cache)
    assert not plain.decoder.lean_applies(x, plain.new_cache(1, 40))  # gradients on: training


@pytest.mark.skipif(not int8.available(), reason="no fbgemm/x86 quantized engine")
def test_lean_int8_steps_equal_the_int8_reference_bitwise():
    """Precision int8: the scripted step takes the packed weights and float64 attention of the reference."""
    model = random_model(k=2, vocab=30, seed=8).float()
    src = random_sources(3, vocab=30, seed=8)
    g = torch.Generator().manual_seed(8)
    chunks = [torch.randint(3, 30, (3, t), generator=g) for t in (1, 4, 1, 2)]
    crops = [None, [4, 3, 5], None, None]
    runs = build_runtime(model, InferenceOptions(precision="int8")).model
    lean = run_steps(runs, src, chunks, crops, lean=True)
    ref = run_steps(runs, src, chunks, crops, lean=False)
    plain = run_steps(model, src, chunks, crops, lean=True)
    for a, b, c in zip(lean, ref, plain):
        assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("precision", ["float32", "float64", "int8"])
def test_lean_encoder_equals_the_reference_bitwise(precision):
    if precision == "int8" and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    model = random_model(k=2, vocab=30, seed=9)
    model = model.double() if precision == "float64" else model.float()
    src = random_sources(20, vocab=30, seed=9)  # padded rows; 20 rows of up to 9: every product layout
    model = build_runtime(model, InferenceOptions(precision=precision)).model
    with torch.no_grad():
        lean = model.encode(src)
        model.use_lean_steps(False)
        ref = model.encode(src)
        model.use_lean_steps(True)
    assert model.encoder.lean_tensors is not None  # the lean path ran
    assert torch.equal(lean.memory, ref.memory)
    for (k1, v1), (k2, v2) in zip(lean.cross_kv, ref.cross_kv):
        assert torch.equal(k1, k2) and torch.equal(v1, v2)


@pytest.mark.skipif(not int8.available(), reason="no fbgemm/x86 quantized engine")
def test_the_lean_functions_compile():
    """`script` falls back to plain Python where TorchScript fails: here it must not, or the speed is gone quietly."""
    from lightning_bpd.inference import fused_chain
    from lightning_bpd.nn import lean_step

    for fn in (lean_step.lean_decoder_step, lean_step.lean_encoder, fused_chain.chain_links_scripted):
        assert isinstance(fn, torch.jit.ScriptFunction), fn
