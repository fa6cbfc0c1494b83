"""Tree decoding: the fast decoder against the one-path-at-a-time reference, against greedy, and against
today's single-path blockwise decoding; stub models with hand-written ranks."""

import math

import pytest
import torch

from lightning_bpd.decoding import (
    Distance,
    Exact,
    MinBlock,
    TopK,
    Tree,
    blockwise_decode,
    greedy_decode,
    parse_criterion,
    tree_decode_reference,
)
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.kernels import int8
from tests.models import (
    EOS,
    StubModel,
    TreeStub,
    float32_model,
    pick_eos,
    random_model,
    random_sources,
    scramble_chain,
    stub_sources,
)

MAX_LEN = 16
TREES = {
    "path": Tree.path(3),
    "wide": Tree.from_paths([(0,), (1,), (2,), (3,)]),
    "medusa": Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0)]),
    "shallow": Tree.from_paths([(0,), (1,), (0, 0), (1, 1)]),
}


RUNTIMES = {"float32": {}, "invariant": {"precision": "float32-invariant"}, "packed": {"precision": "float32-packed"},
            "int8": {"precision": "int8"}, "screened": {"screened_argmax": True}, "draft_vocab": {"draft_vocab": range(30)}}


def tree_model(head_type: str, seed: int, k: int = 4):
    model = random_model(k=k, seed=seed, head_type=head_type)
    if model.chained_heads:
        scramble_chain(model, seed=seed)
    return model


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


@pytest.mark.parametrize("tree", list(TREES), ids=str)
@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize("batch", [1, 5])
def test_tree_decoder_equals_the_reference_and_greedy(tree, head_type, batch):
    model = tree_model(head_type, seed=batch + 1)
    src = random_sources(batch, seed=batch + 1)
    pick_eos(model, src, MAX_LEN)
    fast = blockwise_decode(model, src, Exact(), MAX_LEN, tree=TREES[tree])
    slow = tree_decode_reference(model, src, Exact(), MAX_LEN, tree=TREES[tree])
    assert torch.equal(fast.tokens, slow.tokens)
    assert fast.block_sizes == slow.block_sizes
    assert torch.equal(fast.tokens, greedy_decode(model, src, MAX_LEN).tokens)
    assert fast.model_calls == int(fast.iterations.max()) + 1


@pytest.mark.parametrize("criterion", [TopK(2), TopK(3), Distance(2)], ids=lambda c: c.name)
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_approximate_rules_on_trees_equal_the_reference(criterion, head_type):
    model = tree_model(head_type, seed=3)
    src = random_sources(5, seed=3)
    pick_eos(model, src, MAX_LEN)
    fast = blockwise_decode(model, src, criterion, MAX_LEN, tree=TREES["medusa"])
    slow = tree_decode_reference(model, src, criterion, MAX_LEN, tree=TREES["medusa"])
    assert torch.equal(fast.tokens, slow.tokens)
    assert fast.block_sizes == slow.block_sizes


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize(("k", "depth"), [(4, 3), (4, 1), (8, 7), (4, 0)])
def test_the_single_path_tree_is_todays_blockwise_decoding(head_type, k, depth):
    model = tree_model(head_type, seed=k + depth, k=k)
    src = random_sources(6, seed=k)
    pick_eos(model, src, 20)
    today = blockwise_decode(model, src, Exact(), 20, k=depth + 1)
    tree = blockwise_decode(model, src, Exact(), 20, tree=Tree.path(depth))
    assert torch.equal(tree.tokens, today.tokens) and torch.equal(tree.lengths, today.lengths)
    assert tree.block_sizes == today.block_sizes
    assert tree.model_calls == today.model_calls


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize("options", ["float32", "packed", "int8"])
def test_the_single_path_tree_of_a_runtime_is_its_blockwise_decoding(head_type, options):
    """The path proposes through the runtime's fast proposals, as today (int8 chains round unlike the module links)."""
    if options == "int8" and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    runtime = build_runtime(float32_model(seed=5, head_type=head_type), InferenceOptions(**RUNTIMES[options]))
    src = random_sources(6, vocab=40, seed=5)
    today = blockwise_decode(runtime, src, Exact(), 20)
    tree = blockwise_decode(runtime, src, Exact(), 20, tree=Tree.path(3))
    assert torch.equal(tree.tokens, today.tokens) and tree.block_sizes == today.block_sizes


def test_a_wider_tree_accepts_more_than_the_single_path_on_a_random_model():
    model = tree_model("paper", seed=2)
    src = random_sources(8, seed=2)
    pick_eos(model, src, 24)
    path = blockwise_decode(model, src, Exact(), 24, tree=Tree.path(3))
    wide = blockwise_decode(model, src, Exact(), 24, tree=Tree.from_budget(20, [[0.5, 0.3, 0.2]] * 3))
    assert torch.equal(wide.tokens, path.tokens)
    assert wide.mean_accepted_block_size > path.mean_accepted_block_size


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
@pytest.mark.parametrize("options", list(RUNTIMES))
def test_a_runtime_decodes_trees_exactly(head_type, options):
    if options == "int8" and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    runtime = build_runtime(float32_model(seed=3, head_type=head_type), InferenceOptions(**RUNTIMES[options]))
    src = random_sources(4, vocab=40, seed=3)
    greedy = greedy_decode(runtime, src, 20)
    out = blockwise_decode(runtime, src, Exact(), 20, tree=TREES["medusa"])
    assert out.sequences() == greedy.sequences()


# ---- stub models with hand-written ranks -------------------------------------------------------------------------

TARGET = [5 + i for i in range(17)] + [EOS]  # 18 tokens ending in EOS


