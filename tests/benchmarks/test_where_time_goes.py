from types import SimpleNamespace

import pytest

from lightning_bpd.benchmarks.where_time_goes import PARTS, TIMED, TimedModel, ceilings, profile
from lightning_bpd.decoding import Exact, blockwise_decode, parse_criterion
from lightning_bpd.decoding.protocol import OptionalCapabilities
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.models import EOS, StubModel, random_model, random_sources, stub_sources


def test_parts_add_up_and_calls_match_the_decoders():
    model = random_model(k=4, seed=3)
    model.eos_id = 5
    module = SimpleNamespace(model=model, make_criterion=parse_criterion, max_decode_len=lambda src: 12)
    inputs = [row[None] for row in random_sources(4, seed=3)]
    runtime = build_runtime(model)
    greedy = profile(module, runtime, inputs, None, None)
    blockwise = profile(module, runtime, inputs, 4, "exact")
    for r in (greedy, blockwise):
        assert sum(r["share"].values()) == pytest.approx(1.0)
        assert sum(r["ms_per_step_by_part"].values()) == pytest.approx(r["ms_per_step"])
        assert set(r["share"]) == {*PARTS, "loop"}
    assert greedy["calls"]["decode_step"] == greedy["steps"] and "logits_heads" not in greedy["calls"]
    assert blockwise["calls"]["decode_step"] == blockwise["steps"] + len(inputs)  # + the first call on BOS
    assert blockwise["calls"]["encode"] == len(inputs)


@pytest.mark.parametrize("fused", [True, False])
def test_chained_heads_chain_is_a_part_of_its_own(fused):
    """Fused links run the whole chain in one call (chain_drafts); the reference links one call per link."""
    model = random_model(k=4, seed=3, head_type="chained_attn")
    model.eos_id = 5
    module = SimpleNamespace(model=model, make_criterion=parse_criterion, max_decode_len=lambda src: 12)
    inputs = [row[None] for row in random_sources(3, seed=3)]
    r = profile(module, build_runtime(model, InferenceOptions(fused_chain=fused)), inputs, 4, "exact")
    chains = r["calls"]["decode_step"] - len(inputs)  # a chain of 3 links after every model call but each row's last
    part = "chain_drafts" if fused else "chain_draft"
    assert r["calls"][part] == (chains if fused else 3 * chains) and "logits_heads" not in r["calls"]
    assert r["ms_per_step_by_part"][part] > 0


def test_ceilings_take_the_named_parts_away():
    """Hand-made parts (ms per step or iteration): greedy 10 steps of 1.0 ms (decoder 0.6, argmax 0.2, loop 0.1,
    encoder 0.1); blockwise 4 iterations of 2.0 ms (decoder 0.9, argmax 0.4, chain 0.3, loop 0.3, encoder 0.1)."""
    zero = dict.fromkeys((*PARTS, "loop"), 0.0)
    greedy = {"seconds": 0.010, "steps": 10,
              "ms_per_step_by_part": {**zero, "encode": 0.1, "decode_step": 0.6, "argmax_first": 0.2, "loop": 0.1}}
    blockwise = {"seconds": 0.008, "steps": 4,
                 "ms_per_step_by_part": {**zero, "encode": 0.1, "decode_step": 0.9, "argmax_first": 0.4,
                                         "chain_drafts": 0.3, "loop": 0.3}}
    c = ceilings(greedy, blockwise)
    assert c["measured"] == pytest.approx(10 / 8)
    assert c["free_proposals"] == pytest.approx(10 / (8 - 4 * 0.3))
    assert c["and_lean_loop"] == pytest.approx(10 / (8 - 1.2 - 4 * 0.2))
    assert c["and_one_token_pass"] == pytest.approx(10 / (4 * (0.1 + 0.6 + 0.2 + 0.1)))  # encoder + a greedy step each


def test_an_optional_member_the_model_does_not_offer_stays_none_through_the_proxy():
    """A stub offers no fast path: the proxy leaves those members None, so blockwise decoding through it takes the
    required path (and times it) and decodes what it decodes without the proxy."""
    model = StubModel([[5, 6, 7, 8, EOS]], k=3)
    proxy = TimedModel(model)
    assert all(getattr(proxy, name) is None for name in TIMED if name in OptionalCapabilities.__annotations__)
    src = stub_sources(1)
    assert blockwise_decode(proxy, src, Exact(), 8).sequences() == blockwise_decode(model, src, Exact(), 8).sequences()
    assert proxy.calls["logits_heads"] > 0 and "draft_tokens" not in proxy.calls
