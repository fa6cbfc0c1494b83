"""A tiny Llama written as a float32 GGUF (``lightning_bpd.hf.gguf_llama``): the rotary interleave, the file
read back, and, where llama-cpp-python is installed, llama.cpp's tokens and greedy decoding equal to Hugging Face's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from lightning_bpd.benchmarks.ctranslate2_hf import cut
from lightning_bpd.hf.gguf_llama import check_llama, gguf_vocabulary, interleave_rotary, write_llama_gguf
from tests.tasks.lm.tiny_lm import EOS, PAD, scrambled, source_file, tiny_llama, tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = ["def f_1(x, y):\n", "    return", "for items in range(3):\n        total = total * items\n",
           "x = {'a': 1}  # ünïcode, tabs\t and  spaces\n\n", "def f_2(key, value):\n    key = key + 4\n"]


def rotate_halves(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """transformers' rotary map of (d,) ``x``: dimension j turns with j + d/2 by ``angles[j]`` (d/2,)."""
    a, b = x.chunk(2)
    return torch.cat([a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()])


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """llama.cpp's Llama rotary map: dimension 2j turns with 2j + 1 by ``angles[j]``."""
    a, b = x[0::2], x[1::2]
    return torch.stack([a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()], dim=1).flatten()


def test_interleaved_rows_make_llama_cpp_rotary_the_same_map():
    heads, d, width = 3, 8, 5
    g = torch.Generator().manual_seed(0)
    weight, x = torch.randn(heads * d, width, generator=g, dtype=torch.float64), torch.randn(width, generator=g,
                                                                                               dtype=torch.float64)
    angles = 7 * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # position 7
    theirs = torch.cat([rotate_halves(q, angles) for q in (weight @ x).split(d)])
    ours = torch.cat([rotate_pairs(q, angles) for q in (interleave_rotary(weight, heads) @ x).split(d)])
    assert torch.allclose(ours, interleave_rotary(theirs[:, None], heads)[:, 0], atol=1e-12, rtol=0)
    assert not torch.allclose(ours, theirs)  # the interleave is not the identity


def test_the_file_reads_back(tmp_path):
    tok = tokenizer()
    model = tiny_llama(len(tok) + 5)  # the model's vocabulary padded past the tokenizer's
    path = write_llama_gguf(model, tok, tmp_path / "tiny.gguf")
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    assert len(tensors) == 3 + 9 * 2 and all(t.tensor_type == gguf.GGMLQuantizationType.F32 for t in tensors.values())
    q = torch.from_numpy(tensors["blk.0.attn_q.weight"].data.copy()).reshape(32, 32)
    assert torch.equal(q, interleave_rotary(model.model.layers[0].self_attn.q_proj.weight.detach(), 4))
    k = torch.from_numpy(tensors["blk.1.attn_k.weight"].data.copy()).reshape(16, 32)
    assert torch.equal(k, interleave_rotary(model.model.layers[1].self_attn.k_proj.weight.detach(), 2))
    field = reader.fields["tokenizer.ggml.pre"]
    assert bytes(field.parts[field.data[0]]).decode() == "gpt-2"
    vocab = gguf_vocabulary(tok, len(tok) + 5)
    assert vocab["tokens"][-1] == f"[PAD{len(tok) + 4}]" and vocab["add_bos"] and not vocab["add_eos"]
    assert vocab["types"][:3] == [gguf.TokenType.CONTROL] * 3 and vocab["tokens"][:3] == ["<pad>", "<s>", "</s>"]


def test_a_tokenizer_llama_cpp_would_split_otherwise_is_refused():
    from tokenizers import pre_tokenizers

    tok = tokenizer()
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    with pytest.raises(ValueError, match="gpt-2 pre-tokenizer would split text differently") as err:
        gguf_vocabulary(tok, len(tok))
    assert "\n" not in str(err.value)
    from transformers import GPT2Config, LlamaConfig

    with pytest.raises(ValueError, match="Llama checkpoints only, not 'gpt2'"):
        check_llama(GPT2Config())
    with pytest.raises(ValueError, match="with rope scaling, attention biases"):
        check_llama(LlamaConfig(attention_bias=True, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                      "rope_theta": 10000.0}))


@pytest.fixture(scope="module", params=["tests", "recipe"])
def llama_cpp_peer(request, tmp_path_factory):
    """The tests' tiny Llama and tokenizer, or the code LM recipe's (make-base's config at the tiny shape: tied
    embeddings; its tokenizer builder), in llama.cpp."""
    pytest.importorskip("llama_cpp")
    import random

    from transformers import LlamaForCausalLM

    from lightning_bpd.benchmarks.llamacpp_peer import LlamaCppGreedy
    from lightning_bpd.hf.causal_base import CAUSAL_SHAPES, byte_bpe_tokenizer, llama_config

    if request.param == "tests":
        tok = tokenizer()
        model = tiny_llama(len(tok), positions=256)
    else:
        tok = byte_bpe_tokenizer([source_file(random.Random(i)) for i in range(20)], 400, 256)
        torch.manual_seed(0)
        model = scrambled(LlamaForCausalLM(llama_config(len(tok), CAUSAL_SHAPES["tiny"])).eval(), 0)
        assert model.config.tie_word_embeddings
    path = write_llama_gguf(model, tok, tmp_path_factory.mktemp("gguf") / "tiny.gguf")
    return model, tok, LlamaCppGreedy(path, n_ctx=256, threads=1, pad_id=PAD, eos_ids=[EOS])


def test_llama_cpp_tokenizes_as_the_hf_tokenizer(llama_cpp_peer):
    import random

    _, tok, peer = llama_cpp_peer
    texts = PROMPTS + [source_file(random.Random(seed), functions=2) for seed in range(4)]
    assert [peer.tokenize(t) for t in texts] == [tok(t)["input_ids"] for t in texts]


def test_llama_cpp_greedy_equals_generate_in_float32(llama_cpp_peer):
    model, tok, peer = llama_cpp_peer
    n = 24
    for prompt in PROMPTS:
        ids = torch.tensor([tok(prompt)["input_ids"]])
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=1,
                             max_new_tokens=n, pad_token_id=PAD)
        want = cut(out[:, ids.shape[1]:].tolist(), EOS)
        assert peer(ids, n) == want, prompt


def test_the_bench_runs_llama_cpp_on_the_same_prompts(tmp_path):
    pytest.importorskip("llama_cpp")
    from lightning_bpd.commands.bench import main as bench
    from lightning_bpd.tasks.lm import LMModule
    from lightning_bpd.tasks.translation.hf_module import save_heads
    from tests.tasks.lm.tiny_lm import write_checkpoint

    module = LMModule(str(write_checkpoint(tmp_path / "llama")), k=2, head_type="chained", max_new_tokens=6).eval()
    save_heads(module, tmp_path / "heads")
    (tmp_path / "p.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    result = bench(["--ckpt", str(tmp_path / "heads"), "--input", str(tmp_path / "p.jsonl"), "--batch-sizes", "1", "2",
                    "--warmup", "0", "--device", "cpu", "--peers", "generate,llamacpp", "--gguf", str(tmp_path / "m.gguf")])
    one, two = result["batch_sizes"]["1"], result["batch_sizes"]["2"]
    assert one["llamacpp_f32"]["differs_from_hf_generate"] == 0 and one["llamacpp_f32"]["sentences"] == len(PROMPTS)
    assert "batch 1 only" in two["llamacpp_f32"]["skipped"] and "llamacpp_f32" in one["exact"]["speedup_over"]
    assert result["llamacpp"]["tokenization_differs"] == 0 and Path(result["llamacpp"]["gguf"]).is_file()
