"""The EAGLE-3 drafter (lightning_bpd/drafters/eagle3/network.py): the training-time test == its cached token-by-token reference,
the cache's ragged rows, crops and tree masks, the state fed back, weight names, the draft vocabulary, config and
input checks. Tiny float64 sizes."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.drafters.eagle3.network import (
    Eagle3Cache,
    Eagle3Config,
    Eagle3Drafter,
    default_eagle3_layers,
    train_forward_reference,
    vocab_mapping,
)

pytestmark = pytest.mark.usefixtures("one_thread")

H, A, V, VD = 32, 3, 50, 20


def make(seed: int = 0, **overrides) -> Eagle3Drafter:
    """A tiny drafter with every parameter (norm weights and embeddings included) random, in float64."""
    torch.manual_seed(seed)
    fields = {"hidden_size": H, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
              "target_layer_ids": (1, 3, 5), "vocab_size": V, "draft_vocab_size": VD, "rope_theta": 100.0,
              **overrides}
    model = Eagle3Drafter(Eagle3Config(**fields)).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    if model.config.uses_draft_vocab:
        d2t, t2d = vocab_mapping(torch.randint(0, 100, (V,)), VD)
        model.set_vocab_mapping(d2t, t2d)
    return model.eval()


def inputs(b: int, t: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, t, A * H, generator=g, dtype=torch.float64), torch.randint(0, V, (b, t), generator=g)


VARIANTS = [{}, {"num_kv_heads": 1}, {"num_kv_heads": 4}, {"family": "qwen3"}, {"norm_before_residual": True},
            {"norm_output": True}, {"norm_before_fc": True}, {"fc_norm": True}, {"draft_vocab_size": V},
            {"family": "qwen3", "norm_before_residual": True, "norm_output": True, "fc_norm": True}]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "plain")
def test_train_forward_equals_the_cached_unroll(overrides):
    model = make(**overrides)
    features, tokens = inputs(2, 7)
    with torch.no_grad():
        got = model.train_forward(features, tokens, 3)
        want = train_forward_reference(model, features, tokens, 3)
    assert got.shape == (2, 3, 7, model.config.draft_vocab_size)
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


def test_each_step_feeds_its_own_states_and_sees_only_its_own_slot_of_earlier_steps():
    model = make()
    features, tokens = inputs(1, 8)
    with torch.no_grad():
        out = model.train_forward(features, tokens, 3)
        # the features at slot 5 reach step 0 of slots >= 5 only, and every step of slot 5
        moved = features.clone()
        moved[0, 5] += 1.0
        changed = (model.train_forward(moved, tokens, 3) - out).abs().amax(-1)[0]  # (steps, T)
    assert bool((changed[0, :5] == 0).all()) and bool((changed[0, 5:] > 0).all())
    assert bool((changed[1:, :5] == 0).all()) and bool((changed[1:, 5] > 0).all())
    # step s of slot t reads the token at t + 1 + s: token 6 reaches step 0 of slots >= 5 and step 1 of slot 4
    with torch.no_grad():
        other = tokens.clone()
        other[0, 6] = (other[0, 6] + 1) % V
        changed = (model.train_forward(features, other, 3) - out).abs().amax(-1)[0]
    assert bool((changed[0, :5] == 0).all()) and bool((changed[0, 5:] > 0).all())
    assert bool((changed[1, :4] == 0).all()) and bool(changed[1, 4] > 0) and bool(changed[2, 3] > 0)


def test_the_state_fed_back_is_the_layer_output_before_the_final_norm():
    for norm_output in (False, True):
        model = make(norm_output=norm_output)
        features, tokens = inputs(1, 4)
        cache = model.new_cache(1, 8)
        with torch.no_grad():
            state, logits = model.extend(cache, features, tokens, torch.arange(1, 5)[None])
            head = model.lm_head(state if norm_output else model.norm(state))
        torch.testing.assert_close(logits, head)
        assert not torch.allclose(model.norm(state), state) or norm_output


def test_cached_chunks_equal_one_pass_and_ragged_rows_crop_and_select():
    model = make()
    b, t = 3, 9
    features, tokens = inputs(b, t)
    positions = torch.arange(1, t + 1).expand(b, t)
    lengths = torch.tensor([9, 4, 6])
    with torch.no_grad():
        # one pass over the whole rows: step 0 of train_forward is the same computation
        whole = model.new_cache(b, 16)
        state, logits = model.extend(whole, features, tokens.roll(-1, 1), positions)
        step0 = model.train_forward(features, tokens, 1)[:, 0]
        torch.testing.assert_close(logits[:, :-1], step0[:, :-1], rtol=1e-10, atol=1e-10)

        # ragged chunks: row b takes its next counts[b] positions at its own length
        chunked = model.new_cache(b, 16)
        done = torch.zeros(b, dtype=torch.long)
        last = torch.zeros(b, VD, dtype=torch.float64)
        for counts in ([2, 0, 3], [5, 1, 0], [0, 3, 3], [2, 0, 0]):
            counts = torch.tensor(counts)
            idx = (done[:, None] + torch.arange(5)).clamp(max=t - 1)  # (B, 5) the next slots, padded
            out = model.extend(chunked, torch.gather(features, 1, idx[..., None].expand(-1, -1, A * H)),
                               torch.gather(tokens.roll(-1, 1), 1, idx), idx + 1, counts)[1]
            for r in range(b):
                if counts[r] > 0:
                    torch.testing.assert_close(out[r, counts[r] - 1], logits[r, done[r] + counts[r] - 1],
                                               rtol=1e-10, atol=1e-10)
                    last[r] = out[r, counts[r] - 1]
            done += counts
        assert chunked.lengths.tolist() == lengths.tolist()

        # a drafted position after each row's context, then crop it away and draft another
        nxt = torch.tensor([[3], [7], [11]])
        rows = torch.arange(b)
        first = model.extend(chunked, state[rows, lengths - 1][:, None], nxt, lengths[:, None] + 1)[1]
        chunked.crop(lengths)
        again = model.extend(chunked, state[rows, lengths - 1][:, None], nxt, lengths[:, None] + 1)[1]
        torch.testing.assert_close(again, first, rtol=1e-10, atol=1e-10)
        for r in range(b):  # each row equals its own single-row run
            single = model.new_cache(1, 16)
            n = int(lengths[r])
            s, _ = model.extend(single, features[r:r + 1, :n], tokens.roll(-1, 1)[r:r + 1, :n], positions[r:r + 1, :n])
            one = model.extend(single, s[:, -1:], nxt[r:r + 1], torch.tensor([[n + 1]]))[1]
            torch.testing.assert_close(one[0], first[r], rtol=1e-10, atol=1e-10)
        chunked.crop(lengths)
        chunked.select([2, 0])
        assert chunked.lengths.tolist() == [6, 9]
        picked = model.extend(chunked, state[[2, 0], lengths[[2, 0]] - 1][:, None], nxt[[2, 0]],
                              lengths[[2, 0], None] + 1)[1]
        torch.testing.assert_close(picked, first[[2, 0]], rtol=1e-10, atol=1e-10)


def test_a_tree_mask_drafts_branches_as_separate_chains():
    """Two branches of depth 2 from one context, each node seeing the context and its ancestors only, drafted level
    by level in one cache == each branch alone as a chain."""
    model = make(family="qwen3")
    features, tokens = inputs(1, 5)
    ctx_tokens, ctx_pos = tokens.roll(-1, 1), torch.arange(1, 6)[None]
    with torch.no_grad():
        chains = []
        for branch in ([7, 8], [9, 10]):
            cache = model.new_cache(1, 10)
            state = model.extend(cache, features, ctx_tokens, ctx_pos)[0][:, -1:]
            out = []
            for depth, tok in enumerate(branch):
                state, logits = model.extend(cache, state, torch.tensor([[tok]]), torch.tensor([[6 + depth]]))
                out.append(logits[0, 0])
            chains.append(out)

        cache = model.new_cache(1, 10)
        state = model.extend(cache, features, ctx_tokens, ctx_pos)[0][:, -1:].expand(1, 2, H)
        # depth 1: two siblings, each sees the context (5 slots) and itself, not the other
        mask = torch.tensor([[[True] * 5 + [True, False], [True] * 5 + [False, True]]])
        state, level1 = model.extend(cache, state, torch.tensor([[7, 9]]), torch.tensor([[6, 6]]), mask=mask)
        # depth 2: each child sees the context, its parent (slot 5 or 6) and itself
        mask = torch.tensor([[[True] * 5 + [True, False, True, False], [True] * 5 + [False, True, False, True]]])
        _, level2 = model.extend(cache, state, torch.tensor([[8, 10]]), torch.tensor([[7, 7]]), mask=mask)
    for i in range(2):
        torch.testing.assert_close(level1[0, i], chains[i][0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(level2[0, i], chains[i][1], rtol=1e-10, atol=1e-10)


def test_weight_names_are_speculators():
    names = set(make(family="qwen3", norm_before_fc=True).state_dict())
    layer = {f"layers.0.{n}.weight" for n in ("input_layernorm", "hidden_norm", "post_attention_layernorm",
                                               "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                               "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm",
                                               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == layer | {"embed_tokens.weight", "input_norm.weight", "fc.weight", "norm.weight",
                             "lm_head.weight", "d2t", "t2d"}
    plain = make(draft_vocab_size=V, fc_norm=True)
    assert {"d2t", "t2d"}.isdisjoint(plain.state_dict()) and "fc_norm.2.weight" in plain.state_dict()
    assert "layers.0.self_attn.q_norm.weight" not in plain.state_dict()
    assert plain.layers[0].self_attn.q_proj.weight.shape == (32, 2 * H)
    assert plain.fc.weight.shape == (H, A * H) and not plain.embed_tokens.weight.requires_grad


def test_training_reaches_every_trained_weight_and_not_the_embeddings():
    model = make(fc_norm=True).float().train()
    for p in model.parameters():
        p.grad = None
    features, tokens = inputs(2, 6)
    model.train_forward(features.float(), tokens, 3).logsumexp(-1).sum().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert not missing and model.embed_tokens.weight.grad is None


def test_vocab_mapping_picks_the_most_frequent_ties_by_id_and_round_trips():
    counts = torch.tensor([5, 0, 9, 5, 1, 9, 0, 2])
    d2t, t2d = vocab_mapping(counts, 4)
    assert t2d.tolist() == [True, False, True, True, False, True, False, False]  # 9, 9, then 5, 5 (ids 0, 3)
    assert (d2t + torch.arange(4)).tolist() == [0, 2, 3, 5] and d2t.dtype == torch.long
    d2t, t2d = vocab_mapping(counts, 7)  # the zero counts: the lower id first
    assert t2d.nonzero().flatten().tolist() == [0, 1, 2, 3, 4, 5, 7]
    model = make()
    ids = torch.arange(VD)
    assert torch.equal(model.draft_to_target(ids), model.t2d.nonzero().flatten())
    logits = torch.randn(2, V)
    assert torch.equal(model.draft_targets(logits), logits[:, model.draft_to_target(ids)])
    full = make(draft_vocab_size=V)
    assert torch.equal(full.draft_to_target(ids), ids) and full.d2t is None and full.t2d is None
    with pytest.raises(ValueError, match="disagree"):
        model.set_vocab_mapping(torch.zeros(VD, dtype=torch.long), torch.arange(V) >= V - VD)
    with pytest.raises(ValueError, match="whole vocabulary"):
        full.set_vocab_mapping(d2t, t2d)
    with pytest.raises(ValueError, match=r"draft_vocab must lie in \[1, 8\]"):
        vocab_mapping(counts, 9)


def test_from_target_and_default_layers():
    from transformers import LlamaConfig, Qwen3Config

    llama = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=32,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, rope_theta=5e5)
    c = Eagle3Config.from_target(llama, draft_vocab_size=100, norm_before_residual=True)
    assert c.target_layer_ids == (1, 15, 28)  # speculators' / vLLM's [2, 16, 29]
    assert (c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size) == (64, 4, 2, 16, 96)
    assert (c.vocab_size, c.draft_vocab_size, c.family, c.rope_theta, c.max_position_embeddings) == (
        300, 100, "llama", 5e5, 512)
    assert c.norm_before_residual and not c.norm_output
    assert Eagle3Config.from_dict(c.to_dict()) == c
    qwen = Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=8,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    q = Eagle3Config.from_target(qwen, target_layer_ids=[0, 3, 7])
    assert (q.family, q.head_dim, q.draft_vocab_size, q.target_layer_ids) == ("llama", 8, 300, (0, 3, 7))
    assert Eagle3Config.from_target(qwen, target_layer_ids=[0, 3, 7], family="qwen3").family == "qwen3"
    assert default_eagle3_layers(7) == [1, 2, 3]
    with pytest.raises(ValueError, match=">= 7 layers"):
        default_eagle3_layers(6)
    with pytest.raises(ValueError, match=r"\[8\] not a layer of the 8-layer target"):
        Eagle3Config.from_target(qwen, target_layer_ids=[0, 3, 8])
    with pytest.raises(ValueError, match="unknown flags"):
        Eagle3Config.from_target(qwen, target_layer_ids=[0, 3, 7], norm_after=True)


def one_line(call, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        call()
    assert "\n" not in str(err.value)


def test_bad_input_is_one_line():
    model = make()
    features, tokens = inputs(2, 6)
    one_line(lambda: model.train_forward(features[..., :-1], tokens, 2), r"width 95: give target features \(A\*H = 96\)")
    one_line(lambda: model.train_forward(features, tokens, 0), r"steps must lie in \[1, T - 1\] = \[1, 5\], got 0")
    one_line(lambda: model.train_forward(features, tokens, 6), "got 6")
    one_line(lambda: model.train_forward(features[:, :5], tokens, 2), "must share")
    cache = model.new_cache(2, 4)
    pos = torch.arange(1, 7).expand(2, 6)
    one_line(lambda: model.extend(cache, features[..., :H + 1], tokens, pos), "inputs of width 33")
    one_line(lambda: model.extend(cache, features, tokens, pos[:, :5]), "must share")
    one_line(lambda: model.extend(cache, features, tokens, pos, mask=torch.ones(2, 6, 5, dtype=torch.bool)),
             r"mask of shape \(2, 6, 5\), expected")
    with pytest.raises(RuntimeError, match="Eagle3Cache overflow"):
        model.extend(cache, features, tokens, pos)
    assert isinstance(cache, Eagle3Cache)
    base = make().config.to_dict()
    for change, match in (({"norm_before_fc": True, "fc_norm": True}, "exclude each other"),
                          ({"target_layer_ids": [1, 1, 3]}, "distinct"),
                          ({"target_layer_ids": [4]}, ">= 2 distinct"),
                          ({"draft_vocab_size": V + 1}, "exceeds the target's vocabulary"),
                          ({"family": "gpt2"}, "family must be one of llama, qwen3"),
                          ({"head_dim": 7}, "even"),
                          ({"bias": True}, "unknown keys")):
        one_line(lambda change=change: Eagle3Config.from_dict({**base, **change}), match)
    one_line(lambda: model.set_embeddings(torch.zeros(V, H + 1)), r"target embeddings of shape \(50, 33\)")


def test_ttt_valid():
    valid = Eagle3Drafter.ttt_valid(torch.tensor([5, 3]), 5, 2)
    assert valid.shape == (2, 2, 5)
    assert valid[0].int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 0, 0]]
    assert valid[1].int().tolist() == [[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]
