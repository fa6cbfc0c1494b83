"""Issue 47 on the Hugging Face bases: ``--tree-nodes auto``'s cost curve measured through a seq2seq and a causal
base's own verify pass, the chosen tree (and those a flatter or steeper curve would choose) decoding exactly as
``generate``; dynamic trees (EAGLE-2) equal to ``generate`` and to their reference."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, Tree, blockwise_decode
from lightning_bpd.decoding.trees.budget import auto_tree, measure_rank_agreement
from lightning_bpd.evaluation import EvalBatch
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.hf import test_causal as causal
from tests.hf.test_generation_config import MAX_LEN, hf_greedy, model_for

pytestmark = pytest.mark.usefixtures("one_thread")


def check_auto(model, src: torch.Tensor, want: list[list[int]], max_len: int) -> None:
    runtime = build_runtime(model, InferenceOptions())
    table = measure_rank_agreement(runtime, [EvalBatch(src, max_len)])
    tree, choice = auto_tree(runtime, table, model.k, src[:2], "auto:12", repeats=2)
    assert set(choice.ratios) == set(range(13)) and (tree is None) == (choice.nodes == 0)
    for nodes in {choice.nodes, 3, 12} - {0}:
        out = blockwise_decode(runtime, src, Exact(), max_len, tree=Tree.from_budget(nodes, table[: model.k - 1]))
        assert out.sequences() == want, nodes


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_auto_on_a_seq2seq_base_equals_generate(family):
    base, model, src = model_for(family, "all", "chained_attn")
    check_auto(model, src, hf_greedy(base, src, MAX_LEN), MAX_LEN)


@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_auto_on_a_causal_base_equals_generate(head_type):
    base, src = causal.tiny_lm("llama"), causal.prompts()
    causal.pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    causal.scramble_head(model, std=0.05)
    check_auto(model, src, causal.hf_greedy(base, src), causal.MAX_LEN)


# ---- dynamic trees (EAGLE-2) on the Hugging Face bases ----------------------------------------------------------------
@pytest.mark.parametrize("family", ["marian", "t5"])
def test_dynamic_trees_on_a_seq2seq_base_equal_generate_and_the_reference(family):
    from lightning_bpd.decoding.reference.dynamic import dynamic_tree_reference
    from lightning_bpd.decoding.trees.tree import DynamicTree

    base, model, src = model_for(family, "all", "chained_attn")
    spec = DynamicTree(8, 3, 3)
    fast = blockwise_decode(model, src, Exact(), MAX_LEN, tree=spec)
    assert fast.sequences() == hf_greedy(base, src, MAX_LEN)
    slow = dynamic_tree_reference(model, src, Exact(), MAX_LEN, spec)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes
    runtime = build_runtime(model, InferenceOptions())  # lean steps on the BART family
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN, tree=spec).sequences() == fast.sequences()


@pytest.mark.parametrize("family, extra", [("llama", {}), ("gpt2", {}), ("mistral", {"sliding_window": 4})])
@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_dynamic_trees_on_a_causal_base_equal_generate_and_the_reference(family, extra, head_type):
    from lightning_bpd.decoding.reference.dynamic import dynamic_tree_reference
    from lightning_bpd.decoding.trees.tree import DynamicTree

    base, src = causal.tiny_lm(family, **extra), causal.prompts()
    causal.pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    causal.scramble_head(model, std=0.05)
    spec = DynamicTree(8, 3, 3)
    fast = blockwise_decode(model, src, Exact(), causal.MAX_LEN, tree=spec)
    assert fast.sequences() == causal.hf_greedy(base, src)
    slow = dynamic_tree_reference(model, src, Exact(), causal.MAX_LEN, spec)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes
