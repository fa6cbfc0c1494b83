"""The DFlash proposer in the one loop on Hugging Face causal bases (issue 53): every row = the checkpoint's own
greedy ``generate`` on ragged batches, and each proposed block is the drafter's own reading of the target's features,
as its training pass computes it (the context strictly before the block, from an uncached forward)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, decode
from lightning_bpd.decoding.acceptance import SpeculativeSampling
from lightning_bpd.drafters.dflash.network import DFlashConfig, DFlashDrafter
from lightning_bpd.drafters.dflash.proposer import DFlash, DFlashDrafting
from lightning_bpd.hf.causal import HFCausalBlockwise
from tests.hf import test_causal as causal

pytestmark = pytest.mark.usefixtures("one_thread")


def drafter_for(base, block_size: int = 4, layers: tuple[int, ...] = (0, 1), seed: int = 7) -> DFlashDrafter:
    """A random drafter for a tiny causal base (float64, its hidden size), weights large enough to vary."""
    torch.manual_seed(seed)
    hidden = base.config.hidden_size if hasattr(base.config, "hidden_size") else base.config.n_embd
    config = DFlashConfig(hidden_size=hidden, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64,
                          target_layer_ids=layers, mask_token_id=3, num_layers=2, block_size=block_size)
    return DFlashDrafter(config).double().eval()


@dataclass
class Recording(DFlashDrafting):
    """The drafting state, logging each live row's committed length and proposed block."""

    log: list = field(default_factory=list)

    def propose(self, state, features):
        path = super().propose(state, features)
        self.log.append((state.book.live_rows[:], state.book.committed().tolist(), path.block.tokens.clone()))
        return path


@dataclass(frozen=True)
class Recorded(DFlash):
    def start(self, state, prompt):
        base = super().start(state, prompt)
        self.__dict__.setdefault("made", []).append(Recording(**{f.name: getattr(base, f.name) for f in fields(base)}))
        return self.made[-1]


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_dflash_decoding_equals_generate_on_a_ragged_batch(family, side):
    base, src, max_len = causal.tiny_lm(family), causal.prompts(6, side=side), 14
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    assert {len(r) for r in want} != {max_len} and max_len in {len(r) for r in want}
    got = decode(model, src, Exact(), DFlash(drafter_for(base)), max_len=max_len)
    assert got.sequences() == want
    assert max(max(sizes) for sizes in got.block_sizes) <= 4
    assert decode(model, src, Exact(), DFlash(drafter_for(base), block_size=2), max_len=max_len).sequences() == want


def uncached_features(base, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    """The target's layer outputs over one whole sequence (1, T, A * D), uncached."""
    out = base.base_model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in layers], dim=-1)


def test_each_block_is_the_drafters_reading_of_the_target_features_before_it():
    """Batch 1: at every iteration the proposals are what the drafter's training pass drafts with the anchor at the
    block's first position, from the target's uncached features of the prompt and the output before it."""
    base = causal.tiny_lm("llama")
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(base, block_size=5)
    prompt = causal.prompts(1, width=7)[0]
    prompt = prompt[prompt != causal.PAD][None]  # (1, n)
    proposer = Recorded(drafter)
    got = decode(model, prompt, Exact(), proposer, max_len=16)
    out = got.sequences()[0]
    seq = prompt[0].tolist() + out
    features = uncached_features(base, seq, (0, 1))  # (1, T, 2 * D)
    n, log = prompt.shape[1], proposer.made[-1].log
    assert len(log) == got.model_calls - 1 and len(log) >= 3
    for rows, committed, tokens in log:
        c, block = committed[0], tokens[0]
        assert block[0] == out[c]  # greedy's next token opens the block
        w = block.shape[0]
        ids = torch.tensor([[[out[c]] + [3] * (w - 1)]])  # (1, 1, w): the first token and masks
        anchor = torch.tensor([[n + c]])
        h = drafter.train_forward(features, model.embed_tokens(ids), anchor, anchor[..., None] + torch.arange(w))
        want = model.logits_first(h[0, 0, 1:]).argmax(dim=-1)
        assert block[1:].tolist() == want.tolist()


