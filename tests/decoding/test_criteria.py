"""Acceptance rules on hand-written proposals and p_1 logits."""

import pytest
import torch

from lightning_bpd.decoding.acceptance import Distance, Exact, MinBlock, TopK, parse_criterion
from tests.models import random_model


def logits_ranking(*rankings: list[int], vocab: int = 10) -> torch.Tensor:
    """(1, m, V) logits where position j ranks tokens in the order rankings[j]."""
    out = torch.zeros(1, len(rankings), vocab)
    for j, order in enumerate(rankings):
        for rank, tok in enumerate(order):
            out[0, j, tok] = 10.0 - rank
    return out


# proposals y_1..y_4; p_1 after y_1 ranks (4, 5), after y_2 ranks (6, 7), after y_3 ranks (8, 3)
VERIFY = logits_ranking([4, 5], [6, 7], [8, 3])


@pytest.mark.parametrize(
    "criterion, proposals, accepted",
    [
        (Exact(), [9, 4, 6, 8], 4),
        (Exact(), [9, 4, 7, 8], 2),
        (Exact(), [9, 5, 6, 8], 1),  # y_1 is always accepted
        (TopK(2), [9, 5, 7, 3], 4),
        (TopK(2), [9, 5, 1, 8], 2),
        (TopK(1), [9, 5, 7, 3], 1),
        (Distance(1), [9, 5, 7, 9], 4),  # |5-4|, |7-6|, |9-8| <= 1
        (Distance(1), [9, 5, 8, 8], 2),  # |8-6| = 2 > 1
        (Distance(0), [9, 4, 6, 9], 3),
        (MinBlock(3), [9, 5, 1, 1], 3),  # exact accepts 1, at least 3
        (MinBlock(2, TopK(2)), [9, 5, 7, 1], 3),  # more when the inner rule allows
    ],
)
def test_accepted_block_sizes(criterion, proposals, accepted):
    assert criterion.accept(torch.tensor([proposals]), VERIFY).tolist() == [accepted]


def test_rows_accept_independently():
    proposals = torch.tensor([[9, 4, 6, 8], [9, 4, 0, 8], [9, 0, 6, 8]])
    verify = VERIFY.expand(3, -1, -1)
    assert Exact().accept(proposals, verify).tolist() == [4, 2, 1]


def test_distance_uses_token_values_and_specials_never_match_approximately():
    values = torch.tensor([float("nan"), float("nan"), float("nan")] + [float(v) for v in range(7)])  # ids 3.. -> 0..
    crit = Distance(1, values=values)
    verify = logits_ranking([4], [2])  # value(4) = 1; then EOS (id 2)
    assert crit.accept(torch.tensor([[9, 5, 2]]), verify).tolist() == [3]  # |2-1| <= 1, EOS exact
    assert crit.accept(torch.tensor([[9, 5, 3]]), verify).tolist() == [2]  # id 3 (value 0) is not EOS


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: TopK(0), r"TopK n must be an integer >= 1"),
        (lambda: Distance(-0.5), r"Distance eps must be >= 0"),
        (lambda: MinBlock(0), r"MinBlock l must be an integer >= 1"),
        (lambda: MinBlock(5).validate(4), r"MinBlock l must lie in \[1, k\] = \[1, 4\]"),
        (lambda: parse_criterion("fast"), r"unknown criterion 'fast'"),
    ],
)
def test_invalid_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_parse_criterion_names_round_trip():
    for spec in ["exact", "top2", "eps2", "min2", "min3_top2", "eps0.5"]:
        assert parse_criterion(spec).name == parse_criterion(parse_criterion(spec).name).name
    assert isinstance(parse_criterion("min2_eps4").inner, Distance)


@pytest.mark.parametrize("criterion", [Exact(), TopK(2), MinBlock(2)])
def test_a_rule_owns_its_verdict_from_hidden_states(criterion):
    """first_token, verify and check_position: p_1 through propose, accept and matches; Exact's own (greedy's
    token, the model's argmax when it offers one) decides the same."""
    model = random_model(k=4, seed=4)
    h = torch.randn(5, 4, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(4))  # (b, k, D)
    tokens = criterion.propose(model.logits_heads(h[:, 0]))  # (b, k)
    tokens[:2, 1:] = model.logits_first(h[:2, :-1]).argmax(-1)  # rows 0, 1: greedy's tokens, all accepted
    logits = model.logits_first(h)  # (b, k, V)
    accepted, best = criterion.verify(model, tokens, h)
    assert torch.equal(accepted, criterion.accept(tokens, logits[:, :-1])) and torch.equal(best, logits.argmax(-1))
    assert accepted[:2].tolist() == [4, 4] and (criterion.name == "top2" or bool((accepted < 4).any()))
    assert torch.equal(criterion.first_token(model, h[:, 0]), logits[:, 0].argmax(-1))
    if criterion.prefix_checks:
        ok, token = criterion.check_position(model, tokens[:, 1], h[:, 0])
        assert torch.equal(ok, criterion.matches(tokens[:, 1:2], logits[:, :1])[:, 0])
        assert torch.equal(token, logits[:, 0].argmax(-1))
