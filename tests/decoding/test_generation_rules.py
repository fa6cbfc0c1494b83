"""The generation config's rules on p_1 (forced BOS/EOS, EOS ids, suppressed and banned tokens, minimum lengths)
in every decoder: exact stays greedy, the fast decoders equal their references, and the rules hold."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
import torch

from lightning_bpd.decoding import (
    Exact,
    MinBlock,
    SpeculativeSampling,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    greedy_decode_reference,
    static_decode,
)
from lightning_bpd.decoding.draft import draft_decode
from lightning_bpd.decoding.generation_rules import GenerationRules, history_tail
from lightning_bpd.decoding.sampling import ancestral_sample, sample_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.models import pick_eos, random_model, random_sources, scramble_chain

MAX_LEN = 16
VOCAB = 16


def model_and_rules(head_type: str = "paper", seed: int = 0):
    """A random model, ragged sources, and rules read off its plain greedy output so that each one changes it."""
    model = random_model(k=4, vocab=VOCAB, seed=seed, head_type=head_type)
    if model.chained_heads:
        scramble_chain(model, std=0.05)
    src = random_sources(6, vocab=VOCAB, seed=seed + 1)
    eos = pick_eos(model, src, MAX_LEN)
    plain = greedy_decode(model, src, MAX_LEN).sequences()
    counts = Counter(t for row in plain for t in row if t != eos)
    common = [t for t, _ in counts.most_common()]
    common += [t for t in range(3, VOCAB) if t not in common and t != eos]  # then the tokens it never emits
    firsts = [row[0] for row in plain]
    bigram = next((row[i], row[i + 1]) for row in plain for i in range(len(row) - 1) if eos not in row[i : i + 2])
    forced_bos = next(t for t in range(3, VOCAB) if t not in firsts and t not in common[:4])
    second_eos = common[2]
    rules = {
        "eos_ids": GenerationRules(eos_ids=(eos, second_eos)),
        "forced_bos": GenerationRules(eos_ids=(eos,), forced_bos=forced_bos),
        "forced_eos": GenerationRules(eos_ids=(eos,), forced_eos=(eos,)),
        "suppress": GenerationRules(eos_ids=(eos,), suppress=(common[0],)),
        "begin_suppress": GenerationRules(eos_ids=(eos,), begin_suppress=(firsts[0],)),
        "bad_word": GenerationRules(eos_ids=(eos,), bad_words=((common[1],),)),
        "bad_words_of_two": GenerationRules(eos_ids=(eos,), bad_words=(bigram, (bigram[1], bigram[0]))),
        "min_new_tokens": GenerationRules(eos_ids=(eos,), min_new_tokens=6),
        "min_length": GenerationRules(eos_ids=(eos,), min_length=8),
    }
    rules["all"] = GenerationRules(eos_ids=(eos, second_eos), forced_bos=rules["forced_bos"].forced_bos,
                                   forced_eos=(eos, second_eos), suppress=(common[0],), begin_suppress=(common[3],),
                                   bad_words=((common[1],), bigram), min_new_tokens=3)
    return model, src, rules, plain


def with_rules(model, rules: GenerationRules):
    model.generation_rules = rules
    return model


def ends(row: list[int], rules: GenerationRules) -> bool:
    return bool(row) and row[-1] in rules.eos_ids


def check_obeyed(rows: list[list[int]], rules: GenerationRules) -> None:
    """Each output obeys the rules as generate's processors would make it."""
    for row in rows:
        assert all(t not in rules.eos_ids for t in row[:-1])  # a row ends at its first EOS id
        if rules.forced_bos is not None:
            assert row[0] == rules.forced_bos
        if rules.forced_eos and len(row) == MAX_LEN:
            assert row[-1] in rules.forced_eos
        assert not set(row) & set(rules.suppress)
        begin = 1 if rules.forced_bos is not None else 0
        if rules.begin_suppress and len(row) > begin:
            assert row[begin] not in rules.begin_suppress
        for word in rules.bad_words:
            n = len(word)
            assert all(tuple(row[i : i + n]) != word for i in range(len(row) - n + 1))
        ban_until = rules.eos_ban_until
        assert all(t not in rules.eos_ids for t in row[:ban_until])


