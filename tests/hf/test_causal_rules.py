"""The generation config's rules on causal bases (issue 46, deliverable 5): several EOS ids, min_new_tokens,
min_length counting the padded prompt, suppressed and begin-suppressed tokens, forced EOS, bad words of one or
several tokens matched against the prompts as generate does; exact against generate, the references, batch 1."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import (
    Exact,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    greedy_decode_reference,
)
from lightning_bpd.decoding.acceptance import parse_criterion
from lightning_bpd.hf.causal import HFCausalBlockwise
from tests.hf.test_causal import (
    FAMILIES,
    MAX_LEN,
    PAD,
    TREES,
    hf_greedy,
    left_padded,
    pick_eos,
    prompts,
    scramble_head,
    tiny_lm,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def configure(base, src: torch.Tensor) -> None:
    """Several EOS ids (Llama 3 style), min_new_tokens and a suppressed token, each read off the plain output so
    that it changes it."""
    eos = pick_eos(base, src)
    plain = hf_greedy(base, src)
    counts: dict[int, int] = {}
    for row in plain:
        for t in row[1:]:
            counts[t] = counts.get(t, 0) + (t != eos)
    common = sorted(counts, key=lambda t: -counts[t])
    gc = base.generation_config
    gc.eos_token_id = [eos, common[2]]
    gc.min_new_tokens = 3
    gc.suppress_tokens = [common[0]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head_type", ["paper", "chained", "medusa"])
def test_generation_config_rules_at_batch_one_and_ragged(family, head_type):
    base, src = tiny_lm(family, seed=1), prompts(seed=2)
    configure(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    assert want != hf_greedy(tiny_lm(family, seed=1), src), "the rules should change the output"
    assert greedy_decode(model, src, MAX_LEN).sequences() == want
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want
    for row in range(src.shape[0]):
        one = src[row : row + 1, : int((src[row] != PAD).sum())]  # the prompt alone, unpadded
        assert blockwise_decode(model, one, Exact(), MAX_LEN).sequences() == hf_greedy(base, one) == [want[row]]
    fast, slow = (decode(model, src, TopK(2), MAX_LEN) for decode in (blockwise_decode, blockwise_decode_reference))
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_min_length_counts_the_padded_prompt(family):
    """generate's min_length counts the left-padded prompt width: the same prompt ends later in a wider batch."""
    base, src = tiny_lm(family), prompts()
    pick_eos(base, src)
    plain = hf_greedy(base, src)
    base.generation_config.min_length = src.shape[1] + 4
    model = HFCausalBlockwise(base, k=3)
    want = hf_greedy(base, src)
    assert want != plain
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want
    assert greedy_decode_reference(model, src, MAX_LEN).sequences() == want
    one = src[-1:, :1]
    assert blockwise_decode(model, one, Exact(), MAX_LEN).sequences() == hf_greedy(base, one)


@pytest.mark.parametrize("family", ["qwen2", "gpt2"])
def test_forced_eos_begin_suppress_and_single_bad_words(family):
    base, src = tiny_lm(family), prompts()
    eos = pick_eos(base, src)
    plain = hf_greedy(base, src)
    gc = base.generation_config
    gc.forced_eos_token_id = eos
    gc.begin_suppress_tokens = sorted({row[0] for row in plain})[:2]
    gc.bad_words_ids = [[next(row[1] for row in plain if len(row) > 1 and row[1] != eos)]]
    model = HFCausalBlockwise(base, k=4, head_type="medusa")
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    assert want != plain and all(row[-1] == eos for row in want)
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want
    assert greedy_decode_reference(model, src, MAX_LEN).sequences() == want


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_bad_words_of_several_tokens_see_the_prompt(family):
    """generate matches banned words against its left-padded input: a word whose first token ends a prompt bans
    that row's first new token, one of three tokens may start inside the prompt, and one inside the output."""
    base, src = tiny_lm(family), prompts()
    pick_eos(base, src)
    plain = hf_greedy(base, src)
    lefts = left_padded(src)
    row = next(r for r in range(6) if len(plain[r]) > 2)
    gc = base.generation_config
    gc.bad_words_ids = [[int(lefts[0, -1]), plain[0][0]], [*lefts[1, -2:].tolist(), plain[1][0]],
                        plain[row][1:3]]
    model = HFCausalBlockwise(base, k=4, head_type="chained")
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    assert want[0][0] != plain[0][0] and want[1][0] != plain[1][0] and want != plain
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want
    assert greedy_decode(model, src, MAX_LEN).sequences() == want
    assert greedy_decode_reference(model, src, MAX_LEN).sequences() == want
    from lightning_bpd.decoding.methods import make_method
    from lightning_bpd.decoding.trees.tree import Tree

    assert blockwise_decode(model, src, Exact(), MAX_LEN, tree=Tree.from_paths(TREES["medusa"])).sequences() == want
    assert make_method("sample_t0", parse_criterion, model, seed=3)(model, src, MAX_LEN).sequences() == want
    for r in range(2):  # batch 1: the prompt alone, unpadded
        one = src[r : r + 1, : int((src[r] != PAD).sum())]
        assert blockwise_decode(model, one, Exact(), MAX_LEN).sequences() == hf_greedy(base, one)
    fast, slow = (decode(model, src, TopK(2), MAX_LEN) for decode in (blockwise_decode, blockwise_decode_reference))
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("head_type", ["paper", "chained", "medusa"])
def test_tree_sampling_under_the_rules(family, head_type):
    """Lossless sampling on a tree (issue 47) on a causal base: temperature 0 is generate's output, samples obey
    the rules (no suppressed token, no EOS before min_new_tokens), each prompt alone draws the reference's tokens."""
    from lightning_bpd.decoding import SpeculativeSampling, Tree, tree_decode_reference

    base, src = tiny_lm(family, seed=1), prompts(seed=2)
    configure(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    scramble_head(model, std=0.05)
    tree = Tree.from_paths(TREES["medusa"])
    want = hf_greedy(base, src)
    assert blockwise_decode(model, src, SpeculativeSampling(0.0), MAX_LEN, tree=tree).sequences() == want
    gc = base.generation_config
    for row in blockwise_decode(model, src, SpeculativeSampling(1.5, seed=0), MAX_LEN, tree=tree).sequences():
        assert gc.suppress_tokens[0] not in row and all(t not in gc.eos_token_id for t in row[: gc.min_new_tokens])
    for row in (0, 2, 5):
        one = src[row : row + 1, : int((src[row] != PAD).sum())]  # the prompt alone, unpadded
        fast = blockwise_decode(model, one, SpeculativeSampling(seed=row), MAX_LEN, tree=tree)
        slow = tree_decode_reference(model, one, SpeculativeSampling(seed=row), MAX_LEN, tree=tree)
        assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
