"""The lean Llama-family step (``hf/lean_causal.py``) against the HF layers it replaces: bitwise the same hidden states
in float32 and float64 (one-token steps, several-token steps with per-row crops, tree passes), installed by a runtime
on the Llama family only, and exact against ``generate``."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, Tree, blockwise_decode, greedy_decode
from lightning_bpd.hf.causal import HFCausalBlockwise
from lightning_bpd.inference import InferenceOptions, build_runtime
from tests.hf.test_causal import MAX_LEN, VOCAB, hf_greedy, pick_eos, prompts, scramble_head, tiny_lm

pytestmark = pytest.mark.usefixtures("one_thread")

LEAN = ("llama", "qwen2", "qwen3", "mistral")
WINDOWED = {"mistral": {"sliding_window": 4},
            "qwen2": {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}}  # a mask per type


def lean_and_reference(base, k: int = 3):
    """Two runtimes of one model: lean steps on, and off (the HF modules, the reference)."""
    model = HFCausalBlockwise(base, k=k)
    return build_runtime(model, InferenceOptions()), build_runtime(model, InferenceOptions(lean_steps=False))


def steps(runtime, src: torch.Tensor, tgt: torch.Tensor, widths: list[int]) -> list[torch.Tensor]:
    """The first step, then steps of the given widths, each row keeping a different number of each step's tokens."""
    b = src.shape[0]
    context = runtime.encode(src)
    cache = runtime.new_cache(b, 1 + tgt.shape[1] + max(widths))
    out = [runtime.decode_step(tgt[:, :1], context, cache)]
    keep = torch.arange(b) % 3
    for width in widths:
        at = cache.lengths.clone()
        block = torch.stack([tgt[r, at[r] : at[r] + width] for r in range(b)])
        out.append(runtime.decode_step(block, context, cache))
        cache.crop(cache.lengths - width + torch.minimum(keep + 1, torch.tensor(width)))
        keep = keep.roll(1)
    return out


@pytest.mark.parametrize("family", LEAN)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("windowed", [False, True])
def test_lean_steps_are_bitwise_the_modules(family, dtype, attention, windowed):
    if windowed and family not in WINDOWED:
        pytest.skip("no sliding window in this family's config")
    base = tiny_lm(family, dtype=dtype, attention=attention, **(WINDOWED[family] if windowed else {}))
    lean, reference = lean_and_reference(base)
    assert lean.model.lean and not reference.model.lean
    src = prompts(side="left" if windowed else "right")
    g = torch.Generator().manual_seed(5)
    tgt = torch.cat([torch.full((src.shape[0], 1), lean.bos_id), torch.randint(3, VOCAB, (src.shape[0], 12),
                                                                               generator=g)], dim=1)
    widths = [1, 4, 1, 3, 1]  # one query (grouped-query heads packed) and several (keys repeated)
    for got, want in zip(steps(lean, src, tgt, widths), steps(reference, src, tgt, widths), strict=True):
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_lean_tree_passes_are_bitwise_the_modules(family):
    base = tiny_lm(family, dtype=torch.float32)
    lean, reference = lean_and_reference(base)
    src = prompts()
    tree = Tree.from_paths([(0,), (0, 0), (0, 1), (1,)])
    depths, ancestors = tree.table("depths"), tree.ancestors()
    out = []
    for runtime in (lean, reference):
        context = runtime.encode(src)
        cache = runtime.new_cache(src.shape[0], 8, extra_slots=len(depths))
        runtime.decode_step(torch.full((src.shape[0], 2), 5), context, cache)
        nodes = torch.randint(3, VOCAB, (src.shape[0], len(depths)), generator=torch.Generator().manual_seed(2))
        out.append(runtime.decode_tree(nodes, depths, ancestors, context, cache))
    assert torch.equal(out[0], out[1])


