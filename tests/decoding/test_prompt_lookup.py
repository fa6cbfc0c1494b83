"""Prompt lookup through the one loop: the lookup itself by hand, exact = greedy on ragged batches of our own model,
copied blocks accepted on a stub whose output repeats itself, and a proposer written outside the package."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from lightning_bpd.decoding import Exact, TopK, decode, greedy_decode
from lightning_bpd.decoding.acceptance import Block, SpeculativeSampling
from lightning_bpd.decoding.candidates import Path
from lightning_bpd.decoding.proposers import PromptLookup, Proposer
from lightning_bpd.decoding.proposers.base import opening_token
from lightning_bpd.decoding.proposers.prompt_lookup import histories, lookup
from tests.models import EOS, PAD, StubModel, pick_eos, random_model, random_sources, stub_sources


def row(values: list[int], width: int) -> list[int]:
    return values + [-1] * (width - len(values))


def test_lookup_copies_after_the_last_match_of_the_longest_ngram():
    #              0  1  2  3  4  5  6  7  8  9
    history = [[5, 6, 7, 1, 5, 6, 8, 2, 5, 6],   # "5 6" twice before the tail: last match at 4 -> 8 2 5 6
               [5, 6, 7, 1, 9, 6, 8, 2, 5, 6]]   # "5 6" once (at 0) -> 7 1 9 6; "6" alone would match at 5
    history = torch.tensor(history)
    lengths = torch.tensor([10, 10])
    found, count = lookup(history, lengths, max_ngram=3, num_tokens=4)
    assert found.tolist() == [[8, 2, 5, 6], [7, 1, 9, 6]]
    assert count.tolist() == [4, 4]
    first, count = lookup(history, lengths, max_ngram=3, num_tokens=4, latest=False)
    assert first[0].tolist() == [7, 1, 5, 6] and count[0] == 4  # transformers' choice: the earliest match


def test_lookup_counts_only_tokens_inside_the_history_and_none_without_a_match():
    history = torch.tensor([row([4, 9, 3, 4], 6), row([1, 2, 3], 6), row([7, 7, 7, 7, 7], 6)])
    found, count = lookup(history, torch.tensor([4, 3, 5]), max_ngram=2, num_tokens=3)
    assert count.tolist() == [3, 0, 1]  # row 0: "4" at 0 -> 9 3 4 (up to the tail's end); row 1: nothing repeats
    assert found[0].tolist() == [9, 3, 4]
    assert found[2, :1].tolist() == [7]  # "7 7" last matched at 2, one token after it before the tail


def test_histories_join_the_prompt_its_outputs_and_the_next_token():
    prompts = torch.tensor([[PAD, 5, 6, PAD], [7, PAD, PAD, PAD]])  # padded on either side
    outputs = torch.tensor([[10, 11, 12, 0], [13, 0, 0, 0]])
    history, lengths = histories(prompts, outputs, torch.tensor([2, 0]), torch.tensor([20, 21]), PAD)
    assert lengths.tolist() == [5, 2]
    assert history[0, :5].tolist() == [5, 6, 10, 11, 20]
    assert history[1, :2].tolist() == [7, 21]
    assert bool((history[1, 2:] == -1).all())


@pytest.mark.parametrize("batch", [1, 5])
@pytest.mark.parametrize("num_tokens", [1, 3, 8])
@pytest.mark.parametrize("seed", [0, 1])
def test_exact_prompt_lookup_equals_greedy_on_a_ragged_batch(batch, num_tokens, seed):
    model, src, max_len = random_model(k=1, seed=seed), random_sources(batch, seed=seed + 3), 14
    pick_eos(model, src, max_len)
    want = greedy_decode(model, src, max_len)
    got = decode(model, src, Exact(), PromptLookup(max_ngram=2, num_tokens=num_tokens), max_len=max_len)
    assert got.sequences() == want.sequences()
    assert [sum(sizes) for sizes in got.block_sizes] == want.lengths.tolist()
    assert max(max(sizes) for sizes in got.block_sizes) <= num_tokens + 1
    if batch > 1:  # these outputs repeat themselves: copies were proposed and accepted
        assert max(max(sizes) for sizes in got.block_sizes) > 1


def test_a_repeating_output_is_copied_in_few_calls():
    cycle = [5, 6, 7, 8, 9]
    targets = [cycle * 4 + [EOS], cycle[:2] * 3 + [EOS]]
    model = StubModel(targets, k=1)
    src = stub_sources(2)
    got = decode(model, src, Exact(), PromptLookup(max_ngram=3, num_tokens=5), max_len=30)
    assert got.sequences() == [t for t in targets]
    greedy_calls = 1 + max(len(t) for t in targets)
    assert got.model_calls < greedy_calls / 2
    assert max(got.block_sizes[0]) == 6  # the first token plus 5 copied, all accepted


def test_approximate_rules_keep_their_verdict_and_sampling_is_refused():
    model, src = random_model(k=1, seed=2), random_sources(3, seed=4)
    got = decode(model, src, TopK(2), PromptLookup(num_tokens=4), max_len=10)
    assert got.lengths.tolist() == [10, 10, 10]
    with pytest.raises(ValueError, match="deterministic"):
        decode(model, src, SpeculativeSampling(temperature=1.0), PromptLookup(), max_len=10)
    with pytest.raises(ValueError, match="num_tokens"):
        PromptLookup(num_tokens=0)


@dataclass(frozen=True)
class RepeatFirst(Proposer):
    """A proposer as a user writes one: guess that greedy's next token repeats n more times."""

    n: int = 3

    @property
    def width(self) -> int:
        return self.n + 1

    def propose(self, state, features):
        first = opening_token(state, features)  # (b,): greedy's next token
        return Path(Block(first[:, None].expand(-1, state.width).clone()))  # (b, width): the loop's room clamp


def test_a_proposer_written_outside_the_package_runs_in_the_loop():
    targets = [[5, 5, 5, 5, 6, 6, 6, EOS], [7, 8, 7, 8, EOS]]
    model, src = StubModel(targets, k=1), stub_sources(2)
    got = decode(model, src, Exact(), RepeatFirst(3), max_len=20)
    assert got.sequences() == targets
    assert got.block_sizes[0][0] == 4  # 5 5 5 5 in one call
    assert got.block_sizes[1] == [1, 1, 1, 1, 1]


def test_a_method_with_a_proposer_decodes_through_it():
    from lightning_bpd.decoding.acceptance import parse_criterion
    from lightning_bpd.decoding.methods import make_method

    model, src = random_model(k=2, seed=1), random_sources(4, seed=2)
    method = make_method("exact", parse_criterion, model, proposer=PromptLookup(num_tokens=5))
    assert method.block_size(model) == 6 and method.baseline == "greedy"
    got = method(model, src, 12)
    assert got.sequences() == greedy_decode(model, src, 12).sequences()
    assert got.sequences() == decode(model, src, Exact(), PromptLookup(num_tokens=5), max_len=12).sequences()
    with pytest.raises(ValueError, match="deterministic"):
        make_method("sample_t1", parse_criterion, model, proposer=PromptLookup())
    with pytest.raises(ValueError, match="no tree"):
        make_method("exact", parse_criterion, model, proposer=PromptLookup(), lazy=True)
