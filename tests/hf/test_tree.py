"""Trees of candidates on the Hugging Face bases (issue 47): the verify pass over a tree's nodes equals the HF
decoder's own uncached pass over each node's path (HF layers and lean steps, T5's relative bias at per-node
positions), and tree decoding equals greedy, ``generate`` and the one-candidate-at-a-time reference; tree sampling
obeys the generation config and equals its reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import (
    Exact,
    SpeculativeSampling,
    TopK,
    Tree,
    blockwise_decode,
    greedy_decode,
    parse_criterion,
    tree_decode_reference,
)
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.hf import HFSeq2SeqBlockwise
from lightning_bpd.hf.step_cache import tree_positions
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.hf.test_base import FAMILIES, PAD, VOCAB, sources, tiny_base
from tests.hf.test_generation_config import MAX_LEN, hf_greedy, model_for
from tests.models import assert_close_to_rounding

pytestmark = pytest.mark.usefixtures("one_thread")

TREE = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
MEDUSA = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0)])


def ragged_cache(model: HFSeq2SeqBlockwise, context, prefixes: torch.Tensor, lengths: list[int]):
    """A cache holding prefixes[b, :lengths[b]] of each row (a longer write cropped back)."""
    cache = model.new_cache(prefixes.shape[0], capacity=32)
    model.decode_step(prefixes, context, cache)
    cache.crop(torch.tensor(lengths))
    return cache


def tree_pass(model: HFSeq2SeqBlockwise, lean: bool, seed: int = 7):
    """A verify pass of TREE over random tokens after ragged random prefixes: (hidden (B, N, D), prefixes, lengths,
    tokens, context)."""
    src = sources(3, seed=seed)
    g = torch.Generator().manual_seed(seed)
    prefixes = torch.randint(3, VOCAB, (3, 6), generator=g)
    prefixes[:, 0] = model.bos_id
    lengths = [6, 2, 4]
    tokens = torch.randint(3, VOCAB, (3, TREE.size), generator=g)
    net = build_runtime(model, InferenceOptions(lean_steps=True)).model if lean else model  # a runtime's snapshot
    with torch.no_grad():
        assert net.runs_lean() == (lean and not model.t5)
        context = net.encode(src)
        cache = ragged_cache(net, context, prefixes, lengths)
        hidden = net.decode_tree(tokens, TREE.table("depths"), TREE.ancestors(), context, cache)
    assert cache.lengths.tolist() == [n + TREE.size for n in lengths]
    return hidden, prefixes, lengths, tokens, context, cache


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("attention", "lean"), [("sdpa", False), ("sdpa", True), ("eager", False)])
def test_every_nodes_hidden_state_is_the_uncached_pass_over_its_own_path(family, attention, lean):
    model = HFSeq2SeqBlockwise(tiny_base(family, attention=attention), k=4)
    hidden, prefixes, lengths, tokens, context, _ = tree_pass(model, lean)
    for b, n in enumerate(lengths):
        for i in range(TREE.size):
            path = tokens[b, TREE.root_path(i)]
            full = model.decode_full(torch.cat([prefixes[b, :n], path])[None], context.select(torch.tensor([b])))
            assert_close_to_rounding(hidden[b, i], full[0, -1])


@pytest.mark.parametrize("family", ["bart", "mbart"])
def test_the_lean_tree_pass_is_the_layers_pass_to_rounding(family):
    model = HFSeq2SeqBlockwise(tiny_base(family), k=4)
    layers = tree_pass(model, lean=False)
    lean = tree_pass(model, lean=True)
    assert_close_to_rounding(lean[0], layers[0])
    assert_close_to_rounding(lean[5].v, layers[5].v)  # the nodes' values, at their slots


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_keeping_the_accepted_path_then_stepping_on_equals_the_uncached_pass(family):
    model = HFSeq2SeqBlockwise(tiny_base(family), k=4)
    _, prefixes, lengths, tokens, context, cache = tree_pass(model, lean=False)
    accepted = torch.tensor([7, 6, 0])  # paths to node 7 (0, 1, 4, 7), node 6 (0, 2, 6), the root alone
    kept = torch.tensor([4, 3, 1])
    cache.keep_path(TREE.path_table()[accepted], kept, TREE.size)
    assert cache.lengths.tolist() == [n + m for n, m in zip(lengths, kept.tolist())]
    nxt = torch.tensor([[11], [12], [13]])
    with torch.no_grad():
        h = model.decode_step(nxt, context, cache)[:, -1]  # (3, D)
    for b, n in enumerate(lengths):
        row = torch.cat([prefixes[b, :n], tokens[b, TREE.root_path(int(accepted[b]))], nxt[b]])
        full = model.decode_full(row[None], context.select(torch.tensor([b])))
        assert_close_to_rounding(h[b], full[0, -1])


def test_tree_positions_give_each_node_and_each_key_its_own_position():
    queries, keys = tree_positions(torch.tensor([2, 0]), TREE.table("depths"), stop=2 + TREE.size + 1)
    assert queries.tolist() == [[2, 3, 3, 3, 4, 4, 4, 5], [0, 1, 1, 1, 2, 2, 2, 3]]
    assert keys[0].tolist() == [0, 1, 2, 3, 3, 3, 4, 4, 4, 5, 10]  # the prefix, then the nodes' own positions
    assert keys[1, :TREE.size].tolist() == queries[1].tolist()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_tree_decoding_equals_greedy_generate_and_the_reference(family, head_type):
    """With the generation config forcing BOS and EOS (and every other rule of ``model_for``'s "all")."""
    base, model, src = model_for(family, "all", head_type)
    want = hf_greedy(base, src, MAX_LEN)
    assert greedy_decode(model, src, MAX_LEN).sequences() == want
    fast = blockwise_decode(model, src, Exact(), MAX_LEN, tree=MEDUSA)
    assert fast.sequences() == want
    assert max(max(sizes) for sizes in fast.block_sizes) > 1
    slow = tree_decode_reference(model, src, Exact(), MAX_LEN, tree=MEDUSA)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes
    runtime = build_runtime(model, InferenceOptions())  # lean steps on the BART family
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN, tree=MEDUSA).sequences() == want
    for row in (0, 3):  # batch 1: the row alone, unpadded
        one = src[row : row + 1, : int((src[row] != PAD).sum())]
        assert blockwise_decode(model, one, Exact(), MAX_LEN, tree=MEDUSA).sequences() == [want[row]]


