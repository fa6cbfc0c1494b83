"""The other acceptance rules, sampling and a draft model on a Hugging Face base: as for our own models."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import (
    MinBlock,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    parse_criterion,
)
from lightning_bpd.decoding.methods import make_method
from lightning_bpd.hf import HFSeq2SeqBlockwise
from tests.hf.test_base import pick_eos, scramble_head, sources, tiny_base

MAX_LEN = 12


def hf_model(family: str = "marian", head_type: str = "chained", k: int = 4, seed: int = 0) -> HFSeq2SeqBlockwise:
    base = tiny_base(family, seed=seed)
    pick_eos(base, sources(), MAX_LEN)
    model = HFSeq2SeqBlockwise(base, k=k, head_type=head_type)
    scramble_head(model, std=0.05)  # heads that sometimes agree with p_1 and sometimes not
    return model


@pytest.mark.parametrize("criterion", [TopK(2), MinBlock(2), MinBlock(2, TopK(3))], ids=lambda c: c.name)
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_approximate_rules_decode_as_the_reference_decoder(criterion, head_type):
    model = hf_model("bart", head_type)
    src = sources()
    with torch.no_grad():
        fast = blockwise_decode(model, src, criterion, MAX_LEN)
        slow = blockwise_decode_reference(model, src, criterion, MAX_LEN)
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
    assert max(max(sizes) for sizes in fast.block_sizes) > 1


def test_speculative_sampling_at_temperature_zero_is_greedy_and_seeded_sampling_repeats():
    model = hf_model("marian", "chained")
    src = sources()
    with torch.no_grad():
        greedy = greedy_decode(model, src, MAX_LEN).sequences()
        cold = make_method("sample_t0", parse_criterion, model, seed=3)(model, src, MAX_LEN)
        assert cold.sequences() == greedy
        warm = [make_method("sample_t1", parse_criterion, model, seed=5)(model, src, MAX_LEN).sequences()
                for _ in range(2)]
    assert warm[0] == warm[1]  # the seed decides the draws


def test_a_separate_draft_model_proposes_for_a_hf_target():
    """``draft:exact``: another small HF model of the same vocabulary proposes; the output is the target's greedy."""
    target = hf_model("marian", "paper", k=1)
    draft = hf_model("marian", "paper", k=1, seed=4)
    draft.base.config.eos_token_id = target.eos_id
    draft.eos_id = target.eos_id
    src = sources()
    with torch.no_grad():
        greedy = greedy_decode(target, src, MAX_LEN).sequences()
        out = make_method("draft:exact", parse_criterion, target, 3, draft)(target, src, MAX_LEN)
    assert out.sequences() == greedy
