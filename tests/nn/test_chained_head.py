import pytest
import torch

from lightning_bpd.nn.chained_head import ChainedHead
from lightning_bpd.nn.config import ModelConfig
from tests.models import assert_close_to_rounding, random_model


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
    assert_close_to_rounding(model.logits_first(h), full[:, 0])
    z = h
    for i in range(1, 4):
        z, logits = model.chain_step(z, prev[:, i - 1], i)
        assert_close_to_rounding(logits, full[:, i])


def test_unknown_head_type_is_refused():
    with pytest.raises(ValueError, match=r"head_type must be one of \('paper', 'chained', 'chained_attn'\), got 'tree'"):
        ModelConfig(src_vocab_size=8, tgt_vocab_size=8, head_type="tree")
    with pytest.raises(ValueError, match="chained_attn reads the last decoder layer's cross-attention"):
        ModelConfig(src_vocab_size=8, tgt_vocab_size=8, head_type="chained_attn", n_decoder_layers=0)


def attn_model(seed: int = 3):
    model = random_model(k=4, seed=seed, head_type="chained_attn")
    with torch.no_grad():
        for cell in model.head.cells:
            cell.out.weight.normal_(0, 0.3, generator=torch.Generator().manual_seed(seed))
    return model


def test_source_attending_chain_reads_the_source_and_steps_equal_the_teacher_forced_path():
    model = attn_model()
    src = torch.randint(3, 16, (3, 6), generator=torch.Generator().manual_seed(0))
    context = model.encode(src)
    source = model.chain_source(context)
    assert source.keys.shape == (3, 6, 4, 8) and source.valid.shape == (3, 6)
    h = torch.randn(3, 32, dtype=torch.float64)
    prev = torch.randint(3, 16, (3, 3))
    full = model.logits_heads(h, range(4), prev, source)  # (3, 4, V)
    z = h
    for i in range(1, 4):
        z, logits = model.chain_step(z, prev[:, i - 1], i, source)
        assert_close_to_rounding(logits, full[:, i])
    # positions of a (B, T, D) batch and the same positions taken one by one agree
    hs = torch.randn(3, 5, 32, dtype=torch.float64)
    prevs = torch.randint(3, 16, (3, 5, 3))
    batched = model.logits_heads(hs, [3], prevs, source)  # (3, 5, 1, V)
    rows = torch.arange(3).repeat_interleave(5)
    flat = model.logits_heads(hs.reshape(15, 32), [3], prevs.reshape(15, 3), source.take(rows))
    assert_close_to_rounding(flat.reshape(3, 5, 1, -1), batched)
    # another source changes heads 2..k, never head 1
    other = model.chain_source(model.encode(src.flip(0)))
    moved = model.logits_heads(h, range(4), prev, other)
    assert torch.equal(moved[:, 0], full[:, 0]) and not torch.allclose(moved[:, 1:], full[:, 1:])
    with pytest.raises(ValueError, match="needs the source"):
        model.logits_heads(h, [2], prev)