@pytest.mark.parametrize("family", ["mbart", "t5"])
def test_an_approximate_rule_on_a_tree_equals_the_reference(family):
    _, model, src = model_for(family, "all", "paper", seed=1)
    fast = blockwise_decode(model, src, TopK(2), MAX_LEN, tree=TREE)
    slow = tree_decode_reference(model, src, TopK(2), MAX_LEN, tree=TREE)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes


def test_a_tree_wider_than_the_heads_decodes_up_to_the_checkpoints_last_position():
    """A tree's nodes past its depth take slots that no position reaches: max_len may be the table's length."""
    model = HFSeq2SeqBlockwise(tiny_base("marian"), k=4)
    src = sources(2)
    n = model.n_positions  # 64
    greedy = greedy_decode(model, src, n)
    assert max(greedy.lengths.tolist()) == n  # a row that reaches the last position
    assert blockwise_decode(model, src, Exact(), n, tree=TREE).sequences() == greedy.sequences()
    with pytest.raises(ValueError, match="max_len too long: the checkpoint has 64 decoder positions"):
        blockwise_decode(model, src, Exact(), n + 1, tree=TREE)


@pytest.mark.parametrize("family", ["marian", "t5"])
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_tree_sampling_applies_the_rules_and_draws_what_the_reference_draws(family, head_type):
    """Lossless sampling on a tree (the walk reads p_1 under the generation config's rules at every node):
    temperature 0 is ``generate``'s greedy output, samples obey the rules, and each row alone draws the reference's
    tokens at the same seed."""
    base, model, src = model_for(family, "all", head_type)
    want = hf_greedy(base, src, MAX_LEN)
    assert make_method("sample_t0", parse_criterion, model, tree=MEDUSA)(model, src, MAX_LEN).sequences() == want
    gc = base.generation_config
    for seed in range(2):
        for row in blockwise_decode(model, src, SpeculativeSampling(1.5, seed=seed), MAX_LEN, tree=MEDUSA).sequences():
            assert row[0] == gc.forced_bos_token_id and gc.suppress_tokens[0] not in row
            assert all(t not in gc.eos_token_id for t in row[:-1])
            if len(row) == MAX_LEN:
                assert row[-1] in gc.eos_token_id  # forced EOS at the cap
    for row in (0, 3):
        one = src[row : row + 1, : int((src[row] != PAD).sum())]
        fast = blockwise_decode(model, one, SpeculativeSampling(seed=row), MAX_LEN, tree=TREE)
        slow = tree_decode_reference(model, one, SpeculativeSampling(seed=row), MAX_LEN, tree=TREE)
        assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
