import pytest
import torch

from lightning_bpd.decoding import blockwise_decode, greedy_decode
from lightning_bpd.nn.warm_start import CheckpointMismatchError, base_detached, freeze_base, load_base_weights
from tests.models import random_model, random_sources


def test_frozen_identity_first_model_decodes_exactly_like_its_base():
    base = random_model(k=1, seed=3)
    block = random_model(k=4, seed=9, identity_first=True)
    left = load_base_weights(block, base.state_dict())
    assert left and all(key.startswith("head.") for key in left)
    freeze_base(block)
    assert {n for n, p in block.named_parameters() if p.requires_grad} == {n for n, _ in block.head.named_parameters(prefix="head")}
    src = random_sources(6)
    base.eos_id = block.eos_id = 5
    want = greedy_decode(base, src, 20)
    got = blockwise_decode(block, src, max_len=20)
    assert torch.equal(want.tokens, got.tokens)


def test_mismatched_checkpoint_names_the_keys():
    base = random_model(k=1, d_model=32)
    other = random_model(k=2, d_model=16, n_heads=4, d_ff=32)
    with pytest.raises(CheckpointMismatchError, match=r"tgt_embed.weight: checkpoint \(16, 32\) vs model \(16, 16\)"):
        load_base_weights(other, base.state_dict())
    state = base.state_dict()
    del state["decoder.norm.weight"]
    with pytest.raises(CheckpointMismatchError, match="missing from checkpoint: decoder.norm.weight"):
        load_base_weights(random_model(k=2), state)


def test_a_draft_vocabulary_is_optional_on_both_sides():
    import torch

    from lightning_bpd.nn.warm_start import load_base_weights
    from tests.models import random_model

    base = random_model(k=1, seed=0)
    model = random_model(k=4, seed=1)
    model.set_draft_ids(torch.arange(8))
    load_base_weights(model, base.state_dict())  # the base has none: set later from the data
    assert torch.equal(model.draft_vocab.ids, torch.arange(8))
    load_base_weights(base, model.state_dict())  # and a model without one ignores it


def test_base_detached_blocks_gradients_outside_the_head_and_puts_the_parameters_back():
    model = random_model(k=4, seed=5)
    before = {name: p for name, p in model.named_parameters(remove_duplicate=False)}
    h = torch.randn(2, 3, model.config.d_model, dtype=next(model.parameters()).dtype)
    with base_detached(model):
        detached = model.logits_heads(h).sum()
    plain = model.logits_heads(h).sum()
    assert torch.equal(detached, plain)  # the same values
    detached.backward()
    grads = {name for name, p in model.named_parameters() if p.grad is not None and p.grad.any()}
    assert grads and all(name.startswith("head.") for name in grads)
    assert all(p is before[name] for name, p in model.named_parameters(remove_duplicate=False))
    model.zero_grad()
    plain.backward()
    assert any(not name.startswith("head.") for name, p in model.named_parameters() if p.grad is not None)
    with pytest.raises(RuntimeError, match="inside"), base_detached(model):
        raise RuntimeError("inside")  # restored on errors too
    assert all(p is before[name] for name, p in model.named_parameters(remove_duplicate=False))
