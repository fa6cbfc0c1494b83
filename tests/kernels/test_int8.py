"""int8 products with per-row activation scales: the reference arithmetic, batch invariance, and decoding in int8."""

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.product_kinds import Int8Products
from lightning_bpd.kernels import int8
from tests.models import float32_model, random_model, random_sources

pytestmark = pytest.mark.skipif(not int8.available(), reason="no fbgemm/x86 quantized engine")


def rows_of_many_scales(n: int = 40, d: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=g) * torch.logspace(-3, 3, n)[:, None]
    x[3] = 0.0  # an all-zero row
    x[5] = x[5].abs()  # a non-negative one (a ReLU's output)
    return x


@pytest.mark.parametrize("bias", [True, False])
def test_row_int8_is_the_reference_arithmetic(bias):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(300, 64, generator=g) * 0.1
    b = torch.randn(300, generator=g) if bias else None
    x = rows_of_many_scales()
    got = int8.RowInt8(w, b)(x).double()
    want = int8.reference_linear(x, w, b)
    top = want.abs().amax(dim=1, keepdim=True) + 1e-30
    assert ((got - want).abs() / top).max() < 1e-5  # float rounding only: the same integer products
    exact = x.double() @ w.double().t() + (0 if b is None else b.double())
    err = (got - exact).norm(dim=1) / exact.norm(dim=1).clamp(min=1e-30)
    assert err[x.abs().sum(1) > 0].max() < 0.06  # 7-bit activations, 8-bit weights


@pytest.mark.parametrize("shape", [(300, 64), (768, 256), (256, 1024)])
def test_the_fixed_grid_is_the_one_fbgemms_dynamic_product_picks_for_unit_range(shape):
    """Bit for bit the first construction (two constant columns +1, -1 appended to pin the dynamic product's
    range), on rows of every scale, rows whose largest entry is +1 or -1 and the rows of a ReLU."""
    g = torch.Generator().manual_seed(shape[0])
    w = torch.randn(*shape, generator=g) * 0.1
    x = torch.cat([rows_of_many_scales(40, shape[1], seed=shape[1]), torch.randn(60, shape[1], generator=g)])
    x[40:50] = x[40:50].abs()  # largest entry +1 after scaling
    x[50:60] = -x[50:60].abs()  # largest entry -1 after scaling
    x[60:70] = torch.relu(x[60:70])
    got = int8.RowInt8(w)(x)
    assert torch.equal(got, int8.appended_range_product(x, w))
    assert torch.equal(int8.RowInt8(w)(x[:1]), got[:1])


def test_a_row_gives_the_same_result_alone_and_in_any_batch():
    """The verify pass (k rows) and the greedy step (1 row) round alike: no other row changes a row's scale."""
    g = torch.Generator().manual_seed(2)
    layer = int8.RowInt8(torch.randn(200, 64, generator=g), torch.randn(200, generator=g))
    x = rows_of_many_scales()
    alone = torch.cat([layer(x[i : i + 1]) for i in range(len(x))])
    for n in (2, 3, 8, 17, 40):
        assert torch.equal(torch.cat([layer(x[i : i + n]) for i in range(0, len(x), n)]), alone)
    assert torch.equal(layer(x.view(5, 8, 64)).view(40, 200), alone)


def test_int8_products_pack_at_build_time_and_take_float32_inference_only():
    lin = torch.nn.Linear(64, 30)
    x = rows_of_many_scales(8)
    products = Int8Products().prepare(lin)
    assert products.copy_of(lin.weight, lin.bias) is products.copy_of(lin.weight, lin.bias)  # packed once
    with torch.no_grad():
        eight = products.linear(x, lin.weight, lin.bias)
        assert torch.equal(eight, int8.RowInt8(lin.weight, lin.bias)(x))
        other = torch.nn.Linear(64, 30)  # not what it was built from: packed per call
        assert torch.equal(products.linear(x, other.weight, other.bias), int8.RowInt8(other.weight, other.bias)(x))
        assert torch.equal(products.linear(x.double(), lin.weight.double()), x.double() @ lin.weight.double().t())
    plain = products.linear(x, lin.weight, lin.bias)  # with gradients: plain float32
    torch.testing.assert_close(plain, torch.nn.functional.linear(x, lin.weight, lin.bias))
    assert not torch.equal(plain, eight)


def test_a_view_of_prepared_weights_is_copied_once_where_it_lies():
    """The paper head multiplies by a slice of its rows made anew at every call: copied once, by its place in the
    prepared weight; the same slice of another weight, or another slice, gets its own copy."""
    lin = torch.nn.Linear(64, 30)
    products = Int8Products().prepare(lin)
    first = products.copy_of(lin.weight[10:20], lin.bias[10:20])
    assert products.copy_of(lin.weight[10:20], lin.bias[10:20]) is first  # a new view object, the same place
    assert products.copy_of(lin.weight[10:21], lin.bias[10:21]) is not first
    x = rows_of_many_scales(8)
    with torch.no_grad():
        want = int8.RowInt8(lin.weight[10:20], lin.bias[10:20])(x)
        assert torch.equal(products.linear(x, lin.weight[10:20], lin.bias[10:20]), want)
    other = torch.randn(30, 64)  # not prepared: its views are made per call, as any other tensor
    assert products.view_key(other[10:20], None) is None


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_exact_equals_int8_greedy_by_construction(head_type):
    model = float32_model(3, head_type)
    model.eos_id = 5
    src = random_sources(8, vocab=40, seed=4)
    float32 = greedy_decode(model, src, 24).sequences()
    model = build_runtime(model, InferenceOptions(precision="int8"))
    assert model.precision == "int8"
    greedy = greedy_decode(model, src, 24).sequences()
    out = blockwise_decode(model, src, Exact(), 24)
    assert out.sequences() == greedy
    assert [blockwise_decode(model, row[None], Exact(), 24).sequences()[0] for row in src] == greedy
    assert out.mean_accepted_block_size > 1.2
    same = sum(a == b for r, s in zip(greedy, float32) for a, b in zip(r, s)) / sum(len(r) for r in float32)
    assert same > 0.5  # the same model, rounded: mostly the same tokens


def test_int8_is_refused_for_a_model_off_the_cpu():
    model = random_model(k=2, vocab=40).float()
    model.to("meta")  # any device other than the CPU
    with pytest.raises(ValueError, match="precision int8 runs on the CPU"):
        build_runtime(model, InferenceOptions(precision="int8"))
