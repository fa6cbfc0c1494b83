"""Lossless speculative sampling on a tree (SpecInfer's walk): the draws, the walk's output distribution in closed
form, whole decodes against the enumerated ancestral distribution, temperature 0 against greedy, and the fast
decoder against the one-row reference on the same random numbers. Broken walks (no residual update, no update of q
after a draw without replacement) must fail the same tests."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from lightning_bpd.decoding import (
    Exact,
    MinBlock,
    Tree,
    blockwise_decode,
    greedy_decode,
    tree_decode_reference,
    tree_sampling,
)
from lightning_bpd.decoding.acceptance import SpeculativeSampling, parse_criterion
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.decoding.tree_sampling import draw_children, judge_tree
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.decoding.sampling_helpers import (
    P_MIN,
    SRC,
    VOCAB,
    chi_square_p_value,
    copies,
    sequence_probabilities,
    tiny_model,
)
from tests.models import EOS, Wrapped, float32_model, pick_eos, random_model, random_sources, scramble_chain

TREE = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 1), (2, 0)])  # 3 children at the root
MEDUSA = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0)])
N_ROWS = 100_000  # rows of the closed-form tests: sampling noise in TV ~0.004


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


def broken(monkeypatch, variant: str) -> None:
    """A wrong walk: ``no_residual`` keeps judging siblings against p itself; ``no_q_update`` judges a child drawn
    without replacement against the q before the earlier draws."""
    if variant == "no_residual":
        monkeypatch.setattr(tree_sampling, "residual", lambda r, q: r)
    elif variant == "no_q_update":
        monkeypatch.setattr(tree_sampling, "drop_drawn", lambda q, x: q)


# ---- the draws ---------------------------------------------------------------------------------------------------

def test_draws_without_replacement_are_successive_draws_from_q():
    q = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0], dtype=torch.float64)
    drawn = draw_children(q.expand(N_ROWS, 5), 5, torch.Generator().manual_seed(0))  # (n, 5)
    assert all(len(set(row)) == 5 for row in drawn[:100].tolist()) and bool((drawn[:, 4] == 4).all())  # q = 0 last
    first = torch.bincount(drawn[:, 0], minlength=5).double() / N_ROWS
    assert 0.5 * float((first - q).abs().sum()) < 0.01
    pairs = Counter(map(tuple, drawn[:, :2].tolist()))
    for (x, y), n in pairs.items():  # P(x, then y) = q(x) q(y) / (1 - q(x))
        assert abs(n / N_ROWS - float(q[x] * q[y] / (1 - q[x]))) < 0.006


# ---- the walk in closed form: two tokens, p and q given as tables --------------------------------------------------

V = 5
P1 = torch.tensor([0.35, 0.3, 0.2, 0.1, 0.05], dtype=torch.float64)  # the target after the root
Q1 = torch.tensor([0.05, 0.15, 0.2, 0.3, 0.3], dtype=torch.float64)  # what the root's children are drawn from
_g = torch.Generator().manual_seed(0)
P2 = torch.softmax(1.5 * torch.randn(V, V, generator=_g, dtype=torch.float64), -1)  # row x: the target after x
Q2 = torch.softmax(1.5 * torch.randn(V, V, generator=_g, dtype=torch.float64), -1)  # row x: a chained head after x


def walk_two_tokens(chained: bool, seed: int = 0) -> float:
    """TV distance between the first two tokens of N_ROWS walks over TREE and P1(y1) P2[y1](y2). Parallel heads:
    the nodes of depth 2 share draws from Q2[1]; chained heads: node n's children are drawn from Q2[token n]."""
    rule = SpeculativeSampling(seed=seed)
    rule.reset()
    g, b = rule.rng(torch.device("cpu")), N_ROWS
    tokens = torch.zeros(b, TREE.size, dtype=torch.long)  # the root is token 0, whatever: P1 is its target
    kids = [TREE.children(i) for i in range(TREE.size)]
    tokens[:, kids[0]] = draw_children(Q1.expand(b, V), 3, g)
    parents = TREE.at_depth(1)
    if chained:
        qs = [Q2[tokens[:, p]] for p in parents]  # (b, V) each
        for p, q in zip(parents, qs):
            tokens[:, kids[p]] = draw_children(q, len(kids[p]), g)
        q = torch.stack([Q1.expand(b, V), *qs], dim=1)  # (b, 4, V): one per expanded node
    else:
        shared = draw_children(Q2[1].expand(b, V), 2, g)
        for p in parents:
            tokens[:, kids[p]] = shared[:, : len(kids[p])]
        q = torch.stack([Q1.expand(b, V), Q2[1].expand(b, V)], dim=1)  # (b, 2, V): one per depth
    p = torch.cat([P1.expand(b, 1, V), P2[tokens[:, 1:]]], dim=1)  # (b, N, V)
    node, after = judge_tree(rule, TREE, tokens, p, q, chained)
    path, depth = TREE.path_table()[node], torch.tensor(TREE.depths)[node]  # (b, 3), (b,)
    y1 = torch.where(depth >= 1, tokens.gather(1, path[:, 1:2])[:, 0], after)
    y2 = torch.where(depth >= 2, tokens.gather(1, path[:, 2:3])[:, 0], after)
    y2 = torch.where(depth >= 1, y2, torch.multinomial(P2[y1], 1, generator=g)[:, 0])  # the next iteration's root
    joint = torch.zeros(V, V, dtype=torch.float64).index_put_((y1, y2), torch.ones(b, dtype=torch.float64),
                                                              accumulate=True) / b
    return 0.5 * float((joint - P1[:, None] * P2).abs().sum())


