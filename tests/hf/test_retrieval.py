"""Retrieval on Hugging Face causal bases: every row = the checkpoint's own greedy ``generate`` on ragged batches
padded on either side, with a datastore of that model's own outputs (its trees get accepted) and of noise; rules other
than exact are refused in one line."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from lightning_bpd.decoding import Exact, TopK, decode
from lightning_bpd.decoding.proposers.retrieval import Datastore, Retrieval
from lightning_bpd.hf.causal import HFCausalBlockwise
from tests.hf import test_causal as causal

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("stream", ["own", "noise"])
def test_retrieval_equals_generate_on_a_ragged_batch(family, side, stream):
    base, src, max_len = causal.tiny_lm(family), causal.prompts(8, side=side), 20
    causal.pick_eos(base, src, max_len)
    model = HFCausalBlockwise(base, k=1)
    want = causal.hf_greedy(base, src, max_len)
    assert {len(r) for r in want} != {max_len} and max_len in {len(r) for r in want}  # EOS and the cap both
    if stream == "own":  # the model's own continuations of other prompts and of these: trees that get accepted
        other = causal.prompts(8, seed=7, side=side)
        tokens = [t for rows in (causal.hf_greedy(base, other, max_len), want) for r in rows for t in r]
    else:
        tokens = torch.randint(0, base.config.vocab_size, (500,), generator=torch.Generator().manual_seed(0)).tolist()
    store = Datastore.of(torch.tensor(tokens), orders=(1, 2, 3, 4))
    got = decode(model, src, Exact(), Retrieval(store, nodes=6, depth=4), max_len=max_len)
    assert got.sequences() == want
    capped = decode(model, src, Exact(), Retrieval(store, nodes=6, depth=4, inputs=12), max_len=max_len)
    assert capped.sequences() == want  # 8 rows: no tree (a greedy step); fewer as rows finish: 1 node, 2, ...
    if stream == "own":
        assert max(max(sizes) for sizes in got.block_sizes) > 2, "the model's own continuations get accepted"


def test_retrieval_refuses_other_rules_in_one_line():
    model = HFCausalBlockwise(causal.tiny_lm("llama"), k=1)
    store = Datastore.of(torch.arange(20))
    with pytest.raises(ValueError, match="exact acceptance, not top2"):
        decode(model, causal.prompts(2), TopK(2), Retrieval(store), max_len=8)
