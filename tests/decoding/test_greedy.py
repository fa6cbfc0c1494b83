import pytest
import torch

from lightning_bpd.decoding import greedy_decode, greedy_decode_reference
from tests.models import StubModel, pick_eos, random_model, random_sources, stub_sources


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("window", [None, 4])
def test_cached_greedy_equals_uncached_reference(seed, window):
    model = random_model(k=2, seed=seed, window=window)
    src = random_sources(8, seed=seed)
    pick_eos(model, src, 24)
    fast = greedy_decode(model, src, max_len=24)
    slow = greedy_decode_reference(model, src, max_len=24)
    assert torch.equal(fast.tokens, slow.tokens)
    assert torch.equal(fast.lengths, slow.lengths)
    assert fast.model_calls == int(fast.lengths.max())


def test_batched_greedy_equals_one_row_at_a_time():
    model = random_model(k=1, seed=4)
    src = random_sources(6, seed=4)
    pick_eos(model, src, 20)
    batched = greedy_decode(model, src, 20).sequences()
    single = [greedy_decode(model, src[i : i + 1, : int((src[i] != 0).sum())], 20).sequences()[0] for i in range(6)]
    assert batched == single


def test_stub_greedy_follows_targets_and_stops_at_eos_or_max_len():
    model = StubModel([[5, 6, 7, 2], [8, 9, 10, 11, 12, 13, 14]], k=1)
    out = greedy_decode(model, stub_sources(2), max_len=5)
    assert out.sequences() == [[5, 6, 7, 2], [8, 9, 10, 11, 12]]
    assert out.iterations.tolist() == [4, 5] and out.model_calls == 5
    assert out.tokens[0, 4].item() == model.pad_id


def test_invalid_max_len_and_empty_source():
    model = random_model(k=1)
    with pytest.raises(ValueError, match=r"max_len must be an integer >= 1"):
        greedy_decode(model, random_sources(2), max_len=0)
    with pytest.raises(ValueError, match="empty source"):
        greedy_decode(model, torch.tensor([[5, 6], [0, 0]]), max_len=4)
    with pytest.raises(ValueError, match="non-empty"):
        greedy_decode(model, torch.zeros(2, 0, dtype=torch.long), max_len=4)
