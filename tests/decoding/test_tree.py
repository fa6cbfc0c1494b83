"""The Tree: construction from Medusa's choices, validation, its mask and tables, and the budgeted tree."""

import pytest
import torch

from lightning_bpd.decoding import Tree, parse_tree

PATHS = [(1,), (0, 1), (0,), (0, 0), (1, 0), (0, 0, 0)]


def test_nodes_are_numbered_by_depth_then_path_with_parents_depths_and_ranks():
    tree = Tree.from_paths(PATHS)
    assert tree.paths == ((), (0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert tree.parents == (-1, 0, 0, 1, 1, 2, 3)
    assert tree.depths == (0, 1, 1, 2, 2, 2, 3)
    assert tree.ranks == (0, 0, 1, 0, 1, 0, 0)
    assert (tree.size, tree.depth, tree.widths()) == (7, 3, [2, 2, 1])
    assert tree.leaves() == [4, 5, 6]
    assert tree.leaf_paths() == [[0, 1, 4], [0, 2, 5], [0, 1, 3, 6]]


def test_the_tree_mask_lets_each_node_see_its_ancestors_and_itself_only():
    tree = Tree.from_paths(PATHS)
    mask = tree.ancestors()
    for i in range(tree.size):
        assert mask[i].nonzero()[:, 0].tolist() == tree.root_path(i)
    assert tree.table("depths").tolist() == list(tree.depths)
    assert tree.path_table().tolist()[4] == [0, 1, 4, 4]  # padded with the node itself
    assert tree.path_table().tolist()[6] == [0, 1, 3, 6]


def test_the_single_path_is_a_lower_triangular_mask():
    tree = Tree.path(3)
    assert tree.is_path and tree.size == 4 and tree.depth == 3
    assert torch.equal(tree.ancestors(), torch.ones(4, 4, dtype=torch.bool).tril())
    assert not Tree.from_paths([(0,), (1,)]).is_path
    assert Tree.from_paths([]).size == 1 and Tree.path(0).depth == 0


@pytest.mark.parametrize(("paths", "message"), [
    ([(0,), (0, 1, 0)], r"\(0, 1, 0\) needs its parent \(0, 1\)"),
    ([(0,), (-1,)], r"ranks must be integers >= 0, got \(-1,\)"),
    ([(0,), (0.5,)], r"ranks must be integers >= 0"),
    ([(0,), [0]], r"\(0,\) is listed twice"),
    ([()], r"the empty path is the root"),
])
def test_bad_paths_raise_one_clear_line(paths, message):
    with pytest.raises(ValueError, match=message) as err:
        Tree.from_paths(paths)
    assert "\n" not in str(err.value)


def test_the_budgeted_tree_adds_the_best_expected_node_first():
    agreement = [[0.6, 0.3, 0.05], [0.5, 0.2, 0.1]]  # depth 1, depth 2; ranks 0..2
    # expected contributions: (0,) .6, (1,) .3, (0,0) .3, (0,1) .12, (1,0) .15, (2,) .05, ...
    assert Tree.from_budget(1, agreement).paths == ((), (0,))
    assert Tree.from_budget(3, agreement).paths == ((), (0,), (1,), (0, 0))  # a tie of .3: the shorter first
    assert Tree.from_budget(5, agreement).paths == ((), (0,), (1,), (0, 0), (0, 1), (1, 0))
    assert Tree.from_budget(0, agreement).size == 1
    full = Tree.from_budget(12, agreement)
    assert full.size == 13 and full.depth == 2 and full.widths() == [3, 3]


def test_a_perfect_first_choice_budgets_the_single_path():
    agreement = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]]
    assert Tree.from_budget(3, agreement).is_path


@pytest.mark.parametrize(("n", "agreement", "message"), [
    (7, [[0.5, 0.5], [0.5, 0.5]], r"n_nodes must be an integer in \[0, 6\]"),
    (1, [[1.5]], r"probabilities in \[0, 1\]"),
    (1, [0.5, 0.5], r"a non-empty \(depth, ranks\) table"),
])
def test_bad_budgets_raise_one_clear_line(n, agreement, message):
    with pytest.raises(ValueError, match=message):
        Tree.from_budget(n, agreement)


def test_trees_from_the_command_line():
    assert parse_tree("0;1;0,0;0,1") == Tree.from_paths([(0,), (1,), (0, 0), (0, 1)])
    assert parse_tree("path:2") == Tree.path(2)
    with pytest.raises(ValueError, match=r"--tree '0;1,1': tree paths: \(1, 1\) needs its parent \(1,\)"):
        parse_tree("0;1,1")
    with pytest.raises(ValueError, match="--tree 'a'"):
        parse_tree("a")