@pytest.mark.parametrize("chained", [False, True], ids=["parallel", "chained"])
def test_the_walk_emits_the_targets_distribution(chained):
    assert walk_two_tokens(chained) < 0.015  # sampling noise ~0.003


@pytest.mark.parametrize("variant", ["no_residual", "no_q_update"])
@pytest.mark.parametrize("chained", [False, True], ids=["parallel", "chained"])
def test_a_broken_walk_fails_the_closed_form_test(monkeypatch, variant, chained):
    broken(monkeypatch, variant)
    assert walk_two_tokens(chained) > 0.05  # measured: 0.23-0.26 without the residual, 0.08-0.09 without q's update


# ---- whole decodes against the enumerated ancestral distribution ---------------------------------------------------

SHALLOW = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)])  # depth 2: the tiny model's k = 3


def chained_tiny(scale: float = 10.0) -> Wrapped:
    model = random_model(k=3, vocab=VOCAB, seed=2, head_type="chained_attn")
    scramble_chain(model, seed=2, std=1.0)
    model.eos_id = EOS
    return Wrapped(model, scale)  # p_1 sharpened; the links' own logits draw the candidates


def tree_chi_square(model, temperature: float, top_p: float, n: int = 5000) -> tuple[float, int, list]:
    exact = sequence_probabilities(model, SRC, 4, temperature, top_p)
    out = blockwise_decode(model, copies(n), SpeculativeSampling(temperature, top_p, seed=0), 4, tree=SHALLOW)
    p_value, bins = chi_square_p_value(out.sequences(), exact)
    return p_value, bins, [s for row in out.block_sizes for s in row]


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.8)])
@pytest.mark.parametrize("heads", ["paper", "chained"])
def test_tree_samples_follow_ancestral_sampling(heads, temperature, top_p):
    model = tiny_model() if heads == "paper" else chained_tiny()
    p_value, bins, blocks = tree_chi_square(model, temperature, top_p)
    assert bins >= 15 and p_value > P_MIN, f"chi-square p = {p_value:.2e} over {bins} bins"
    assert 1 in blocks and max(blocks) > 1  # rejections and accepted candidates


