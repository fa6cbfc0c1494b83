"""Dynamic trees (EAGLE-2, issue 47): per row and iteration, the nodes of highest path confidence; the fast decoder
against the reference that enumerates the whole tree and checks each candidate on its own, and against greedy."""

import pytest
import torch

from lightning_bpd.decoding import Exact, TopK, Tree, blockwise_decode, greedy_decode
from lightning_bpd.decoding.proposers.dynamic_tree import RowTrees, grow
from lightning_bpd.decoding.protocol import chain_source, first_argmax
from lightning_bpd.decoding.reference.dynamic import dynamic_tree_reference, reference_dynamic_tree
from lightning_bpd.decoding.trees.tree import DynamicTree
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.models import pick_eos, random_model, random_sources, scramble_chain

MAX_LEN = 16
SPECS = {"narrow": DynamicTree(3, 3, 2), "medusa": DynamicTree(9, 3, 3), "wide": DynamicTree(20, 3, 4)}


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


def tree_model(head_type: str, seed: int, k: int = 4):
    model = random_model(k=k, seed=seed, head_type=head_type)
    with torch.no_grad():  # heads confident enough that the confidences rank, and agree with p_1 at times
        for name, p in model.head.named_parameters():
            if p.dim() == 2:
                p.mul_(30.0)
    if model.chained_heads:
        scramble_chain(model, seed=seed)
    return model


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize("batch", [1, 5])
def test_dynamic_trees_equal_the_reference_and_greedy(spec, head_type, batch):
    model = tree_model(head_type, seed=batch + 2)
    src = random_sources(batch, seed=batch + 2)
    pick_eos(model, src, MAX_LEN)
    fast = blockwise_decode(model, src, Exact(), MAX_LEN, tree=SPECS[spec])
    slow = dynamic_tree_reference(model, src, Exact(), MAX_LEN, SPECS[spec])
    assert torch.equal(fast.tokens, greedy_decode(model, src, MAX_LEN).tokens)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes
    if batch > 1 and head_type == "paper":  # where these random heads agree with p_1 at times
        assert max(max(sizes) for sizes in fast.block_sizes) > 1
    assert fast.model_calls == int(fast.iterations.max()) + 1


@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_each_row_grows_the_reference_tree_of_its_own_state(head_type):
    model = tree_model(head_type, seed=4)
    src = random_sources(5, seed=4)
    spec = SPECS["medusa"]
    with torch.no_grad():
        context = model.encode(src)
        h = model.decode_full(torch.full((5, 1), model.bos_id), context)[:, -1]  # (5, D)
        first = first_argmax(model, h)
        trees = grow(model, spec, h, first, chain_source(model, context))
    shapes = set()
    for b, row in enumerate(strip_rows(src, model.pad_id)):
        one = model.encode(row)
        tree, tokens = reference_dynamic_tree(model, spec, model.decode_full(torch.tensor([[model.bos_id]]), one)[:, -1],
                                              int(first[b]), one)
        # the same nodes (each as the tokens of its root path), numbered by depth and confidence, not by path
        fast = {tuple(trees.tokens[b, trees.paths[b, i, : int(trees.depths[b, i]) + 1]].tolist())
                for i in range(spec.size)}
        assert fast == {tuple(tokens[j] for j in tree.root_path(i)) for i in range(tree.size)}
        assert sorted(trees.depths[b].tolist()) == trees.depths[b].tolist() == list(tree.depths)
        assert trees.parents[b, 0] == 0 and bool((trees.parents[b, 1:] < torch.arange(1, spec.size)).all())
        shapes.add(tree.paths)
    assert len(shapes) > 1  # the rows grew different trees


def strip_rows(src: torch.Tensor, pad_id: int) -> list[torch.Tensor]:
    from lightning_bpd.decoding.greedy import strip_padding

    return strip_padding(src, pad_id)


def test_row_tables_of_a_static_tree_are_its_own():
    tree = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    parents = torch.tensor([[0, *tree.parents[1:]]] * 2)
    depths = torch.tensor([tree.depths] * 2)
    rows = RowTrees.of(torch.zeros_like(depths), depths, parents, tree.depth)
    assert torch.equal(rows.ancestors, tree.ancestors().expand(2, -1, -1))
    assert torch.equal(rows.paths, tree.path_table().expand(2, -1, -1))


@pytest.mark.parametrize("options", [{}, {"precision": "float32-packed"}, {"draft_vocab": range(12)}], ids=str)
def test_a_runtime_decodes_dynamic_trees_exactly(options):
    model = tree_model("chained", seed=3).float()
    src = random_sources(4, seed=3)
    pick_eos(model, src, MAX_LEN)
    runtime = build_runtime(model, InferenceOptions(**options))
    out = blockwise_decode(runtime, src, Exact(), MAX_LEN, tree=SPECS["medusa"])
    assert out.sequences() == greedy_decode(runtime, src, MAX_LEN).sequences()


@pytest.mark.parametrize(("make", "message"), [
    (lambda: DynamicTree(0, 2), r"^a dynamic tree's nodes, depth and width must be integers >= 1"),
    (lambda: DynamicTree(7, 2, 2), r"^a dynamic tree 2 deep and 2 wide has at most 6 nodes, got 7$"),
    (lambda: blockwise_decode(random_model(k=3), random_sources(1), TopK(2), 8, tree=DynamicTree(4, 2)),
     r"^dynamic trees take exact acceptance, not top2$"),
    (lambda: blockwise_decode(random_model(k=3), random_sources(1), Exact(), 8, tree=DynamicTree(4, 3)),
     r"^a dynamic tree 3 deep needs k >= 4 heads, decoding with k=3$"),
])
def test_dynamic_trees_that_cannot_decode_raise_one_clear_line(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_a_named_method_and_the_command_line_take_a_dynamic_tree():
    from lightning_bpd.decoding import parse_criterion, parse_tree
    from lightning_bpd.decoding.methods import make_method

    assert parse_tree("dynamic:16:3") == DynamicTree(16, 3, 4) and parse_tree(" dynamic:8:2:3") == DynamicTree(8, 2, 3)
    for bad, message in [("dynamic:16", "a dynamic tree is dynamic:N:D or dynamic:N:D:W"), ("dynamic:a:2", "invalid"),
                         ("dynamic:9:2:2", "at most 6 nodes")]:
        with pytest.raises(ValueError, match=rf"^--tree '{bad}': .*{message}"):
            parse_tree(bad)
    model = tree_model("paper", seed=6)
    src = random_sources(3, seed=6)
    method = make_method("exact", parse_criterion, model, tree=DynamicTree(6, 3, 2))
    assert method.block_size(model) == 4
    assert method(model, src, MAX_LEN).sequences() == greedy_decode(model, src, MAX_LEN).sequences()
    with pytest.raises(ValueError, match="^dynamic trees take exact acceptance, not top2$"):
        make_method("top2", parse_criterion, model, tree=DynamicTree(6, 3, 2))
