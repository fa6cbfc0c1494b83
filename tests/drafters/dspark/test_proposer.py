"""The DSpark proposer in the one loop on Hugging Face causal bases: every row = the checkpoint's own greedy
``generate`` on ragged batches, with and without confidence truncation; each proposed block is the drafter's reading
of the target's features (its training pass with the anchor at the block's first token, the Markov chain on its
argmax); speculative sampling with it stays lossless; what it cannot serve is one line."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, decode
from lightning_bpd.decoding.acceptance import SpeculativeSampling
from lightning_bpd.drafters.dspark.proposer import DSpark, DSparkDrafting
from lightning_bpd.hf.causal import HFCausalBlockwise
from tests.drafters.dspark.tiny import random_dspark
from tests.hf import test_causal as causal

pytestmark = pytest.mark.usefixtures("one_thread")


def drafter_for(base, block_size: int = 4, layers: tuple[int, ...] = (0, 1), **kwargs):
    hidden = base.config.hidden_size if hasattr(base.config, "hidden_size") else base.config.n_embd
    return random_dspark(hidden, base.config.vocab_size, block_size, layers, **kwargs)


@dataclass
class Recording(DSparkDrafting):
    """The drafting state, logging each live row's committed length and proposed block."""

    log: list = field(default_factory=list)

    def propose(self, state, features):
        path = super().propose(state, features)
        self.log.append((state.book.committed().tolist(), path.block.tokens.clone(), path.block.widths))
        return path


@dataclass(frozen=True)
class Recorded(DSpark):
    def start(self, state, prompt):
        base = super().start(state, prompt)
        self.__dict__.setdefault("made", []).append(Recording(**{f.name: getattr(base, f.name) for f in fields(base)}))
        return self.made[-1]


@pytest.mark.parametrize("family", ["llama", "qwen3", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_dspark_decoding_equals_generate_on_a_ragged_batch(family, side):
    base, src, max_len = causal.tiny_lm(family), causal.prompts(6, side=side), 14
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    assert {len(r) for r in want} != {max_len} and max_len in {len(r) for r in want}
    drafter = drafter_for(base)
    got = decode(model, src, Exact(), DSpark(drafter), max_len=max_len)
    assert got.sequences() == want
    assert max(max(sizes) for sizes in got.block_sizes) <= 5  # token 1 and up to 4 drafts
    assert decode(model, src, Exact(), DSpark(drafter, block_size=1), max_len=max_len).sequences() == want
    sure = Recorded(drafter, confidence_threshold=0.5)
    assert decode(model, src, Exact(), sure, max_len=max_len).sequences() == want
    widths = torch.cat([w for _, _, w in sure.made[-1].log])
    assert 1 <= int(widths.min()) and int(widths.min()) < 5  # some rows did stop early (others may not)


def uncached_features(base, tokens: list[int], layers: tuple[int, ...]) -> torch.Tensor:
    out = base.base_model(input_ids=torch.tensor([tokens]), output_hidden_states=True, use_cache=False)
    return torch.cat([out.hidden_states[i + 1] for i in layers], dim=-1)  # (1, T, A * D)


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_each_block_is_the_drafters_reading_of_the_target_features_before_it(threshold):
    """Batch 1: each block is the training pass's, anchor-first (slot j: the token after the anchor's j-th
    successor), each slot's argmax with the Markov bias of the slot before's draft; with a threshold, cut before the
    first slot whose confidence is below it."""
    base = causal.tiny_lm("llama")
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(base, block_size=5)
    prompt = causal.prompts(1, width=7)[0]
    prompt = prompt[prompt != causal.PAD][None]  # (1, n)
    proposer = Recorded(drafter, confidence_threshold=threshold)
    got = decode(model, prompt, Exact(), proposer, max_len=16)
    out = got.sequences()[0]
    features = uncached_features(base, prompt[0].tolist() + out, (0, 1))
    n, log, checked = prompt.shape[1], proposer.made[-1].log, 0
    assert len(log) == got.model_calls - 1 and len(log) >= 3
    for committed, tokens, widths in log:
        c, block = committed[0], tokens[0]
        if c + 6 > 16:
            continue  # the room clamp cut this block
        checked += 1
        assert block[0] == out[c]
        ids = torch.tensor([[[out[c]] + [3] * 4]])  # (1, 1, 5): the anchor and masks
        anchor = torch.tensor([[n + c]])
        h = drafter.train_forward(features, model.embed_tokens(ids), anchor, anchor[..., None] + torch.arange(5))[0]
        want, _, conf = drafter.chain(h, model.logits_first(h), torch.tensor([out[c]]), lambda x: x.argmax(-1),
                                      confidence=True)
        keep = 5 if threshold == 0 else int((torch.sigmoid(conf[0]) >= threshold).long().cumprod(0).sum())
        assert block[1:].tolist() == want[0, :keep].tolist()[: block.shape[0] - 1]
        assert (widths is None) == (threshold == 0) and (widths is None or int(widths[0]) == keep + 1)
    assert checked >= 2


def test_what_the_proposer_cannot_serve_is_one_line():
    from tests.models import random_model, random_sources

    base, src = causal.tiny_lm("llama"), causal.prompts(4)
    model = HFCausalBlockwise(base, k=1)
    drafter = drafter_for(base)
    for bad, match in ((DSpark(drafter, block_size=5), r"2\.\.5 tokens .* block_size must be an integer in \[1, 4\]"),
                       (DSpark(drafter, block_size=0), "block_size must be"),
                       (DSpark(drafter, confidence_threshold=1.5), r"confidence_threshold must lie in \[0, 1\)"),
                       (DSpark(drafter_for(base, confidence=False), confidence_threshold=0.3), "no confidence head"),
                       (DSpark(drafter_for(base, layers=(0, 5))), "target layers")):
        with pytest.raises(ValueError, match=match) as info:
            decode(model, src, Exact(), bad, max_len=8)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="no target features"):
        decode(random_model(k=1), random_sources(2), Exact(), DSpark(drafter), max_len=8)


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_speculative_sampling_with_the_drafter_is_lossless(threshold):
    """Sequences sampled with the drafter proposing (each slot drawn given the draw before it) follow ancestral
    sampling from the target's p_1 exactly (chi-square against the exact sequence probabilities of a 6-token Llama),
    and drafted tokens do get accepted."""
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
    drafter = drafter_for(base, block_size=3, head_scale=2.0)
    rule = SpeculativeSampling(temperature=1.0)
    rule.seed = 5
    out = decode(model, src.expand(N_SAMPLES, -1).contiguous(), rule, DSpark(drafter, confidence_threshold=threshold),
                 max_len=MAX_LEN)
    p_value, bins = chi_square_p_value(out.sequences(), exact)
    assert bins >= 10 and p_value > P_MIN
    assert max(max(sizes) for sizes in out.block_sizes) > 1
