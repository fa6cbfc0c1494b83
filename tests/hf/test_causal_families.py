"""Families beyond the ones issue 46 names, exact with no family-specific code: whatever attention layers call
``cache.update`` and whose base model takes ``position_ids`` and a 4-D mask (embedding scales, partial rotary,
parallel residuals, multi-query attention, sliding windows on some layers, logit scales are the base's own)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

import transformers
from transformers import AutoModelForCausalLM

from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.hf.causal import HFCausalBlockwise
from tests.hf.test_causal import MAX_LEN, PAD, VOCAB, hf_greedy, pick_eos, prompts, scramble_head

pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "max_position_embeddings": 64, "pad_token_id": PAD, "bos_token_id": 1,
          "eos_token_id": 2, "tie_word_embeddings": False}
GQA = {"num_key_value_heads": 2}
FAMILIES = {
    "GemmaConfig": {**GQA, "head_dim": 8},  # embeddings scaled by sqrt(d), (1 + w) RMSNorm
    "Gemma3TextConfig": {**GQA, "head_dim": 8, "sliding_window": 4},  # sliding and full layers, q/k norms
    "Phi3Config": GQA,  # fused qkv and gate-up projections
    "Olmo2Config": GQA,  # norms after attention and MLP
    "CohereConfig": GQA,  # parallel attention and MLP, a logit scale
    "GPTNeoXConfig": {"rotary_pct": 0.5},  # partial rotary, parallel residual
    "GPTBigCodeConfig": {"multi_query": True},  # one key/value head
    "GPTJConfig": {"rotary_dim": 4},
}


def tiny(name: str, extra: dict, seed: int = 0):
    config = getattr(transformers, name)(**{**COMMON, **extra})
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in base.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * (1.0 if "emb" in n or "wte" in n else
                                                                             3.0 / 32 ** 0.5))
    return base


@pytest.mark.parametrize("name", list(FAMILIES))
def test_exact_blockwise_equals_generate(name):
    base, src = tiny(name, FAMILIES[name]), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type="chained")
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    assert len({len(r) for r in want}) > 1
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want


def test_a_family_whose_model_reads_the_cache_otherwise_is_refused_in_one_line():
    """OPT derives its positions from the cache's length and a 2-D mask: refused, not decoded wrong."""
    base = tiny("OPTConfig", {"ffn_dim": 64, "word_embed_proj_dim": 32})
    with pytest.raises(ValueError, match="opt: its model asks the cache for more than update") as err:
        blockwise_decode(HFCausalBlockwise(base, k=2), prompts(), Exact(), 4)
    assert "\n" not in str(err.value)
