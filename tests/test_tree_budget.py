"""Tree budgets (issue 47): the agreement table measured over batches, stored and read back, and the tree of a
budget, with one clear line for a budget out of range or no table."""

import pytest
import torch

from lightning_bpd.decoding import Exact, Tree, blockwise_decode, greedy_decode, head_rank_agreement
from lightning_bpd.evaluation import BatchRun, EvalBatch, MethodRun
from lightning_bpd.tree_budget import as_record, budget_tree, from_record, measure_rank_agreement
from tests.models import pick_eos, random_model, random_sources


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


def test_the_table_over_batches_is_the_table_of_all_rows_at_once():
    model = random_model(k=4, seed=2)
    src = random_sources(6, seed=2)
    pick_eos(model, src, 12)
    batches = [EvalBatch(src[:2], 12), EvalBatch(src[2:], 12)]
    table = measure_rank_agreement(model, batches, ranks=3)
    greedy = greedy_decode(model, src, 12)
    assert len(set(greedy.lengths.tolist())) > 1  # rows of different lengths: the weights matter
    whole = head_rank_agreement(model, src, greedy.tokens, greedy.lengths, 3)
    torch.testing.assert_close(table, whole)
    assert table.shape == (3, 3) and bool((table.sum(dim=1) <= 1 + 1e-12).all())


def test_greedys_rank_counts_add_up_over_batches_to_the_same_table():
    model = random_model(k=3, seed=5)
    src = random_sources(4, seed=5)
    run = MethodRun()
    for part in (src[:1], src[1:]):
        greedy = greedy_decode(model, part, 10)
        n = torch.tensor([float((greedy.lengths - d).clamp(min=0).sum()) for d in range(3)], dtype=torch.float64)
        counts = head_rank_agreement(model, part, greedy.tokens, greedy.lengths, 4) * n[1:, None]
        run.merge(BatchRun([], [], 0, 0, 0, 0.0, [0.0] * 3, n.tolist(), counts.tolist()))
    torch.testing.assert_close(run.rank_agreement(), measure_rank_agreement(model, [EvalBatch(src, 10)], 4))


def test_a_budget_tree_decodes_to_greedys_output():
    model = random_model(k=4, seed=3)
    src = random_sources(5, seed=3)
    table = measure_rank_agreement(model, [EvalBatch(src, 14)])
    tree = budget_tree(12, table, k=4)
    assert tree.size == 13 and tree == Tree.from_budget(12, table)
    assert budget_tree(0, table, k=4) is None  # today's single path
    assert budget_tree(3, table, k=2).depth == 1  # fewer heads: the table's first rows
    out = blockwise_decode(model, src, Exact(), 14, tree=tree)
    assert out.sequences() == greedy_decode(model, src, 14).sequences()


@pytest.mark.parametrize(("n", "table", "k", "message"), [
    (4, None, 4, r"^--tree-nodes 4: no head rank agreement table is stored with these heads"),
    (9, [[0.5, 0.2]], 4, r"^--tree-nodes must lie in \[0, 2\] for 1 heads of 2 measured ranks each, got 9$"),
    (-1, [[0.5]], 4, r"^--tree-nodes must be an integer >= 0 \(0 = the single path\), got -1$"),
    (2, [[0.5]], 1, r"^--tree-nodes 2: a tree needs k >= 2 heads, decoding with k=1$"),
])
def test_budgets_that_cannot_be_built_are_one_line(n, table, k, message):
    with pytest.raises(ValueError, match=message):
        budget_tree(n, None if table is None else torch.tensor(table), k)


def test_records_round_trip_and_malformed_ones_are_one_line():
    table = torch.tensor([[0.5, 0.25], [0.125, 0.0]], dtype=torch.float64)
    assert torch.equal(from_record(as_record(table)), table)
    assert from_record(None) is None and as_record(None) is None
    for bad in ([[1.5]], [], "x", [[0.1], [0.2, 0.3]]):
        with pytest.raises(ValueError, match="^heads.json: head_rank_agreement must be"):
            from_record(bad, "heads.json")

