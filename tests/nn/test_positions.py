"""Image positions: the shared grid puts a source pixel at the centre of its block of target pixels."""

import pytest
import torch

from lightning_bpd.nn.positions import GridPositions, ImageGrid, ImagePositions, centre_weights


def test_centre_weights_interpolate_between_the_two_middle_cells():
    w = centre_weights(8, 32)  # source row i sits at grid row 4 i + 1.5
    assert w.shape == (8, 32)
    torch.testing.assert_close(w.sum(dim=1), torch.ones(8))
    assert w[0, 1] == w[0, 2] == 0.5 and w[7, 29] == w[7, 30] == 0.5
    torch.testing.assert_close(centre_weights(32, 32), torch.eye(32))  # factor 1: the grid itself


def test_grid_positions_share_one_table():
    grid = ImageGrid(16, 8, 8, 3)
    src, tgt = GridPositions(grid, 2, 2, 3), GridPositions(grid, 8, 8, 3)
    p_src = src(torch.tensor([[((1 * 2 + 0) * 3) + 2]]))  # source (1, 0), blue
    rows, cols = grid.rows.detach(), grid.cols.detach()
    expected = (rows[5] + rows[6]) / 2 + (cols[1] + cols[2]) / 2 + grid.chans[2]
    torch.testing.assert_close(p_src[0, 0], expected)
    torch.testing.assert_close(tgt(torch.tensor([[(5 * 8 + 1) * 3 + 2]]))[0, 0], rows[5] + cols[1] + grid.chans[2])
    # nearby target rows start closer to each other than far ones (sin/cos start)
    big = ImageGrid(64, 32, 32, 3).rows.detach()
    assert torch.dot(big[3], big[4]) > torch.dot(big[3], big[20]) and torch.dot(big[3], big[4]) > torch.dot(big[3], big[30])


def test_scaled_positions_have_the_token_scale():
    d = 64
    with torch.no_grad():
        pos = ImagePositions(d, 32, 32, 3, scale=(d / 3) ** 0.5)(torch.arange(3072)[None])
    assert 0.8 < float(pos.pow(2).mean().sqrt()) < 1.25


def test_grid_needs_integer_factors():
    with pytest.raises(ValueError, match="does not tile"):
        GridPositions(ImageGrid(16, 8, 8, 3), 3, 3, 3)


def test_a_host_side_limit_grows_the_table_without_reading_positions():
    from lightning_bpd.nn.positions import SinusoidalPositions

    pos = SinusoidalPositions(8)
    far = torch.tensor([[700, 701]])
    expected = pos(far)  # grows on demand from positions.max()
    fresh = SinusoidalPositions(8)
    assert torch.equal(fresh(far, limit=702), expected) and fresh.table.shape[0] >= 702


def test_decode_step_reads_no_position_from_the_device(monkeypatch):
    """The cache's host-side bounds bound the positions: a cached step never calls ``positions.max()``."""
    from lightning_bpd.nn.model import BlockwiseTransformer, ModelConfig

    torch.manual_seed(0)
    model = BlockwiseTransformer(ModelConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                             n_encoder_layers=1, n_decoder_layers=1, d_ff=32, k=2)).eval()
    src = torch.randint(3, 20, (2, 5))
    context = model.encode(src)
    cache = model.new_cache(2, 16)
    full = model.decode_full(torch.tensor([[1, 5, 6, 7], [1, 8, 9, 4]]), context)
    reads = []
    real_max = torch.Tensor.max
    monkeypatch.setattr(torch.Tensor, "max", lambda self, *a, **kw: reads.append(1) or real_max(self, *a, **kw))
    with torch.no_grad():
        first = model.decode_step(torch.tensor([[1], [1]]), context, cache)
        rest = model.decode_step(torch.tensor([[5, 6, 7], [8, 9, 4]]), context, cache)
    assert not reads
    assert torch.allclose(torch.cat([first, rest], 1), full, atol=1e-5)