def test_the_runtime_installs_the_lean_step_on_the_llama_family_only():
    for family in (*LEAN, "gpt2"):
        model = HFCausalBlockwise(tiny_lm(family), k=2)
        assert build_runtime(model, InferenceOptions()).model.lean == (family != "gpt2")
        assert not model.lean  # the model itself keeps its modules
    runtime = build_runtime(HFCausalBlockwise(tiny_lm("llama"), k=2), InferenceOptions())
    with torch.enable_grad():  # the runtime's calls run without gradients: still lean
        runtime.decode_step(torch.full((1, 1), 3), runtime.encode(torch.tensor([[5, 6, 7]])), runtime.new_cache(1, 4))


@pytest.mark.parametrize("family", LEAN)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_lean_runtime_decodes_like_generate(family, dtype):
    base, src = tiny_lm(family, dtype=dtype), prompts()
    pick_eos(base, src)
    model = HFCausalBlockwise(base, k=4, head_type="chained")
    scramble_head(model, std=0.05)
    runtime = build_runtime(model, InferenceOptions())
    assert runtime.model.lean
    want = hf_greedy(base, src)
    assert greedy_decode(runtime, src, MAX_LEN).sequences() == want
    assert blockwise_decode(runtime, src, Exact(), MAX_LEN).sequences() == want
    for row in range(2):  # batch 1
        assert blockwise_decode(runtime, src[row : row + 1], Exact(), MAX_LEN).sequences() == want[row : row + 1]


@pytest.mark.parametrize("precision", ["float32-packed", "int8", "float32-invariant", "bfloat16"])
def test_lean_steps_are_bitwise_the_modules_in_every_precision(precision, monkeypatch):
    """The lean step multiplies through the runtime's products as the modules' ProductLinear layers do (its
    attention taken as the modules take it: not widened, as it is for these products, where the modules cannot)."""
    from lightning_bpd.kernels import int8, onednn

    if (precision == "int8" and not int8.available()) or (precision == "float32-packed" and not onednn.available()):
        pytest.skip("kernel not available")
    model = HFCausalBlockwise(tiny_lm("qwen2", dtype=torch.float32), k=3)
    lean, reference = (build_runtime(model, InferenceOptions(precision=precision, lean_steps=on)) for on in (True, False))
    monkeypatch.setattr(lean.model.products, "widens_attention", lambda x: False)
    assert lean.model.lean and not reference.model.lean
    src = prompts()
    tgt = torch.randint(3, VOCAB, (src.shape[0], 13), generator=torch.Generator().manual_seed(5))
    for got, want in zip(steps(lean, src, tgt, [1, 4, 1]), steps(reference, src, tgt, [1, 4, 1]), strict=True):
        assert torch.equal(got, want)


def test_a_runtime_of_a_runtime_lists_its_own_weights():
    """A runtime built from another runtime's snapshot in another precision reads its own (cast) weights."""
    model = HFCausalBlockwise(tiny_lm("llama", dtype=torch.float32), k=2)
    first = build_runtime(model, InferenceOptions())
    src = prompts()
    first.decode_step(torch.full((src.shape[0], 1), 3), first.encode(src), first.new_cache(src.shape[0], 3))
    second = build_runtime(first, InferenceOptions(precision="float64"))
    context = second.encode(src)
    h = second.decode_step(torch.full((src.shape[0], 1), 3), context, second.new_cache(src.shape[0], 3))
    assert h.dtype == torch.float64
    assert second.model.lean_trunk().layers[0].q[0] is second.model.trunk.layers[0].self_attn.q_proj.weight