def test_what_the_proposer_cannot_serve_is_one_line():
    from tests.models import random_model, random_sources

    base, src = causal.tiny_lm("llama"), causal.prompts(4)
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(base)
    with pytest.raises(ValueError, match="block_size"):
        decode(model, src, Exact(), DFlash(drafter, block_size=9), max_len=8)
    with pytest.raises(ValueError, match="target layers"):
        decode(model, src, Exact(), DFlash(drafter_for(base, layers=(0, 5))), max_len=8)
    with pytest.raises(ValueError, match="no target features"):
        decode(random_model(k=1), random_sources(2), Exact(), DFlash(drafter), max_len=8)


def test_a_runtime_decodes_with_the_drafter_as_the_model_does():
    from lightning_bpd.inference import InferenceOptions, build_runtime

    base, src, max_len = causal.tiny_lm("qwen3"), causal.prompts(5), 12
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(base)
    want = decode(model, src, Exact(), DFlash(drafter), max_len=max_len)
    got = decode(build_runtime(model, InferenceOptions()), src, Exact(), DFlash(drafter), max_len=max_len)
    assert got.sequences() == want.sequences() == causal.hf_greedy(base, src, max_len)
    assert got.block_sizes == want.block_sizes


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_a_lean_runtime_gives_the_modules_features_bit_for_bit(family):
    """A runtime's lean step (Llama family) returns the same hidden states and layer outputs as the base's modules,
    the last layer's after the final norm as transformers' hidden_states give it."""
    from lightning_bpd.inference import InferenceOptions, build_runtime

    base, src = causal.tiny_lm(family), causal.prompts(4)
    model = HFCausalBlockwise(base, k=1)
    runtime = build_runtime(model, InferenceOptions())
    with torch.no_grad():
        assert runtime.model.runs_lean() and not model.runs_lean()  # the runtime's step is lean, the model's is not
    layers = (0, 1)
    outs = []
    for m in (model, runtime):
        context, *_ = m.encode_features(src, layers)
        cache = m.new_cache(src.shape[0], capacity=8)
        with torch.no_grad():
            m.decode_step(torch.full((src.shape[0], 1), model.bos_id), context, cache)
            outs.append(m.decode_step_features(torch.tensor([[5, 6, 7]] * src.shape[0]), context, cache, layers))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
    d = outs[0][0].shape[-1]
    assert torch.equal(outs[0][1][..., d:], outs[0][0])  # layer 1 is the last: its output after the final norm


def test_speculative_sampling_with_the_drafter_is_lossless():
    """Sequences sampled with the drafter proposing follow ancestral sampling from the target's p_1 exactly
    (chi-square against the exact sequence probabilities of a 6-token Llama), and drafted tokens do get accepted."""
    from transformers import AutoModelForCausalLM, LlamaConfig

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
    drafter = drafter_for(base, block_size=3)
    rule = SpeculativeSampling(temperature=1.0)
    rule.seed = 5
    out = decode(model, src.expand(N_SAMPLES, -1).contiguous(), rule, DFlash(drafter), max_len=MAX_LEN)
    p_value, bins = chi_square_p_value(out.sequences(), exact)
    assert bins >= 10 and p_value > P_MIN
    assert max(max(sizes) for sizes in out.block_sizes) > 1


def test_the_loop_owns_the_target_and_hands_the_drafter_its_features():
    """Every pass of the target is the loop's: one prefill with the drafter's layers, one call on the start token,
    then one verify pass per iteration with those layers; the drafter calls none (issue 60)."""
    base, src, max_len = causal.tiny_lm("llama"), causal.prompts(4, side="left"), 10
    model = HFCausalBlockwise(base, k=1)
    calls: dict[str, list] = {}
    for name in ("encode", "encode_features", "decode_step", "decode_step_features", "decode_full"):
        own = getattr(model, name)

        def counted(*args, _own=own, _name=name, **kwargs):
            calls.setdefault(_name, []).append(args[-1] if _name.endswith("_features") else None)
            return _own(*args, **kwargs)

        setattr(model, name, counted)
    got = decode(model, src, Exact(), DFlash(drafter_for(base, layers=(0, 1))), max_len=max_len)
    assert got.sequences() == causal.hf_greedy(base, src, max_len)
    assert calls["encode_features"] == [(0, 1)] and "encode" not in calls and "decode_full" not in calls
    assert len(calls["decode_step"]) == 1 and calls["decode_step_features"] == [(0, 1)] * (got.model_calls - 1)