def test_the_second_choice_branch_accepts_where_the_single_path_stops():
    model = TreeStub([TARGET], k=4, rank_of=lambda i, t, row: 1)  # every head's greedy token is its second choice
    src = stub_sources(1)
    path = blockwise_decode(model, src, Exact(), 50, tree=Tree.path(3))
    assert path.block_sizes == [[1] * len(TARGET)]
    both = blockwise_decode(model, src, Exact(), 50, tree=Tree.from_paths([(0,), (1,), (1, 0), (1, 1), (1, 1, 1)]))
    assert both.sequences() == path.sequences() == [TARGET]
    assert both.block_sizes == [[4, 4, 4, 4, 2]] and both.iterations.item() == math.ceil(len(TARGET) / 4)
    assert both.model_calls == 6 == model.calls - path.model_calls
    assert tree_decode_reference(model, src, Exact(), 50, tree=Tree.from_paths([(1,), (1, 1)])).block_sizes == \
        blockwise_decode(model, src, Exact(), 50, tree=Tree.from_paths([(1,), (1, 1)])).block_sizes == [[3] * 6]


def test_mixed_ranks_rows_finishing_at_different_times_and_max_len():
    # head 1's greedy token is its second choice, head 2's its first, head 3's neither
    targets = [[5, 6, 7, 8, 9, EOS], [10, 11, EOS], [12, 13, 14, 15, 16, 17, 18, 19, 20, 21]]
    ranks = {1: 1, 2: 0, 3: 5}
    model = TreeStub(targets, k=4, rank_of=lambda i, t, row: ranks[i])
    tree = Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (1, 0, 0), (1, 0, 1)])
    out = blockwise_decode(model, stub_sources(3), Exact(), 8, tree=tree)
    assert out.sequences() == [targets[0], targets[1], targets[2][:8]]
    assert out.block_sizes == [[3, 3], [3], [3, 3, 2]]
    ref = tree_decode_reference(model, stub_sources(3), Exact(), 8, tree=tree)
    assert torch.equal(out.tokens, ref.tokens) and out.block_sizes == ref.block_sizes


def test_a_ragged_batch_keeps_each_rows_own_accepted_path_in_the_cache():
    """Rows accept different branches (row 0 the first choices, row 1 the second) in the same iterations."""
    targets = [[5 + i for i in range(11)] + [EOS], [40 + i for i in range(11)] + [EOS]]
    model = TreeStub(targets, k=3, rank_of=lambda i, t, row: row)
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1)])
    out = blockwise_decode(model, stub_sources(2), Exact(), 30, tree=tree)
    assert out.sequences() == targets
    assert out.block_sizes == [[3, 3, 3, 3]] * 2
    for paths, sizes in [([(0,), (0, 0)], [[3] * 4, [1] * 12]), ([(1,), (1, 1)], [[1] * 12, [3] * 4])]:
        assert blockwise_decode(model, stub_sources(2), Exact(), 30, tree=Tree.from_paths(paths)).block_sizes == sizes


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"criterion": Exact(), "tree": Tree.path(4)}, r"a tree 4 deep needs k >= 5 heads, decoding with k=4"),
    ({"criterion": MinBlock(2), "tree": Tree.path(2)}, "deterministic prefix rules"),
    ({"criterion": Exact(), "tree": Tree.path(2), "lazy": True}, "neither lazy verification"),
    ({"criterion": Exact(), "tree": Tree.path(2), "k": 2}, r"needs k >= 3 heads, decoding with k=2"),
])
def test_trees_that_cannot_decode_raise_one_clear_line(kwargs, message):
    model = random_model(k=4, seed=0)
    with pytest.raises(ValueError, match=message):
        blockwise_decode(model, random_sources(2), max_len=8, **kwargs)


def test_a_model_without_a_tree_verify_pass_is_told_so():
    with pytest.raises(ValueError, match="StubModel has no tree verify pass"):
        blockwise_decode(StubModel([TARGET], k=4), stub_sources(1), Exact(), 8, tree=Tree.path(2))
    windowed = random_model(k=4, seed=0, window=4)
    assert windowed.decode_tree is None and build_runtime(windowed).decode_tree is None
    with pytest.raises(ValueError, match=r"^BlockwiseTransformer has no tree verify pass \(decode_tree; e.g. a local"):
        blockwise_decode(windowed, random_sources(2), Exact(), 8, tree=Tree.path(2))
    with pytest.raises(ValueError, match=r"^Runtime has no tree verify pass"):
        make_method("exact", parse_criterion, build_runtime(windowed), tree=Tree.path(2))
    with pytest.raises(TypeError, match="tree must be a Tree"):
        blockwise_decode(random_model(k=4, seed=0), random_sources(2), Exact(), 8, tree=[(0,)])


def test_a_named_method_with_a_tree():
    model = tree_model("paper", seed=4)
    src = random_sources(3, seed=4)
    method = make_method("exact", parse_criterion, model, tree=TREES["medusa"])
    assert method.tree is TREES["medusa"] and method.block_size(model) == 4
    out = method(model, src, MAX_LEN)
    assert out.block_sizes == blockwise_decode(model, src, Exact(), MAX_LEN, tree=TREES["medusa"]).block_sizes
    assert make_method("greedy", parse_criterion, model, tree=TREES["medusa"]).tree is None  # baselines ignore it
    with pytest.raises(ValueError, match="neither fixed shapes"):
        make_method("exact", parse_criterion, model, fixed_shape=True, tree=TREES["medusa"])
    with pytest.raises(ValueError, match="needs k >= 4 heads, decoding with k=2"):
        make_method("top2", parse_criterion, model, k=2, tree=TREES["medusa"])
