"""Cost-weighted tree budgets (issue 47): the expected length of the greedy tree of every budget, the cost curve,
the budget of most expected tokens per unit of cost (against a stub curve and a brute-force reference, and a wrong
choice caught), the measured curve on tiny models, and ``auto`` decoding exactly as greedy."""

from __future__ import annotations

import itertools

import pytest
import torch

from lightning_bpd.decoding import Exact, Tree, blockwise_decode, greedy_decode
from lightning_bpd.decoding.trees.cost import (
    CostCurve,
    choose_nodes,
    choose_nodes_reference,
    expected_lengths,
    measure_pass_costs,
    measured_widths,
    tree_expected_length,
)
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.models import pick_eos, random_model, random_sources, scramble_chain

pytestmark = pytest.mark.usefixtures("one_thread")

TABLE = torch.tensor([[0.7, 0.15, 0.05], [0.5, 0.2, 0.1], [0.4, 0.2, 0.1]], dtype=torch.float64)


def random_table(seed: int, depth: int = 3, width: int = 4) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    table = torch.rand(depth, width, generator=g, dtype=torch.float64).sort(dim=1, descending=True).values
    table = table / table.sum(dim=1, keepdim=True) * 0.9
    table[1, 2] = table[1, 3]  # a tie
    return table


def random_curve(seed: int, widest: int) -> CostCurve:
    """A rising curve over the widths a run measures, with noise that can make it dip."""
    g = torch.Generator().manual_seed(seed)
    widths = [1, *measured_widths(widest - 1, 4)]
    costs = [1.0] + [1.0 + 0.05 * w * float(torch.rand((), generator=g) + 0.5) for w in widths[1:]]
    return CostCurve(tuple(widths), tuple(costs))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_expected_lengths_are_the_greedy_trees_summed_node_by_node(seed):
    table = random_table(seed)
    lengths = expected_lengths(table, 84)
    assert len(lengths) == 85 and lengths[0] == 1.0
    for n in range(85):
        assert lengths[n] == pytest.approx(tree_expected_length(Tree.from_budget(n, table), table), rel=1e-12)
    assert all(b >= a for a, b in itertools.pairwise(lengths))  # each node adds its contribution


def test_the_single_paths_expected_length():
    want = 1 + 0.7 + 0.7 * 0.5 + 0.7 * 0.5 * 0.4
    assert tree_expected_length(Tree.path(3), TABLE) == pytest.approx(want)


def test_a_curve_interpolates_between_its_widths_and_refuses_bad_ones():
    curve = CostCurve((1, 2, 4, 8), (1.0, 1.1, 1.3, 2.1))
    assert [curve(w) for w in (1, 2, 3, 4, 6, 8)] == pytest.approx([1.0, 1.1, 1.2, 1.3, 1.7, 2.1])
    with pytest.raises(ValueError, match=r"^width 9 lies outside the measured widths 1\.\.8$"):
        curve(9)
    for widths, costs in [((2, 4), (1.0, 1.2)), ((1, 4, 2), (1.0, 1.2, 1.1)), ((1, 2), (1.0, 0.0)), ((1,), ())]:
        with pytest.raises(ValueError, match="^a cost curve"):
            CostCurve(widths, costs)


def test_measured_widths_cover_every_budget_and_the_single_path():
    assert measured_widths(64, 8) == [2, 4, 8, 16, 32, 64, 65]
    assert measured_widths(12, 4) == [2, 4, 8, 13]
    assert measured_widths(2, 8) == [2, 3, 8]


def argmax_by_hand(table: torch.Tensor, cost, n_max: int) -> int:
    ratios = [tree_expected_length(Tree.from_budget(n, table), table) / cost(n + 1) for n in range(1, n_max + 1)]
    return 1 + max(range(n_max), key=lambda i: (ratios[i], -i))


