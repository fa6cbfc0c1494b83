"""Decoder-only Hugging Face bases behind the decoding protocol (issue 46): tiny random Llama / Qwen2 / Qwen3 /
Mistral / GPT-2 models built here, exact against their own greedy ``generate`` on ragged batches of prompts."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from lightning_bpd.decoding import (
    Exact,
    TopK,
    blockwise_decode,
    greedy_decode,
    greedy_decode_reference,
)
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.hf.generation_rules import ids
from tests.models import assert_close_to_rounding

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, PAD, MAX_LEN = 80, 0, 12
EMBED, WEIGHT, FFN = 1.0, 3.0, 0.3  # scrambled weights: std of the embeddings, the attention and the MLP
FAMILIES = ("llama", "qwen2", "qwen3", "mistral", "gpt2")
LLAMA_LIKE = {"vocab_size": VOCAB, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
              "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False}


def config_of(family: str, **extra):
    if family == "gpt2":  # absolute positions, tied LM head, no grouped-query attention
        return GPT2Config(**{"vocab_size": VOCAB, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 64,
                             "pad_token_id": PAD, "bos_token_id": 1, "eos_token_id": 2, "resid_pdrop": 0.0,
                             "embd_pdrop": 0.0, "attn_pdrop": 0.0, **extra})
    kind = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[family]
    more = {"head_dim": 8} if family == "qwen3" else {}
    return kind(**{**LLAMA_LIKE, **more, **extra})


def tiny_lm(family: str, seed: int = 0, dtype: torch.dtype = torch.float64, attention: str = "sdpa", **extra):
    """A tiny random causal LM with scrambled weights, so that its greedy output depends on the prompt."""
    seed += 10 * FAMILIES.index(family)  # families of the same shapes get other weights
    torch.manual_seed(seed)
    config = config_of(family, **extra)
    config._attn_implementation = attention
    base = AutoModelForCausalLM.from_config(config).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if p.dim() == 2:
                std = EMBED if any(s in name for s in ("embed", "wte", "wpe")) else (
                    FFN if "mlp" in name else WEIGHT) / 32 ** 0.5
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
    return base


def prompts(batch: int = 6, seed: int = 1, width: int = 9, side: str = "right") -> torch.Tensor:
    """Prompts of different lengths (one of length 1), padded with PAD on ``side``."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (batch, width), generator=g)
    lengths = torch.randint(2, width + 1, (batch,), generator=g)
    lengths[0], lengths[-1] = width, 1
    src[torch.arange(width)[None, :] >= lengths[:, None]] = PAD
    return left_padded(src) if side == "left" else src


def left_padded(src: torch.Tensor) -> torch.Tensor:
    out = torch.full_like(src, PAD)
    for b, row in enumerate(src):
        real = row[row != PAD]
        out[b, src.shape[1] - len(real):] = real
    return out


def hf_greedy(base, src: torch.Tensor, max_new_tokens: int = MAX_LEN) -> list[list[int]]:
    """The checkpoint's own greedy ``generate`` on the prompts left-padded, each row's new tokens cut after its first
    EOS id."""
    src = left_padded(src)
    out = base.generate(input_ids=src, attention_mask=(src != PAD).long(), do_sample=False, num_beams=1,
                        max_new_tokens=max_new_tokens, pad_token_id=PAD)
    eos = ids(base.generation_config.eos_token_id)
    rows = []
    for row in out[:, src.shape[1]:].tolist():
        end = next((i for i, t in enumerate(row) if t in eos), None)
        rows.append(row if end is None else row[: end + 1])
    return rows


def pick_eos(base, src: torch.Tensor, max_len: int = MAX_LEN) -> int:
    """An EOS that greedy emits after the first step in some rows but not all, so that rows stop at different
    times and some reach the cap."""
    base.config.eos_token_id = base.generation_config.eos_token_id = None
    seqs = hf_greedy(base, src, max_len)
    best, best_score = 2, -1
    for tok in range(3, VOCAB):
        ended = sum(1 for s in seqs if tok in s[1 : max_len - 1])
        score = ended if ended < len(seqs) else 0
        if score > best_score:
            best, best_score = tok, score
    base.config.eos_token_id = base.generation_config.eos_token_id = best
    return best


