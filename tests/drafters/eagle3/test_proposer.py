"""The EAGLE-3 proposer in the one loop (issue 54 item 3): every row = the checkpoint's own greedy ``generate`` on
ragged batches (Hugging Face bases and our own), with the whole vocabulary or a draft vocabulary; each chain is the
drafter's training-time test over the target's uncached features (step 0) and its own states (later steps); lossless
speculative sampling."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, decode, greedy_decode_reference
from lightning_bpd.drafters.eagle3.network import Eagle3Config, Eagle3Drafter, vocab_mapping
from lightning_bpd.drafters.eagle3.proposer import Eagle3, Eagle3Drafting
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.hf import test_causal as causal
from tests.models import assert_close_to_rounding
from tests.nn import test_causal_model as own

pytestmark = pytest.mark.usefixtures("one_thread")


def drafter_for(hidden: int, vocab: int, draft_vocab: int | None = None, seed: int = 7,
                embeddings: torch.Tensor | None = None) -> Eagle3Drafter:
    """A random EAGLE-3 drafter (float64) over a 2-layer target of width ``hidden``; with ``draft_vocab``, the
    draft vocabulary of a random count of the target's tokens. Weights scaled up so that its drafts vary."""
    torch.manual_seed(seed)
    config = Eagle3Config(hidden_size=hidden, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          target_layer_ids=(0, 1), vocab_size=vocab, draft_vocab_size=draft_vocab or vocab)
    drafter = Eagle3Drafter(config).double().eval()
    with torch.no_grad():
        for p in drafter.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    if embeddings is not None:
        drafter.set_embeddings(embeddings)
    if draft_vocab:
        drafter.set_vocab_mapping(*vocab_mapping(torch.rand(vocab, generator=torch.Generator().manual_seed(seed)),
                                                 draft_vocab))
    return drafter


def state_of(drafting) -> dict:
    """A drafting object's fields (to make a recording subclass of it, its cache filled)."""
    return {f.name: getattr(drafting, f.name) for f in fields(drafting)}


@dataclass
class Recording(Eagle3Drafting):
    log: list = field(default_factory=list)

    def propose(self, state, features):
        path = super().propose(state, features)
        self.log.append((state.book.committed().tolist(), path.block.tokens.clone()))
        return path


@dataclass(frozen=True)
class Recorded(Eagle3):
    def start(self, state, prompt):
        base = super().start(state, prompt)
        self.__dict__.setdefault("made", []).append(Recording(**state_of(base)))
        return self.made[-1]


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_eagle3_decoding_equals_generate_on_a_ragged_batch(family, draft_vocab):
    base, src, max_len = causal.tiny_lm(family), causal.prompts(6, side="left"), 14
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    assert {len(r) for r in want} != {max_len} and max_len in {len(r) for r in want}
    drafter = drafter_for(32, causal.VOCAB, draft_vocab, embeddings=base.get_input_embeddings().weight)
    for m in (model, build_runtime(model, InferenceOptions())):
        for size in (2, 5):
            got = decode(m, src, Exact(), Eagle3(drafter, size), max_len=max_len)
            assert got.sequences() == want
            assert max(max(sizes) for sizes in got.block_sizes) <= size


def test_our_own_base_decodes_as_greedy():
    model, src = own.tiny(k=1), own.prompts(6, side="right")
    own.pick_eos(model, src)
    want = greedy_decode_reference(model, src, own.MAX_LEN).sequences()
    drafter = drafter_for(32, own.VOCAB, embeddings=model.embedding_table())
    assert decode(model, src, Exact(), Eagle3(drafter, 4), max_len=own.MAX_LEN).sequences() == want


def uncached_features(base, tokens: list[int]) -> torch.Tensor:
    out = base.base_model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[1], out.hidden_states[2]], dim=-1)  # (1, T, 2D): layers 0 and 1


