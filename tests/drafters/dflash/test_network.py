"""The DFlash drafter (lightning_bpd/drafters/dflash/network.py): training pass == cached inference, ragged caches, masks, weight
names, config checks, GQA. Tiny float64 sizes."""

from __future__ import annotations

import pytest
import torch

from lightning_bpd.drafters.common.cache import DrafterCache
from lightning_bpd.drafters.dflash.network import DFlashConfig, DFlashDrafter, default_target_layers

H, A, BK = 32, 3, 4


def make(num_kv_heads: int = 2, seed: int = 0) -> DFlashDrafter:
    """A tiny drafter with every parameter (norm weights included) random, in float64."""
    torch.manual_seed(seed)
    cfg = DFlashConfig(hidden_size=H, num_layers=2, num_heads=4, num_kv_heads=num_kv_heads, head_dim=8,
                       intermediate_size=48, target_layer_ids=(1, 4, 7), mask_token_id=5, block_size=BK,
                       rope_theta=100.0)
    model = DFlashDrafter(cfg).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() == 1 else 0.0))
    return model.eval()


def reference(model: DFlashDrafter, feats: torch.Tensor, anchor: int, embeds: torch.Tensor, pos: torch.Tensor):
    """extend with features [0, anchor) of one sequence, then draft one block: (Bk, H)."""
    cache = model.new_cache(1, max(anchor, 1))
    model.extend(cache, feats[None, :anchor], torch.arange(anchor)[None])
    return model.draft(cache, embeds[None], pos[None])[0]


@pytest.mark.parametrize("num_kv_heads", [2, 4, 1])
def test_train_forward_equals_extend_then_draft(num_kv_heads):
    model = make(num_kv_heads)
    n, t, m = 3, 11, 3
    feats = torch.randn(n, t, A * H, dtype=torch.float64)
    embeds = torch.randn(n, m, BK, H, dtype=torch.float64)
    anchors = torch.tensor([[0, 3, 7], [1, 5, 10], [2, 4, 4]])
    valid = torch.tensor([[True, True, True], [True, True, True], [True, True, False]])
    positions = anchors[..., None] + torch.arange(BK)
    out = model.train_forward(feats, embeds, anchors, positions, valid)
    assert out.shape == (n, m, BK, H)
    for i in range(n):
        for j in range(m):
            if valid[i, j]:
                want = reference(model, feats[i], int(anchors[i, j]), embeds[i, j], positions[i, j])
                torch.testing.assert_close(out[i, j], want, rtol=1e-10, atol=1e-10)
            else:
                assert out[i, j].abs().sum() == 0


def test_ragged_cache_chunks_crop_and_select():
    model = make()
    b, t = 3, 9
    feats = torch.randn(b, t, A * H, dtype=torch.float64)
    lengths = torch.tensor([9, 4, 6])
    embeds = torch.randn(b, BK, H, dtype=torch.float64)
    pos = lengths[:, None] + torch.arange(BK)

    whole = model.new_cache(b, 16)
    model.extend(whole, feats, torch.arange(t).expand(b, t), lengths)
    want = model.draft(whole, embeds, pos)
    for i in range(b):  # each row equals its own single-row run
        torch.testing.assert_close(want[i], reference(model, feats[i], int(lengths[i]), embeds[i], pos[i]))

    # several ragged chunks: each row takes its next counts[b] features at its own length
    chunked = model.new_cache(b, 16)
    done = torch.zeros(b, dtype=torch.long)
    for counts in ([2, 0, 3], [5, 1, 0], [0, 3, 3], [2, 0, 0]):
        counts = torch.tensor(counts)
        idx = (done[:, None] + torch.arange(5)).clamp(max=t - 1)  # (B, 5): the next positions, padded
        model.extend(chunked, torch.gather(feats, 1, idx[..., None].expand(-1, -1, A * H)), idx, counts)
        done += counts
    assert chunked.lengths.tolist() == lengths.tolist()
    torch.testing.assert_close(model.draft(chunked, embeds, pos), want)
    assert chunked.lengths.tolist() == lengths.tolist()  # draft did not write the block

    # crop back, then re-extend with the same features: same as uncropped
    chunked.crop(torch.tensor([5, 4, 1]))
    back = torch.tensor([5, 4, 1])
    idx = (back[:, None] + torch.arange(5)).clamp(max=t - 1)
    model.extend(chunked, torch.gather(feats, 1, idx[..., None].expand(-1, -1, A * H)), idx, lengths - back)
    torch.testing.assert_close(model.draft(chunked, embeds, pos), want)
    # a crop really cuts: drafting the cropped cache differs
    short = model.new_cache(b, 16)
    model.extend(short, feats, torch.arange(t).expand(b, t), lengths)
    short.crop(torch.tensor([5, 4, 1]))
    assert not torch.allclose(model.draft(short, embeds, pos)[0], want[0])

    chunked.select([2, 0])
    assert chunked.lengths.tolist() == [6, 9]
    torch.testing.assert_close(model.draft(chunked, embeds[[2, 0]], pos[[2, 0]]), want[[2, 0]])


