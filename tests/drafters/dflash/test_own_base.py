"""A DFlash drafter on our own decoder-only base (issue 53 item 1): the base offers its layers' outputs
(``full_features``, ``encode_features``, ``decode_step_features``), the cached ones equal to the uncached pass, and
decoding with the drafter through the one loop equals greedy on ragged prompts, each block being the drafter's
training pass over the base's uncached features."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, decode, greedy_decode_reference
from lightning_bpd.drafters.dflash.network import DFlashConfig, DFlashDrafter
from lightning_bpd.drafters.dflash.proposer import DFlash
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.drafters.dflash.test_proposer import Recorded
from tests.models import assert_close_to_rounding
from tests.nn import test_causal_model as causal

pytestmark = pytest.mark.usefixtures("one_thread")

LAYERS = (0, 1)


def drafter(block_size: int = 4, seed: int = 7) -> DFlashDrafter:
    """A random drafter (float64) on the tiny base's shape: hidden 32, 4 heads."""
    torch.manual_seed(seed)
    config = DFlashConfig(hidden_size=32, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          target_layer_ids=LAYERS, mask_token_id=3, num_layers=2, block_size=block_size)
    return DFlashDrafter(config).double().eval()


def test_cached_features_are_the_uncached_passes():
    model, src = causal.tiny(k=1), causal.prompts(4, side="left")
    context, features, valid, positions = model.encode_features(src, LAYERS)  # (B, P, 2D)
    cache = model.new_cache(src.shape[0], capacity=8)
    model.decode_step(torch.full((src.shape[0], 1), model.bos_id), context, cache)  # the last prompt token again
    new = torch.tensor([[5, 6, 7]] * src.shape[0])
    hidden, stepped = model.decode_step_features(new, context, cache, LAYERS)  # (B, 3, D), (B, 3, 2D)
    for b in range(src.shape[0]):
        row = src[b][valid[b]]
        full_h, full = model.full_features(torch.cat([row, new[b]])[None], LAYERS)
        n = row.shape[0]
        assert positions[b][valid[b]].tolist() == list(range(n))
        assert_close_to_rounding(features[b][valid[b]], full[0, :n])
        assert_close_to_rounding(stepped[b], full[0, n:])
        assert_close_to_rounding(hidden[b], full_h[0, n:])
    d = hidden.shape[-1]
    assert not torch.equal(stepped[..., d:], hidden)  # layer 1's output is taken before the final norm


@pytest.mark.parametrize("side", ["left", "right"])
def test_decoding_with_the_drafter_equals_greedy(side):
    model, src = causal.tiny(k=1), causal.prompts(6, side=side)
    causal.pick_eos(model, src)
    want = greedy_decode_reference(model, src, causal.MAX_LEN).sequences()
    assert {len(r) for r in want} != {causal.MAX_LEN} and causal.MAX_LEN in {len(r) for r in want}
    for m in (model, build_runtime(model, InferenceOptions())):
        got = decode(m, src, Exact(), DFlash(drafter()), max_len=causal.MAX_LEN)
        assert got.sequences() == want


def test_each_block_is_the_drafters_reading_of_the_uncached_features():
    model = causal.tiny(k=1, eos=None)
    d = drafter(block_size=5)
    prompt = causal.prompts(1, width=7)[0]
    prompt = prompt[prompt != causal.PAD][None]  # (1, n)
    proposer = Recorded(d)
    got = decode(model, prompt, Exact(), proposer, max_len=causal.MAX_LEN)
    out = got.sequences()[0]
    _, features = model.full_features(torch.tensor([prompt[0].tolist() + out]), LAYERS)  # (1, T, 2D)
    n, log = prompt.shape[1], proposer.made[-1].log
    assert len(log) == got.model_calls - 1 and len(log) >= 3
    for _, committed, tokens in log:
        c, block = committed[0], tokens[0]
        assert block[0] == out[c]
        w = block.shape[0]
        ids = torch.tensor([[[out[c]] + [3] * (w - 1)]])
        anchor = torch.tensor([[n + c]])
        h = d.train_forward(features, model.embed_tokens(ids), anchor, anchor[..., None] + torch.arange(w))
        assert block[1:].tolist() == model.logits_first(h[0, 0, 1:]).argmax(dim=-1).tolist()


def test_layers_out_of_range_are_one_line():
    model, src = causal.tiny(k=1), causal.prompts(2)
    with pytest.raises(ValueError, match=r"target layers \[0, 2\]: each must be a decoder layer in \[0, 1\]"):
        model.encode_features(src, (0, 2))
