"""oneDNN packed-weight float32 products: agreement with F.linear, and bitwise batch invariance (hardware)."""

import pytest
import torch

from lightning_bpd.kernels import onednn

pytestmark = pytest.mark.skipif(not onednn.available(), reason="no oneDNN packed linear ops in this torch")

BATCHES = (1, 2, 3, 5, 8, 16, 32)  # rows multiplied together in the invariance test


@pytest.fixture
def threads():
    """Restores torch's thread count after a test that changes it."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def close_to_reference(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> bool:
    """|got - F.linear| <= 1e-5 * (|x| @ |W|.T + |b|): float32 rounding relative to the terms' magnitude."""
    want = onednn.reference(x, w, b)
    scale = onednn.reference(x.abs(), w.abs(), None if b is None else b.abs())
    return got.shape == want.shape and bool(((got - want).abs() <= 1e-5 * scale + 1e-30).all())


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize(("lead", "d_in", "d_out"), [
    ((1,), 16, 40), ((3,), 64, 200), ((2, 5), 256, 1024), ((4, 1, 3), 1024, 256), ((1, 1), 2048, 96), ((7,), 1100, 33),
    ((), 32, 8), ((0, 3), 8, 8),
])
def test_packed_linear_agrees_with_f_linear(lead, d_in, d_out, bias, threads):
    threads(1)
    g = torch.Generator().manual_seed(d_in + d_out)
    w = torch.randn(d_out, d_in, generator=g)
    b = torch.randn(d_out, generator=g) if bias else None
    x = torch.randn(*lead, d_in, generator=g) * 3
    lin = onednn.PackedLinear(w, b)
    assert (lin.in_features, lin.out_features) == (d_in, d_out)
    out = lin(x)
    assert out.shape == (*lead, d_out) and out.dtype == torch.float32
    assert close_to_reference(out, x, w, b)
    assert close_to_reference(lin(x.transpose(0, -1).contiguous().transpose(0, -1)), x, w, b)  # non-contiguous x


def test_packed_linear_rejects_what_it_cannot_multiply():
    w = torch.randn(8, 4)
    with pytest.raises(ValueError, match="batch_size_hint 1"):
        onednn.PackedLinear(w, batch_size_hint=1)
    with pytest.raises(ValueError, match="float32 weight"):
        onednn.PackedLinear(w.double())
    with pytest.raises(ValueError, match="float32 bias"):
        onednn.PackedLinear(w, torch.zeros(7))
    lin = onednn.PackedLinear(w)
    with pytest.raises(ValueError, match=r"\(\.\.\., 4\)"):
        lin(torch.randn(2, 5))
    with pytest.raises(ValueError, match="float32"):
        lin(torch.randn(2, 4).double())


def test_packed_linear_keeps_its_own_copy_of_the_weight():
    w, b = torch.randn(8, 4), torch.randn(8)
    x = torch.randn(3, 4)
    lin = onednn.PackedLinear(w, b)
    before = lin(x)
    w.zero_()
    b.zero_()
    assert torch.equal(lin(x), before)


@pytest.mark.hardware
@pytest.mark.parametrize("num_threads", [1, 2])
@pytest.mark.parametrize(("d_in", "d_out"), [(256, 8000), (256, 1024), (1024, 256), (512, 58101), (2048, 512)])
def test_packed_linear_is_batch_invariant(d_in, d_out, num_threads, threads):
    """What exact float32 decoding with packed products rests on: row i of a product of n rows is bitwise
    row i of a 1-row product, for n in BATCHES. 2048 -> 512 checks the 1-row padding (in > 1024)."""
    threads(num_threads)
    g = torch.Generator().manual_seed(d_in * d_out)
    w = torch.randn(d_out, d_in, generator=g)
    b = torch.randn(d_out, generator=g)
    x = torch.randn(32, d_in, generator=g)
    lin = onednn.PackedLinear(w, b)
    alone = torch.cat([lin(x[i : i + 1]) for i in range(32)])  # (32, out)
    for n in BATCHES:
        together = torch.cat([lin(x[s : s + n]) for s in range(0, 32, n)])  # (32, out)
        assert torch.equal(together, alone), n
    assert torch.equal(lin(x[:8].reshape(2, 4, d_in)).reshape(8, d_out), alone[:8])  # leading dims change nothing