def test_the_choice_is_the_argmax_of_expected_length_per_cost_on_a_stub_curve():
    # a pass of w tokens costs 1 + 0.05 (w - 1) up to 8 wide, then grows steeply: a small tree pays
    curve = CostCurve((1, 8, 16, 32), (1.0, 1.35, 2.5, 5.0))
    choice = choose_nodes(TABLE, curve, 31)
    lengths = expected_lengths(TABLE, 31)
    ratios = {n: lengths[n] / curve(n + 1) for n in range(1, 32)}
    assert choice.nodes == max(ratios, key=ratios.get) == argmax_by_hand(TABLE, curve, 31) == 5
    assert choice.expected == pytest.approx(lengths[5]) and choice.cost == pytest.approx(curve(6))
    assert choice.speedup == pytest.approx(max(ratios.values()))
    assert choice.ratios == pytest.approx(ratios)
    # a free pass: the widest tree; a pass as dear as its width: the one node of highest agreement
    assert choose_nodes(TABLE, CostCurve((1, 32), (1.0, 1.0)), 31).nodes == 31
    assert choose_nodes(TABLE, CostCurve((1, 32), (1.0, 32.0)), 31).nodes == 1


@pytest.mark.parametrize("seed", range(6))
def test_the_choice_equals_the_brute_force_reference(seed):
    table, curve = random_table(seed), random_curve(seed, 41)
    assert choose_nodes(table, curve, 40).nodes == choose_nodes_reference(table, curve, 40)


def test_wrong_choices_are_caught():
    """Choices that weigh the cost of the wrong width, or not at all, differ from the argmax on this curve (a pass is
    free up to 6 tokens, then dear): the checks above would fail them."""
    curve = CostCurve((1, 6, 7, 32), (1.0, 1.0, 1.5, 5.0))
    lengths = expected_lengths(TABLE, 31)
    right = argmax_by_hand(TABLE, curve, 31)
    no_cost = max(range(1, 32), key=lambda n: (lengths[n], -n))
    off_by_one = max(range(1, 32), key=lambda n: (lengths[n] / curve(n), -n))  # cost of n, not n + 1 tokens
    assert right == 5 and no_cost == 31 and off_by_one == 6
    assert choose_nodes(TABLE, curve, 31).nodes == right


def test_the_single_path_competes_as_budget_zero():
    curve = CostCurve((1, 8, 16, 32), (1.0, 1.35, 2.5, 5.0))
    cheap = choose_nodes(TABLE, curve, 31, path_cost=1.0)  # a path as cheap as a greedy step: nothing beats it
    assert cheap.nodes == 0 and cheap.expected == pytest.approx(tree_expected_length(Tree.path(3), TABLE))
    assert choose_nodes(TABLE, curve, 31, path_cost=curve(4)).nodes == 5  # the tree of 3 nodes at least as good
    assert "the single path" in cheap.summary() and cheap.as_record()["nodes"] == 0


@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_measured_costs_on_a_tiny_model(head_type):
    model = random_model(k=4, seed=3, head_type=head_type)
    runtime = build_runtime(model, InferenceOptions())
    trees = [Tree.from_budget(n, TABLE) for n in (1, 7, 31)] + [Tree.path(3)]
    src = random_sources(2, seed=3)
    costs = measure_pass_costs(runtime, src, trees, repeats=2)
    assert len(costs) == 4 and all(c > 0 for c in costs)
    with pytest.raises(ValueError, match="^measure_pass_costs needs"):
        measure_pass_costs(runtime, src, [Tree.path(0)])


@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_the_chosen_tree_decodes_exactly_as_greedy(head_type):
    from lightning_bpd.decoding.trees.budget import auto_tree, measure_rank_agreement

    model = random_model(k=4, seed=4, head_type=head_type)
    if head_type == "chained":
        scramble_chain(model, std=0.05)
    src = random_sources(5, seed=4)
    pick_eos(model, src, 14)
    runtime = build_runtime(model, InferenceOptions())
    from lightning_bpd.evaluation import EvalBatch

    table = measure_rank_agreement(runtime, [EvalBatch(src, 14)])
    tree, choice = auto_tree(runtime, table, 4, src[:1], "auto:20")
    assert 0 <= choice.nodes <= 20 and (tree is None) == (choice.nodes == 0)
    want = greedy_decode(model, src, 14).sequences()
    for nodes in {choice.nodes, 5, 20} - {0}:  # the chosen tree, and trees a steeper or flatter curve would choose
        out = blockwise_decode(runtime, src, Exact(), 14, tree=Tree.from_budget(nodes, table[:3]))
        assert out.sequences() == want, nodes
    if tree is not None:
        assert tree == Tree.from_budget(choice.nodes, table[:3])
