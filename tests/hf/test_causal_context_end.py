"""Decoding up to the very end of a causal base's context (issue 46): a prompt that leaves exactly N positions is
continued by N tokens equal to ``generate``'s, by exact blockwise decoding, trees and a runtime, and no input
past the context ever reaches the base (GPT-2's absolute positions would index past their table); one position
fewer is refused in one line."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, TopK, blockwise_decode, greedy_decode
from lightning_bpd.decoding.reference.blockwise import blockwise_decode_reference
from lightning_bpd.decoding.reference.tree import tree_decode_reference
from lightning_bpd.decoding.static import static_decode
from lightning_bpd.decoding.trees.tree import Tree
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.inference import build_runtime
from tests.hf.test_causal import hf_greedy, prompts, scramble_head, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

CONTEXT, NEW = 64, 10  # the tiny bases' positions; new tokens per prompt
TREE = Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (0, 0, 0)])


@pytest.fixture
def within_context(monkeypatch):
    """Every input a decode step feeds sits inside the context (the decoders' cap, not the adapter's clamp)."""
    fed = HFCausalBlockwise.fed_positions

    def checked(self, q_pos):
        assert int(q_pos.max()) < self.n_positions, int(q_pos.max())
        return fed(self, q_pos)

    monkeypatch.setattr(HFCausalBlockwise, "fed_positions", checked)


def model_of(family: str, head_type: str = "paper") -> tuple[HFCausalBlockwise, torch.Tensor]:
    """A tiny base with k = 4 heads, its EOS unreachable (rows run to the cap), and a ragged batch whose longest
    prompt leaves exactly NEW positions."""
    base = tiny_lm(family)
    base.config.eos_token_id = base.generation_config.eos_token_id = None
    model = HFCausalBlockwise(base, k=4, head_type=head_type, pad_id=0)
    scramble_head(model, std=0.05)
    return model, prompts(4, seed=2, width=CONTEXT - NEW)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_a_prompt_that_leaves_exactly_n_positions_decodes_as_generate(family, head_type, within_context):
    model, src = model_of(family, head_type)
    want = hf_greedy(model.base, src, NEW)
    assert all(len(row) == NEW for row in want)
    assert blockwise_decode(model, src, Exact(), NEW).sequences() == want
    assert greedy_decode(model, src, NEW).sequences() == want
    assert blockwise_decode(model, src, Exact(), NEW, tree=TREE).sequences() == want
    assert blockwise_decode(build_runtime(model), src, Exact(), NEW).sequences() == want
    one = src[:1]  # the longest prompt alone: every pass of the last blocks shrinks
    fast, slow = blockwise_decode(model, one, TopK(2), NEW), blockwise_decode_reference(model, one, TopK(2), NEW)
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
    fast = blockwise_decode(model, one, TopK(2), NEW, tree=TREE)
    slow = tree_decode_reference(model, one, TopK(2), NEW, tree=TREE)
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_the_fixed_shape_decoder_reaches_the_end_too(family):
    """Its blocks stay k wide (finished rows ride along): the adapter caps the positions past the context, which
    nothing reads."""
    model, src = model_of(family)
    assert static_decode(model, src, Exact(), NEW).sequences() == hf_greedy(model.base, src, NEW)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_one_position_fewer_is_refused_in_one_line(family):
    model, src = model_of(family)
    longer = torch.cat([src, torch.full((src.shape[0], 1), 0)], dim=1)
    longer[0, -1] = 5  # the longest prompt one token longer: it leaves NEW - 1 positions
    for decode in (lambda: blockwise_decode(model, longer, Exact(), NEW),
                   lambda: blockwise_decode(model, longer, Exact(), NEW, tree=TREE),
                   lambda: greedy_decode(model, longer, NEW)):
        with pytest.raises(ValueError, match=f"^src row 0: the model's context holds {NEW - 1} new tokens after it, "
                                             f"fewer than max_len={NEW}$"):
            decode()
