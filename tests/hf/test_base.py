"""The Hugging Face adapter behind the decoding protocol: tiny random Marian / BART / mBART models built here."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers import (
    AutoModelForSeq2SeqLM,
    BartConfig,
    GPT2Config,
    GPT2LMHeadModel,
    MarianConfig,
    MBartConfig,
    T5Config,
)

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode, greedy_decode_reference
from lightning_bpd.hf import HFSeq2SeqBlockwise, load_base
from tests.models import assert_close_to_rounding

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB, PAD, EOS = 80, 1, 2
COMMON = {"vocab_size": VOCAB, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
          "decoder_attention_heads": 4, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64, "max_position_embeddings": 64,
          "dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0, "forced_eos_token_id": None,
          "pad_token_id": PAD, "eos_token_id": EOS, "tie_word_embeddings": False}
EMBED, WEIGHT, FFN = 1.0, 3.0, 0.3  # scrambled weights: std of the embeddings, the attention and the FFN
FAMILIES = ("marian", "bart", "mbart", "t5")


def tiny_base(family: str, seed: int = 0, dtype: torch.dtype = torch.float64, attention: str = "sdpa"):
    """A tiny random seq2seq model with scrambled weights (so its greedy output depends on the source and stops
    at EOS in some rows only). Marian starts the decoder with the pad id and bans it, as opus-mt does."""
    torch.manual_seed(seed)
    if family == "marian":
        config = MarianConfig(decoder_start_token_id=PAD, **COMMON)
    elif family == "t5":  # tied embeddings: the decoder output is scaled by d_model ** -0.5 before the LM head
        config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                          num_heads=4, relative_attention_num_buckets=8, relative_attention_max_distance=16,
                          dropout_rate=0.0, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD)
    elif family == "bart":
        config = BartConfig(decoder_start_token_id=EOS, bos_token_id=0, forced_bos_token_id=None, **COMMON)
    else:
        config = MBartConfig(decoder_start_token_id=EOS, bos_token_id=0, forced_bos_token_id=None, **COMMON)
    config._attn_implementation = attention
    base = AutoModelForSeq2SeqLM.from_config(config).to(dtype).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in base.named_parameters():
            if p.dim() == 2 and p.requires_grad:
                std = EMBED if "embed" in name or "shared" in name else (FFN if ".fc" in name or "DenseReluDense" in name else WEIGHT) / p.shape[1] ** 0.5
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)
        if hasattr(base, "final_logits_bias"):
            base.final_logits_bias.copy_(torch.randn(base.final_logits_bias.shape, generator=g, dtype=dtype) * 0.5)
    if family == "marian":
        base.generation_config.bad_words_ids = [[PAD]]
    base.generation_config.forced_eos_token_id = None
    return base


def sources(batch: int = 5, seed: int = 1, width: int = 9) -> torch.Tensor:
    """Sources of different lengths (>= 2) padded with PAD, no special ids inside."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, VOCAB, (batch, width), generator=g)
    lengths = torch.randint(2, width + 1, (batch,), generator=g)
    lengths[0] = width
    src[torch.arange(width)[None, :] >= lengths[:, None]] = PAD
    return src


def pick_eos(base, src: torch.Tensor, max_len: int) -> int:
    """Make EOS a token that greedy emits after the first step in some rows but not all (random models repeat
    themselves, so a fixed EOS would end every row or none): the rows then stop at different times."""
    model = HFSeq2SeqBlockwise(base, k=1)
    model.eos_id = None
    seqs = greedy_decode(model, src, max_len).sequences()
    best, best_score = EOS, -1
    for tok in range(3, VOCAB):
        ended = sum(1 for s in seqs if tok in s[1 : max_len - 1])
        score = ended if ended < len(seqs) else 0
        if score > best_score:
            best, best_score = tok, score
    base.config.eos_token_id = base.generation_config.eos_token_id = best
    return best