SETTINGS = ["eos_ids", "forced_bos", "forced_eos", "suppress", "begin_suppress", "bad_word", "bad_words_of_two",
            "min_new_tokens", "min_length", "all"]


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_exact_is_greedy_under_each_rule(setting, head_type):
    model, src, rules, plain = model_and_rules(head_type)
    with_rules(model, rules[setting])
    greedy = greedy_decode(model, src, MAX_LEN)
    slow = greedy_decode_reference(model, src, MAX_LEN)
    assert greedy.sequences() == slow.sequences()
    assert greedy.sequences() != plain  # the rule changes greedy's output
    check_obeyed(greedy.sequences(), rules[setting])
    assert any(len(row) == MAX_LEN for row in greedy.sequences())  # rows that reach the cap
    fast = blockwise_decode(model, src, Exact(), MAX_LEN)
    ref = blockwise_decode_reference(model, src, Exact(), MAX_LEN)
    assert fast.sequences() == greedy.sequences()
    assert fast.sequences() == ref.sequences() and fast.block_sizes == ref.block_sizes
    for row in range(src.shape[0]):  # batch 1: the same rows alone
        alone = blockwise_decode(model, src[row : row + 1], Exact(), MAX_LEN)
        assert alone.sequences() == [greedy.sequences()[row]]


@pytest.mark.parametrize("criterion", [TopK(2), MinBlock(2), MinBlock(2, TopK(3))], ids=lambda c: c.name)
@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_approximate_rules_read_the_same_ruled_p1_as_their_reference(criterion, head_type):
    model, src, rules, _ = model_and_rules(head_type, seed=2)
    with_rules(model, rules["all"])
    fast = blockwise_decode(model, src, criterion, MAX_LEN)
    slow = blockwise_decode_reference(model, src, criterion, MAX_LEN)
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
    first = [row[0] for row in fast.sequences()]  # token 1 of a block is p_1's under the rules: forced BOS
    assert first == [rules["all"].forced_bos] * len(first)


@pytest.mark.parametrize("setting", ["forced_eos", "bad_words_of_two", "all"])
def test_runtimes_apply_the_rules(setting):
    model, src, rules, _ = model_and_rules("chained", seed=3)
    with_rules(model, rules[setting])
    greedy = greedy_decode(model, src, MAX_LEN).sequences()
    for options in (InferenceOptions(), InferenceOptions(precision="float32", screened_argmax=True)):
        runtime = build_runtime(model, options)
        assert runtime.generation_rules == rules[setting]
        out = blockwise_decode(runtime, src.to(torch.long), Exact(), MAX_LEN).sequences()
        if options.precision is None:
            assert out == greedy
        else:  # float32: its own greedy output, under the same rules
            assert out == greedy_decode(runtime, src, MAX_LEN).sequences()
            check_obeyed(out, rules[setting])


def test_a_draft_model_is_verified_under_the_rules():
    model, src, rules, _ = model_and_rules("paper", seed=4)
    draft = random_model(k=1, vocab=VOCAB, seed=9)
    with_rules(model, rules["all"])
    draft.eos_id = model.eos_id
    greedy = greedy_decode(model, src, MAX_LEN).sequences()
    assert draft_decode(model, draft, src, Exact(), MAX_LEN, k=4).sequences() == greedy


def test_sampling_obeys_the_rules_and_at_temperature_zero_is_greedy():
    model, src, rules, _ = model_and_rules("paper", seed=5)
    with_rules(model, rules["all"])
    greedy = greedy_decode(model, src, MAX_LEN).sequences()
    assert blockwise_decode(model, src, SpeculativeSampling(temperature=0.0), MAX_LEN).sequences() == greedy
    for seed in range(3):
        drawn = blockwise_decode(model, src, SpeculativeSampling(temperature=2.0, seed=seed), MAX_LEN).sequences()
        check_obeyed(drawn, rules["all"])
        check_obeyed(sample_decode(model, src, MAX_LEN, temperature=2.0,
                                   generator=torch.Generator().manual_seed(seed)).sequences(), rules["all"])
    one = src[:1]  # one row: the cached sampler draws what the uncached reference draws
    fast = sample_decode(model, one, MAX_LEN, 1.5, generator=torch.Generator().manual_seed(7))
    slow = ancestral_sample(model, one, MAX_LEN, 1.5, generator=torch.Generator().manual_seed(7))
    assert fast.sequences() == slow.sequences()


def test_refused_settings_and_fixed_shapes_say_so_in_one_line():
    model, src, rules, _ = model_and_rules("paper")
    with_rules(model, replace(rules["eos_ids"], refused=("generation_config.no_repeat_ngram_size=3 changes ...",)))
    for decode in (lambda: greedy_decode(model, src, MAX_LEN), lambda: blockwise_decode(model, src, Exact(), MAX_LEN)):
        with pytest.raises(ValueError, match="no_repeat_ngram_size"):
            decode()
    with_rules(model, rules["forced_eos"])
    with pytest.raises(ValueError, match="fixed-shape decoding does not apply"):
        static_decode(model, src, Exact(), MAX_LEN)
    with_rules(model, rules["eos_ids"])  # a list of EOS ids alone: fixed shapes stop on any of them
    assert static_decode(model, src, Exact(), MAX_LEN).sequences() == greedy_decode(model, src, MAX_LEN).sequences()


