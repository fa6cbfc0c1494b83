"""A trained model's draft vocabulary as state (:mod:`lightning_bpd.nn.draft_ids`): its token ids, saved with it, and
the reference decoders' view of a proposing head. What a runtime does with them: tests/inference/test_draft_vocab.py."""

import pytest
import torch

from lightning_bpd.nn.draft_ids import DraftIds, checked_ids, ids_from_counts, restrict
from tests.models import random_model


def test_ids_are_the_most_frequent_plus_the_required_in_increasing_order():
    counts = torch.tensor([5, 0, 9, 1, 7, 3])
    assert ids_from_counts(counts, 3).tolist() == [0, 2, 4]
    assert ids_from_counts(counts, 3, always=[1]).tolist() == [1, 2, 4]  # EOS, say, even if rare
    with pytest.raises(ValueError, match=r"must lie in \[1, 6\]"):
        ids_from_counts(counts, 7)


def test_bad_ids_are_refused():
    ids = DraftIds(50, 3)
    with pytest.raises(ValueError, match=r"need 3 distinct token ids in \[0, 49\]"):
        ids.set_ids(torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match=r"need 3 distinct token ids in \[0, 49\]"):
        ids.set_ids(torch.tensor([1, 2, 50]))
    with pytest.raises(ValueError, match=r"draft_vocab must lie in \[1, 50\]"):
        DraftIds(50, 0)
    with pytest.raises(ValueError, match="at least one token id"):
        checked_ids([], 50)
    assert checked_ids((7, 3, 5), 50).tolist() == [3, 5, 7]  # any order in, increasing out


def test_restrict_puts_every_token_outside_the_list_at_minus_infinity():
    logits = torch.randn(2, 3, 10, dtype=torch.float64)
    out = restrict(logits, torch.tensor([1, 4, 8]))
    assert torch.equal(out[..., [1, 4, 8]], logits[..., [1, 4, 8]])
    assert bool((out[..., [0, 2, 3, 5, 6, 7, 9]] == float("-inf")).all())


def test_the_model_holds_only_the_ids_saved_as_draft_vocab_ids():
    """The state-dict key of a trained model's draft vocabulary stays ``draft_vocab.ids``: checkpoints load as before."""
    model = random_model(k=3, seed=1, draft_vocab=4)
    model.set_draft_ids(torch.tensor([11, 2, 7, 5]))
    state = model.state_dict()
    assert [key for key in state if key.startswith("draft_vocab")] == ["draft_vocab.ids"]
    assert state["draft_vocab.ids"].tolist() == [2, 5, 7, 11]
    fresh = random_model(k=3, seed=2, draft_vocab=4)
    fresh.load_state_dict(state)  # strict
    assert fresh.draft_vocab.ids.tolist() == [2, 5, 7, 11]
    h = torch.randn(6, 32, dtype=torch.float64)
    logits = fresh.logits_heads(h, range(1, 3))
    assert torch.equal(fresh.restrict_draft(logits), restrict(logits, torch.tensor([2, 5, 7, 11])))


def test_setting_ids_of_another_size_rebuilds_the_state_and_the_config():
    model = random_model(k=3, seed=1)
    assert model.draft_vocab is None and torch.equal(model.restrict_draft(torch.ones(3, 16)), torch.ones(3, 16))
    model.set_draft_ids(torch.tensor([2, 5, 7, 11]))
    assert model.config.draft_vocab == 4 and model.draft_vocab.ids.tolist() == [2, 5, 7, 11]
    model.set_draft_ids(torch.tensor([3, 1]))
    assert model.config.draft_vocab == 2 and model.draft_vocab.ids.tolist() == [1, 3]