@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_each_chain_is_the_training_time_test_over_the_target_features(draft_vocab):
    """Batch 1: every proposal [first, d_2, .., d_w] is what train_forward drafts at the slot of the last committed
    position, with the target's uncached features of the committed sequence and the proposal's own tokens fed."""
    base = causal.tiny_lm("llama")
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(32, causal.VOCAB, draft_vocab, embeddings=base.get_input_embeddings().weight)
    prompt = causal.prompts(1, width=7)[0]
    prompt = prompt[prompt != causal.PAD][None]  # (1, n)
    proposer = Recorded(drafter, 5)
    got = decode(model, prompt, Exact(), proposer, max_len=16)
    out = got.sequences()[0]
    n, log = prompt.shape[1], proposer.made[-1].log
    assert len(log) == got.model_calls - 1 and len(log) >= 3
    for committed, tokens in log:
        c, block = committed[0], tokens[0].tolist()
        assert block[0] == out[c]  # greedy's next token opens the block
        seq = prompt[0].tolist() + out[:c] + block  # positions 0 .. n + c - 1 committed, then the proposal
        features = uncached_features(base, seq)  # only positions <= n + c - 1 are read at the slot below
        logits = drafter.train_forward(features, torch.tensor([seq]), steps=len(block) - 1)  # (1, w-1, T, Vd)
        drafts = drafter.draft_to_target(logits[0, :, n + c - 1].argmax(dim=-1))
        assert drafts.tolist() == block[1:]


def test_what_the_proposer_cannot_serve_is_one_line():
    from tests.models import random_model, random_sources

    base, src = causal.tiny_lm("llama"), causal.prompts(4)
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(32, causal.VOCAB)
    with pytest.raises(ValueError, match=r"block_size .* must be an integer in \[2, 64\], got 1"):
        decode(model, src, Exact(), Eagle3(drafter, 1), max_len=8)
    with pytest.raises(ValueError, match="target layers"):
        bad = drafter_for(32, causal.VOCAB)
        object.__setattr__(bad.config, "target_layer_ids", (0, 5))
        decode(model, src, Exact(), Eagle3(bad), max_len=8)
    with pytest.raises(ValueError, match="no target features"):
        decode(random_model(k=1), random_sources(2), Exact(), Eagle3(drafter), max_len=8)
    with pytest.raises(ValueError, match=r"vocabulary \(90\) is not the target's \(80\)"):
        decode(model, src, Exact(), Eagle3(drafter_for(32, 90)), max_len=8)