def test_bad_rule_values_are_one_line():
    with pytest.raises(ValueError, match="token ids must be integers >= 0"):
        GenerationRules(eos_ids=(-1,))
    with pytest.raises(ValueError, match="banned word needs at least one token"):
        GenerationRules(bad_words=((),))
    with pytest.raises(ValueError, match="min_new_tokens must be an integer >= 0"):
        GenerationRules(min_new_tokens=-2)


def test_apply_follows_generate_order_on_hand_written_logits():
    rules = GenerationRules(eos_ids=(2, 3), forced_bos=5, forced_eos=(3, 2), suppress=(7,), begin_suppress=(6,),
                            bad_words=((8,), (2,), (4, 9)), min_new_tokens=3).bind(max_len=6, vocab_size=10)
    logits = torch.arange(10, dtype=torch.float64).flip(0)[None].repeat(6, 1)  # token 0 best, then 1, ...
    index = torch.arange(6)
    tail = torch.stack([history_tail([1, 4, 4, 0, 4, 1][: i + 1], 1, "cpu")[0] for i in range(6)])  # (6, 1)
    out = rules.apply(logits, index, tail)
    inf = float("-inf")
    assert out[0].tolist() == [inf] * 5 + [0.0] + [inf] * 4  # forced BOS
    assert out[5].tolist() == [inf, inf, 0.0, 0.0] + [inf] * 6  # forced EOS: both ids (argmax: the lower)
    assert torch.isinf(out[1:5, 7]).all() and torch.isinf(out[1:5, 8]).all()  # suppressed, banned
    assert torch.isinf(out[1:3, 2:4]).all() and not torch.isinf(out[3:5, 2:4]).any()  # EOS ids before index 3
    assert torch.isinf(out[1, 6]) and not torch.isinf(out[2:5, 6]).any()  # begin suppress: after the forced BOS
    assert torch.isinf(out[[1, 2, 4], 9]).all() and not torch.isinf(out[3, 9])  # (4, 9) after a 4 only


@pytest.mark.parametrize("setting", ["forced_bos", "forced_eos", "bad_words_of_two", "all"])
@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_trees_verify_under_the_rules(setting, head_type):
    from lightning_bpd.decoding import Tree
    from lightning_bpd.decoding.reference.tree import tree_decode_reference

    model, src, rules, _ = model_and_rules(head_type, seed=6)
    with_rules(model, rules[setting])
    tree = Tree.from_paths([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)])
    greedy = greedy_decode(model, src, MAX_LEN).sequences()
    fast = blockwise_decode(model, src, Exact(), MAX_LEN, tree=tree)
    slow = tree_decode_reference(model, src, Exact(), MAX_LEN, tree=tree)
    assert fast.sequences() == greedy == slow.sequences() and fast.block_sizes == slow.block_sizes
    top = blockwise_decode(model, src, TopK(2), MAX_LEN, tree=tree)
    assert top.sequences() == tree_decode_reference(model, src, TopK(2), MAX_LEN, tree=tree).sequences()


def test_a_forced_token_is_proposed_so_the_cap_costs_no_iteration_of_its_own():
    """Heads that are always right reach the cap in ceil(max_len / k) iterations; with EOS forced at the cap the
    proposal there is the forced EOS (a head's other guess could only be rejected), so it takes no more."""
    from tests.models import StubModel, stub_sources

    targets = [[5 + (t % 7) for t in range(40)], [9 + (t % 5) for t in range(40)]]  # no EOS before the cap
    stub = StubModel(targets, k=4)
    stub.vocab_size = stub.vocab
    src = stub_sources(2)
    plain = blockwise_decode(stub, src, Exact(), 8)
    stub.generation_rules = GenerationRules(eos_ids=(stub.eos_id,), forced_eos=(stub.eos_id,))
    forced = blockwise_decode(stub, src, Exact(), 8)
    assert plain.block_sizes == forced.block_sizes == [[4, 4], [4, 4]]
    assert [row[-1] for row in forced.sequences()] == [stub.eos_id] * 2
    assert forced.sequences() == greedy_decode(stub, src, 8).sequences()
    assert forced.sequences() == blockwise_decode_reference(stub, src, Exact(), 8).sequences()
