"""A tree's proposals through a runtime's proposal paths (``draft_ranks``, ``chain_ranks``): each head's n best
tokens are the stable sort's first n of the logits that path proposes from, rank 0 is the single path's token, and
tree decoding through them stays greedy's output."""

import pytest
import torch

from lightning_bpd.decoding import Exact, Tree, blockwise_decode, greedy_decode
from lightning_bpd.inference import InferenceOptions, build_runtime
from lightning_bpd.kernels import int8
from lightning_bpd.nn.argmax import top_ranks_reference
from tests.models import float32_model, random_sources

OPTIONS = {"float32": {}, "packed": {"precision": "float32-packed"}, "int8": {"proposal_precision": "int8"},
           "bfloat16": {"proposal_precision": "bfloat16"}, "draft_vocab": {"draft_vocab": tuple(range(0, 40, 2))},
           "unfused": {"fused_chain": False}, "int8_draft_vocab": {"proposal_precision": "int8",
                                                                   "draft_vocab": tuple(range(1, 40, 3))}}
TREE = Tree.from_paths([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 1, 0), (2, 0)])


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    pass


def runtime_of(head_type: str, options: str):
    if "int8" in options and not int8.available():
        pytest.skip("no fbgemm/x86 quantized engine")
    return build_runtime(float32_model(seed=6, head_type=head_type), InferenceOptions(**OPTIONS[options]))


def draft_ids(runtime, top: torch.Tensor) -> torch.Tensor:
    draft = runtime.draft_vocab
    return top if draft is None else draft.ids[top]


@pytest.mark.parametrize("options", list(OPTIONS))
def test_a_heads_ranks_are_the_stable_sort_of_its_proposing_logits(options):
    runtime = runtime_of("paper", options)
    proposer = runtime.proposer
    h = torch.randn(5, runtime.model.config.d_model, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ranks = runtime.draft_ranks(h, range(1, 4), 4)  # (5, 3, 4)
        _, weight, bias = proposer.parts()
        logits = proposer.proposal_logits(proposer.head_states(h, range(1, 4)), weight, bias)  # (5, 3, V or N)
        assert torch.equal(ranks, draft_ids(runtime, top_ranks_reference(logits, 4)))
        assert torch.equal(ranks[..., 0], runtime.draft_tokens(h, range(1, 4)))


@pytest.mark.parametrize("options", list(OPTIONS))
def test_a_links_ranks_are_the_stable_sort_of_its_proposing_logits(options):
    runtime = runtime_of("chained_attn", options)
    proposer = runtime.proposer
    src = random_sources(3, vocab=40, seed=2)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        source = runtime.chain_source(runtime.encode(src))
        z = torch.randn(3, runtime.model.config.d_model, generator=g)
        token = torch.randint(3, 40, (3,), generator=g)
        for i in (1, 2, 3):
            z_ranked, ranks = runtime.chain_ranks(z, token, i, source, 5)  # (3, D), (3, 5)
            z_draft, best = runtime.chain_draft(z, token, i, source)
            assert torch.equal(z_ranked, z_draft) and torch.equal(ranks[:, 0], best)
            _, weight, bias = proposer.parts()
            _, state = proposer.link(z, token, i, source, nearest=False)
            assert torch.equal(ranks, draft_ids(runtime, top_ranks_reference(proposer.proposal_logits(state, weight,
                                                                                                        bias), 5)))
            z, token = z_ranked, ranks[:, 1]  # on along a second choice


@pytest.mark.parametrize("head_type", ["paper", "chained_attn"])
@pytest.mark.parametrize("options", ["int8", "bfloat16", "draft_vocab", "unfused"])
def test_trees_proposed_through_the_runtimes_paths_decode_to_greedys_output(head_type, options):
    runtime = runtime_of(head_type, options)
    src = random_sources(4, vocab=40, seed=3)
    with torch.no_grad():
        greedy = greedy_decode(runtime, src, 20)
        out = blockwise_decode(runtime, src, Exact(), 20, tree=TREE)
    assert out.sequences() == greedy.sequences()
    assert max(max(sizes) for sizes in out.block_sizes) > 1