def scramble_head(model: HFCausalBlockwise, seed: int = 3, std: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_cached_steps_equal_the_full_pass(family, attention, side):
    """The first step (the start token: each row's last prompt token), then 3-token steps with per-row crops
    between them, give the base's own uncached hidden states."""
    model = HFCausalBlockwise(tiny_lm(family, attention=attention), k=3)
    rel = 1e-5 if attention == "eager" else 1e-12  # eager attention takes its softmax in float32 (row lengths differ)
    src = prompts(side=side)
    b = src.shape[0]
    context = model.encode(src)
    g = torch.Generator().manual_seed(7)
    tgt = torch.cat([torch.full((b, 1), model.bos_id), torch.randint(3, VOCAB, (b, 12), generator=g)], dim=1)
    full = model.decode_full(tgt, context)  # (B, 13, D)
    cache = model.new_cache(b, 1 + 12 + 3)
    assert_close_to_rounding(model.decode_step(tgt[:, :1], context, cache), full[:, :1], rel)
    accepted = torch.tensor([1, 3, 2, 1, 3, 2])  # rows keep different numbers of the 3 tokens of each call
    for _ in range(3):
        at = cache.lengths.clone()
        block = torch.stack([tgt[r, at[r] : at[r] + 3] for r in range(b)])
        h = model.decode_step(block, context, cache)  # (B, 3, D)
        assert_close_to_rounding(h, torch.stack([full[r, at[r] : at[r] + 3] for r in range(b)]), rel)
        cache.crop(cache.lengths - 3 + accepted)
        accepted = accepted.roll(1)


@pytest.mark.parametrize("family", FAMILIES)
def test_first_head_is_the_base(family):
    """p_1 after the prompt is the base's own next-token logits (a left-padded forward as generate runs it)."""
    base = tiny_lm(family)
    model = HFCausalBlockwise(base, k=4)
    src = prompts(side="left")
    mask = (src != PAD).long()
    want = base(input_ids=src, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits[:, -1]
    h = model.decode_step(torch.full((src.shape[0], 1), model.bos_id), model.encode(src), model.new_cache(6, 2))
    assert_close_to_rounding(model.logits_first(h[:, 0]), want)
    assert model.logits_heads(h).shape == (6, 1, 4, VOCAB)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_greedy_equals_generate_on_a_ragged_batch(family, dtype):
    base, src = tiny_lm(family, dtype=dtype), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=1)
    want = hf_greedy(base, src)
    assert {len(r) for r in want} != {MAX_LEN}, "some rows should stop at EOS"
    assert MAX_LEN in {len(r) for r in want}, "some rows should reach the cap"
    assert greedy_decode(model, src, MAX_LEN).sequences() == want
    assert greedy_decode(model, left_padded(src), MAX_LEN).sequences() == want
    assert greedy_decode_reference(model, src, MAX_LEN).sequences() == want


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head_type", ["paper", "chained", "medusa"])
@pytest.mark.parametrize("scrambled", [False, True])
def test_exact_blockwise_equals_generate(family, head_type, scrambled):
    """A zero-initialized head proposes p_1's token again (accepted on repeats), a scrambled one random tokens:
    either way exact acceptance gives generate's tokens, on a ragged batch padded on either side."""
    base, src = tiny_lm(family), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    if scrambled:
        scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    got = blockwise_decode(model, src, Exact(), MAX_LEN)
    assert got.sequences() == want
    assert blockwise_decode(model, left_padded(src), Exact(), MAX_LEN).sequences() == want
    if not scrambled:
        assert max(max(sizes) for sizes in got.block_sizes) > 1
        return
    for row in range(src.shape[0]):  # batch 1: the prompt alone, unpadded
        one = src[row : row + 1, : int((src[row] != PAD).sum())]
        assert blockwise_decode(model, one, Exact(), MAX_LEN).sequences() == hf_greedy(base, one) == [want[row]]


@pytest.mark.parametrize("family, extra", [("mistral", {"sliding_window": 4}),
                                           ("qwen2", {"use_sliding_window": True, "sliding_window": 4,
                                                      "max_window_layers": 1})])
def test_sliding_windows_equal_generate(family, extra):
    """A window shorter than the prompts: Mistral's on every layer, Qwen2's on some layers only (a mask per layer
    type); the cached steps and exact blockwise decoding still equal the full pass and generate."""
    base, src = tiny_lm(family, **extra), prompts()
    assert len(HFCausalBlockwise(base).windows) == (2 if family == "qwen2" else 1)
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type="chained")
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    assert want != hf_greedy(tiny_lm(family), src), "the window should change the output"
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == want
    assert greedy_decode_reference(model, src, MAX_LEN).sequences() == want


def test_a_training_step_of_the_heads_leaves_the_frozen_base_bit_identical():
    from lightning_bpd.nn.loss import blockwise_loss, shifted_targets

    model = HFCausalBlockwise(tiny_lm("llama"), k=3, head_type="chained")
    before = {name: p.clone() for name, p in model.base.state_dict().items()}
    heads_before = [p.clone() for p in model.head.parameters()]
    assert all(p.requires_grad for p in model.head.parameters())
    assert not any(p.requires_grad for p in model.base.parameters())
    tokens = torch.randint(3, VOCAB, (4, 10), generator=torch.Generator().manual_seed(0))
    targets = tokens[:, 1:]  # (B, T): position t predicts token t + 1 (head 1), t + i (head i)
    prev = torch.stack([shifted_targets(targets, i, PAD) for i in range(2)], dim=-1)  # (B, T, 2): teacher forcing
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    h = model(tokens[:, :-1])  # (B, T, D)
    blockwise_loss(model.logits_heads(h, range(3), prev), targets, range(3), PAD, weights=None).loss.backward()
    optimizer.step()
    assert all(torch.equal(p, before[name]) for name, p in model.base.state_dict().items())
    assert any(not torch.equal(p, q) for p, q in zip(model.head.parameters(), heads_before))


