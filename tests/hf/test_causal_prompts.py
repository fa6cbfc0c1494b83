"""Text in and out of a causal LM (issue 46's contract): ``detokenize(blockwise_decode(model,
encode_prompts(texts)).sequences())`` is ``batch_decode(generate(...)[:, P:], skip_special_tokens=True)``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.hf.prompts import CausalLM
from tests.hf.test_causal import hf_greedy, pick_eos, scramble_head, tiny_lm
from tests.hf.tiny_checkpoint import EN

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat", "a big red dog sees the small bird there", "tree", "the house likes a green car"]


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level, pad 0, a BOS (1) that the tokenizer puts before every prompt, EOS 2."""
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.train_from_iterator([" ".join(EN)], trainers.WordLevelTrainer(
        special_tokens=["<pad>", "<s>", "</s>", "<unk>"], min_frequency=1))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_continuations_equal_generate(tmp_path, family):
    tok = word_tokenizer()
    base = tiny_lm(family, vocab_size=len(tok))
    folder = tmp_path / family
    base.save_pretrained(folder)
    tok.save_pretrained(folder)
    lm = CausalLM.from_pretrained(folder, k=3, head_type="chained")
    src = lm.encode_prompts(TEXTS)
    assert src[:, -1].ne(0).all() and (src == 1).sum() == len(TEXTS)  # left-padded, the tokenizer's own BOS
    pick_eos(lm.model.base, src, 8)
    scramble_head(lm.model, std=0.05)
    out = blockwise_decode(lm.model, src, Exact(), max_len=8)
    want = lm.model.base.generate(input_ids=src, attention_mask=(src != 0).long(), do_sample=False, num_beams=1,
                                  max_new_tokens=8, pad_token_id=0)
    assert out.sequences() == hf_greedy(lm.model.base, src, 8)
    texts = lm.detokenize(out.sequences())
    assert texts == tok.batch_decode(want[:, src.shape[1]:], skip_special_tokens=True)
    assert any(texts)


def test_bad_input_is_one_line(tmp_path):
    tok = word_tokenizer()
    base = tiny_lm("llama", vocab_size=len(tok))
    base.save_pretrained(tmp_path / "no_tokenizer")
    with pytest.raises(ValueError, match="no tokenizer beside the checkpoint") as err:
        CausalLM.from_pretrained(tmp_path / "no_tokenizer")
    assert "\n" not in str(err.value)
    small = tiny_lm("llama", vocab_size=len(tok) - 2)
    with pytest.raises(ValueError, match="more than the model's vocabulary"):
        CausalLM(HFCausalBlockwise(small), tok)
    lm = CausalLM(HFCausalBlockwise(base), tok)
    for bad, match in (([], "non-empty list"), ("the cat", "non-empty list"), (["the", "<pad> cat"], "prompt 1 holds")):
        with pytest.raises(ValueError, match=match):
            lm.encode_prompts(bad)
    with pytest.raises(ValueError, match="longer than the model's context"):
        blockwise_decode(lm.model, lm.encode_prompts([" ".join(["the"] * 80)]), Exact(), max_len=4)
    assert torch.equal(lm.encode_prompts(["cat"]), torch.tensor([[1, tok.convert_tokens_to_ids("cat")]]))
