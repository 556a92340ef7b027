"""PagedKVCache: block tables, gather, free/reuse, and attention over the gathered cache."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.paged import OutOfBlocksError, PagedKVCache


def _kv(h, n, d, gen):
    return torch.randn(h, n, d, generator=gen), torch.randn(h, n, d, generator=gen)


@settings(max_examples=30, deadline=None)
@given(
    block_size=st.integers(1, 8),
    chunks=st.lists(st.integers(0, 10), min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_gather_returns_what_was_appended(block_size, chunks, seed):
    gen = torch.Generator().manual_seed(seed)
    cache = PagedKVCache(num_blocks=64, block_size=block_size, num_kv_heads=2, head_dim=3)
    keys, values = [], []
    for n in chunks:
        k, v = _kv(2, n, 3, gen)
        cache.append("s", k, v)
        keys.append(k)
        values.append(v)
    got_k, got_v = cache.gather("s")
    assert torch.equal(got_k, torch.cat(keys, dim=1))
    assert torch.equal(got_v, torch.cat(values, dim=1))
    total = sum(chunks)
    assert cache.lengths["s"] == total
    assert len(cache.block_tables["s"]) == -(-total // block_size)  # ceil


def test_interleaved_sequences_stay_separate():
    gen = torch.Generator().manual_seed(0)
    cache = PagedKVCache(num_blocks=16, block_size=3, num_kv_heads=1, head_dim=2)
    want = {"a": [], "b": []}
    for _ in range(7):  # one token per step for each sequence, like batched decoding
        for seq in ("a", "b"):
            k, v = _kv(1, 1, 2, gen)
            cache.append(seq, k, v)
            want[seq].append((k, v))
    for seq in ("a", "b"):
        k, v = cache.gather(seq)
        assert torch.equal(k, torch.cat([kv[0] for kv in want[seq]], dim=1))
        assert torch.equal(v, torch.cat([kv[1] for kv in want[seq]], dim=1))
    # blocks are interleaved in the pool, which is the point of the block table
    assert set(cache.block_tables["a"]).isdisjoint(cache.block_tables["b"])


def test_attention_over_gathered_equals_contiguous():
    gen = torch.Generator().manual_seed(1)
    h, d = 4, 8
    cache = PagedKVCache(num_blocks=32, block_size=4, num_kv_heads=h, head_dim=d)
    contiguous_k, contiguous_v = torch.empty(h, 0, d), torch.empty(h, 0, d)
    cache.append("other", *_kv(h, 5, d, gen))  # another sequence shares the pool
    for n in (6, 1, 1, 3, 1):
        k, v = _kv(h, n, d, gen)
        cache.append("s", k, v)
        contiguous_k = torch.cat([contiguous_k, k], dim=1)
        contiguous_v = torch.cat([contiguous_v, v], dim=1)
        q = torch.randn(h, 1, d, generator=gen)  # the newest query
        paged_k, paged_v = cache.gather("s")
        torch.testing.assert_close(
            F.scaled_dot_product_attention(q, paged_k, paged_v),
            F.scaled_dot_product_attention(q, contiguous_k, contiguous_v),
            atol=0,
            rtol=0,
        )


def test_freed_blocks_are_reused():
    gen = torch.Generator().manual_seed(2)
    cache = PagedKVCache(num_blocks=4, block_size=2, num_kv_heads=1, head_dim=2)
    cache.append("a", *_kv(1, 3, 2, gen))  # 2 blocks
    cache.append("b", *_kv(1, 4, 2, gen))  # 2 blocks: pool now full
    assert cache.num_free_blocks == 0
    blocks_of_a = list(cache.block_tables["a"])
    cache.free("a")
    assert cache.num_free_blocks == 2 and "a" not in cache.block_tables
    k, v = _kv(1, 4, 2, gen)
    cache.append("c", k, v)
    assert cache.block_tables["c"] == blocks_of_a
    assert torch.equal(cache.gather("c")[0], k) and torch.equal(cache.gather("c")[1], v)
    assert cache.num_used_blocks == 4


def test_out_of_blocks_is_a_clean_error():
    gen = torch.Generator().manual_seed(3)
    cache = PagedKVCache(num_blocks=2, block_size=2, num_kv_heads=1, head_dim=2)
    k, v = _kv(1, 3, 2, gen)
    cache.append("a", k, v)
    with pytest.raises(OutOfBlocksError, match=r"needs 1 more block.*0 of 2 blocks are free"):
        cache.append("b", *_kv(1, 1, 2, gen))
    assert "b" not in cache.block_tables  # a failed first append leaves no trace
    cache.append("a", *_kv(1, 1, 2, gen))  # fills the last slot of a's second block
    with pytest.raises(OutOfBlocksError):
        cache.append("a", *_kv(1, 1, 2, gen))
    # the failed append wrote nothing: a still has exactly 4 positions
    assert cache.lengths["a"] == 4
    assert torch.equal(cache.gather("a")[0][:, :3], k)
    assert issubclass(OutOfBlocksError, RuntimeError)


def test_waste_is_below_one_block_per_sequence():
    gen = torch.Generator().manual_seed(4)
    cache = PagedKVCache(num_blocks=100, block_size=16, num_kv_heads=1, head_dim=1)
    lengths = [1, 15, 16, 17, 40, 63]
    for i, n in enumerate(lengths):
        cache.append(i, *_kv(1, n, 1, gen))
    assert cache.used_positions() == sum(lengths)
    waste = cache.allocated_positions() - cache.used_positions()
    assert waste == sum(-n % 16 for n in lengths)
    assert waste < 16 * len(lengths)


def test_bad_input_raises():
    with pytest.raises(ValueError, match="num_blocks"):
        PagedKVCache(0, 4, 1, 2)
    cache = PagedKVCache(4, 4, num_kv_heads=2, head_dim=3)
    with pytest.raises(ValueError, match=r"\(h_kv=2, n, d=3\).*\(1, 1, 3\)"):
        cache.append("a", torch.zeros(1, 1, 3), torch.zeros(1, 1, 3))
    with pytest.raises(ValueError, match="key and value"):
        cache.append("a", torch.zeros(2, 1, 3), torch.zeros(2, 2, 3))
    with pytest.raises(KeyError, match="seq_id .* is not a sequence of this cache"):
        cache.gather("nope")
    with pytest.raises(KeyError, match="seq_id .* is not a sequence of this cache"):
        cache.free("nope")


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        ((4, 0, 1, 2), {}, ValueError, "block_size must be positive, got 0"),
        ((4, 4, -1, 2), {}, ValueError, "num_kv_heads must be positive, got -1"),
        ((4, 4, 1, 2.0), {}, TypeError, "head_dim must be an int"),
        ((4, 4, 1, 2), {"dtype": torch.long}, TypeError, "dtype must be a floating-point"),
        ((4, 4, 1, 2, torch.float16), {}, TypeError, "positional"),  # dtype only by name
    ],
)
def test_bad_sizes_raise(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        PagedKVCache(*args, **kwargs)


def test_bad_appends_raise_and_leave_the_cache_unchanged():
    cache = PagedKVCache(4, 4, num_kv_heads=2, head_dim=3)
    with pytest.raises(TypeError, match="key must be a floating-point tensor"):
        cache.append("a", torch.zeros(2, 1, 3, dtype=torch.long), torch.zeros(2, 1, 3))
    with pytest.raises(TypeError, match="value must be a torch.Tensor"):
        cache.append("a", torch.zeros(2, 1, 3), [[0.0]])
    with pytest.raises(TypeError, match="seq_id must be hashable, got list"):
        cache.append(["a"], torch.zeros(2, 1, 3), torch.zeros(2, 1, 3))
    with pytest.raises(ValueError, match="length must be >= 0"):
        cache.blocks_needed(-1)
    assert cache.block_tables == {} and cache.num_free_blocks == 4


def test_an_empty_append_allocates_nothing():
    cache = PagedKVCache(4, 4, num_kv_heads=2, head_dim=3)
    cache.append("a", torch.zeros(2, 0, 3), torch.zeros(2, 0, 3))
    k, v = cache.gather("a")
    assert k.shape == v.shape == (2, 0, 3) and cache.num_used_blocks == 0


def test_pool_and_gather_follow_the_device_and_dtype(device):
    gen = torch.Generator().manual_seed(5)
    cache = PagedKVCache(8, 3, num_kv_heads=2, head_dim=4, dtype=torch.float64, device=device)
    k, v = (torch.randn(2, 7, 4, generator=gen, dtype=torch.float64).to(device) for _ in range(2))
    cache.append("a", k[:, :5], v[:, :5])
    cache.append("b", k[:, :1], v[:, :1])  # interleaved: a's blocks are not contiguous
    cache.append("a", k[:, 5:], v[:, 5:])
    got_k, got_v = cache.gather("a")
    assert got_k.device == k.device and got_k.dtype == torch.float64
    assert torch.equal(got_k, k) and torch.equal(got_v, v)