def test_load_causal_from_a_directory(tmp_path):
    from lightning_bpd.hf import load_causal

    base, src = tiny_lm("llama"), prompts()
    pick_eos(base, src)
    base.save_pretrained(tmp_path / "llama")
    model = load_causal(tmp_path / "llama", k=3, head_type="chained")
    assert model.k == 3 and model.chained_heads and not any(p.requires_grad for p in model.base.parameters())
    assert model.eos_id == base.config.eos_token_id and model.pad_id == PAD
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == hf_greedy(base, src)
    assert load_causal(base, k=2).base is base


def one_line(match: str, call) -> None:
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_bad_input_is_one_line(tmp_path):
    from transformers import AutoModelForSeq2SeqLM, BartConfig

    from lightning_bpd.hf import HFSeq2SeqBlockwise, load_base, load_causal

    gpt2 = tiny_lm("gpt2")
    one_line("k must be an integer >= 1", lambda: HFCausalBlockwise(gpt2, k=0))
    one_line("head_type must be one of", lambda: HFCausalBlockwise(gpt2, k=2, head_type="chained_attn"))
    one_line("decoder-only checkpoint.*HFCausalBlockwise", lambda: HFSeq2SeqBlockwise(gpt2, k=2))
    bart = AutoModelForSeq2SeqLM.from_config(BartConfig(vocab_size=VOCAB, d_model=16, encoder_layers=1,
                                                        decoder_layers=1, encoder_attention_heads=2,
                                                        decoder_attention_heads=2, encoder_ffn_dim=16,
                                                        decoder_ffn_dim=16))
    one_line("encoder-decoder checkpoint: use HFSeq2SeqBlockwise", lambda: HFCausalBlockwise(bart, k=2))
    one_line("not a directory", lambda: load_causal(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    one_line("not a Hugging Face checkpoint", lambda: load_causal(tmp_path / "empty"))
    bart.save_pretrained(tmp_path / "bart")
    one_line("encoder-decoder .*load_base", lambda: load_causal(tmp_path / "bart"))
    gpt2.save_pretrained(tmp_path / "gpt2")
    one_line("decoder-only.*load_causal", lambda: load_base(tmp_path / "gpt2"))
    model = HFCausalBlockwise(gpt2, k=2)  # 64 positions
    long = torch.randint(3, VOCAB, (2, 70))
    one_line("a prompt of 70 tokens is longer than the model's context \\(64 positions\\)",
             lambda: greedy_decode(model, long, 4))
    one_line("src row 0: the model's context holds 4 new tokens after it, fewer than max_len=8",
             lambda: greedy_decode(model, long[:, :60], 8))


TREES = {"medusa": [(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (1, 0, 0)],
         "wide": [(0,), (1,), (2,), (3,)]}


@pytest.mark.parametrize("family, extra", [("llama", {}), ("gpt2", {}), ("mistral", {"sliding_window": 4})])
@pytest.mark.parametrize("head_type", ["paper", "chained", "medusa"])
def test_trees_equal_generate_and_the_tree_reference(family, extra, head_type):
    """Tree decoding (issue 47) on a causal base: each node at its row's own position, seeing the prompt, the
    cached prefix and its ancestors; exact equals generate, top2 equals the tree reference."""
    from lightning_bpd.decoding.reference.tree import tree_decode_reference
    from lightning_bpd.decoding.trees.tree import Tree

    base, src = tiny_lm(family, **extra), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type=head_type)
    scramble_head(model, std=0.05)
    want = hf_greedy(base, src)
    for name, paths in TREES.items():
        tree = Tree.from_paths(paths)
        out = blockwise_decode(model, src, Exact(), MAX_LEN, tree=tree)
        assert out.sequences() == want, name
        fast = blockwise_decode(model, src, TopK(2), MAX_LEN, tree=tree)
        slow = tree_decode_reference(model, src, TopK(2), MAX_LEN, tree=tree)
        assert fast.sequences() == slow.sequences() and fast.block_sizes == slow.block_sizes, name


@pytest.mark.parametrize("family", FAMILIES)
def test_exact_blockwise_equals_generate_in_float32(family):
    base, src = tiny_lm(family, dtype=torch.float32), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4)
    scramble_head(model, std=0.05)
    assert blockwise_decode(model, src, Exact(), MAX_LEN).sequences() == hf_greedy(base, src)
