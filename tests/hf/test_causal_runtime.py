"""A causal base behind the inference runtime: its proposer (fused chain links, a draft vocabulary, a bfloat16
proposal copy) and its products (float64, int8, packed) reach the heads and every linear layer of the base."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.hf.test_causal import MAX_LEN, hf_greedy, pick_eos, prompts, scramble_head, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_runtime_decodes_as_the_model():

    base, src = tiny_lm("qwen3"), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4)
    scramble_head(model, std=0.05)
    runtime = build_runtime(model, InferenceOptions())
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == hf_greedy(base, src)


@pytest.mark.parametrize("head_type", ["paper", "chained", "medusa"])
@pytest.mark.parametrize("options", ["plain", "draft_vocab", "bfloat16_proposals"])
def test_a_runtimes_fast_proposals_stay_exact(head_type, options):
    """The runtime's proposer on a causal base: fused chain links, a draft vocabulary, proposals from a bfloat16
    copy of the heads; exact decoding still equals generate, and the proposer is in use."""

    base, src = tiny_lm("llama", dtype=torch.float32), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    opts = {"plain": InferenceOptions(), "draft_vocab": InferenceOptions(draft_vocab=tuple(range(3, 40))),
            "bfloat16_proposals": InferenceOptions(proposal_precision="bfloat16")}[options]
    runtime = build_runtime(model, opts)
    assert runtime.proposer is not None
    assert (runtime.chain_draft is not None) == (head_type == "chained")
    fast = blockwise_decode(runtime, src, Exact(), MAX_LEN)
    assert fast.sequences() == want
    assert greedy_decode(runtime, src, MAX_LEN).sequences() == want
    if options == "plain":  # the proposer's tokens are the model's own: the same blocks accepted
        assert fast.block_sizes == blockwise_decode(model, src, Exact(), MAX_LEN).block_sizes
    assert (runtime.draft_vocab is not None) == (options == "draft_vocab")
    assert (runtime.proposer.proposal is not None) == (options == "bfloat16_proposals")


def test_an_invariant_runtime_decodes_like_generate():
    """float64 products in a float32 runtime: every nn.Linear of the causal base through the runtime's products."""
    from lightning_bpd.inference.product_swap import ProductLinear

    base, src = tiny_lm("qwen2", dtype=torch.float32), prompts()
    pick_eos(base, src)
    runtime = build_runtime(HFCausalBlockwise(base, k=3, head_type="chained"), InferenceOptions(
        precision="float32-invariant"))
    assert all(type(m) is ProductLinear for m in runtime.model.base.modules() if isinstance(m, torch.nn.Linear))
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == hf_greedy(base, src)


@pytest.mark.hardware
@pytest.mark.parametrize("precision", ["int8", "float32-packed"])
def test_exact_equals_the_runtimes_greedy_on_a_causal_base(precision):
    from lightning_bpd.kernels import int8, onednn

    if (precision == "int8" and not int8.available()) or (precision == "float32-packed" and not onednn.available()):
        pytest.skip("kernel not available")
    base, src = tiny_lm("llama", dtype=torch.float32), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type="chained")
    scramble_head(model, std=0.05)
    runtime = build_runtime(model, InferenceOptions(precision=precision))
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == greedy_decode(runtime, src, MAX_LEN).sequences()
