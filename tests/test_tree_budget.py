"""Tree budgets (issue 47): the agreement table measured over batches, stored and read back, and the tree of a
budget, with one clear line for a budget out of range or no table."""

import pytest
import torch

from lightning_bpd.decoding import Exact, Tree, blockwise_decode, greedy_decode, head_rank_agreement
from lightning_bpd.decoding.trees.budget import as_record, budget_tree, from_record, measure_rank_agreement
from lightning_bpd.evaluation import BatchRun, EvalBatch, MethodRun
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



def test_tree_nodes_takes_integers_auto_and_auto_m():
    import argparse

    from lightning_bpd.decoding.trees.budget import auto_limit, tree_nodes_arg

    assert tree_nodes_arg("12") == 12 and tree_nodes_arg("-1") == -1  # range-checked by budget_tree, one line
    assert tree_nodes_arg("auto") == "auto" and auto_limit("auto") == 64
    assert tree_nodes_arg("auto:8") == "auto:8" and auto_limit("auto:8") == 8
    for bad, message in [("auto:0", "^auto:M takes an integer M >= 1"), ("auto:x", "^auto:M takes"),
                         ("many", "^a node budget")]:
        with pytest.raises(argparse.ArgumentTypeError, match=message):
            tree_nodes_arg(bad)


def test_auto_is_measured_once_per_runtime_and_reported(monkeypatch, capsys):
    from types import SimpleNamespace

    import lightning_bpd.decoding.trees.budget as tb
    from lightning_bpd.evaluation import budget_trees
    from lightning_bpd.inference import InferenceOptions, build_runtime

    model = random_model(k=4, seed=3)
    src = random_sources(4, seed=3)
    table = measure_rank_agreement(model, [EvalBatch(src, 14)])
    runtime = build_runtime(model, InferenceOptions())
    module = SimpleNamespace(model=model, rank_agreement=table)
    calls = []

    def stub(model, src, trees, repeats=5):  # a pass costs 1 + 0.1 per extra token; the single path no less
        calls.append([t.size for t in trees])
        return [1 + 0.1 * (t.size - 1) for t in trees]

    monkeypatch.setattr(tb, "measure_pass_costs", stub)
    choices: dict = {}
    for _ in range(2):
        trees = budget_trees(module, runtime, list(src.split(1)), ["auto:12", 4], None, "bench", 2, choices)
    assert calls == [[2, 4, 8, 13, 4]]  # the curve's widths, then the single path's; once per runtime
    assert list(trees) == ["nodes-auto:12", "nodes4"]
    record = choices["nodes-auto:12"]
    assert record["batch"] == 2 and record["cost_per_width"] == {"1": 1.0, "2": 1.1, "4": 1.3, "8": 1.7, "13": 2.2}
    best = max(record["predicted_speedup_per_budget"].items(), key=lambda kv: kv[1])
    assert record["nodes"] == int(best[0]) and trees["nodes-auto:12"] == (
        None if record["nodes"] == 0 else Tree.from_budget(record["nodes"], table[:3]))
    assert "bench: tree-nodes auto: " in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"^--tree-nodes auto: no head rank agreement table is stored"):
        tb.auto_tree(runtime, None, 4, src)
    with pytest.raises(ValueError, match=r"^--tree-nodes auto: a tree needs k >= 2 heads, decoding with k=1$"):
        tb.auto_tree(runtime, table, 1, src)


def test_auto_measures_the_cost_curve_once_per_runtime(monkeypatch):
    from lightning_bpd.decoding.trees import budget as tree_budget
    from lightning_bpd.inference import InferenceOptions, build_runtime

    calls = []

    def stub(model, src, trees, repeats):  # cost = width: no tree pays
        calls.append(model)
        return [float(t.size) for t in trees]

    monkeypatch.setattr(tree_budget, "measure_pass_costs", stub)
    model = random_model(k=3, seed=1)
    src = random_sources(1, seed=1)
    table = torch.tensor([[0.5, 0.2], [0.3, 0.1]], dtype=torch.float64)
    runtime = build_runtime(model, InferenceOptions())
    first = tree_budget.auto_tree(runtime, table, 3, src, "auto:4")
    assert tree_budget.auto_tree(runtime, table, 3, src, "auto:4") == first and len(calls) == 1  # kept on the runtime
    tree_budget.auto_tree(model, table, 3, src, "auto:4")  # a model keeps nothing: measured each time
    tree_budget.auto_tree(model, table, 3, src, "auto:4")
    assert len(calls) == 3
