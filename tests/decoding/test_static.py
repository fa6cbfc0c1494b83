"""Fixed-shape decoding (the CUDA-graph shape) against the eager decoders and the references."""

import pytest
import torch

from lightning_bpd.decoding import (
    Distance,
    Exact,
    MinBlock,
    TopK,
    blockwise_decode,
    blockwise_decode_reference,
    greedy_decode_reference,
    parse_criterion,
)
from lightning_bpd.decoding.static import StaticDecoder, static_decode
from tests.models import pick_eos, random_model, random_sources

MAX_LEN = 24


def same(a, b) -> None:
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.lengths, b.lengths)
    assert torch.equal(a.iterations, b.iterations)
    assert a.block_sizes == b.block_sizes


@pytest.mark.parametrize("criterion", [Exact(), TopK(2), Distance(2), MinBlock(2), MinBlock(2, TopK(2))],
                         ids=lambda c: c.name)
@pytest.mark.parametrize("k", [2, 4, 8])
def test_fixed_shapes_equal_the_reference_for_every_rule(criterion, k):
    """Rows end at EOS inside blocks and at max_len, at different iterations; finished rows ride along."""
    model = random_model(k=k, seed=k)
    src = random_sources(6, seed=k)
    pick_eos(model, src, MAX_LEN)
    out = static_decode(model, src, criterion, MAX_LEN)
    same(out, blockwise_decode_reference(model, src, criterion, MAX_LEN))
    assert (out.lengths == MAX_LEN).any() and (out.lengths < MAX_LEN).any()
    assert out.model_calls == 1 + int(out.iterations.max())  # one flag read per iteration: no wasted call


@pytest.mark.parametrize("seed", [0, 1])
def test_k_1_is_greedy(seed):
    model = random_model(k=4, seed=seed)
    src = random_sources(5, seed=seed)
    pick_eos(model, src, MAX_LEN)
    same(static_decode(model, src, Exact(), MAX_LEN, k=1), greedy_decode_reference(model, src, MAX_LEN))


@pytest.mark.parametrize("head_type", ["paper", "chained", "chained_attn"])
def test_local_windows_and_chained_heads(head_type):
    """A ring KV cache (window 3) and heads that see the previous proposal: same as the eager decoder."""
    model = random_model(k=4, seed=7, window=3, head_type=head_type)
    src = random_sources(6, seed=7)
    pick_eos(model, src, MAX_LEN)
    for criterion in (Exact(), TopK(2)):
        same(static_decode(model, src, criterion, MAX_LEN), blockwise_decode(model, src, criterion, MAX_LEN))


def test_reading_the_flag_less_often_wastes_calls_not_tokens():
    model = random_model(k=4, seed=3)
    src = random_sources(6, seed=3)
    pick_eos(model, src, MAX_LEN)
    every = static_decode(model, src, Exact(), MAX_LEN)
    sparse = static_decode(model, src, Exact(), MAX_LEN, sync_every=5)
    same(sparse, every)
    assert every.model_calls <= sparse.model_calls < every.model_calls + 5


@pytest.mark.parametrize("max_len", [7, 13, 20])
def test_rows_cut_at_max_len_while_others_go_on(max_len):
    """No EOS: every row ends at max_len, cutting its last block, at its own iteration; the rows that
    finished ride along for the others' iterations without growing their cache (full-length cache, no ring)."""
    model = random_model(k=8, seed=11)
    model.eos_id = None
    src = random_sources(6, seed=11)
    out = static_decode(model, src, TopK(3), max_len)
    same(out, blockwise_decode(model, src, TopK(3), max_len))
    assert len(set(out.iterations.tolist())) > 1


def test_images_without_eos():
    """A fixed-length image model (no EOS): every row stops at max_len exactly."""
    model = random_model(k=3, seed=4, vocab=20, eos_id=None, share_embeddings=True, src_image_shape=(2, 2, 3),
                         tgt_image_shape=(8, 8, 3), src_positions="grid", tgt_positions="grid", window=16)
    src = torch.randint(3, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    criterion = parse_criterion("eps2")
    out = static_decode(model, src, criterion, 192)
    same(out, blockwise_decode(model, src, criterion, 192))
    assert (out.lengths == 192).all()


def test_an_iteration_traces_as_one_graph_without_host_reads():
    """TorchDynamo traces one iteration as a single graph (``fullgraph=True`` fails on any host read,
    ``.item()``, ``bool(tensor)`` or data-dependent Python branch): the property CUDA graphs need.
    The traced iteration then decodes exactly as the eager one."""
    model = random_model(k=4, seed=2)
    src = random_sources(4, seed=2)
    pick_eos(model, src, MAX_LEN)
    decoder = StaticDecoder(model, src, Exact(), MAX_LEN)
    torch._dynamo.reset()
    traced = torch.compile(decoder.iterate, backend="eager", fullgraph=True)
    with torch.no_grad():
        while not bool(decoder.done.all()):
            traced()
            decoder.calls += 1
    same(decoder.result(), static_decode(model, src, Exact(), MAX_LEN))


@pytest.mark.parametrize("kwargs, message", [
    ({"criterion": parse_criterion("sample_t0.7")}, "deterministic rules"),
    ({"sync_every": 0}, "sync_every must be an integer >= 1"),
    ({"graphs": True}, "graphs=True needs a CUDA device"),
    ({"k": 9}, r"k must be an integer in \[1, 4\]"),
])
def test_bad_arguments(kwargs, message):
    model = random_model(k=4)
    with pytest.raises(ValueError, match=message):
        StaticDecoder(model, random_sources(2), max_len=8, **kwargs)


def test_a_static_cache_keeps_its_batch():
    cache = random_model(k=2).new_cache(3, 10)
    cache.make_static()
    with pytest.raises(RuntimeError, match="keeps its batch"):
        cache.select(torch.tensor([0, 2]))
    assert cache.length_bounds() == (0, 10)
