import pytest
import torch

from lightning_bpd.inference import build_runtime
from lightning_bpd.nn.draft_vocab import DraftVocabulary, ids_from_counts
from tests.models import random_model


def test_ids_are_the_most_frequent_plus_the_required_in_increasing_order():
    counts = torch.tensor([5, 0, 9, 1, 7, 3])
    assert ids_from_counts(counts, 3).tolist() == [0, 2, 4]
    assert ids_from_counts(counts, 3, always=[1]).tolist() == [1, 2, 4]  # EOS, say, even if rare
    with pytest.raises(ValueError, match=r"must lie in \[1, 6\]"):
        ids_from_counts(counts, 7)


def test_argmax_over_the_list_equals_the_masked_full_argmax_and_follows_weight_updates():
    g = torch.Generator().manual_seed(0)
    weight, h = torch.randn(50, 8, generator=g), torch.randn(20, 8, generator=g)
    vocab = DraftVocabulary(50, 10)
    vocab.set_ids(torch.randperm(50, generator=g)[:10])
    assert torch.equal(vocab.ids, vocab.ids.sort().values)
    full = h @ weight.t()
    assert torch.equal(vocab.argmax(h, weight), vocab.restrict(full).argmax(-1))
    assert set(vocab.argmax(h, weight).tolist()) <= set(vocab.ids.tolist())
    with torch.no_grad():
        weight.mul_(-1)  # an in-place update (an optimizer step): the cached rows must follow
    assert torch.equal(vocab.argmax(h, weight), vocab.restrict(h @ weight.t()).argmax(-1))


def test_bad_ids_are_refused():
    vocab = DraftVocabulary(50, 3)
    with pytest.raises(ValueError, match=r"need 3 distinct token ids in \[0, 49\]"):
        vocab.set_ids(torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match=r"need 3 distinct token ids in \[0, 49\]"):
        vocab.set_ids(torch.tensor([1, 2, 50]))
    with pytest.raises(ValueError, match=r"draft_vocab must lie in \[1, 50\]"):
        DraftVocabulary(50, 0)


def test_model_proposals_use_the_list():
    model = random_model(k=4, seed=1)
    h = torch.randn(6, 32, dtype=torch.float64)
    model.use_draft_vocab(torch.tensor([2, 5, 7, 11]))
    assert model.config.draft_vocab == 4
    tokens = build_runtime(model).draft_tokens(h, range(1, 4))  # (6, 3)
    assert set(tokens.flatten().tolist()) <= {2, 5, 7, 11}
    assert torch.equal(tokens, model.restrict_draft(model.logits_heads(h, range(1, 4))).argmax(-1))