@pytest.mark.parametrize("draft_vocab", [None, 4])
def test_speculative_sampling_with_the_drafter_is_lossless(draft_vocab):
    """Sequences sampled with the drafter proposing (over the whole vocabulary, or 4 of its 6 tokens) follow
    ancestral sampling from the target's p_1 exactly (chi-square against the exact sequence probabilities of a
    6-token Llama), and drafted tokens do get accepted."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    from lightning_bpd.decoding.acceptance import SpeculativeSampling
    from tests.decoding.sampling_helpers import MAX_LEN, N_SAMPLES, P_MIN, chi_square_p_value, sequence_probabilities

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=6, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=32, pad_token_id=0, bos_token_id=1,
                         eos_token_id=2, tie_word_embeddings=False)
    base = AutoModelForCausalLM.from_config(config).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (1.0 if "embed" in name else 0.6))
    model = HFCausalBlockwise(base, k=1)
    src = torch.tensor([[3, 4, 5, 3]])
    exact = sequence_probabilities(model, src, MAX_LEN, 1.0, 1.0)
    drafter = drafter_for(32, 6, draft_vocab, embeddings=base.get_input_embeddings().weight)
    rule = SpeculativeSampling(temperature=1.0)
    rule.seed = 5
    out = decode(model, src.expand(N_SAMPLES, -1).contiguous(), rule, Eagle3(drafter, 3), max_len=MAX_LEN)
    p_value, bins = chi_square_p_value(out.sequences(), exact)
    assert bins >= 10 and p_value > P_MIN
    assert max(max(sizes) for sizes in out.block_sizes) > 1


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_eagle3_trees_equal_generate_on_a_ragged_batch(family, draft_vocab):
    from lightning_bpd.decoding.trees.tree import DynamicTree
    from lightning_bpd.drafters.eagle3.tree import Eagle3Tree

    base, src, max_len = causal.tiny_lm(family), causal.prompts(6, side="right"), 14
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    drafter = drafter_for(32, causal.VOCAB, draft_vocab, embeddings=base.get_input_embeddings().weight)
    for m in (model, build_runtime(model, InferenceOptions())):
        for spec in (DynamicTree(nodes=6, depth=3, width=3), DynamicTree(nodes=2, depth=2, width=2)):
            got = decode(m, src, Exact(), Eagle3Tree(drafter, spec=spec), max_len=max_len)
            assert got.sequences() == want
            assert max(max(sizes) for sizes in got.block_sizes) <= spec.depth + 1


def test_an_eagle3_tree_with_fewer_candidates_than_nodes_is_one_line():
    """Expanding 2 nodes per depth, a tree 3 deep and 2 wide ranks 2 + 4 + 4 candidates: 12 nodes is refused, as is an
    expansion that is no count; expanding 4 gives 2 + 4 + 8 and the 12 nodes fit."""
    from lightning_bpd.decoding.trees.tree import DynamicTree
    from lightning_bpd.drafters.eagle3.tree import Eagle3Tree

    base = causal.tiny_lm("llama")
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(32, causal.VOCAB, embeddings=base.get_input_embeddings().weight)
    spec = DynamicTree(nodes=12, depth=3, width=2)
    with pytest.raises(ValueError, match="expands 2 nodes per depth has 10 candidates, fewer than its 12 nodes"):
        Eagle3Tree(drafter, spec=spec).check(model, Exact())
    with pytest.raises(ValueError, match="expands an integer >= 1 of nodes per depth, got 0"):
        Eagle3Tree(drafter, spec=spec, expand=0).check(model, Exact())
    wide = Eagle3Tree(drafter, spec=spec, expand=4)
    rule = Exact()
    assert wide.candidates == 14 and wide.check(model, rule) is rule
    src = causal.prompts(2)
    assert decode(model, src, Exact(), wide, max_len=10).sequences() == decode(
        model, src, Exact(), Eagle3(drafter, 4), max_len=10).sequences()


def test_an_eagle3_tree_of_one_path_is_the_chain():
    """A tree one wide is the chain of the same depth: the same blocks, token for token (the tree's mask and
    positions give each node what the chain gives its draft)."""
    from lightning_bpd.decoding.trees.tree import DynamicTree
    from lightning_bpd.drafters.eagle3.tree import Eagle3Tree

    base, src = causal.tiny_lm("qwen3"), causal.prompts(5)
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(32, causal.VOCAB, embeddings=base.get_input_embeddings().weight)
    chain = decode(model, src, Exact(), Eagle3(drafter, 4), max_len=14)
    tree = decode(model, src, Exact(), Eagle3Tree(drafter, spec=DynamicTree(nodes=3, depth=3, width=1)), max_len=14)
    assert tree.sequences() == chain.sequences() and tree.block_sizes == chain.block_sizes
    assert max(max(sizes) for sizes in chain.block_sizes) > 1
    # chain first: a tree 3 wide of as many nodes as it is deep is the chain too (the chain's nodes come first,
    # every tree reaches the full depth); ranked by confidence alone, its 3 nodes are mostly shallower ones
    from lightning_bpd.drafters.eagle3.tree import Eagle3TreeDrafting

    @dataclass
    class Depths(Eagle3TreeDrafting):
        deepest: list = field(default_factory=list)

        def propose(self, state, features):
            out = super().propose(state, features)
            self.deepest += self.trees.depths.max(dim=1).values.tolist()
            return out

    @dataclass(frozen=True)
    class Recorded(Eagle3Tree):
        def start(self, state, prompt):
            self.__dict__["made"] = Depths(**state_of(super().start(state, prompt)))
            return self.made

    wide = DynamicTree(nodes=3, depth=3, width=3)
    proposer = Recorded(drafter, spec=wide)
    first = decode(model, src, Exact(), proposer, max_len=14)
    assert first.sequences() == chain.sequences() and first.block_sizes == chain.block_sizes
    assert set(proposer.made.deepest) == {3}
    ranked = Recorded(drafter, spec=wide, chain_first=False)
    assert decode(model, src, Exact(), ranked, max_len=14).sequences() == chain.sequences()
    assert min(ranked.made.deepest) < 3


def test_our_own_base_decodes_trees_as_greedy():
    from lightning_bpd.decoding.trees.tree import DynamicTree
    from lightning_bpd.drafters.eagle3.tree import Eagle3Tree

    model, src = own.tiny(k=1), own.prompts(6, side="left")
    own.pick_eos(model, src)
    want = greedy_decode_reference(model, src, own.MAX_LEN).sequences()
    drafter = drafter_for(32, own.VOCAB, embeddings=model.embedding_table())
    got = decode(model, src, Exact(), Eagle3Tree(drafter, spec=DynamicTree(nodes=5, depth=3, width=2)),
                 max_len=own.MAX_LEN)
    assert got.sequences() == want


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("draft_vocab", [None, 50])
def test_eagle3_static_trees_equal_generate_on_a_ragged_batch(family, draft_vocab):
    """A static tree (paths of the drafter's ranks) decodes as greedy; a path of ranks 0 is the chain, block for
    block."""
    from lightning_bpd.decoding.trees.tree import Tree
    from lightning_bpd.drafters.eagle3.tree import Eagle3StaticTree

    base, src, max_len = causal.tiny_lm(family), causal.prompts(6, side="right"), 14
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    drafter = drafter_for(32, causal.VOCAB, draft_vocab, embeddings=base.get_input_embeddings().weight)
    tree = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0)])
    for m in (model, build_runtime(model, InferenceOptions())):
        got = decode(m, src, Exact(), Eagle3StaticTree(drafter, tree=tree), max_len=max_len)
        assert got.sequences() == want and max(max(sizes) for sizes in got.block_sizes) <= 4
    chain = decode(model, src, Exact(), Eagle3(drafter, 4), max_len=max_len)
    path = decode(model, src, Exact(), Eagle3StaticTree(drafter, tree=Tree.path(3)), max_len=max_len)
    assert path.sequences() == want and path.block_sizes == chain.block_sizes


@pytest.mark.parametrize(("rows", "static"), [(1, False), (3, False), (3, True)])
def test_each_tree_entry_is_the_training_time_test_along_its_path(rows, static):
    """A tree 3 wide (dynamic, or static), one row or three ragged ones (left-padded): every node the drafter extends
    gets the logits the training-time test gives after the node's own path (over the row's uncached features, the
    path's tokens fed), so each entry saw its own row's committed entries and ancestors, not its siblings or cousins,
    at its own position."""
    from lightning_bpd.decoding.trees.tree import DynamicTree, Tree
    from lightning_bpd.drafters.eagle3.tree import (
        Eagle3StaticTree,
        Eagle3StaticTreeDrafting,
        Eagle3Tree,
        Eagle3TreeDrafting,
    )

    @dataclass
    class Entries(Eagle3StaticTreeDrafting if static else Eagle3TreeDrafting):
        log: list = field(default_factory=list)

        def grow_entries(self, states, tokens, front, ancestors, committed, d):
            out = super().grow_entries(states, tokens, front, ancestors, committed, d)
            every = torch.cat(self.candidates, dim=1)  # (b, M): the candidates' tokens so far
            if front.shape[0] < rows:  # a finished row left the batch: row indices are no longer the prompts'
                return out
            for r in range(front.shape[0]):
                for i, f in enumerate(front[r].tolist()):
                    path = every[r, ancestors[r, f].nonzero().flatten()].tolist()  # root .. f, ancestors first
                    self.log.append((r, int(committed[r]), path, out[1][r, i]))
            return out

    @dataclass(frozen=True)
    class Recorded(Eagle3StaticTree if static else Eagle3Tree):
        def start(self, state, prompt):
            self.__dict__.setdefault("made", []).append(Entries(**state_of(super().start(state, prompt))))
            return self.made[-1]

    base = causal.tiny_lm("llama")
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(32, causal.VOCAB, 50, embeddings=base.get_input_embeddings().weight)
    src = causal.prompts(rows, width=7, side="left")  # (rows, 7): lengths 7, .., 1
    if static:  # node (1, 0) extended before (0, 0, 0): slots in the tree's order, not by depth of extension
        proposer = Recorded(drafter, tree=Tree.from_paths([(0,), (1,), (0, 0), (1, 0), (1, 1), (0, 0, 0), (1, 0, 0),
                                                           (1, 1, 0), (1, 0, 0, 0)]))
    else:
        proposer = Recorded(drafter, spec=DynamicTree(nodes=8, depth=4, width=3))  # depth 4: slots != candidate ids
    outs = decode(model, src, Exact(), proposer, max_len=12).sequences()
    log = proposer.made[-1].log
    assert len(log) >= 6 * rows and {r for r, *_ in log} == set(range(rows))
    for r, entries, path, logits in log:
        prompt, out = src[r][src[r] != causal.PAD].tolist(), outs[r]
        n = len(prompt)
        committed = prompt + out[: entries - n + 1 - 1]  # the drafter holds positions 1 .. L - 1
        assert len(committed) == entries
        seq = torch.tensor([committed + path + [0]])
        features = uncached_features(base, committed)  # (1, L, 2D)
        padded = torch.cat([features, features.new_zeros(1, seq.shape[1] - len(committed), 64)], dim=1)
        want = drafter.train_forward(padded, seq, steps=len(path))[0, len(path) - 1, len(committed) - 1]
        assert_close_to_rounding(logits, want)