def test_cache_errors():
    model = make()
    cache = model.new_cache(2, 4, check=True)  # the checks read the host: tests and debugging only
    feats = torch.randn(2, 3, A * H, dtype=torch.float64)
    model.extend(cache, feats, torch.arange(3).expand(2, 3))
    with pytest.raises(RuntimeError, match="overflow"):
        model.extend(cache, feats, torch.arange(3).expand(2, 3), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="crop"):
        cache.crop([4, 1])
    assert isinstance(cache, DrafterCache) and cache.capacity == 4


def test_block_is_bidirectional_and_context_strictly_before():
    model = make()
    t = 10
    feats = torch.randn(1, t, A * H, dtype=torch.float64)
    embeds = torch.randn(1, 2, BK, H, dtype=torch.float64)
    anchors = torch.tensor([[3, 6]])
    positions = anchors[..., None] + torch.arange(BK)
    out = model.train_forward(feats, embeds, anchors, positions)

    later = embeds.clone()
    later[0, 0, -1] += 1.0  # the last token of block 0
    changed = model.train_forward(feats, later, anchors, positions)
    assert not torch.allclose(changed[0, 0, 0], out[0, 0, 0])  # slot 0 sees the last slot
    torch.testing.assert_close(changed[0, 1], out[0, 1])  # other blocks do not

    at_anchor = feats.clone()
    at_anchor[0, 3:] += 1.0  # features at positions >= block 0's anchor
    moved = model.train_forward(at_anchor, embeds, anchors, positions)
    torch.testing.assert_close(moved[0, 0], out[0, 0])
    assert not torch.allclose(moved[0, 1], out[0, 1])  # block 1 (anchor 6) sees positions 3..5

    before = feats.clone()
    before[0, 2] += 1.0  # the last position before block 0
    assert not torch.allclose(model.train_forward(before, embeds, anchors, positions)[0, 0], out[0, 0])


def test_state_dict_names():
    keys = set(make().state_dict())
    want = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(2):
        want |= {f"layers.{i}.{name}.weight" for name in (
            "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
            "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj")}
    assert keys == want
    model = make()
    assert model.fc.weight.shape == (H, A * H)
    assert model.layers[0].self_attn.k_proj.weight.shape == (2 * 8, H)


def test_config_validation_and_default_layers():
    assert default_target_layers(36, 5) == [1, 9, 17, 25, 33]
    assert default_target_layers(10, 1) == [5]
    base = {"hidden_size": 32, "num_heads": 4, "num_kv_heads": 2, "head_dim": 8, "intermediate_size": 48,
            "target_layer_ids": (1, 2), "mask_token_id": 0}
    cfg = DFlashConfig(**base).validate()
    assert DFlashConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.to_dict()["target_layer_ids"] == [1, 2]
    for bad, match in (({"num_kv_heads": 3}, "divisible"), ({"target_layer_ids": ()}, "empty"),
                       ({"block_size": 1}, "block_size"), ({"head_dim": 7}, "even"),
                       ({"num_heads": 0}, "num_heads")):
        with pytest.raises(ValueError, match=match) as info:
            DFlashConfig(**{**base, **bad}).validate()
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="unknown"):
        DFlashConfig.from_dict({**base, "extra": 1})
    with pytest.raises(ValueError, match="block_size"):
        DFlashDrafter(DFlashConfig(**{**base, "block_size": 1}))


