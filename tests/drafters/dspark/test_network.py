"""The DSpark drafter (lightning_bpd/drafters/dspark/network.py): the training pass with its heads equals the cached
inference path (extend, draft, then the Markov chain slot by slot), the weight names and shapes are speculators',
config checks are one line. Tiny float64 sizes."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.drafters.dspark.network import DSparkConfig, DSparkDrafter
from tests.drafters.dspark.tiny import random_dspark

H, A, K, V, R = 32, 2, 4, 40, 8


def lm_head(seed: int = 1) -> torch.Tensor:
    return torch.randn(V, H, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))  # (V, H)


@pytest.mark.parametrize("with_markov", [True, False])
def test_train_forward_and_heads_equal_extend_draft_and_the_chain(with_markov):
    drafter = random_dspark(H, V, K, layers=(0, 1), rank=R, with_markov=with_markov)
    with torch.no_grad():
        for p in drafter.parameters():  # norms too: every weight matters
            p.add_(torch.randn_like(p) * 0.1)
    w = lm_head()
    n, t = 2, 14
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(n, t, A * H, dtype=torch.float64, generator=g)
    src = torch.randint(4, V, (n, t), generator=g)
    anchors = torch.tensor([[1, 5, 9], [2, 3, 8]])
    positions = anchors[..., None] + torch.arange(K)  # (N, M, K)
    tokens = torch.full((n, 3, K), 3)
    tokens[..., 0] = src.gather(1, anchors)
    embeds = torch.randn(V, H, dtype=torch.float64, generator=g)  # an embedding table
    h = drafter.train_forward(feats, embeds[tokens], anchors, positions)  # (N, M, K, H)
    prev = src.gather(1, positions.flatten(1)).view(positions.shape)  # slot j reads the data's token at a + j
    logits, conf = drafter.heads(h, h @ w.T, prev)
    assert logits.shape == (n, 3, K, V) and conf.shape == (n, 3, K)
    for i in range(n):
        for m in range(3):
            a = int(anchors[i, m])
            cache = drafter.new_cache(1, a)
            drafter.extend(cache, feats[i : i + 1, :a], torch.arange(a)[None])
            out = drafter.draft(cache, embeds[tokens[i, m]][None], positions[i, m][None])  # (1, K, H)
            given = iter(src[i, a + 1 : a + K + 1].tolist())  # the chain picks the data's next tokens
            got, got_logits, got_conf = drafter.chain(out, out @ w.T, src[i, a][None],
                                                      lambda _, it=given: torch.tensor([next(it)]), confidence=True)
            assert got[0].tolist() == src[i, a + 1 : a + K + 1].tolist()
            torch.testing.assert_close(got_logits[0], logits[i, m], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(got_conf[0], conf[i, m], rtol=1e-10, atol=1e-10)


def test_the_bias_changes_the_drafts_and_the_argmax_chain_is_self_consistent():
    drafter = random_dspark(H, V, K, rank=R, head_scale=1.0)
    h = torch.randn(3, K, H, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    base = h @ lm_head().T  # (3, K, V)
    anchor = torch.tensor([5, 6, 7])
    tokens, logits, conf = drafter.chain(h, base, anchor, lambda x: x.argmax(dim=-1))
    assert conf is None and tokens.shape == (3, K)
    prev = torch.cat([anchor[:, None], tokens[:, :-1]], dim=1)  # what each slot read
    want, _ = drafter.heads(h, base, prev)
    torch.testing.assert_close(logits, want)
    assert torch.equal(tokens, want.argmax(dim=-1))
    assert not torch.equal(tokens, base.argmax(dim=-1))  # the Markov bias does change drafts


def test_weight_names_shapes_and_init():
    drafter = DSparkDrafter(DSparkConfig(hidden_size=H, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48,
                                         target_layer_ids=(1,), mask_token_id=0, vocab_size=V, markov_rank=R))
    shapes = {k: tuple(v.shape) for k, v in drafter.state_dict().items()}
    assert shapes["markov_head.markov_w1.weight"] == (V, R) and shapes["markov_head.markov_w2.weight"] == (V, R)
    assert shapes["confidence_head.proj.weight"] == (1, H + R) and shapes["confidence_head.proj.bias"] == (1,)
    assert {k.split(".")[0] for k in shapes} == {"fc", "hidden_norm", "layers", "norm", "markov_head",
                                                 "confidence_head"}
    assert float(drafter.markov_head.markov_w2.weight.detach().std()) == pytest.approx(0.02, rel=0.2)
    assert float(drafter.confidence_head.proj.bias.detach().abs().sum()) == 0.0
    plain = DSparkDrafter(DSparkConfig(**{**drafter.config.to_dict(), "enable_confidence_head": False}))
    assert plain.confidence_head is None and not any(k.startswith("confidence") for k in plain.state_dict())
    alone = DSparkDrafter(DSparkConfig(**{**drafter.config.to_dict(), "confidence_head_with_markov": False}))
    assert tuple(alone.confidence_head.proj.weight.shape) == (1, H)


def test_config_round_trip_and_checks_are_one_line():
    base = {"hidden_size": H, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
            "target_layer_ids": (1, 2), "mask_token_id": 0, "vocab_size": V, "markov_rank": R}
    config = DSparkConfig(**base).validate()
    assert DSparkConfig.from_dict(config.to_dict()) == config and config.to_dict()["markov_rank"] == R
    for bad, match in (({"vocab_size": 0}, "vocab_size >= 1"), ({"markov_rank": 0}, "markov_rank >= 1"),
                       ({"mask_token_id": V}, "outside the vocabulary"), ({"block_size": 1}, "block_size")):
        with pytest.raises(ValueError, match=match) as info:
            DSparkConfig(**{**base, **bad}).validate()
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="unknown"):
        DSparkConfig.from_dict({**base, "markov_head_type": "rnn"})
