"""Top-r agreement of the heads with greedy's output: the table a budgeted tree is built from."""

import pytest
import torch

from lightning_bpd.decoding import Tree, greedy_decode, head_agreement, head_rank_agreement
from lightning_bpd.decoding.agreement import token_rank
from tests.models import TreeStub, pick_eos, random_model, random_sources, scramble_chain, stub_sources


def test_a_stub_whose_heads_rank_greedys_token_second():
    targets = [[5, 6, 7, 8, 9, 2], [10, 11, 2]]
    ranks = {1: 1, 2: 0, 3: 7}  # head 2's greedy token is its second choice, head 3's its first, head 4's neither
    model = TreeStub(targets, k=4, rank_of=lambda i, t, row: ranks[i])
    greedy = greedy_decode(model, stub_sources(2), 20)
    table = head_rank_agreement(model, stub_sources(2), greedy.tokens, greedy.lengths, ranks=3)
    assert table.tolist() == [[0, 1, 0], [1, 0, 0], [0, 0, 0]]
    assert Tree.from_budget(2, table).paths == ((), (1,), (1, 0))


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_rank_zero_is_head_agreement_and_ranks_add_up(head_type):
    model = random_model(k=4, seed=6, head_type=head_type)
    if model.chained_heads:
        scramble_chain(model)
    src = random_sources(6, seed=6)
    pick_eos(model, src, 16)
    greedy = greedy_decode(model, src, 16)
    matches, positions = head_agreement(model, src, greedy.tokens, greedy.lengths)
    table = head_rank_agreement(model, src, greedy.tokens, greedy.lengths, ranks=16)  # every rank of 16 tokens
    assert (table[:, 0] * positions[1:].double()).round().tolist() == matches[1:].double().tolist()
    assert torch.allclose(table.sum(dim=1), torch.ones(3, dtype=torch.float64))
    assert bool((table[:, 1] > 0).any())  # greedy's token is sometimes a head's second choice


def test_token_rank_breaks_ties_to_the_lowest_id_like_argmax():
    logits = torch.tensor([[1.0, 3.0, 3.0, 0.0]])
    assert token_rank(logits, torch.tensor([1])).tolist() == [0]
    assert token_rank(logits, torch.tensor([2])).tolist() == [1]
    assert token_rank(logits, torch.tensor([3])).tolist() == [3]
    with pytest.raises(ValueError, match="ranks must be an integer >= 1"):
        head_rank_agreement(random_model(k=2), random_sources(1), torch.ones(1, 2, dtype=torch.long),
                            torch.tensor([2]), ranks=0)
