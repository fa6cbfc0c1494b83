import pytest
import torch
import torch.nn.functional as F

from lightning_bpd.nn.loss import blockwise_loss, choose_heads, shifted_targets

PAD = 0


def test_shifted_targets():
    t = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    assert shifted_targets(t, 0, PAD).tolist() == t.tolist()
    assert shifted_targets(t, 1, PAD).tolist() == [[6, 7, 2, 0], [2, 0, 0, 0]]
    assert shifted_targets(t, 5, PAD).tolist() == [[0] * 4, [0] * 4]


def test_each_head_is_trained_on_the_target_shifted_by_its_offset():
    torch.manual_seed(0)
    targets = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    logits = torch.randn(2, 4, 3, 10)
    out = blockwise_loss(logits, targets, [0, 1, 2], PAD)
    for i in range(3):
        tgt = shifted_targets(targets, i, PAD)
        expected = F.cross_entropy(logits[:, :, i].reshape(-1, 10), tgt.reshape(-1), ignore_index=PAD)
        torch.testing.assert_close(out.head_loss[i + 1], expected)
    torch.testing.assert_close(out.loss, torch.stack([out.head_loss[i] for i in (1, 2, 3)]).mean())


def test_later_targets_train_heads_two_on_and_head_one_keeps_the_data():
    torch.manual_seed(0)
    targets = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    later = torch.tensor([[9, 4, 3, 1], [6, 5, 0, 0]])
    logits = torch.randn(2, 4, 3, 10)
    out = blockwise_loss(logits, targets, [0, 1, 2], PAD, later_targets=later)
    for i in range(3):
        tgt = shifted_targets(targets if i == 0 else later, i, PAD)
        expected = F.cross_entropy(logits[:, :, i].reshape(-1, 10), tgt.reshape(-1), ignore_index=PAD)
        torch.testing.assert_close(out.head_loss[i + 1], expected)
    assert out.head_loss[2] != blockwise_loss(logits, targets, [0, 1, 2], PAD).head_loss[2]


def test_accuracy_and_padding_ignored():
    targets = torch.tensor([[5, 6, 0]])
    logits = torch.full((1, 3, 1, 10), -5.0)
    logits[0, 0, 0, 5] = 5.0  # right
    logits[0, 1, 0, 3] = 5.0  # wrong
    logits[0, 2, 0, 9] = 5.0  # on padding: ignored
    out = blockwise_loss(logits, targets, [0], PAD)
    assert out.head_acc[1].item() == pytest.approx(0.5)


def test_choose_heads_random_is_uniform_and_mean_is_all():
    g = torch.Generator().manual_seed(0)
    picks = [choose_heads(4, "random", g)[0] for _ in range(4000)]
    counts = torch.bincount(torch.tensor(picks), minlength=4).float() / 4000
    assert torch.all((counts - 0.25).abs() < 0.03)
    assert choose_heads(4, "mean") == [0, 1, 2, 3]
    assert all(choose_heads(3, "random", g, skip=[0])[0] in (1, 2) for _ in range(50))
    with pytest.raises(ValueError, match="loss mode"):
        choose_heads(4, "max")


def test_loss_at_selected_positions_equals_the_masked_full_loss():
    torch.manual_seed(1)
    targets = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    logits = torch.randn(2, 4, 2, 10)
    positions = torch.tensor([[True, False, True, True], [True, True, False, False]])
    sel = blockwise_loss(logits[positions], targets, [0, 1], PAD, positions=positions)
    for i in (0, 1):
        tgt = shifted_targets(targets, i, PAD).clone()
        tgt[~positions] = PAD
        expected = F.cross_entropy(logits[:, :, i].reshape(-1, 10), tgt.reshape(-1), ignore_index=PAD)
        torch.testing.assert_close(sel.head_loss[i + 1], expected)


