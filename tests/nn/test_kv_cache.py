import pytest
import torch

from lightning_bpd.nn.kv_cache import KVCache


def test_write_per_row_positions_then_crop_and_select():
    cache = KVCache(n_layers=2, batch_size=3, capacity=8, n_heads=1, head_dim=1)
    cache.lengths = torch.tensor([0, 2, 5])
    pos = cache.positions(2)
    assert pos.tolist() == [[0, 1], [2, 3], [5, 6]]
    kv = torch.arange(6, dtype=torch.float32).view(3, 2, 1, 1) + 1
    cache.write(1, pos, kv, -kv)
    cache.advance(2)
    assert cache.lengths.tolist() == [2, 4, 7]
    assert cache.k[1, 1, 2:4, 0, 0].tolist() == [3.0, 4.0]
    assert cache.v[1, 2, 5:7, 0, 0].tolist() == [-5.0, -6.0]
    assert cache.k[0].abs().sum() == 0  # other layers untouched
    cache.crop(torch.tensor([1, 4, 5]))
    assert cache.lengths.tolist() == [1, 4, 5]
    cache.select(torch.tensor([2, 0]))
    assert cache.lengths.tolist() == [5, 1]
    assert cache.k[1, 0, 5:7, 0, 0].tolist() == [5.0, 6.0]


def test_crop_cannot_grow_and_overflow_is_reported():
    cache = KVCache(1, 2, 4, 1, 1)
    cache.advance(3)
    with pytest.raises(ValueError, match="current length"):
        cache.crop(torch.tensor([4, 1]))
    with pytest.raises(RuntimeError, match="overflow"):
        cache.check_room(2)
    with pytest.raises(ValueError, match="capacity"):
        KVCache(1, 1, 0, 1, 1)


def test_ring_cache_maps_positions_to_slots():
    cache = KVCache(1, 2, capacity=100, n_heads=1, head_dim=1, ring=5)
    assert cache.k.shape[2] == 5 and cache.capacity == 100
    cache.lengths = torch.tensor([6, 2])
    pos = cache.positions(2)  # [[6, 7], [2, 3]]
    cache.write(0, pos, torch.tensor([[[[6.0]], [[7.0]]], [[[2.0]], [[3.0]]]]), torch.zeros(2, 2, 1, 1))
    assert cache.k[0, 0, :, 0, 0].tolist()[1:3] == [6.0, 7.0]
    assert cache.slot_positions(pos[:, -1]).tolist() == [[5, 6, 7, 3, 4], [0, 1, 2, 3, -1]]


@pytest.mark.parametrize("bounds", [(3, 3), None], ids=["equal-lengths-slice", "unknown-bounds-index"])
def test_writes_land_at_each_rows_positions_whatever_the_path(bounds):
    """Rows of one length are written as one slice (the bounds say so), others per row: same buffers."""
    cache = KVCache(1, 2, 8, 1, 2)
    cache.write(0, cache.positions(3), torch.ones(2, 3, 1, 2), torch.ones(2, 3, 1, 2))
    cache.advance(3)
    cache.crop(torch.tensor([3, 3]), bounds=bounds, check=False)
    k = torch.arange(8.0).view(2, 2, 1, 2)
    cache.write(0, cache.positions(2), k, -k)
    assert torch.equal(cache.k[0, :, 3:5], k) and torch.equal(cache.v[0, :, 3:5], -k)
    assert torch.equal(cache.k[0, :, :3], torch.ones(2, 3, 1, 2)) and not cache.k[0, :, 5:].any()


@pytest.mark.parametrize("bounds", [(2, 2), None], ids=["equal-lengths-slice", "unknown-bounds-index"])
def test_a_prefix_sits_ahead_of_position_zero(bounds):
    """A prefix (a prompt) written once ahead of the positions: writes, views, crops and a tree's kept path count
    positions as before, and view_with_prefix reads the prefix and the positions as one span."""
    prefix = [torch.full((2, 3, 1, 2), 100.0 + layer) for layer in range(2)]
    plain, cache = KVCache(2, 2, 8, 1, 2), KVCache(2, 2, 8, 1, 2)
    first = torch.arange(8.0).view(2, 2, 1, 2)
    for c in (plain, cache):
        c.write(1, c.positions(2), first, -first)
        c.advance(2)
    cache.put_prefix(prefix, [-p for p in prefix])  # after two positions: they keep their place after it
    assert cache.prefix == 3 and cache.k.shape[2] == 3 + 8
    for c in (plain, cache):
        c.crop(torch.tensor([2, 2]), bounds=bounds, check=False)
        k = torch.arange(12.0).view(2, 3, 1, 2) + 10
        c.write(1, c.positions(3), k, -k)
        c.advance(3)
        c.keep_path(torch.tensor([[0, 2], [1, 2]]), torch.tensor([2, 1]), width=3)  # a tree's accepted nodes
    assert cache.lengths.tolist() == plain.lengths.tolist() == [4, 3]
    assert torch.equal(cache.view(1, 5)[0], plain.view(1, 5)[0]) and torch.equal(cache.view(1, 5)[1], plain.view(1, 5)[1])
    keys, values = cache.view_with_prefix(1, 5)  # (B, 3 + 5, H, Dh)
    assert torch.equal(keys[:, :3], prefix[1]) and torch.equal(values[:, :3], -prefix[1])
    assert torch.equal(keys[:, 3:], plain.view(1, 5)[0])
    cache.select(torch.tensor([1]))
    assert torch.equal(cache.view_with_prefix(0, 1)[0][0, :3], prefix[0][1])
    with pytest.raises(RuntimeError, match="already"):
        cache.put_prefix(prefix, prefix)
    with pytest.raises(ValueError, match="ring"):
        KVCache(1, 2, 8, 1, 2, ring=4).put_prefix(prefix, prefix)
