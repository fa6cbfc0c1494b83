"""A Hugging Face base behind the inference runtime: the runtime's products reach its linear layers."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.hf import HFSeq2SeqBlockwise
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.product_kinds import Int8Products
from lightning_bpd.inference.product_swap import ProductLinear
from lightning_bpd.kernels import int8, onednn
from lightning_bpd.nn.products import FLOAT
from tests.hf.test_base import generated, pick_eos, sources, tiny_base

MAX_LEN = 12


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_a_float32_runtime_of_a_hf_base_decodes_like_generate(family):
    base = tiny_base(family, dtype=torch.float32)
    src = sources()
    pick_eos(base, src, MAX_LEN)
    model = HFSeq2SeqBlockwise(base, k=3)
    runtime = build_runtime(model)
    linears = [m for m in runtime.model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is ProductLinear and m.products is FLOAT for m in linears)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))  # untouched
    with torch.no_grad():
        want = generated(base, src, MAX_LEN)
        assert greedy_decode(runtime, src, MAX_LEN).sequences() == want
        assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == want


@pytest.mark.skipif(not int8.available(), reason="needs torch's fbgemm/x86 quantized engine")
def test_an_int8_runtime_multiplies_the_hf_base_in_int8():
    base = tiny_base("marian", dtype=torch.float32)
    model = HFSeq2SeqBlockwise(base, k=3)
    runtime = build_runtime(model, InferenceOptions(precision="int8"))
    assert isinstance(runtime.products, Int8Products)
    linears = [m for m in runtime.model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(runtime.products.copies) >= len(linears) > 0
    src = sources()
    with torch.no_grad():
        plain = model.decode_full(torch.full((src.shape[0], 1), model.bos_id), model.encode(src))
        eight = runtime.decode_full(torch.full((src.shape[0], 1), model.bos_id), runtime.encode(src))
    assert not torch.equal(plain, eight)
    torch.testing.assert_close(eight, plain, rtol=0.1, atol=0.1 * float(plain.abs().max()))


@pytest.mark.hardware
@pytest.mark.parametrize("precision", ["int8", "float32-packed"])
def test_exact_equals_the_runtimes_greedy_on_a_hf_base(precision):
    """With batch-invariant products exact decoding reproduces the runtime's own greedy (attention stays the base's
    own kernel, so this is measured, not by construction)."""
    if (precision == "int8" and not int8.available()) or (precision == "float32-packed" and not onednn.available()):
        pytest.skip("kernel not available")
    base = tiny_base("marian", dtype=torch.float32)
    src = sources()
    pick_eos(base, src, MAX_LEN)
    runtime = build_runtime(HFSeq2SeqBlockwise(base, k=3), InferenceOptions(precision=precision))
    with torch.no_grad():
        greedy = greedy_decode(runtime, src, MAX_LEN).sequences()
        assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == greedy
