import pytest
import torch

from lightning_bpd.nn.argmax import argmax, top_ranks, top_ranks_reference


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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab", [7, 5000])
def test_top_ranks_are_the_stable_sorts_first_n_ties_and_all(dtype, vocab):
    g = torch.Generator().manual_seed(vocab)
    tied = torch.randint(-3, 3, (4, 3, vocab), generator=g).to(dtype)  # many ties, at the cut too
    tied[0, 0, :] = float("-inf")  # every value tied (a draft vocabulary's row of -inf, at worst)
    tied[0, 1, ::2] = float("-inf")
    tied[1, 0, :] = 0.0
    tied[1, 0, 1::3] = -0.0  # equal to 0.0, as the sort sees it
    smooth = torch.randn(4, 3, vocab, generator=g).to(dtype)
    for x in (tied, smooth):
        for n in (1, 2, 3, 6, vocab):
            got = top_ranks(x, n)
            assert torch.equal(got, top_ranks_reference(x, n)), (n, dtype)
            assert torch.equal(got[..., 0], argmax(x))
