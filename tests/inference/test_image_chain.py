"""The whole image chain in one call (:func:`lightning_bpd.inference.fused_chain.chain_links`) against the link-by-link reference."""

import pytest
import torch

from lightning_bpd.decoding import blockwise_decode
from lightning_bpd.decoding.acceptance import parse_criterion
from lightning_bpd.inference import build_runtime
from tests.nn.test_head_centres import assert_exact_decoding_is_the_reference_and_greedy, image_model
from tests.nn.test_pixel_neighbours import K, neighbour_model, sources


def model_for(kind: str, head_type: str, dtype: torch.dtype):
    if kind == "neighbours":
        model = neighbour_model(head_type)
    else:  # own centres alone
        model = image_model("own", head_type, "gaussian")
        with torch.no_grad():
            for p in model.head.parameters():
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel()), dtype=p.dtype) * 0.1)
            torch.nn.init.normal_(model.prior.adapt.weight, std=0.05, generator=torch.Generator().manual_seed(9))
    return model.to(dtype).eval()


def link_by_link(model, h: torch.Tensor, first: torch.Tensor, k: int, source) -> torch.Tensor:
    """The reference: :meth:`chain_draft` once per link, the state carrying its values from link to link."""
    z, token, out = h, first, []
    for i in range(1, k):
        z, token = model.chain_draft(z, token, i, source)
        out.append(token)
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("head_type", ["chained", "chained_attn"])
@pytest.mark.parametrize("kind", ["neighbours", "own centres"])
def test_the_whole_image_chain_proposes_what_the_links_one_by_one_propose(kind, head_type, dtype):
    """Bit for bit, at every position of decoded images (pending left neighbours filled from the chain's own
    proposals), for the full chain and for fewer heads; and the proposals vary (the check is not vacuous)."""
    model = model_for(kind, head_type, dtype)
    src = sources(3)
    tgt_in = torch.randint(3, 20, (3, 150), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        context = model.encode(src)
        source = model.chain_source(context)
        hidden = model.decode_full(tgt_in, context)  # (3, T, D + carried)
        runtime = build_runtime(model)
        for k in (K, 2):
            for t in range(0, 150, 7):
                h = hidden[:, t]
                first = torch.randint(3, 20, (3,), generator=torch.Generator().manual_seed(t))
                whole = runtime.chain_drafts(h, first, k, source)
                assert whole is not None and whole.shape == (3, k - 1)
                assert torch.equal(whole, link_by_link(runtime, h, first, k, source)), (k, t)
        drafts = torch.stack([runtime.chain_drafts(hidden[:, t], tgt_in[:, t], K, source) for t in range(150)])
    assert drafts.unique().numel() > 3


def test_exact_decoding_through_the_whole_image_chain_is_greedy_and_the_reference():
    model = model_for("neighbours", "chained", torch.float64)
    src = sources()
    assert_exact_decoding_is_the_reference_and_greedy(model, src)
    with torch.no_grad():  # the same blocks as with the links one by one
        eps = parse_criterion("eps2")
        runtime = build_runtime(model)
        fast = blockwise_decode(runtime, src, eps, 192)
        runtime.proposer.image_chain_drafts = lambda *args: None  # chain_drafts falls back to the links
        slow = blockwise_decode(runtime, src, eps, 192)
    assert torch.equal(fast.tokens, slow.tokens) and fast.block_sizes == slow.block_sizes


def test_the_link_by_link_path_takes_what_the_whole_chain_does_not():
    """A categorical output or int8 proposals: no whole chain (None), the caller goes link by link."""
    model = image_model("own", "chained", "categorical")
    h = model.decode_full(torch.ones(2, 1, dtype=torch.long), model.encode(sources(2)))[:, -1]
    with torch.no_grad():
        assert build_runtime(model).chain_drafts(h, torch.full((2,), 5), K) is None
