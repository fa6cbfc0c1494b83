"""Fused chain links (decoding) against the reference links of :class:`ChainedHead`."""

import pytest
import torch

from lightning_bpd.decoding import Exact, blockwise_decode, greedy_decode
from lightning_bpd.decoding.acceptance import Distance
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.inference.fused_chain import FusedChain
from lightning_bpd.kernels import int8
from tests.models import assert_close_to_rounding, random_model, random_sources, scramble_chain
from tests.nn.test_head_centres import image_model, sources


@pytest.mark.parametrize("tables", [True, False])
@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
def test_fused_links_give_the_reference_states(head_type, tables):
    model = random_model(k=4, seed=3, head_type=head_type)
    scramble_chain(model)
    src = random_sources(3)  # rows with different source lengths (padding masked)
    context = model.encode(src)
    source = model.chain_source(context)
    embed = model.tgt_embed.weight * model.scale
    fused = FusedChain(model.head, embed, table_budget=2**40 if tables else 0)
    assert (fused.links[0].tok_table is not None) == tables
    z_ref = z_fused = torch.randn(3, 32, dtype=torch.float64)
    for i in range(1, 4):
        token = torch.randint(3, 16, (3,))
        z_ref = model.head.step(z_ref, model.embed_tokens(token), i, source)
        z_fused = fused.step(z_fused, token, i, source)
        assert_close_to_rounding(z_fused, z_ref)
    assert not torch.allclose(z_ref, z_ref.new_zeros(z_ref.shape))


@pytest.mark.parametrize("criterion", [Exact(), Distance(2.0)])
@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
def test_fused_and_reference_proposals_decode_alike_and_exact_equals_greedy(head_type, criterion):
    model = random_model(k=4, seed=4, head_type=head_type)
    scramble_chain(model, std=0.05)
    src = random_sources(5)
    fused = blockwise_decode(build_runtime(model), src, criterion, 20)
    ref = blockwise_decode(build_runtime(model, InferenceOptions(fused_chain=False)), src, criterion, 20)
    direct = blockwise_decode(model, src, criterion, 20)  # the model itself: the reference links (chain_step)
    assert torch.equal(direct.tokens, ref.tokens) and direct.block_sizes == ref.block_sizes
    assert torch.equal(fused.tokens, ref.tokens) and fused.block_sizes == ref.block_sizes
    if isinstance(criterion, Exact):
        assert torch.equal(fused.tokens, greedy_decode(model, src, 20).tokens)
    assert max(max(sizes) for sizes in fused.block_sizes) > 1


def test_fused_links_with_own_centres_decode_like_the_reference():
    """Image models tag the state with the input under the pixel before the link: the fused step slots in."""
    model = image_model("own", "chained", "gaussian")
    with torch.no_grad():
        torch.nn.init.normal_(model.prior.adapt.weight, std=0.05)
    src = sources()
    fused = blockwise_decode(build_runtime(model), src, Exact(), 192)
    ref = blockwise_decode(build_runtime(model, InferenceOptions(fused_chain=False)), src, Exact(), 192)
    assert torch.equal(fused.tokens, ref.tokens) and fused.block_sizes == ref.block_sizes


def test_a_runtime_fuses_the_links_of_its_snapshot_once():
    """The fused links are made when the runtime is built, from its snapshot: a later change of the model's weights
    reaches a runtime built after it, not one built before."""
    model = random_model(k=3, seed=3, head_type="chained")
    scramble_chain(model)
    h, token = torch.randn(2, 32, dtype=torch.float64), torch.tensor([4, 5])
    runtime = build_runtime(model)
    fused = runtime.proposer.fused
    with torch.no_grad():
        z1 = runtime.chain_draft(h, token, 1)[0]
        before = runtime.chain_draft(z1, token, 2)[0]
        assert runtime.proposer.fused is fused  # reused, never rebuilt
        model.head.cells[1].z_in.weight.mul_(2.0)  # an in-place update of one weight (of link 2)
        assert torch.equal(runtime.chain_draft(z1, token, 2)[0], before)  # the snapshot is unchanged
        after = build_runtime(model).chain_draft(z1, token, 2)[0]
        assert not torch.equal(after, before)
        reference = build_runtime(model, InferenceOptions(fused_chain=False)).chain_draft(z1, token, 2)[0]
        assert_close_to_rounding(after, reference)


@pytest.mark.skipif(not int8.available(), reason="no fbgemm/x86 quantized engine")
@pytest.mark.parametrize("tables", [True, False])
@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
def test_int8_links_give_the_reference_states_up_to_int8_rounding(head_type, tables):
    model = random_model(k=4, seed=3, head_type=head_type).float()
    scramble_chain(model)
    src = random_sources(3)
    source = model.chain_source(model.encode(src))
    embed = model.tgt_embed.weight * model.scale
    fused = FusedChain(model.head, embed, table_budget=2**40 if tables else 0, int8=True)
    z_ref = z_int8 = torch.randn(3, 32)
    with torch.no_grad():
        for i in range(1, 4):
            token = torch.randint(3, 16, (3,))
            z_ref = model.head.step(z_ref, model.embed_tokens(token), i, source)
            z_int8 = fused.step(z_int8, token, i, source)
            assert (z_int8 - z_ref).norm() <= 0.05 * z_ref.norm()  # 7-bit activations, 8-bit weights
            z_int8 = z_ref  # each link from the same state


@pytest.mark.parametrize("proposals", [None, "int8", "bfloat16"])  # bfloat16: the link-by-link fallback
@pytest.mark.parametrize("draft", [False, True])
def test_whole_chain_at_once_proposes_what_the_links_one_by_one_propose(draft, proposals):
    if proposals == "int8" and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    model = random_model(k=5, seed=4, vocab=40, head_type="chained_attn").float()
    scramble_chain(model, std=0.05)
    if draft:
        model.set_draft_ids(torch.arange(3, 40, 2))
    runtime = build_runtime(model, InferenceOptions(proposal_precision=proposals))
    src = random_sources(4, vocab=40)
    context = model.encode(src)
    source = model.chain_source(context)
    with torch.no_grad():
        h = model.decode_full(torch.ones(4, 1, dtype=torch.long), context)[:, -1]
        first = model.project(h).argmax(-1)
        whole = runtime.chain_drafts(h, first, 5, source)
        z, token, one_by_one = h, first, []
        for i in range(1, 5):
            z, token = runtime.chain_draft(z, token, i, source)
            one_by_one.append(token)
    assert torch.equal(whole, torch.stack(one_by_one, dim=1))
    assert not draft or bool(torch.isin(whole, model.draft_vocab.ids).all())