@pytest.mark.parametrize("variant", ["no_residual", "no_q_update"])
def test_a_broken_walk_fails_the_enumerated_test(monkeypatch, variant):
    broken(monkeypatch, variant)
    p_value, bins, _ = tree_chi_square(tiny_model(), 1.0, 1.0)
    assert p_value < P_MIN, f"a broken walk passed: chi-square p = {p_value:.2e} over {bins} bins"


# ---- temperature 0, the reference, the API --------------------------------------------------------------------------

def tree_model(head_type: str, seed: int, k: int = 4):
    model = random_model(k=k, seed=seed, head_type=head_type)
    if model.chained_heads:
        scramble_chain(model, seed=seed)
    return model


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_temperature_to_zero_is_greedy(head_type):
    model = tree_model(head_type, seed=2)
    src = random_sources(6, seed=2)
    pick_eos(model, src, 16)
    greedy = greedy_decode(model, src, 16)
    zero = blockwise_decode(model, src, SpeculativeSampling(temperature=0.0), 16, tree=MEDUSA)
    assert torch.equal(zero.tokens, greedy.tokens)
    assert zero.block_sizes == blockwise_decode(model, src, Exact(), 16, tree=MEDUSA).block_sizes
    cold = blockwise_decode(model, src, SpeculativeSampling(temperature=1e-4, seed=1), 16, tree=MEDUSA)
    assert torch.equal(cold.tokens, greedy.tokens)  # the walk itself, on (numerically) one-hot distributions


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.8, 0.9)])
@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_the_fast_decoder_draws_what_the_reference_draws(head_type, temperature, top_p):
    """Row by row at the same seed: the same candidates, the same verdicts, the same tokens and blocks."""
    model = tree_model(head_type, seed=3)
    src = random_sources(4, seed=3)
    pick_eos(model, src, 12)
    for seed, row in enumerate(src):
        one = row[row != model.pad_id][None]
        for tree in (MEDUSA, Tree.path(2)):
            fast = blockwise_decode(model, one, SpeculativeSampling(temperature, top_p, seed=seed), 12, tree=tree)
            slow = tree_decode_reference(model, one, SpeculativeSampling(temperature, top_p, seed=seed), 12, tree=tree)
            assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes


def test_a_ragged_batch_reproduces_and_accepts_more_than_the_single_path():
    model = tiny_model(scale=4.0, head_scale=3.0, k=3)
    src = random_sources(64, vocab=VOCAB, seed=4)
    rule = SpeculativeSampling(seed=7)
    first, again = (blockwise_decode(model, src, rule, 10, tree=SHALLOW) for _ in range(2))
    assert torch.equal(first.tokens, again.tokens) and first.block_sizes == again.block_sizes
    assert len({len(row) for row in first.block_sizes}) > 1  # rows finish at different iterations
    path = blockwise_decode(model, src, SpeculativeSampling(seed=7), 10, tree=Tree.path(2))
    assert first.mean_accepted_block_size > path.mean_accepted_block_size


def test_named_methods_and_a_runtime_sample_on_trees():
    model = float32_model(seed=3, head_type="chained_attn")
    src = random_sources(4, vocab=40, seed=3)
    method = make_method("sample_t0.8_p0.9", parse_criterion, model, seed=5, tree=MEDUSA)
    assert method.tree is MEDUSA and method.baseline == "ancestral_t0.8_p0.9"
    assert method(model, src, 12).sequences() == method(model, src, 12).sequences()
    runtime = build_runtime(model, InferenceOptions(precision="float32-packed"))
    greedy = greedy_decode(runtime, src, 12).sequences()
    assert make_method("sample_t0", parse_criterion, runtime, tree=MEDUSA)(runtime, src, 12).sequences() == greedy
    assert blockwise_decode(runtime, src, SpeculativeSampling(1e-4), 12, tree=MEDUSA).sequences() == greedy
    with pytest.raises(ValueError, match="deterministic prefix rules"):
        blockwise_decode(model, src, MinBlock(2), 12, tree=MEDUSA)
