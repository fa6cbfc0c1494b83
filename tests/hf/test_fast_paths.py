"""A runtime's fast paths on a Hugging Face base: the lean decoder step, the fused chain with int8 proposals and a
draft vocabulary. Each against its reference (the HF layers, the heads' own links), and exact decoding against
``generate``."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.hf import HFSeq2SeqBlockwise
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.kernels import int8
from lightning_bpd.nn.argmax import argmax
from tests.hf.test_base import EOS, PAD, VOCAB, generated, pick_eos, scramble_head, sources, tiny_base
from tests.models import assert_close_to_rounding

LEAN_FAMILIES = ("marian", "bart", "mbart")  # T5 keeps its modules


def steps(model, src: torch.Tensor) -> list[torch.Tensor]:
    """Hidden states of a 1-token step, then three 3-token steps with per-row crops between them."""
    b = src.shape[0]
    context = model.encode(src)
    g = torch.Generator().manual_seed(7)
    tgt = torch.cat([torch.full((b, 1), model.bos_id), torch.randint(3, VOCAB, (b, 12), generator=g)], dim=1)
    cache = model.new_cache(b, 16)
    out = [model.decode_step(tgt[:, :1], context, cache)]
    accepted = torch.tensor([1, 3, 2, 1, 3])
    for _ in range(3):
        at = cache.lengths.clone()
        out.append(model.decode_step(torch.stack([tgt[r, at[r] : at[r] + 3] for r in range(b)]), context, cache))
        cache.crop(cache.lengths - 3 + accepted)
        accepted = accepted.roll(1)
    return out


@pytest.mark.parametrize("family", LEAN_FAMILIES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_the_lean_step_is_the_hf_layers_step(family, attention, dtype):
    """The same kernels in the same order on the same inputs: bitwise the HF layers' states, ragged rows included."""
    model = HFSeq2SeqBlockwise(tiny_base(family, dtype=dtype, attention=attention), k=3)
    lean = build_runtime(model, InferenceOptions(lean_steps=True))
    modules = build_runtime(model, InferenceOptions(lean_steps=False))
    src = sources()
    with torch.no_grad():
        got, want = steps(lean, src), steps(modules, src)
    assert lean.model.lean and lean.model._lean is not None and modules.model._lean is None
    for g, w in zip(got, want):
        assert torch.equal(g, w)


@pytest.mark.parametrize("family", LEAN_FAMILIES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_lean_encoder_layers_are_the_hf_layers(family, attention):
    """The encoder's own embeddings, mask and loop around lean layers: bitwise its states and cross keys, padded
    rows included; with gradients on the installed layers hand the call back to the HF layers."""
    model = HFSeq2SeqBlockwise(tiny_base(family, dtype=torch.float32, attention=attention), k=3)
    lean = build_runtime(model, InferenceOptions(lean_steps=True))
    modules = build_runtime(model, InferenceOptions(lean_steps=False))
    src = sources()
    with torch.no_grad():
        got, want = lean.encode(src), modules.encode(src)
    assert all("forward" in layer.__dict__ for layer in lean.model.base.get_encoder().layers)
    assert not any("forward" in layer.__dict__ for layer in modules.model.base.get_encoder().layers)
    assert torch.equal(got.hidden, want.hidden)
    assert all(torch.equal(a, b) for (a, _), (b, _) in zip(got.cross, want.cross))
    # gradients on: the HF layers themselves, as in a runtime without lean steps
    assert torch.equal(lean.model.encode(src).hidden, modules.model.encode(src).hidden)


def test_the_model_itself_and_training_keep_the_hf_layers():
    model = HFSeq2SeqBlockwise(tiny_base("marian"), k=2)
    assert not model.lean
    with torch.no_grad():
        steps(model, sources())
    assert model._lean is None


def test_the_output_layer_is_the_projection():
    """Marian: the LM head, its final logits bias and the pad ban as one affine map, kept while unchanged."""
    model = HFSeq2SeqBlockwise(tiny_base("marian"), k=2)
    h = torch.randn(4, 32, dtype=torch.float64)
    weight, bias = model.output_layer()
    assert_close_to_rounding(torch.nn.functional.linear(h, weight, bias)[:, 3:], model.project(h)[:, 3:])
    assert bool((bias[PAD] == float("-inf")).all())
    assert model.output_layer()[1] is bias
    with torch.no_grad():
        model.base.final_logits_bias.add_(1.0)
    assert model.output_layer()[1] is not bias
    with torch.inference_mode():  # Lightning's test and validate: inference tensors keep no version counter
        made = build_runtime(model, InferenceOptions(draft_vocab=(4, 5, EOS)))
        assert made.model.output_layer()[1] is made.model.output_layer()[1]
        assert made.draft_vocab.rows(*made.model.output_layer())[0].shape == (3, 32)


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_fused_links_follow_the_heads_links(family):
    """The runtime's fused chain links give the states of the heads' own (reference) links."""
    model = HFSeq2SeqBlockwise(tiny_base(family), k=4, head_type="chained_attn")
    scramble_head(model)
    runtime = build_runtime(model)
    fused = runtime.proposer.fused
    assert fused is not None
    src = sources()
    with torch.no_grad():
        source = model.chain_source(model.encode(src))
        z = torch.randn(src.shape[0], 32, dtype=torch.float64)
        token = torch.randint(3, VOCAB, (src.shape[0],))
        for i in range(1, 4):
            want, _ = model.chain_step(z, token, i, source)
            assert_close_to_rounding(fused.step(z, token, i, source), want)
            z, token = want, argmax(model.project(want))


@pytest.mark.parametrize("family", ["marian", "bart", "mbart", "t5"])
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_exact_decoding_through_every_fast_path_equals_generate(family, head_type):
    """float32 runtime, lean steps, fused chain, int8 proposals (where the CPU has them) and a draft vocabulary:
    a ragged batch decodes to generate's greedy tokens."""
    base = tiny_base(family, dtype=torch.float32)
    src, max_len = sources(6), 16
    pick_eos(base, src, max_len)
    model = HFSeq2SeqBlockwise(base, k=4, head_type=head_type)
    scramble_head(model, std=0.05)
    draft = tuple(range(3, VOCAB, 2)) + (EOS,)
    options = InferenceOptions(precision="float32", draft_vocab=draft,
                               proposal_precision="int8" if int8.available() and head_type != "paper" else None)
    runtime = build_runtime(model, options)
    want = generated(base, src, max_len)
    with torch.no_grad():
        got = blockwise_decode(runtime, src, Exact(), max_len)
    assert got.sequences() == want
    assert runtime.draft_vocab is not None and runtime.model.draft_vocab is None  # the runtime's own


def test_proposals_stay_in_the_draft_vocabulary():
    model = HFSeq2SeqBlockwise(tiny_base("marian", dtype=torch.float32), k=4, head_type="chained_attn")
    scramble_head(model)
    draft = (5, 9, 17, EOS)
    runtime = build_runtime(model, InferenceOptions(draft_vocab=draft))
    src = sources()
    with torch.no_grad():
        context = runtime.encode(src)
        h = torch.randn(src.shape[0], 32)
        tokens = runtime.chain_drafts(h, torch.full((src.shape[0],), 5), 4, runtime.chain_source(context))
    assert tokens.shape == (src.shape[0], 3)
    assert set(tokens.flatten().tolist()) <= set(draft)