def generated(base, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """HF greedy ``generate``, each row without its decoder start token and cut after its first EOS."""
    out = base.generate(input_ids=src, attention_mask=(src != PAD).long(), num_beams=1, do_sample=False,
                        max_new_tokens=max_len, min_length=0)
    eos = base.generation_config.eos_token_id
    return [row[: row.index(eos) + 1] if eos in row else row for row in out[:, 1:].tolist()]


def scramble_head(model: HFSeq2SeqBlockwise, seed: int = 3, std: float = 0.3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * std)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_cached_steps_equal_the_full_pass(family, attention):
    """1-token and k-token steps, with per-row crops between them, give the HF decoder's own hidden states."""
    model = HFSeq2SeqBlockwise(tiny_base(family, attention=attention), k=3)
    src = sources()
    b = src.shape[0]
    context = model.encode(src)
    g = torch.Generator().manual_seed(7)
    tgt = torch.cat([torch.full((b, 1), model.bos_id), torch.randint(3, VOCAB, (b, 12), generator=g)], dim=1)
    full = model.decode_full(tgt, context)  # (B, 13, D)
    cache = model.new_cache(b, 1 + 12 + 3)
    h = model.decode_step(tgt[:, :1], context, cache)
    assert_close_to_rounding(h, full[:, :1])
    accepted = torch.tensor([1, 3, 2, 1, 3])  # rows keep different numbers of the 3 tokens of each call
    for _ in range(3):
        at = cache.lengths.clone()  # (B,) the next position of every row
        block = torch.stack([tgt[r, at[r] : at[r] + 3] for r in range(b)])  # the next 3 prefix tokens of each row
        h = model.decode_step(block, context, cache)  # (B, 3, D)
        want = torch.stack([full[r, at[r] : at[r] + 3] for r in range(b)])
        assert_close_to_rounding(h, want)
        cache.crop(cache.lengths - 3 + accepted)
        accepted = accepted.roll(1)


@pytest.mark.parametrize("family", FAMILIES)
def test_first_head_is_the_base(family):
    """p_1 is the base's own logits (LM head and final logits bias) from a full forward, bitwise."""
    base = tiny_base(family)
    base.generation_config.bad_words_ids = None
    model = HFSeq2SeqBlockwise(base, k=4)
    src = sources()
    tgt = torch.cat([torch.full((src.shape[0], 1), model.bos_id), src[:, :5].clamp(min=3)], dim=1)
    want = base(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt).logits
    got = model.logits_first(model.decode_full(tgt, model.encode(src)))
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert model.logits_heads(got.new_zeros(2, 32)).shape == (2, 4, VOCAB)


def test_banned_tokens_are_never_proposed():
    """Marian's single-token bad words (the pad id) are at -inf in every head's logits."""
    model = HFSeq2SeqBlockwise(tiny_base("marian"), k=2)
    logits = model.logits_heads(torch.randn(3, 32, dtype=torch.float64))
    assert bool((logits[..., PAD] == float("-inf")).all())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_greedy_equals_generate_on_a_ragged_batch(family, dtype):
    base = tiny_base(family, dtype=dtype)
    src, max_len = sources(6), 16
    pick_eos(base, src, max_len)
    model = HFSeq2SeqBlockwise(base, k=1)
    want = generated(base, src, max_len)
    assert {len(r) for r in want} != {max_len}, "some rows should stop at EOS"
    assert len({len(r) for r in want}) > 1, "rows should stop at different times"
    got = greedy_decode(model, src, max_len)
    assert got.sequences() == want
    assert greedy_decode_reference(model, src, max_len).sequences() == want


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
@pytest.mark.parametrize("scrambled", [False, True])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_exact_blockwise_equals_greedy(family, head_type, scrambled, dtype):
    """A zero-initialized head proposes p_1's token again (accepted on repeats), a scrambled one random tokens:
    either way exact acceptance gives greedy's (= generate's) tokens on a ragged batch."""
    base = tiny_base(family, dtype=dtype)
    src, max_len = sources(6), 16
    pick_eos(base, src, max_len)
    model = HFSeq2SeqBlockwise(base, k=4, head_type=head_type)
    if scrambled:
        scramble_head(model)
    want = generated(base, src, max_len)
    got = blockwise_decode(model, src, Exact(), max_len)
    assert got.sequences() == want
    assert got.sequences() == greedy_decode(model, src, max_len).sequences()


def test_blocks_longer_than_one_are_accepted():
    """The zero-initialized heads repeat p_1's token: accepted where greedy repeats a token."""
    base, src = tiny_base("marian"), sources(6)
    pick_eos(base, src, 16)
    model = HFSeq2SeqBlockwise(base, k=4)
    got = blockwise_decode(model, src, Exact(), 16)
    assert max(max(b) for b in got.block_sizes) > 1
    assert len({len(b) for b in got.block_sizes}) > 1


@pytest.mark.parametrize("frozen", [True, False])
def test_frozen_base(frozen):
    model = HFSeq2SeqBlockwise(tiny_base("bart"), k=3, frozen=frozen)
    assert all(p.requires_grad is not frozen for p in model.base.parameters())
    assert all(p.requires_grad for p in model.head.parameters())
    assert not any(name.startswith("decoder.") for name, _ in model.named_parameters())


def test_one_line_errors():
    base = tiny_base("bart")
    with pytest.raises(ValueError, match="k must be an integer >= 1"):
        HFSeq2SeqBlockwise(base, k=0)
    with pytest.raises(ValueError, match="head_type"):
        HFSeq2SeqBlockwise(base, k=2, head_type="medusa")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    with pytest.raises(ValueError, match="decoder-only checkpoint") as err:
        HFSeq2SeqBlockwise(gpt2, k=2)
    assert "\n" not in str(err.value)
    model = HFSeq2SeqBlockwise(base, k=2)
    with pytest.raises(ValueError, match="max_len too long"):
        model.new_cache(2, 100)


def test_load_base_from_a_directory(tmp_path):
    base, src = tiny_base("marian"), sources(4)
    pick_eos(base, src, 12)
    base.save_pretrained(tmp_path / "marian")
    model = load_base(tmp_path / "marian", k=3, head_type="chained")
    assert model.k == 3 and model.chained_heads and not any(p.requires_grad for p in model.base.parameters())
    assert model.eos_id == base.config.eos_token_id
    assert greedy_decode(model, src, 12).sequences() == generated(base, src, 12)
    assert load_base(base, k=2).base is base


def test_load_base_refuses_what_is_not_a_seq2seq_checkpoint(tmp_path):
    with pytest.raises(ValueError, match="not a directory"):
        load_base(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a Hugging Face checkpoint") as err:
        load_base(tmp_path / "empty")
    assert "\n" not in str(err.value)
    GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=16, n_layer=1, n_head=2, n_positions=32)).save_pretrained(
        tmp_path / "gpt2")
    with pytest.raises(ValueError, match="decoder-only"):
        load_base(tmp_path / "gpt2")
