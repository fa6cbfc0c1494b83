"""A runtime's arithmetic does not depend on torch's grad mode: decoding under ``torch.enable_grad()`` gives the
bits it gives under ``torch.no_grad()``, for every product kind (float32, packed float32, int8, float64-accumulated
invariant), on our model and on a Hugging Face base."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.kernels import int8
from tests.models import float32_model, random_sources

pytestmark = pytest.mark.usefixtures("one_thread")

MAX_LEN = 10
KINDS = ["float32", "float32-packed", "int8", "float32-invariant"]


def outputs(runtime, src: torch.Tensor) -> tuple[list[torch.Tensor], list]:
    """One step's hidden states, p_1 and the heads' logits, and greedy and exact decoding's tokens."""
    context = runtime.encode(src)
    cache = runtime.new_cache(src.shape[0], MAX_LEN + runtime.k + 1)
    h = runtime.decode_step(torch.full((src.shape[0], 2), runtime.bos_id), context, cache)
    tensors = [h, runtime.logits_first(h)] + ([] if runtime.chained_heads else [runtime.logits_heads(h[:, -1])])
    tokens = [greedy_decode(runtime, src, MAX_LEN).sequences(),
              blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences()]
    return tensors, tokens


def assert_same_bits_with_gradients_on(runtime, src: torch.Tensor) -> None:
    with torch.no_grad():
        want, want_tokens = outputs(runtime, src)
    with torch.enable_grad():
        got, got_tokens = outputs(runtime, src)
    assert got_tokens == want_tokens
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert not any(t.requires_grad for t in got)


def skip_without(kind: str) -> None:
    if kind == "int8" and not int8.available():
        pytest.skip("needs torch's fbgemm/x86 quantized engine")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_our_model_decodes_the_same_bits_under_enable_grad(kind, head_type):
    skip_without(kind)
    runtime = build_runtime(float32_model(seed=3, head_type=head_type), InferenceOptions(precision=kind))
    assert_same_bits_with_gradients_on(runtime, random_sources(5, vocab=40, seed=2))


@pytest.mark.parametrize("kind", KINDS)
def test_a_hugging_face_base_decodes_the_same_bits_under_enable_grad(kind, tmp_path):
    pytest.importorskip("transformers")
    skip_without(kind)
    from lightning_bpd.hf import load_base
    from tests.hf.tiny_checkpoint import PAD, write_checkpoint

    model = load_base(write_checkpoint(tmp_path / "marian"), k=3)
    src = torch.randint(3, model.vocab_size, (4, 7), generator=torch.Generator().manual_seed(1))
    src[2:, 5:] = PAD
    assert_same_bits_with_gradients_on(build_runtime(model, InferenceOptions(precision=kind)), src)
