from types import SimpleNamespace

import pytest

from lightning_bpd.benchmarks.where_time_goes import TIMED, profile
from lightning_bpd.decoding import parse_criterion
from tests.models import random_model, random_sources


def test_parts_add_up_and_calls_match_the_decoders():
    model = random_model(k=4, seed=3)
    model.eos_id = 5
    module = SimpleNamespace(model=model, make_criterion=parse_criterion, max_decode_len=lambda src: 12)
    inputs = [row[None] for row in random_sources(4, seed=3)]
    greedy = profile(module, inputs, None, None)
    blockwise = profile(module, inputs, 4, "exact")
    for r in (greedy, blockwise):
        assert sum(r["share"].values()) == pytest.approx(1.0)
        assert sum(r["ms_per_step_by_part"].values()) == pytest.approx(r["ms_per_step"])
        assert set(r["share"]) == {*TIMED, "loop"}
    assert greedy["calls"]["decode_step"] == greedy["steps"] and "logits_heads" not in greedy["calls"]
    assert blockwise["calls"]["decode_step"] == blockwise["steps"] + len(inputs)  # + the first call on BOS
    assert blockwise["calls"]["encode"] == len(inputs)


def test_chained_heads_are_split_by_link():
    model = random_model(k=4, seed=3, head_type="chained_attn")
    model.eos_id = 5
    module = SimpleNamespace(model=model, make_criterion=parse_criterion, max_decode_len=lambda src: 12)
    inputs = [row[None] for row in random_sources(3, seed=3)]
    r = profile(module, inputs, 4, "exact")
    calls = r["calls"]["decode_step"]  # a chain of 3 links after every model call but each row's last
    assert r["calls"]["chain_draft"] == 3 * (calls - len(inputs)) and "logits_heads" not in r["calls"]
    assert r["ms_per_step_by_part"]["chain_draft"] > 0
