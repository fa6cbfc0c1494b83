"""The task-independent training recipe: chained heads, cached frozen states, Medusa-2 style options."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from lightning_bpd.nn.loss import decoder_inputs, shifted_targets
from tests.task_modules import superres_module, translation_module

SHAPE = {"src_vocab_size": 40, "tgt_vocab_size": 40, "d_model": 32, "n_heads": 2, "d_ff": 64, "n_encoder_layers": 1, "n_decoder_layers": 1,
         "head_hidden": 16, "k": 4}


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 40, (5, 7), generator=g)
    tgt = torch.randint(4, 40, (5, 6), generator=g)
    tgt[0, 4:] = 0  # a shorter row: padding after its EOS
    tgt[0, 3] = 2
    tgt[:, -1] = torch.where(tgt[:, -1] == 0, 0, 2)
    return src, tgt, torch.arange(10, 15)


def test_frozen_base_runs_in_eval_mode_and_its_states_are_cached():
    torch.manual_seed(0)
    module = translation_module({"freeze_base": True, "init_from": "base.ckpt"}, **SHAPE, identity_first=True)
    module.train()
    assert module.model.head.training
    assert not any(m.training for name, m in module.model.named_modules() if name and not name.startswith("head"))
    src, tgt, index = batch()
    direct = module.blockwise_step(src, tgt, [1, 2, 3])  # no index: the base runs (in eval mode)
    cached = module.blockwise_step(src, tgt, [1, 2, 3], index=index)  # computes and stores
    again = module.blockwise_step(src, tgt, [1, 2, 3], index=index)  # from the store
    torch.testing.assert_close(cached.loss, direct.loss, rtol=0, atol=1e-6)
    torch.testing.assert_close(again.loss, direct.loss, rtol=0, atol=1e-6)
    states = module.frozen_states
    assert len(states) == 5 and states.misses == 5 and states.hits == 5
    # the states keep only each row's real positions
    assert states.states[10].shape == (4, 32) and states.states[11].shape == (6, 32)
    module.eval()
    module.blockwise_step(src, tgt, [1, 2, 3], index=index)  # validation: never from the store
    assert states.hits == 5


def test_frozen_cache_budget_and_switch():
    module = translation_module({"freeze_base": True, "init_from": "base.ckpt", "frozen_cache_gb": 1e-7}, **SHAPE)  # ~107 bytes
    src, tgt, index = batch()
    module.train()
    module.blockwise_step(src, tgt, [2], index=index)
    assert len(module.frozen_states) == 0  # over budget: computed, not kept
    assert translation_module({"freeze_base": True, "init_from": "b.ckpt", "frozen_cache_gb": 0}, **SHAPE).frozen_states is None
    assert translation_module(**SHAPE).frozen_states is None  # fine-tuning: the base changes
    with pytest.raises(ValueError, match="frozen_cache_gb must be >= 0"):
        translation_module({"freeze_base": True, "init_from": "b.ckpt", "frozen_cache_gb": -1}, **SHAPE)


@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_chained_heads_are_trained_on_teacher_forced_targets(fraction, head_type):
    torch.manual_seed(1)
    module = translation_module({"loss_mode": "mean", "label_smoothing": 0.0}, **SHAPE, head_type=head_type, dropout=0.0)
    for cell in module.model.head.cells:
        torch.nn.init.normal_(cell.out.weight, std=0.5)
    src, tgt, _ = batch()
    g = torch.Generator().manual_seed(3)
    out = module.blockwise_step(src, tgt, [0, 2, 3], fraction, g)
    # by hand: head 4 (index 3) at position t is fed the targets at t, t+1, t+2 and predicts t+3
    bos = torch.full_like(tgt[:, :1], 1)
    context = module.model.encode(src)
    hidden = module.model.decode_full(torch.cat([bos, tgt[:, :-1]], dim=1), context)
    prev = torch.stack([shifted_targets(tgt, j, 0) for j in range(3)], dim=-1)
    positions = torch.ones_like(tgt, dtype=torch.bool)
    if fraction < 1:
        g = torch.Generator().manual_seed(3)
        positions = (torch.rand(tgt.shape, generator=g) < fraction) & (tgt != 0)
    source = module.model.chain_source(context)  # None without source attention
    assert (source is None) == (head_type == "chained")
    source = source.take(positions.nonzero()[:, 0]) if source is not None else None
    logits = module.model.logits_heads(hidden[positions], [3], prev[positions], source)[:, 0]  # (N, V)
    target = shifted_targets(tgt, 3, 0)[positions]
    expected = torch.nn.functional.cross_entropy(logits, target, ignore_index=0)
    torch.testing.assert_close(out.head_loss[4], expected)
    assert set(out.head_loss) == {1, 3, 4}


@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_own_head_targets_are_the_models_greedy_choices_under_the_teacher_forced_prefix(fraction):
    torch.manual_seed(2)
    module = translation_module({"loss_mode": "mean", "label_smoothing": 0.0, "head_targets": "own"}, **SHAPE,
                                head_type="chained", dropout=0.0)
    for cell in module.model.head.cells:
        torch.nn.init.normal_(cell.out.weight, std=0.5)
    src, tgt, _ = batch()
    out = module.train().blockwise_step(src, tgt, [0, 2, 3], fraction, torch.Generator().manual_seed(3))
    # by hand: own[t] = argmax of p_1 after the clean prefix up to t (ordinary tokens or EOS), padding kept
    bos = torch.full_like(tgt[:, :1], 1)
    with torch.no_grad():
        hidden = module.model(src, torch.cat([bos, tgt[:, :-1]], dim=1))
        own = torch.empty_like(tgt)
        for t in range(tgt.shape[1]):  # one position at a time, from its own prefix (causal)
            logits = module.model.logits_first(module.model(src, torch.cat([bos, tgt[:, :t]], dim=1)))[:, -1]
            logits[:, :2] = float("-inf")  # never pad or BOS (EOS, id 2, stays a candidate)
            logits[:, 3] = float("-inf")  # nor the unknown token
            own[:, t] = logits.argmax(dim=-1)
    own = torch.where(tgt == 0, tgt, own)
    assert not torch.equal(own, tgt)
    positions = torch.ones_like(tgt, dtype=torch.bool)
    if fraction < 1:
        positions = (torch.rand(tgt.shape, generator=torch.Generator().manual_seed(3)) < fraction) & (tgt != 0)
    prev = torch.stack([shifted_targets(own, j, 0) for j in range(3)], dim=-1)  # the chain reads them too
    logits = module.model.logits_heads(hidden[positions], [0, 3], prev[positions])  # (N, 2, V)
    for head, target, j in ((1, tgt, 0), (4, own, 1)):  # head 1 keeps the data
        expected = torch.nn.functional.cross_entropy(logits[:, j], shifted_targets(target, head - 1, 0)[positions],
                                                     ignore_index=0)
        torch.testing.assert_close(out.head_loss[head], expected)
    # evaluation (validation loss, head accuracy) scores the data; unknown values are refused
    data = translation_module({"loss_mode": "mean", "label_smoothing": 0.0}, **SHAPE, head_type="chained", dropout=0.0)
    data.load_state_dict(module.state_dict())
    torch.testing.assert_close(module.eval().blockwise_step(src, tgt, [0, 3]).loss,
                               data.eval().blockwise_step(src, tgt, [0, 3]).loss)
    with pytest.raises(ValueError, match="head_targets must be one of"):
        translation_module({"head_targets": "teacher"}, **SHAPE)


@pytest.mark.parametrize("detach", ["states", "base"])
@pytest.mark.parametrize("heads", [[0, 1, 2, 3], [0, 3], [2]])
def test_detached_heads_keep_their_losses_out_of_the_base(heads, detach):
    src, tgt, _ = batch()
    modules = []
    for mode in ("none", detach):
        torch.manual_seed(4)
        modules.append(translation_module({"loss_mode": "mean", "detach_heads": mode}, **SHAPE, head_type="chained",
                                          dropout=0.0).train())
    plain, detached = modules
    before = {name: id(p) for name, p in detached.model.named_parameters(remove_duplicate=False)}
    for module in modules:
        module.zero_grad()
        module.loss = module.blockwise_step(src, tgt, heads).loss
        module.loss.backward()
    assert plain.loss == detached.loss  # the same forward pass
    assert before == {name: id(p) for name, p in detached.model.named_parameters(remove_duplicate=False)}
    params = dict(plain.named_parameters())
    for name, p in detached.named_parameters():
        if name.startswith("model.head."):  # the heads learn as before
            torch.testing.assert_close(p.grad, params[name].grad)
        elif 0 not in heads and (detach == "base" or name.startswith("model.decoder.")):
            assert p.grad is None or not p.grad.any(), name  # nothing reaches the base (or its decoder)
    # the decoder's gradient (with "base": every base weight's) is p_1's share of the loss alone
    plain.zero_grad()
    (plain.blockwise_step(src, tgt, [0]).loss / len(heads)).backward()
    for name, p in detached.named_parameters():
        if 0 in heads and (name.startswith("model.decoder.") or detach == "base" and not name.startswith("model.head.")):
            q = params[name]
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad)
    if detach == "states" and 0 not in heads:  # the shared output layer still learns from the heads
        assert detached.model.tgt_embed.weight.grad is not None and detached.model.tgt_embed.weight.grad.any()
    with pytest.raises(ValueError, match="detach_heads must be one of"):
        translation_module({"detach_heads": "decoder"}, **SHAPE)


def test_joint_schedule_options():
    module = translation_module({"lr": 1e-3, "base_lr_scale": 0.1, "head_loss_decay": 0.5, "loss_mode": "mean"}, **SHAPE)
    groups = module.configure_optimizers()["optimizer"].param_groups
    assert [g["initial_lr"] for g in groups] == pytest.approx([1e-4, 1e-3])  # before the warm-up factor
    head_params = {id(p) for p in module.model.head.parameters()}
    assert all(id(p) in head_params for p in groups[1]["params"])
    assert not any(id(p) in head_params for p in groups[0]["params"])
    assert module.head_weights([0, 1, 2, 3]) == [1.0, 0.5, 0.25, 0.125]
    src, tgt, _ = batch()
    out = module.blockwise_step(src, tgt, [0, 1, 2, 3], weights=module.head_weights([0, 1, 2, 3]))
    expected = sum(out.head_loss[i + 1] * 0.5**i for i in range(4)) / (1 + 0.5 + 0.25 + 0.125)
    torch.testing.assert_close(out.loss, expected)
    for bad, message in [({"base_lr_scale": 0.0}, "base_lr_scale must lie in"),
                         ({"head_loss_decay": 1.5}, "head_loss_decay must lie in"),
                         ({"base_lr_scale": 0.5, "freeze_base": True, "init_from": "b.ckpt"}, "frozen base")]:
        with pytest.raises(ValueError, match=message):
            translation_module(bad, **SHAPE)


def test_input_noise_corrupts_ordinary_decoder_inputs_only_while_training():
    torch.manual_seed(0)
    module = superres_module({"input_noise": 0.3, "input_noise_kind": "uniform"}, d_model=16, n_heads=2, n_encoder_layers=1,
                             n_decoder_layers=1, d_ff=32, window=16)
    tgt_in = torch.cat([torch.full((4, 1), module.model.bos_id), torch.randint(3, 259, (4, 2999))], dim=1)
    tgt_in[0, 2000:] = module.model.pad_id
    noisy = module.corrupt_inputs(tgt_in, torch.Generator().manual_seed(1))
    changed = noisy != tgt_in
    assert not changed[:, 0].any() and not changed[0, 2000:].any()  # BOS and padding stay
    assert 0.25 < float(changed[1:].float().mean()) < 0.31  # ~30% drawn (a draw may repeat the token)
    assert int(noisy[changed].min()) >= 3  # only ordinary intensities: no pad, BOS or EOS id
    # shuffle: a replaced input is a token of the same row, never its BOS or padding
    module.options = replace(module.options, input_noise_kind="shuffle")
    tgt_in = torch.cat([torch.full((2, 1), module.model.bos_id), torch.randint(3, 259, (2, 99))], dim=1)
    tgt_in[0, :] = torch.tensor([module.model.bos_id] + [7] * 9 + [module.model.pad_id] * 90)  # row 0: nine 7s
    tgt_in[1, 1:] = 200 + torch.arange(99) % 50
    noisy = module.corrupt_inputs(tgt_in, torch.Generator().manual_seed(1))
    assert torch.equal(noisy[0], tgt_in[0]) and (noisy[1] != tgt_in[1]).sum() > 10
    assert set(noisy[1, 1:].tolist()) <= set(tgt_in[1, 1:].tolist()) and noisy[1, 0] == module.model.bos_id
    src, tgt = torch.randint(3, 259, (2, 192)), torch.randint(3, 259, (2, 3072))
    module.eval()
    assert module.blockwise_step(src, tgt, [0]).loss == module.blockwise_step(src, tgt, [0]).loss  # no noise in eval
    module.train()
    noisy = module.blockwise_step(src, tgt, [0], generator=torch.Generator().manual_seed(0)).loss
    assert noisy != module.eval().blockwise_step(src, tgt, [0]).loss


def test_input_noise_range_is_checked_and_a_frozen_base_sees_clean_inputs():
    with pytest.raises(ValueError, match=r"input_noise must lie in \[0, 1\)"):
        superres_module({"input_noise": 1.0}, d_model=16, n_heads=2, d_ff=32)
    with pytest.raises(ValueError, match="input_noise_kind must be one of"):
        superres_module({"input_noise": 0.1, "input_noise_kind": "gauss"}, d_model=16, n_heads=2, d_ff=32)
    # a frozen base trains on clean inputs (its states are what decoding sees; a sweep may toggle freeze_base)
    frozen = superres_module({"freeze_base": True, "init_from": "base.ckpt", "input_noise": 0.5, "frozen_cache_gb": 0},
                             d_model=16, n_heads=2, d_ff=32, k=2).train()
    src, tgt = torch.randint(3, 259, (2, 192)), torch.randint(3, 259, (2, 64))
    g = torch.Generator().manual_seed(0)
    assert frozen.blockwise_step(src, tgt, [1], generator=g).loss == frozen.eval().blockwise_step(src, tgt, [1]).loss


def test_span_noise_copies_runs_from_the_same_row():
    module = superres_module({"input_noise": 0.3, "input_noise_kind": "span"}, d_model=16, n_heads=2, d_ff=32)
    tgt_in = torch.cat([torch.full((2, 1), module.model.bos_id), 3 + torch.arange(2999).repeat(2, 1) % 256], dim=1)
    tgt_in[1, 1500:] = module.model.pad_id
    noisy = module.corrupt_inputs(tgt_in, torch.Generator().manual_seed(0))
    changed = noisy != tgt_in
    assert not changed[:, 0].any() and not changed[1, 1500:].any()  # BOS and padding stay
    assert 0.2 < float(changed[0].float().mean()) < 0.4 and 0.2 < float(changed[1, :1500].float().mean()) < 0.4
    # runs: a changed token's neighbour inside the same copied run is its successor in the original
    i = int(changed[0].nonzero()[0])
    assert int(noisy[0, i + 1] - noisy[0, i]) % 256 == 1 or not changed[0, i + 1]


def test_self_noise_feeds_the_models_own_greedy_guesses():
    torch.manual_seed(0)
    module = superres_module({"input_noise": 0.3, "input_noise_kind": "self"}, d_model=16, n_heads=2, n_encoder_layers=1,
                             n_decoder_layers=1, d_ff=32, window=16)
    src, tgt = torch.randint(3, 259, (2, 192)), torch.randint(3, 259, (2, 3072))
    tgt_in = decoder_inputs(tgt, module.model.bos_id)
    own = module.train().own_predictions(src, tgt_in)  # without dropout (as decoding), the mode kept
    assert module.training and module.model.decoder.training
    module.eval()
    assert own.shape == tgt_in.shape and bool((own[:, 0] == module.model.bos_id).all())
    assert int(own[:, 1:].min()) >= 3  # ordinary intensities only
    # reference: input t + 1 is the argmax of p_1 after the clean prefix tgt_in[:, : t + 1] (causal: nothing later)
    for t in (0, 5, 40):
        with torch.no_grad():
            logits = module.model.logits_first(module.model(src, tgt_in[:, : t + 1]))[:, -1]  # (B, V)
        assert torch.equal(own[:, t + 1], logits[:, 3:].argmax(dim=-1) + 3)
    noisy = module.corrupt_inputs(tgt_in, torch.Generator().manual_seed(1), own)
    changed = noisy != tgt_in
    assert not changed[:, 0].any() and torch.equal(noisy[changed], own[changed])
    assert 0.05 < float(changed.float().mean()) <= 0.31
    with pytest.raises(ValueError, match="own guesses"):
        module.corrupt_inputs(tgt_in, torch.Generator().manual_seed(1))
    module.train()
    noisy_loss = module.blockwise_step(src, tgt, [0], generator=torch.Generator().manual_seed(0)).loss
    assert noisy_loss != module.eval().blockwise_step(src, tgt, [0]).loss
