import pytest
import torch

from lightning_bpd.nn.chained_head import ChainedHead
from lightning_bpd.nn.model import ModelConfig
from tests.models import random_model


def embed(tokens: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(tokens, 8).double()  # D = 8


def test_fresh_chain_proposes_p1_at_every_head():
    head = ChainedHead(d_model=8, d_hidden=5, k=4).double()
    h = torch.randn(2, 3, 8, dtype=torch.float64)
    prev = torch.randint(0, 8, (2, 3, 3))
    out = head.select(h, range(4), prev, embed)
    assert out.shape == (2, 3, 4, 8)
    assert torch.equal(out, h.unsqueeze(-2).expand(2, 3, 4, 8))  # zero output layers


def test_head_i_depends_on_the_tokens_before_it_only():
    torch.manual_seed(0)
    head = ChainedHead(d_model=8, d_hidden=5, k=4).double()
    for cell in head.cells:
        torch.nn.init.normal_(cell.out.weight)
    h = torch.randn(5, 8, dtype=torch.float64)
    prev = torch.randint(0, 8, (5, 3))
    base = head.select(h, range(4), prev, embed)
    changed = prev.clone()
    changed[:, 1] = (changed[:, 1] + 1) % 8  # the token fed to head 3 (index 2)
    other = head.select(h, range(4), changed, embed)
    assert torch.equal(base[:, :2], other[:, :2])  # heads 1, 2 do not see it
    assert not torch.allclose(base[:, 2], other[:, 2]) and not torch.allclose(base[:, 3], other[:, 3])
    # selected heads equal the full chain; the step API equals the teacher-forced path
    torch.testing.assert_close(head.select(h, [3, 1], prev, embed), base[:, [3, 1]], rtol=0, atol=0)
    z = h
    for i in range(1, 4):
        z = head.step(z, embed(prev[:, i - 1]), i)
        torch.testing.assert_close(z, base[:, i], rtol=0, atol=0)


def test_missing_or_short_prev_tokens_are_refused():
    head = ChainedHead(d_model=8, d_hidden=5, k=3)
    h = torch.zeros(2, 8)
    assert torch.equal(head.select(h, [0], None, embed)[:, 0], h)  # head 1 needs none
    with pytest.raises(ValueError, match="chained heads up to 3 need prev tokens of shape"):
        head.select(h, [2], torch.zeros(2, 1, dtype=torch.long), embed)
    with pytest.raises(ValueError, match=r"heads must lie in \[0, 2\]"):
        head.select(h, [3], torch.zeros(2, 3, dtype=torch.long), embed)


def test_model_chain_step_matches_logits_heads():
    model = random_model(k=4, seed=3, head_type="chained")
    assert model.chained_heads
    h = torch.randn(6, 32, dtype=torch.float64)
    prev = torch.randint(3, 16, (6, 3))
    full = model.logits_heads(h, range(4), prev)  # (6, 4, V)
    torch.testing.assert_close(model.logits_first(h), full[:, 0], rtol=0, atol=1e-10)
    z = h
    for i in range(1, 4):
        z, logits = model.chain_step(z, prev[:, i - 1], i)
        torch.testing.assert_close(logits, full[:, i], rtol=0, atol=1e-10)


def test_unknown_head_type_is_refused():
    with pytest.raises(ValueError, match=r"head_type must be one of \('paper', 'chained'\), got 'tree'"):
        ModelConfig(src_vocab_size=8, tgt_vocab_size=8, head_type="tree")
