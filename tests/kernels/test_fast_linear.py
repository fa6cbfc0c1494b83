import pytest
import torch
import torch.nn.functional as F

from lightning_bpd.kernels.fast_linear import linear


@pytest.mark.parametrize("rows", [1, 2, 8, 16, 64, 65])
@pytest.mark.parametrize("shape", [(1024, 1024), (96, 32)])
def test_equals_f_linear_for_every_row_count(rows, shape):
    g = torch.Generator().manual_seed(rows)
    w, b = torch.randn(*shape, generator=g), torch.randn(shape[0], generator=g)
    x = torch.randn(1, rows, shape[1], generator=g)
    with torch.no_grad():
        torch.testing.assert_close(linear(x, w, b), F.linear(x, w, b), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    assert linear(x, w, b).shape == (1, rows, shape[0])


def test_training_keeps_autograd():
    w = torch.randn(64, 16, requires_grad=True)
    linear(torch.randn(20, 16), w).sum().backward()
    assert w.grad is not None and w.grad.shape == (64, 16)
