"""Medusa-1's heads: residual blocks ``x + SiLU(W x + b)`` per head, p_1 the input itself."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.nn.medusa_head import MedusaHead


def test_heads_are_residual_silu_blocks():
    torch.manual_seed(0)
    head = MedusaHead(8, k=3, n_layers=2).double()
    for p in head.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    want = [x]
    for i in range(2):  # the slow way, layer by layer
        y = x
        for layer in head.blocks[i].layers:
            y = y + torch.nn.functional.silu(y @ layer.weight.T + layer.bias)
        want.append(y)
    torch.testing.assert_close(head(x), torch.stack(want, dim=-2), rtol=0, atol=0)
    torch.testing.assert_close(head.select(x, [2, 0]), torch.stack([want[2], want[0]], dim=-2), rtol=0, atol=0)
    assert head.first(x) is x
    names = {name for name, _ in head.named_parameters()}
    assert names == {f"blocks.{i}.layers.{j}.{w}" for i in range(2) for j in range(2) for w in ("weight", "bias")}


def test_a_new_head_starts_as_p1_and_bad_input_is_refused():
    head = MedusaHead(4, k=3)
    x = torch.randn(3, 4)
    assert torch.equal(head(x), x[:, None].expand(3, 3, 4))
    with pytest.raises(ValueError, match="k must be >= 1"):
        MedusaHead(4, k=0)
    with pytest.raises(ValueError, match="n_layers >= 1"):
        MedusaHead(4, k=2, n_layers=0)
    with pytest.raises(ValueError, match="heads must lie in"):
        head.select(x, [3])
