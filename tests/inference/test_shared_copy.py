"""A runtime decodes with its own modules on the model's own weights (issue 45 item 6): no copy of a weight in the
model's dtype, copies only for another dtype and for the products, and the model left as it was."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.memory import measured_build, products_bytes
from lightning_bpd.inference.shared_copy import own_bytes, shared_copy, tensor_bytes
from lightning_bpd.nn.products import FLOAT
from tests.models import float32_model, random_sources


def test_a_float32_runtime_shares_every_weight_and_leaves_the_models_modules_alone():
    model = float32_model(seed=1, head_type="chained").train()
    runtime = build_runtime(model, InferenceOptions())
    mine = dict(runtime.model.named_parameters())
    assert all(p is mine[name] for name, p in model.named_parameters())  # the same tensors
    assert own_bytes(runtime.model, model) == 0
    assert model.training and not runtime.model.training  # eval mode is the runtime's own
    assert all(m is not r for m, r in zip(model.modules(), runtime.model.modules()))


def test_other_precisions_copy_only_what_they_replace_and_the_model_keeps_its_bits():
    model = float32_model(seed=2).double()
    before = {name: p.clone() for name, p in model.named_parameters()}
    runtime = build_runtime(model, InferenceOptions(precision="float32-packed"))
    assert all(torch.equal(p, before[name]) and p.dtype == torch.float64 for name, p in model.named_parameters())
    assert own_bytes(runtime.model, model) == tensor_bytes(model) // 2  # every float64 weight as float32, once
    assert products_bytes(runtime.products) > 0  # the packed copies of the linear weights
    assert all(getattr(m, "products", FLOAT) is FLOAT for m in model.modules())  # the products are the runtime's
    assert len(list(runtime.model.parameters())) == len(list(model.parameters()))  # tied weights stay tied


def test_a_runtime_reads_the_live_weights_and_a_draft_vocabulary_stays_its_own():
    model = float32_model(seed=3)
    src = random_sources(3, vocab=40)
    runtime = build_runtime(model, InferenceOptions(draft_vocab=list(range(20))))
    assert model.draft_vocab is None and model.config.draft_vocab in (None, 0)  # the trained model is unchanged
    plain = build_runtime(model, InferenceOptions())
    with torch.no_grad():
        model.tgt_embed.weight.mul_(3.0)  # a training step, in place
    assert torch.equal(blockwise_decode(plain, src, Exact(), 12).tokens, blockwise_decode(model, src, Exact(), 12).tokens)
    assert runtime.draft_vocab is not None and runtime.model.draft_vocab is None  # the runtime's own


@pytest.mark.parametrize("precision", [None, "float32-packed"])
def test_bench_memory_record(precision):
    model = float32_model(seed=4)
    _runtime, memory = measured_build(lambda: build_runtime(model, InferenceOptions(precision=precision)), model)
    assert memory["model_mb"] == pytest.approx(tensor_bytes(model) / 2**20, abs=0.01)
    assert memory["runtime_cast_mb"] == 0
    assert (memory["runtime_products_mb"] > 0) == (precision is not None)


def test_shared_copy_keeps_ties_and_copies_the_config():
    model = float32_model(seed=5)
    made = shared_copy(model)
    assert made.src_embed is made.tgt_embed if model.src_embed is model.tgt_embed else True
    assert made.config is not model.config and made.config == model.config


def test_a_model_without_runtime_parts_decodes_through_the_protocol_alone():
    """The runtime asks ``isinstance(model, RuntimeParts)`` (declared), not for single members: a stub gets no
    proposer, decodes as itself, and a draft vocabulary is refused in one line."""
    from lightning_bpd.nn.runtime_parts import RuntimeParts
    from tests.models import StubModel, stub_sources

    class ModuleStub(StubModel, torch.nn.Module):  # hand-written logits, as a torch module
        def __init__(self, *args, **kwargs) -> None:
            torch.nn.Module.__init__(self)
            StubModel.__init__(self, *args, **kwargs)
            self.unused = torch.nn.Parameter(torch.zeros(1))  # a dtype to decode in

    targets = [[5, 6, 7, 8, 2], [9, 10, 2]]
    stub = ModuleStub(targets, k=3)
    runtime = build_runtime(stub, InferenceOptions())
    assert not isinstance(stub, RuntimeParts) and runtime.proposer is None
    src = stub_sources(2)
    assert blockwise_decode(runtime, src, Exact(), 8).sequences() == blockwise_decode(stub, src, Exact(), 8).sequences()
    with pytest.raises(ValueError, match="cannot take a draft vocabulary"):
        build_runtime(stub, InferenceOptions(draft_vocab=[2, 5, 6]))
    assert isinstance(float32_model(seed=6), RuntimeParts) and build_runtime(float32_model(seed=6)).proposer is not None


def test_plain_objects_that_point_into_the_model_point_into_the_copy():
    """An image model's read-out (a plain object holding its model) reads the runtime's modules, with their
    products, not the trained model's (a float32-invariant runtime's greedy and exact agree only so)."""
    from tests.kernels.test_invariant import image_model

    model = image_model()
    runtime = build_runtime(model, InferenceOptions(precision="float32-invariant"))
    assert runtime.model.image is not model.image and runtime.model.image.model is runtime.model
    assert model.image.model is model
