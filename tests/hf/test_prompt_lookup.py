"""Prompt lookup on Hugging Face bases (issue 52): every row = the checkpoint's own greedy ``generate``, on ragged
batches padded on either side, causal (Llama, GPT-2) and seq2seq (Marian, T5); at batch 1 the same tokens as
transformers' own prompt lookup (``generate(prompt_lookup_num_tokens=...)``)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, decode
from lightning_bpd.decoding.proposers import PromptLookup
from lightning_bpd.hf import HFSeq2SeqBlockwise
from lightning_bpd.hf.causal import HFCausalBlockwise
from tests.hf import test_base as seq2seq
from tests.hf import test_causal as causal

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_causal_prompt_lookup_equals_generate_on_a_ragged_batch(family, side):
    base, src, max_len = causal.tiny_lm(family), causal.prompts(8, side=side), 20
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    assert {len(r) for r in want} != {max_len} and max_len in {len(r) for r in want}  # EOS and the cap both
    got = decode(model, src, Exact(), PromptLookup(max_ngram=3, num_tokens=6), max_len=max_len)
    assert got.sequences() == want
    assert max(max(sizes) for sizes in got.block_sizes) > 1, "random LMs repeat themselves: copies get accepted"


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_batch_one_equals_transformers_prompt_lookup(family):
    base, src, max_len = causal.tiny_lm(family), causal.prompts(4), 16
    model = HFCausalBlockwise(base, k=1)
    for row in range(src.shape[0]):
        one = src[row : row + 1, : int((src[row] != causal.PAD).sum())]
        theirs = base.generate(input_ids=one, attention_mask=torch.ones_like(one), do_sample=False, num_beams=1,
                               max_new_tokens=max_len, pad_token_id=causal.PAD, prompt_lookup_num_tokens=5,
                               max_matching_ngram_size=3)[0, one.shape[1]:].tolist()
        ours = decode(model, one, Exact(), PromptLookup(max_ngram=3, num_tokens=5, match="first"), max_len=max_len)
        eos = base.generation_config.eos_token_id
        end = theirs.index(eos) + 1 if eos in theirs else len(theirs)
        assert ours.sequences() == [theirs[:end]]


@pytest.mark.parametrize("family", ["marian", "t5"])
def test_seq2seq_prompt_lookup_equals_generate(family):
    base, src, max_len = seq2seq.tiny_base(family), seq2seq.sources(6), 16
    seq2seq.pick_eos(base, src, max_len)
    model = HFSeq2SeqBlockwise(base, k=1)
    want = seq2seq.generated(base, src, max_len)
    got = decode(model, src, Exact(), PromptLookup(max_ngram=2, num_tokens=4), max_len=max_len)
    assert got.sequences() == want