def test_head1_weight_keeps_head_one_and_weights_its_loss():
    g = torch.Generator().manual_seed(0)
    draws = [choose_heads(4, "random", g, keep_first=True) for _ in range(300)]
    assert all(d[0] == 0 and len(d) == 2 and d[1] in (1, 2, 3) for d in draws)
    assert {d[1] for d in draws} == {1, 2, 3}
    assert choose_heads(4, "mean", keep_first=True) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="head1_weight needs a trainable head 1"):
        choose_heads(4, "mean", skip=[0], keep_first=True)

    torch.manual_seed(0)
    targets = torch.tensor([[5, 6, 7, 2], [8, 2, 0, 0]])
    logits = torch.randn(2, 4, 3, 10)
    out = blockwise_loss(logits, targets, [0, 1, 2], PAD, head1_weight=0.5)
    expected = 0.5 * out.head_loss[1] + 0.5 * (out.head_loss[2] + out.head_loss[3]) / 2
    torch.testing.assert_close(out.loss, expected)
    plain = blockwise_loss(logits, targets, [0, 1, 2], PAD)
    assert not torch.allclose(out.loss, plain.loss)
    with pytest.raises(ValueError, match="head1_weight must lie in"):
        blockwise_loss(logits, targets, [0, 1, 2], PAD, head1_weight=1.0)


def test_weighted_heads_and_weighted_draws():
    torch.manual_seed(0)
    targets = torch.tensor([[5, 6, 7, 2]])
    logits = torch.randn(1, 4, 3, 10)
    out = blockwise_loss(logits, targets, [0, 1, 2], PAD, weights=[1.0, 0.5, 0.25])
    expected = (out.head_loss[1] + 0.5 * out.head_loss[2] + 0.25 * out.head_loss[3]) / 1.75
    torch.testing.assert_close(out.loss, expected)
    kept = blockwise_loss(logits, targets, [0, 1, 2], PAD, head1_weight=0.5, weights=[1.0, 0.5, 0.25])
    torch.testing.assert_close(kept.loss, 0.5 * out.head_loss[1] + 0.5 * (0.5 * out.head_loss[2]
                                                                           + 0.25 * out.head_loss[3]) / 0.75)
    with pytest.raises(ValueError, match="weights must be 3 positive numbers"):
        blockwise_loss(logits, targets, [0, 1, 2], PAD, weights=[1.0, 0.0, 1.0])
    g = torch.Generator().manual_seed(0)
    draws = [choose_heads(4, "random", g, weights=[1.0, 0.5, 0.25, 0.125])[0] for _ in range(3000)]
    freq = [draws.count(i) / 3000 for i in range(4)]
    assert freq == pytest.approx([8 / 15, 4 / 15, 2 / 15, 1 / 15], abs=0.03)


def test_gaussian_kernel_soft_targets():
    from lightning_bpd.nn.loss import gaussian_kernel

    kernel = gaussian_kernel(10, 3, 1.0)
    assert torch.equal(kernel[:3], torch.eye(10)[:3])  # special tokens stay one-hot
    torch.testing.assert_close(kernel.sum(1), torch.ones(10))
    assert kernel[5].argmax() == 5 and kernel[5, 4] == kernel[5, 6] and kernel[5, :3].sum() == 0
    logits = torch.randn(2, 4, 1, 10, generator=torch.Generator().manual_seed(0))
    targets = torch.tensor([[4, 5, 9, 2], [6, 7, 2, 0]])
    one_hot = blockwise_loss(logits, targets, [0], pad_id=0)
    same = blockwise_loss(logits, targets, [0], pad_id=0, target_kernel=torch.eye(10))
    torch.testing.assert_close(same.loss, one_hot.loss)  # the identity kernel is the plain cross-entropy
    soft = blockwise_loss(logits, targets, [0], pad_id=0, target_kernel=kernel)
    log_p = logits[:, :, 0].log_softmax(-1)
    mask = targets != 0
    expected = -((kernel[targets] * log_p).sum(-1) * mask).sum() / mask.sum()
    torch.testing.assert_close(soft.loss, expected)
    with pytest.raises(ValueError, match="sigma must be > 0"):
        gaussian_kernel(10, 3, 0.0)
