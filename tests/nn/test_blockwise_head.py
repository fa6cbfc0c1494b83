import pytest
import torch

from lightning_bpd.nn.blockwise_head import BlockwiseHead
from tests.models import assert_close_to_rounding, random_model


def test_shapes_and_selected_heads_equal_the_full_head():
    head = BlockwiseHead(d_model=8, d_hidden=5, k=4).double()
    torch.nn.init.normal_(head.out.weight)
    h = torch.randn(2, 3, 8, dtype=torch.float64)
    full = head(h)
    assert full.shape == (2, 3, 4, 8)
    for heads in ([0], [2, 3], [3, 1], [1, 2, 3]):
        assert_close_to_rounding(head.select(h, heads), full[:, :, heads])
    assert_close_to_rounding(head.first(h), full[:, :, 0])


def test_residual_from_the_decoder_output_to_every_head():
    head = BlockwiseHead(d_model=8, d_hidden=5, k=3)
    h = torch.randn(2, 3, 8)
    # zero-initialized output layer: every head starts as the decoder output itself
    assert torch.equal(head(h), h.unsqueeze(-2).expand(2, 3, 3, 8))
    assert head.hidden.out_features == 3 * 5 and head.out.out_features == 3 * 8


def test_identity_first_bypasses_the_layer_and_k1_is_the_base():
    head = BlockwiseHead(d_model=8, d_hidden=5, k=3, identity_first=True)
    torch.nn.init.normal_(head.out.weight)
    h = torch.randn(4, 8)
    assert torch.equal(head.first(h), h)
    assert torch.equal(head(h)[:, 0], h)
    assert not torch.allclose(head(h)[:, 1], h)
    base = BlockwiseHead(d_model=8, d_hidden=5, k=1)
    assert list(base.parameters()) == []
    assert torch.equal(base.first(h), h)


def test_model_logits_first_is_head_one():
    model = random_model(k=4)
    h = torch.randn(2, 5, 32, dtype=torch.float64)
    assert_close_to_rounding(model.logits_first(h), model.logits_heads(h)[:, :, 0])
    assert model.logits_heads(h, [1, 3]).shape == (2, 5, 2, 16)


@pytest.mark.parametrize("bad", [0, -1])
def test_k_below_one_is_refused(bad):
    with pytest.raises(ValueError, match="k must be >= 1"):
        BlockwiseHead(8, 5, bad)
    with pytest.raises(ValueError, match=r"heads must lie in \[0, 2\]"):
        BlockwiseHead(8, 5, 3).select(torch.zeros(8), [3])
