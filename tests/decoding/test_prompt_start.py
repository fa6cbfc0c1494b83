"""Rules whose ``start`` is the padded prompt width of each decode (a causal LM: ``generate`` counts its
left-padded ``input_ids`` in ``min_length``)."""

from __future__ import annotations

import torch

from lightning_bpd.decoding.generation_rules import GenerationRules, RuleBook, rules_of


class Stub:
    pad_id, eos_id, bos_id, vocab_size = 1, 2, 0, 10  # the ids every target has
    rules_history = decode_room = None  # the rules members besides generation_rules: none

    def __init__(self, rules: GenerationRules) -> None:
        self.generation_rules = rules


def test_prompt_start_is_the_width_of_the_sources():
    rules = GenerationRules(eos_ids=(2, 3), min_length=8, prompt_start=True)
    assert rules.at_width(5).start == 5 and rules.at_width(5).eos_ban_until == 3
    assert rules.at_width(9).eos_ban_until == 0
    fixed = GenerationRules(eos_ids=(2,), min_length=8)
    assert fixed.at_width(5) is fixed and fixed.eos_ban_until == 7
    src = torch.ones(4, 6, dtype=torch.long)
    assert rules_of(Stub(rules), src).start == 6
    assert rules_of(Stub(fixed), src).start == 1
    book = RuleBook(Stub(rules), max_len=10, device="cpu", src=src)
    assert book.bound is not None and book.bound.eos_ban_until == 2
    assert RuleBook(Stub(rules), max_len=10, device="cpu", src=torch.ones(4, 8, dtype=torch.long)).bound is None