def test_gqa_groups_query_heads_onto_kv_heads():
    """With num_kv_heads < num_heads, query head i reads kv head i // (nH / nKV): equal to an MHA drafter whose k/v
    projections repeat each kv head's rows."""
    gqa = make(num_kv_heads=2)
    mha = DFlashDrafter(DFlashConfig(**{**gqa.config.to_dict(), "num_kv_heads": 4})).double()
    state = gqa.state_dict()
    for key, value in state.items():
        if key.endswith(("k_proj.weight", "v_proj.weight")):
            state[key] = value.view(2, 8, H).repeat_interleave(2, dim=0).reshape(4 * 8, H)
    mha.load_state_dict(state)
    feats = torch.randn(2, 7, A * H, dtype=torch.float64)
    embeds = torch.randn(2, 2, BK, H, dtype=torch.float64)
    anchors = torch.tensor([[2, 5], [0, 3]])
    positions = anchors[..., None] + torch.arange(BK)
    torch.testing.assert_close(gqa.train_forward(feats, embeds, anchors, positions),
                               mha.train_forward(feats, embeds, anchors, positions))


def naive_block(model: DFlashDrafter, feats: torch.Tensor, anchor: int, embeds: torch.Tensor, pos: torch.Tensor):
    """The Qwen3/z-lab layer written out by hand for one block: keys/values = [context[:anchor] | block], k_norm and
    q_norm before rotate-half RoPE, kv heads repeated, no mask, pre-norm residuals, SwiGLU, final norm."""
    cfg = model.config
    rms = lambda x, norm: norm.weight * x / (x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps).sqrt()

    def rotate(x, p):  # x (P, heads, hd), p (P,)
        inv = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=x.dtype) / cfg.head_dim)
        ang = torch.cat([p[:, None] * inv] * 2, dim=-1)[:, None, :]
        x1, x2 = x.chunk(2, dim=-1)
        return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()

    g = rms(feats[:anchor] @ model.fc.weight.T, model.hidden_norm)
    kv_pos = torch.cat([torch.arange(anchor), pos]).to(feats.dtype)
    x = embeds
    for layer in model.layers:
        att, h = layer.self_attn, rms(x, layer.input_layernorm)
        q = rotate(rms((h @ att.q_proj.weight.T).view(BK, cfg.num_heads, -1), att.q_norm), pos.to(feats.dtype))
        kv_in = torch.cat([g, h])
        k = rotate(rms((kv_in @ att.k_proj.weight.T).view(len(kv_in), cfg.num_kv_heads, -1), att.k_norm), kv_pos)
        v = (kv_in @ att.v_proj.weight.T).view(len(kv_in), cfg.num_kv_heads, -1)
        rep = cfg.num_heads // cfg.num_kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        p = torch.softmax(torch.einsum("qhd,khd->hqk", q, k) / cfg.head_dim ** 0.5, dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", p, v).reshape(BK, -1) @ att.o_proj.weight.T
        h = rms(x, layer.post_attention_layernorm)
        x = x + (torch.nn.functional.silu(h @ layer.mlp.gate_proj.weight.T) * (h @ layer.mlp.up_proj.weight.T)) \
            @ layer.mlp.down_proj.weight.T
    return rms(x, model.norm)


def test_draft_matches_the_layer_written_out_by_hand():
    model = make()
    feats = torch.randn(9, A * H, dtype=torch.float64)
    embeds = torch.randn(BK, H, dtype=torch.float64)
    for anchor in (0, 1, 6):
        pos = anchor + torch.arange(BK)
        torch.testing.assert_close(reference(model, feats, anchor, embeds, pos),
                                   naive_block(model, feats, anchor, embeds, pos))


def test_a_drafter_step_reads_nothing_back_from_the_device(monkeypatch):
    """Unchecked (the decoders' cache), ``extend`` and ``draft`` (the cache's append and view) never read a tensor
    back to the host: every call of a tensor's host read fails; the drafts equal the checked cache's."""
    model = make()
    feats = torch.randn(3, 5, A * H, dtype=torch.float64)
    pos, counts = torch.arange(5).expand(3, 5), torch.tensor([5, 3, 1])
    embeds, block_pos = torch.randn(3, BK, H, dtype=torch.float64), 5 + torch.arange(BK).expand(3, BK)
    checked = model.new_cache(3, 16, check=True)
    model.extend(checked, feats, pos, counts)
    want = model.draft(checked, embeds, block_pos)
    cache = model.new_cache(3, 16)

    def refuse(*args, **kwargs):
        raise AssertionError("a host read in a drafter's step")

    for name in ("__bool__", "item", "tolist", "__int__", "__index__", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    model.extend(cache, feats, pos, counts)
    got = model.draft(cache, embeds, block_pos)
    monkeypatch.undo()
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert cache.span == 5 and cache.lengths.tolist() == [5, 3, 1]
