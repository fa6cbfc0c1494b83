"""A runtime's draft vocabulary (:mod:`lightning_bpd.inference.draft_vocab`): built by the runtime from its options'
token list or else from the ids the trained model stores, in the runtime's products; the proposer proposes through
it, the runtime's ``restrict_draft`` masks with it, and the trained model (and its snapshot) keep their ids."""

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, blockwise_decode_reference, greedy_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.draft_vocab import DraftVocabulary
from lightning_bpd.kernels import int8
from lightning_bpd.nn.draft_ids import checked_ids, restrict
from tests.models import float32_model, random_model, random_sources


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


def test_argmax_over_the_list_equals_the_masked_full_argmax_and_follows_weight_updates():
    g = torch.Generator().manual_seed(0)
    weight, h = torch.randn(50, 8, generator=g), torch.randn(20, 8, generator=g)
    vocab = DraftVocabulary(checked_ids(torch.randperm(50, generator=g)[:10], 50))
    assert torch.equal(vocab.ids, vocab.ids.sort().values)
    full = h @ weight.t()
    assert torch.equal(vocab.argmax(h, weight), vocab.restrict(full).argmax(-1))
    assert torch.equal(vocab.restrict(full), restrict(full, vocab.ids))
    assert set(vocab.argmax(h, weight).tolist()) <= set(vocab.ids.tolist())
    with torch.no_grad():
        weight.mul_(-1)  # an in-place update (an optimizer step): the cached rows must follow
    assert torch.equal(vocab.argmax(h, weight), vocab.restrict(h @ weight.t()).argmax(-1))
    bias = torch.randn(50, generator=g)
    assert torch.equal(vocab.argmax(h, weight, bias), vocab.restrict(h @ weight.t() + bias).argmax(-1))


def test_model_proposals_use_the_stored_list():
    model = random_model(k=4, seed=1)
    h = torch.randn(6, 32, dtype=torch.float64)
    model.set_draft_ids(torch.tensor([2, 5, 7, 11]))
    runtime = build_runtime(model)
    tokens = runtime.draft_tokens(h, range(1, 4))  # (6, 3)
    assert set(tokens.flatten().tolist()) <= {2, 5, 7, 11}
    assert torch.equal(tokens, model.restrict_draft(model.logits_heads(h, range(1, 4))).argmax(-1))
    assert runtime.draft_vocab.ids is model.draft_vocab.ids  # the stored ids, read as they are


def test_the_options_list_replaces_the_stored_one_in_the_runtime_only():
    model = random_model(k=4, seed=2)
    model.set_draft_ids(torch.tensor([2, 5, 7, 11]))
    runtime = build_runtime(model, InferenceOptions(draft_vocab=(13, 3, 9)))
    assert runtime.draft_vocab.ids.tolist() == [3, 9, 13]
    assert model.draft_vocab.ids.tolist() == [2, 5, 7, 11] and model.config.draft_vocab == 4  # the trained model
    assert runtime.model.draft_vocab.ids.tolist() == [2, 5, 7, 11]  # and its snapshot keep theirs
    h = torch.randn(6, 32, dtype=torch.float64)
    logits = runtime.logits_heads(h, range(1, 4))
    assert torch.equal(runtime.restrict_draft(logits), restrict(logits, torch.tensor([3, 9, 13])))
    assert set(runtime.draft_tokens(h, range(1, 4)).flatten().tolist()) <= {3, 9, 13}
    assert build_runtime(random_model(k=4, seed=2)).draft_vocab is None  # neither: every token
    with pytest.raises(ValueError, match=r"need 3 distinct token ids in \[0, 15\]"):
        build_runtime(model, InferenceOptions(draft_vocab=(3, 3, 9)))
    with pytest.raises(ValueError, match=r"need 2 distinct token ids in \[0, 15\]"):
        build_runtime(model, InferenceOptions(draft_vocab=(3, 16)))


@pytest.mark.parametrize("stored", [False, True], ids=["options", "stored"])
@pytest.mark.parametrize("precision", ["float32-invariant", "int8"])
@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
def test_the_draft_vocabulary_multiplies_in_the_runtimes_products_and_the_fast_path_equals_the_reference(
        head_type, precision, stored):
    """Whether the ids come from the options or from the model, the draft rows multiply in the runtime's products,
    so the paper heads' fast proposals are the reference view's (the full projection, masked), and exact decoding
    stays greedy (the fused chain links project in their own TorchScript, not through the products)."""
    if precision == "int8" and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    model = float32_model(seed=5, head_type=head_type)
    ids = tuple(range(3, 40, 2)) + (model.eos_id,)
    if stored:
        model.set_draft_ids(torch.tensor(ids))
    runtime = build_runtime(model, InferenceOptions(precision=precision, draft_vocab=None if stored else ids))
    assert runtime.draft_vocab.products is runtime.products
    src = random_sources(5, vocab=40, seed=5)
    fast = blockwise_decode(runtime, src, Exact(), 20)
    assert fast.sequences() == greedy_decode(runtime, src, 20).sequences()
    if head_type == "paper":
        slow = blockwise_decode_reference(runtime, src, Exact(), 20)
        assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes
