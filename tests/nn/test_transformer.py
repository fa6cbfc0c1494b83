"""The cached decoder must give the logits of the uncached reference pass."""

import pytest
import torch
from torch.nn import functional as F

from lightning_bpd.nn.conditioning import bicubic_taps, bilinear_taps, source_index
from tests.models import assert_close_to_rounding, random_model, random_sources


def full_logits(model, src, tgt_in):
    return model.logits_heads(model.decode_full(tgt_in, model.encode(src)))  # (B, T, k, V)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("chunks", [[1] * 9, [1, 4, 2, 2], [9]])
def test_cached_steps_match_full_pass(window, chunks):
    model = random_model(k=4, window=window)
    src = random_sources(3)
    tgt_in = torch.randint(3, 16, (3, 9))
    tgt_in[:, 0] = model.bos_id
    ref = full_logits(model, src, tgt_in)
    context = model.encode(src)
    cache = model.new_cache(3, capacity=16)
    outs, start = [], 0
    for size in chunks:
        outs.append(model.logits_heads(model.decode_step(tgt_in[:, start : start + size], context, cache)))
        start += size
    assert_close_to_rounding(torch.cat(outs, dim=1), ref)


def test_ragged_rows_and_crop_match_full_pass():
    """Rows at different lengths, with rejected (cropped) tokens overwritten, equal the reference."""
    model = random_model(k=2)
    src = random_sources(2)
    seq = torch.randint(3, 16, (2, 8))
    seq[:, 0] = model.bos_id
    context = model.encode(src)
    cache = model.new_cache(2, capacity=16)
    model.decode_step(seq[:, :3], context, cache)
    junk = torch.randint(3, 16, (2, 4))
    model.decode_step(junk, context, cache)  # speculative tokens ...
    cache.crop(torch.tensor([3, 4]))  # ... row 0 rejects all, row 1 keeps the first one
    junk_row1 = junk[1, 0].item()
    h = model.decode_step(torch.stack([seq[0, 3:5], torch.tensor([seq[1, 3].item(), seq[1, 4].item()])]), context, cache)
    ref0 = model.decode_full(seq[:1, :5], context.select(torch.tensor([0])))[:, 3:5]
    prefix1 = torch.cat([seq[1, :3], torch.tensor([junk_row1]), seq[1, 3:5]])[None]
    ref1 = model.decode_full(prefix1, context.select(torch.tensor([1])))[:, 4:6]
    assert_close_to_rounding(h[:1], ref0)
    assert_close_to_rounding(h[1:], ref1)


def test_local_window_ignores_tokens_outside_it():
    model = random_model(k=1, window=3)
    src = random_sources(1)
    a = torch.tensor([[1, 5, 6, 7, 8, 9, 10, 11, 12, 13]])
    b = a.clone()
    b[0, 1] = 14
    ha = model.decode_full(a, model.encode(src))
    hb = model.decode_full(b, model.encode(src))
    # 2 layers of window 3: position p sees back to p - 4, so positions >= 6 cannot see position 1
    torch.testing.assert_close(ha[:, 6:], hb[:, 6:], rtol=0, atol=0)
    assert not torch.allclose(ha[:, 5], hb[:, 5])


def test_padding_in_source_does_not_change_outputs():
    model = random_model(k=1)
    src = torch.tensor([[5, 6, 7, 0, 0]])
    tgt_in = torch.tensor([[1, 4, 9]])
    assert_close_to_rounding(full_logits(model, src, tgt_in), full_logits(model, src[:, :3], tgt_in))


def test_empty_source_is_refused():
    model = random_model(k=1)
    with pytest.raises(ValueError, match="empty source"):
        model.encode(torch.tensor([[4, 5], [0, 0]]))


@pytest.mark.parametrize("t, window", [(40, 8), (37, 8), (17, 8), (9, 4)])
def test_blocked_local_attention_equals_the_full_mask(t, window):
    model = random_model(k=1, window=window)
    src = random_sources(2)
    tgt_in = torch.randint(3, 16, (2, t))
    context = model.encode(src)
    x = model.embed_tgt(tgt_in, torch.arange(t).expand(2, -1))
    full = model.decoder(x, context, blocked=False)
    blocked = model.decoder(x, context, blocked=True)
    assert_close_to_rounding(blocked, full)


def test_ring_cache_with_crops_matches_the_full_pass():
    """A window-3 decoder keeps a ring of 3 + margin slots; 80 positions wrap it several times."""
    from lightning_bpd.nn.transformer import RING_MARGIN

    model = random_model(k=1, window=3)
    src = random_sources(2)
    seq = torch.randint(3, 16, (2, 80))
    seq[:, 0] = model.bos_id
    context = model.encode(src)
    cache = model.new_cache(2, capacity=100)
    assert cache.ring == 3 + RING_MARGIN
    outs, start = [], 0
    g = torch.Generator().manual_seed(0)
    while start < 80:
        size = min(int(torch.randint(1, 8, (1,), generator=g)), 80 - start)
        junk = torch.randint(3, 16, (2, 5), generator=g)
        model.decode_step(junk, context, cache)  # speculative tokens, then all rejected
        cache.crop(cache.lengths - 5)
        outs.append(model.decode_step(seq[:, start : start + size], context, cache))
        start += size
    ref = model.decode_full(seq, context)
    assert_close_to_rounding(torch.cat(outs, dim=1), ref)


IMAGE = {"share_embeddings": True, "src_image_shape": (2, 2, 3), "tgt_image_shape": (8, 8, 3), "eos_id": None,
         "src_positions": "image", "tgt_positions": "image"}
IMAGE_OPTIONS = {
    "original": {},
    "untied": {"tie_output": False},
    "grid": {"src_positions": "grid", "tgt_positions": "grid"},
    "scaled": {"scale_positions": True},
    "direct": {"direct_conditioning": True},
    "all": {"tie_output": False, "src_positions": "grid", "tgt_positions": "grid", "scale_positions": True,
            "direct_conditioning": True},
    "source_output": {"tie_output": False, "tie_output_to_source": True, "share_embeddings": False,
                      "direct_conditioning": True},
    "bilinear": {"tie_output": False, "tie_output_to_source": True, "share_embeddings": False,
                 "direct_conditioning": True, "conditioning": "bilinear"},
    "prior": {"tie_output": False, "tie_output_to_source": True, "share_embeddings": False,
              "direct_conditioning": True, "conditioning": "bilinear", "intensity_prior": 3.0},
    "prior_untied": {"tie_output": False, "direct_conditioning": True, "intensity_prior": 3.0},
    "gaussian": {"tie_output": False, "tie_output_to_source": True, "share_embeddings": False,
                 "direct_conditioning": True, "intensity_prior": 3.0, "intensity_output": "gaussian"},
}


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("option", list(IMAGE_OPTIONS))
def test_image_options_cached_steps_match_full_pass(option, window):
    """Every image option, cached == uncached: rows at different lengths (row 1 keeps one speculative
    token per round, row 0 none), a ring cache, and positions past the 192-intensity target (clamped)."""
    model = random_model(k=3, vocab=20, window=window, **{**IMAGE, **IMAGE_OPTIONS[option]})
    g = torch.Generator().manual_seed(2)
    src = torch.randint(3, 20, (2, 12), generator=g)
    context = model.encode(src)
    cache = model.new_cache(2, capacity=260)
    seqs: list[list[int]] = [[model.bos_id], [model.bos_id]]
    h = model.decode_step(torch.full((2, 1), model.bos_id), context, cache)
    outs: list[list[torch.Tensor]] = [[h[0, 0]], [h[1, 0]]]
    while cache.lengths.max() < 200:
        junk = torch.randint(3, 20, (2, 4), generator=g)
        model.decode_step(junk, context, cache)  # speculative tokens ...
        cache.crop(cache.lengths - torch.tensor([4, 3]))  # ... row 0 rejects all, row 1 keeps the first
        seqs[1].append(int(junk[1, 0]))
        new = torch.randint(3, 20, (2, int(torch.randint(1, 9, (1,), generator=g))), generator=g)
        h = model.decode_step(new, context, cache)
        for row in range(2):
            seqs[row] += new[row].tolist()
            outs[row] += list(h[row])
        outs[1].insert(len(outs[1]) - new.shape[1], None)  # the kept junk token's output was not recorded
    for row in range(2):
        ref = model.decode_full(torch.tensor([seqs[row]]), context.select(torch.tensor([row])))[0]  # (T, D)
        kept = [t for t, o in enumerate(outs[row]) if o is not None]
        stepped = torch.stack([outs[row][t] for t in kept])
        assert_close_to_rounding(stepped, ref[kept])
        assert_close_to_rounding(model.logits_heads(stepped), model.logits_heads(ref[kept]))


def test_direct_conditioning_adds_the_source_intensity_under_each_target_pixel():
    """Target (r, c, ch) of an 8x8 image over a 2x2 source reads source (r // 4, c // 4, ch)."""
    model = random_model(k=1, vocab=20, **{**IMAGE, "direct_conditioning": True})
    src = torch.arange(3, 15)[None]  # (1, 12): source position s holds token s + 3
    context = model.encode(src)
    tokens = torch.full((1, 192), 5)
    pos = torch.arange(192)[None]
    plain = model.tgt_embed(tokens) * model.scale + model.tgt_pos(pos)
    added = model.embed_tgt(tokens, pos, context) - plain  # (1, 192, D)
    for r, c, ch in [(0, 0, 0), (3, 3, 2), (4, 3, 1), (7, 7, 2), (5, 6, 0)]:
        s = ((r // 4) * 2 + c // 4) * 3 + ch
        expected = model.src_embed(torch.tensor(s + 3)) * model.scale
        assert_close_to_rounding(added[0, (r * 8 + c) * 3 + ch], expected)


def test_bilinear_conditioning_adds_the_interpolated_input_intensity():
    """``conditioning: bilinear``: target (r, c, ch) reads the input intensity that bilinear interpolation
    (align_corners=False, as F.interpolate computes it in float64) gives there, rounded half up; the nearest
    taps are the intensity under the pixel."""
    model = random_model(k=1, vocab=300, **{**IMAGE, "src_image_shape": (4, 4, 3), "tgt_image_shape": (16, 16, 3),
                                            "direct_conditioning": True, "conditioning": "bilinear"})
    values = torch.randint(0, 256, (3, 4, 4, 3), generator=torch.Generator().manual_seed(0))  # (B, H, W, C)
    src = values.flatten(1) + 3  # (B, 48) raster ids, intensity + 3
    up = F.interpolate(values.permute(0, 3, 1, 2).double(), scale_factor=4, mode="bilinear", align_corners=False)
    expected = (up + 0.5).floor().long().permute(0, 2, 3, 1).flatten(1) + 3  # (B, 768), ties rounded up
    assert torch.equal(model.image.conditioning_ids(src), expected)
    context = model.encode(src)
    tokens, pos = torch.full((3, 768), 5), torch.arange(768).expand(3, -1)
    added = model.embed_tgt(tokens, pos, context) - (model.tgt_embed(tokens) * model.scale + model.tgt_pos(pos))
    assert_close_to_rounding(added, model.src_embed(expected) * model.scale)
    index, weight = bilinear_taps((4, 4, 3), (16, 16, 3))
    assert index.shape == weight.shape == (768, 4) and torch.allclose(weight.sum(-1), torch.ones(768))
    nearest = random_model(k=1, vocab=300, **{**IMAGE, "src_image_shape": (4, 4, 3), "tgt_image_shape": (16, 16, 3),
                                              "direct_conditioning": True})
    assert torch.equal(nearest.image.conditioning_ids(src), src[:, source_index((4, 4, 3), (16, 16, 3))])


@pytest.mark.parametrize("shapes", [((4, 4, 3), (16, 16, 3)), ((8, 8, 3), (32, 32, 3)), ((8, 8, 3), (16, 16, 3))])
def test_bicubic_conditioning_is_bicubic_upsampling(shapes):
    """``conditioning: bicubic``: target (r, c, ch) reads the intensity that bicubic interpolation (a = -0.75,
    align_corners=False, as F.interpolate computes it in float64) gives there, rounded half up and clipped to
    [0, 255] (the overshoot next to a saturated input is clipped); the weights are exact in float32."""
    low, high = shapes
    model = random_model(k=1, vocab=259, **{**IMAGE, "src_image_shape": low, "tgt_image_shape": high,  # ids 3..258
                                            "direct_conditioning": True, "conditioning": "bicubic"})
    values = torch.randint(0, 256, (3, *low), generator=torch.Generator().manual_seed(1))  # (B, H, W, C)
    values[0, ::2] = 255  # stripes of saturated intensities: bicubic overshoots both ways here
    values[0, 1::2] = 0
    src = values.flatten(1) + 3
    up = F.interpolate(values.permute(0, 3, 1, 2).double(), size=high[:2], mode="bicubic", align_corners=False)
    assert float(up.max()) > 255.5 and float(up.min()) < -0.5  # the clip is exercised
    expected = (up + 0.5).floor().clamp(0, 255).long().permute(0, 2, 3, 1).flatten(1) + 3
    assert torch.equal(model.image.conditioning_ids(src), expected)
    index, weight = bicubic_taps(low, high)
    assert index.shape == weight.shape == (high[0] * high[1] * 3, 16) and torch.equal(weight.double().sum(-1),
                                                                                         torch.ones(len(weight)).double())


def test_default_options_keep_the_translation_layout():
    """The image options are off by default: no new tensors, the tied projection."""
    model = random_model(k=2)
    assert not any(key.startswith("out_proj") or ".grid." in key for key in model.state_dict())
    h = torch.randn(3, 32, dtype=torch.float64)
    assert_close_to_rounding(model.project(h), h @ model.tgt_embed.weight.T)


@pytest.mark.parametrize("bad, match", [
    ({"src_positions": "grid"}, "grid positions need"),
    ({"direct_conditioning": True, "src_image_shape": (3, 3, 3)}, "integer multiple"),
    ({"scale_positions": True, "src_positions": "sinusoidal", "tgt_positions": "sinusoidal"}, "scale_positions"),
    ({"src_positions": "pixels"}, "positions must be one of"),
    ({"tie_output_to_source": True}, "tie_output_to_source needs tie_output off and share_embeddings off"),
    ({"tie_output_to_source": True, "tie_output": False}, "tie_output_to_source needs"),
    ({"direct_conditioning": True, "conditioning": "lanczos"}, "conditioning must be one of"),
    ({"intensity_prior": 4.0}, "intensity_prior is centred on the input intensity .* needs direct_conditioning"),
    ({"direct_conditioning": True, "intensity_prior": -1.0}, "intensity_prior must be >= 0"),
    ({"direct_conditioning": True, "intensity_output": "gaussian"}, "gaussian' needs intensity_prior > 0"),
    ({"direct_conditioning": True, "intensity_prior": 3.0, "intensity_output": "logistic"}, "intensity_output must be"),
    ({"direct_conditioning": True, "intensity_prior": 4.0, "intensity_offset": 19}, "fewer than two intensity ids"),
])
def test_bad_image_options_are_refused(bad, match):
    """One message each, naming the option to change."""
    with pytest.raises(ValueError, match=match):
        random_model(k=1, vocab=20, **{**IMAGE, **bad})
