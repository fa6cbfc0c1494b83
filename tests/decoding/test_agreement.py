import pytest
import torch

from lightning_bpd.decoding import greedy_decode, head_agreement
from tests.models import StubModel, pick_eos, random_model, random_sources, stub_sources


def test_head_one_always_agrees_and_right_heads_score_one():
    targets = [[5, 6, 7, 8, 9, 2], [10, 11, 2]]
    # head 3 (index 2) is wrong everywhere, the others right
    model = StubModel(targets, k=4, right=lambda i, t: i != 2)
    greedy = greedy_decode(model, stub_sources(2), 20)
    matches, positions = head_agreement(model, stub_sources(2), greedy.tokens, greedy.lengths)
    assert positions.tolist() == [9, 7, 5, 3]  # head i is scored where greedy has a token t + i
    assert (matches / positions).tolist() == [1.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_agreement_of_a_random_model_matches_counting_by_hand(head_type):
    model = random_model(k=3, seed=4, head_type=head_type)
    with torch.no_grad():
        for name, p in model.head.named_parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05 if head_type == "paper" else 0.3, generator=torch.Generator().manual_seed(1))
    src = random_sources(5, seed=4)
    pick_eos(model, src, 12)
    greedy = greedy_decode(model, src, 12)
    matches, positions = head_agreement(model, src, greedy.tokens, greedy.lengths)
    assert matches[0] == positions[0] == greedy.lengths.sum()
    # by hand, one row and one position at a time through the uncached decoder
    expect = torch.zeros(3)
    for row, seq in enumerate(greedy.sequences()):
        ctx = model.encode(src[row : row + 1][:, src[row] != 0])
        h = model.decode_full(torch.tensor([[model.bos_id, *seq]]), ctx)[0]  # (L + 1, D)
        for t in range(len(seq)):
            for i in range(3):
                if t + i < len(seq):
                    prev = torch.tensor([seq[t : t + i]]) if i else None
                    source = model.chain_source(ctx)
                    guess = model.logits_heads(h[t : t + 1], [i], prev, source)[0, 0].argmax() \
                        if head_type != "paper" else model.logits_heads(h[t : t + 1], [i])[0, 0].argmax()
                    expect[i] += float(guess == seq[t + i])
    assert matches.tolist() == expect.tolist()
    assert 0 < matches[1] < positions[1]  # the heads are right some of the time
