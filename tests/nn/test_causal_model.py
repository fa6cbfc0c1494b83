"""Our own decoder-only Transformer (``ModelConfig(decoder_only=True)``, issue 46 item 2) behind the decoding protocol:
prompts as sources, cached == uncached, greedy == exact blockwise on ragged prompt batches, trees, a runtime."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import (
    Exact,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode,
    greedy_decode_reference,
)
from lightning_bpd.decoding.reference.tree import tree_decode_reference
from lightning_bpd.decoding.static import static_decode
from lightning_bpd.decoding.trees.tree import Tree
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.nn.causal_model import CausalTransformer
from lightning_bpd.nn.config import ModelConfig
from lightning_bpd.nn.model import BlockwiseTransformer
from tests.models import assert_close_to_rounding

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, PAD, MAX_LEN = 40, 0, 12


def tiny(k: int = 4, head_type: str = "paper", seed: int = 0, dtype: torch.dtype = torch.float64,
         eos: int | None = 2) -> CausalTransformer:
    """A tiny decoder-only model with scrambled weights (peaked logits: its greedy output depends on the prompt)."""
    torch.manual_seed(seed)
    config = ModelConfig(VOCAB, VOCAB, d_model=32, n_heads=4, n_encoder_layers=0, n_decoder_layers=2, d_ff=64,
                         dropout=0.0, k=k, head_type=head_type, pad_id=PAD, eos_id=eos, decoder_only=True)
    model = CausalTransformer(config).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                std = 0.05 if name.startswith("head.") else (1.0 if "embed" in name else 3.0 / p.shape[1] ** 0.5)
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return model


def prompts(batch: int = 6, seed: int = 1, width: int = 9, side: str = "right") -> torch.Tensor:
    """Prompts of different lengths (one of length 1), padded with PAD on ``side``."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (batch, width), generator=g)
    lengths = torch.randint(2, width + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = width, 1
    src[torch.arange(width)[None, :] >= lengths[:, None]] = PAD
    if side == "left":
        src = torch.stack([torch.cat([row[row == PAD], row[row != PAD]]) for row in src])
    return src


def pick_eos(model: CausalTransformer, src: torch.Tensor) -> None:
    """An EOS that greedy emits after the first step in some rows but not all (rows stop at different times)."""
    model.eos_id = None
    seqs = greedy_decode_reference(model, src, MAX_LEN).sequences()
    scores = {t: sum(t in s[1 : MAX_LEN - 1] for s in seqs) for t in range(3, VOCAB)}
    model.eos_id = max(scores, key=lambda t: scores[t] if scores[t] < len(seqs) else 0)


def test_a_decoder_only_config_builds_no_encoder_and_no_cross_attention():
    model = tiny()
    names = [name for name, _ in model.named_parameters()]
    assert model.encoder is None and not any("cross_attn" in n or "src_embed" in n for n in names)
    assert model.src_embed is model.tgt_embed
    with pytest.raises(ValueError, match="CausalTransformer"):
        BlockwiseTransformer(model.config)
    with pytest.raises(ValueError, match="BlockwiseTransformer"):
        CausalTransformer(ModelConfig(VOCAB, VOCAB, n_encoder_layers=0))


@pytest.mark.parametrize("side", ["left", "right"])
def test_cached_steps_equal_the_full_pass(side):
    """The first step (each row's last prompt token), then 3-token steps with per-row crops between them, give the
    uncached stack's hidden states over each row alone."""
    model, src = tiny(k=3), prompts(side=side)
    b = src.shape[0]
    context = model.encode(src)
    g = torch.Generator().manual_seed(7)
    tgt = torch.cat([torch.full((b, 1), model.bos_id), torch.randint(3, VOCAB, (b, 12), generator=g)], dim=1)
    full = model.decode_full(tgt, context)  # (B, 13, D)
    whole = [model(torch.cat([row[row != PAD], t[1:]])[None])[0, -13:] for row, t in zip(src, tgt)]
    assert_close_to_rounding(full, torch.stack(whole))
    cache = model.new_cache(b, 1 + 12 + 3)
    assert_close_to_rounding(model.decode_step(tgt[:, :1], context, cache), full[:, :1])
    accepted = torch.tensor([1, 3, 2, 1, 3, 2])  # rows keep different numbers of the 3 tokens of each call
    for _ in range(3):
        at = cache.lengths.clone()
        block = torch.stack([tgt[r, at[r] : at[r] + 3] for r in range(b)])
        h = model.decode_step(block, context, cache)  # (B, 3, D)
        assert_close_to_rounding(h, torch.stack([full[r, at[r] : at[r] + 3] for r in range(b)]))
        cache.crop(cache.lengths - 3 + accepted)
        accepted = accepted.roll(1)


@pytest.mark.parametrize("head_type", ["paper", "chained"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_greedy_equals_exact_blockwise_on_ragged_prompts(head_type, dtype):
    """Greedy (cached and the reference) == exact blockwise (its reference, the fixed-shape decoder) token for token,
    on prompts padded on either side and at batch 1, rows ending at EOS and rows reaching the cap."""
    model, src = tiny(head_type=head_type, dtype=dtype), prompts()
    pick_eos(model, src)
    want = greedy_decode_reference(model, src, MAX_LEN).sequences()
    assert {len(r) for r in want} != {MAX_LEN} and MAX_LEN in {len(r) for r in want}
    assert greedy_decode(model, src, MAX_LEN).sequences() == want
    for padded in (src, prompts(side="left")):
        got = blockwise_decode(model, padded, Exact(), MAX_LEN)
        assert got.sequences() == want
    assert blockwise_decode_reference(model, src, Exact(), MAX_LEN).sequences() == want
    assert static_decode(model, src, Exact(), MAX_LEN).sequences() == want  # fixed shapes: a static cache
    assert max(max(sizes) for sizes in got.block_sizes) > 1 or head_type == "chained"
    fast, slow = blockwise_decode(model, src, TopK(2), MAX_LEN), blockwise_decode_reference(model, src, TopK(2), MAX_LEN)
    assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes
    for row in range(src.shape[0]):  # batch 1: the prompt alone, unpadded
        one = src[row : row + 1, : int((src[row] != PAD).sum())]
        assert blockwise_decode(model, one, Exact(), MAX_LEN).sequences() == [want[row]]


@pytest.mark.parametrize("head_type", ["paper", "chained"])
def test_trees_equal_greedy_and_the_tree_reference(head_type):
    model, src = tiny(head_type=head_type), prompts()
    pick_eos(model, src)
    want = greedy_decode_reference(model, src, MAX_LEN).sequences()
    for paths in ([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)], [(0,), (1,), (2,), (3,)]):
        tree = Tree.from_paths(paths)
        assert blockwise_decode(model, src, Exact(), MAX_LEN, tree=tree).sequences() == want
        fast = blockwise_decode(model, src, TopK(2), MAX_LEN, tree=tree)
        slow = tree_decode_reference(model, src, TopK(2), MAX_LEN, tree=tree)
        assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes


@pytest.mark.parametrize("head_type", ["paper", "chained"])
@pytest.mark.parametrize("options", ["plain", "draft_vocab", "int8"])
def test_a_runtime_decodes_as_the_model(head_type, options):
    """A runtime (its proposer, fused chain links, a draft vocabulary) decodes the model's greedy tokens exactly; an
    int8 runtime its own greedy ones."""
    model, src = tiny(head_type=head_type, dtype=torch.float32), prompts()
    pick_eos(model, src)
    opts = {"plain": InferenceOptions(), "draft_vocab": InferenceOptions(draft_vocab=tuple(range(3, 30))),
            "int8": InferenceOptions(precision="int8")}[options]
    runtime = build_runtime(model, opts)
    assert runtime.proposer is not None and (runtime.chain_draft is not None) == (head_type == "chained")
    want = greedy_decode(runtime if options == "int8" else model, src, MAX_LEN).sequences()
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == want
    if options == "plain":
        assert greedy_decode(runtime, src, MAX_LEN).sequences() == want
        assert (blockwise_decode(runtime, src, Exact(), MAX_LEN).block_sizes
                == blockwise_decode(model, src, Exact(), MAX_LEN).block_sizes)


def test_the_rules_history_is_each_prompts_tail():
    model = tiny()
    src = torch.tensor([[5, 6, 7, PAD], [PAD, PAD, 8, 9], [4, PAD, PAD, PAD]])
    assert model.rules_history(src, 3).tolist() == [[5, 6, 7], [-1, 8, 9], [-1, -1, 4]]
    assert model.rules_history(src, 5).tolist()[2] == [-1, -1, -1, -1, 4]


def test_bad_input_is_one_line():
    with pytest.raises(ValueError, match="n_encoder_layers=3"):
        ModelConfig(VOCAB, VOCAB, decoder_only=True)
    with pytest.raises(ValueError, match="src_vocab_size=50, window=4"):
        ModelConfig(50, VOCAB, n_encoder_layers=0, window=4, decoder_only=True)
    with pytest.raises(ValueError, match="empty prompt"):
        tiny().encode(torch.tensor([[3, 4], [PAD, PAD]]))