@pytest.mark.parametrize("family", LEAN)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("precision", ["int8", "float32-packed"])
def test_layers_fused_in_torchscript_are_bitwise_the_separate_products(family, attention, precision):
    """int8 and float32-packed runtimes run the layers through ``fused_layers`` (q/k/v and gate/up as one product
    each): the hidden states, the features of chosen layers and the tree passes are bitwise the lean Python layers'
    (attention in float64 in both), and with attention not widened, the modules'."""
    from lightning_bpd.kernels import int8, onednn

    if not (int8.available() and onednn.available()):
        pytest.skip("kernel not available")
    model = HFCausalBlockwise(tiny_lm(family, dtype=torch.float32, attention=attention,
                                      **WINDOWED.get(family, {})), k=3)
    runtimes = [build_runtime(model, InferenceOptions(precision=precision, lean_steps=on)) for on in (True, True, False)]
    runtimes[1].model.lean_trunk().scripted = False  # the lean layers in Python, one product each
    src = prompts(side="left")
    tgt = torch.randint(3, VOCAB, (src.shape[0], 13), generator=torch.Generator().manual_seed(5))
    tree = Tree.from_paths([(0,), (0, 0), (0, 1), (1,)])
    depths, ancestors = tree.table("depths"), tree.ancestors()
    out = []
    for runtime in runtimes:
        got = steps(runtime, src, tgt, [1, 4, 1, 3])
        with torch.no_grad():
            context = runtime.encode(src)
            cache = runtime.new_cache(src.shape[0], 8, extra_slots=len(depths))
            got += runtime.model.decode_step_features(tgt[:, :2], context, cache, [0, 1])
            got += runtime.model.decode_step_features(tgt[:, 2:4], context, cache, [1, 0])
            got.append(runtime.decode_tree(tgt[:, 4 : 4 + len(depths)], depths, ancestors, context, cache))
        out.append(got)
    assert runtimes[0].model.products.fused and not runtimes[1].model.products.fused  # the fused path ran
    for fused, python in zip(out[0], out[1], strict=True):
        assert torch.equal(fused, python)
    narrow = build_runtime(model, InferenceOptions(precision=precision))  # attention as the modules take it
    narrow.model.products.widens_attention = lambda x: False
    assert all(torch.equal(a, b) for a, b in zip(steps(narrow, src, tgt, [1, 4, 1, 3]), out[2], strict=False))


@pytest.mark.parametrize("precision", ["int8", "float32-packed", "float32-invariant"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_a_query_comes_out_of_a_pass_as_out_of_a_step(precision, attention):
    """Products that widen attention (int8, float32-packed, the invariant kinds) take the lean step's attention in
    float64: the first input of a T-input pass comes out bitwise as the same input alone (whatever masked keys and
    other queries come with it), so exact decoding reproduces this precision's own greedy."""
    from lightning_bpd.kernels import int8, onednn

    if (precision == "int8" and not int8.available()) or (precision == "float32-packed" and not onednn.available()):
        pytest.skip("kernel not available")
    base = tiny_lm("llama", dtype=torch.float32, attention=attention, max_position_embeddings=256)
    runtime = build_runtime(HFCausalBlockwise(base, k=3), InferenceOptions(precision=precision))
    assert runtime.model.lean
    src = torch.randint(3, VOCAB, (2, 150), generator=torch.Generator().manual_seed(3))
    tokens = torch.randint(3, VOCAB, (2, 17), generator=torch.Generator().manual_seed(4))
    context = runtime.encode(src)
    cache = runtime.new_cache(2, 40)
    runtime.decode_step(tokens[:, :1], context, cache)
    keep = cache.lengths.clone()
    first = []
    for width in (1, 2, 9, 16):
        first.append(runtime.decode_step(tokens[:, 1 : 1 + width], context, cache)[:, 0])
        cache.crop(keep.clone())
    assert all(torch.equal(first[0], other) for other in first[1:])


def test_the_fused_layers_compile():
    """``fused_layers`` is TorchScript where the int8 kernel is (``script`` falls back to Python silently)."""
    from lightning_bpd.hf.lean_causal_fused import fused_layers
    from lightning_bpd.kernels import int8

    if not int8.available():
        pytest.skip("kernel not available")
    assert isinstance(fused_layers, torch.jit.ScriptFunction)
