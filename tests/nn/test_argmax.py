import pytest
import torch

from lightning_bpd.nn.argmax import argmax


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(7,), (3, 259), (1, 8000), (2, 8, 8001), (33, 4096)])
def test_same_index_as_torch_argmax_with_ties_infinities_and_nan(shape, dtype):
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randint(0, 3, shape, generator=g).to(dtype)  # many ties: the first maximal index wins
    assert torch.equal(argmax(x), x.argmax(dim=-1))
    y = torch.randn(shape, generator=g).to(dtype)
    y[..., -1] = float("inf")
    y.reshape(-1, shape[-1])[0, 2] = float("nan")
    assert torch.equal(argmax(y), y.argmax(dim=-1))
    z = torch.randn((*shape[:-1], 2 * shape[-1]), generator=g).to(dtype)[..., ::2]  # not contiguous
    assert torch.equal(argmax(z), z.argmax(dim=-1))
