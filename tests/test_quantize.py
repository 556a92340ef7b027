"""int8 quantisation: the round-trip error bound and the exact memory it takes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.quantize import QMAX, quantize_int8


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    magnitude=st.sampled_from([1e-3, 1.0, 30.0, 1e4]),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32]),
)
def test_round_trip_error_is_at_most_half_a_step(shape, magnitude, seed, dtype):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * magnitude
    q = quantize_int8(x, dim=-1, scale_dtype=dtype)
    assert q.values.dtype == torch.int8 and q.values.shape == x.shape
    assert q.scale.shape == x.shape[:-1] + (1,)
    err = (q.dequantize() - x).abs()
    bound = q.scale.float() / 2
    # float32 arithmetic in x / scale and q * scale adds a few ulps of x on top of half a step
    assert (err <= bound + 1e-6 * x.abs().amax(-1, keepdim=True)).all()
    assert int(q.values.abs().max()) <= QMAX


def test_the_largest_entry_of_each_slice_uses_the_full_range():
    x = torch.tensor([[0.5, -2.0, 1.0], [3.0, 0.0, -1.5]])
    q = quantize_int8(x, dim=-1, scale_dtype=torch.float32)
    assert q.values.abs().amax(-1).tolist() == [QMAX, QMAX]
    assert torch.allclose(q.scale.squeeze(-1), torch.tensor([2.0, 3.0]) / QMAX)


@pytest.mark.parametrize("magnitude", [1e-30, 1e-9, 1e-6, 1.0, 1e6, 1e30])
def test_default_scales_keep_the_full_range_at_every_magnitude(magnitude):
    # bfloat16 scales have float32's exponent range: with float16 scales (smallest 6e-8) a row
    # of magnitude 1e-6 mapped its largest entry to 17, and 1e-9 to 0.
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * magnitude
    q = quantize_int8(x)
    assert q.scale.dtype == torch.bfloat16
    # the scale is rounded up to a bfloat16 (8-bit mantissa): at most 2**-7 above absmax / 127
    assert (q.values.abs().amax(-1) >= QMAX / (1 + 2**-7) - 0.5).all()
    assert ((q.dequantize() - x).abs() <= q.scale.float() / 2 + 1e-6 * x.abs().amax()).all()


def test_zero_slices_round_trip_exactly():
    x = torch.zeros(2, 3, 4)
    q = quantize_int8(x)
    assert torch.equal(q.dequantize(), x)


def test_memory_is_one_byte_per_value_plus_the_scales():
    B, h, S, d_k = 2, 4, 10, 16
    q = quantize_int8(torch.randn(B, h, S, d_k), dim=-1)  # bfloat16 scales: 2 bytes per (B, h, S)
    assert q.nbytes == B * h * S * d_k * 1 + B * h * S * 2


def test_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_int8(torch.arange(4))
    with pytest.raises(ValueError, match="not finite"):
        quantize_int8(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="does not fit"):
        quantize_int8(torch.tensor([1e9, 1.0]), scale_dtype=torch.float16)


@pytest.mark.parametrize(
    "args, kwargs, error, match",
    [
        (([1.0, 2.0],), {}, TypeError, "x must be a torch.Tensor"),
        ((torch.tensor(1.0),), {}, ValueError, "x must have at least one dimension"),
        (
            (torch.zeros(2, 3),),
            {"dim": 2},
            ValueError,
            r"dim must be in \[-2, 2\).*\(2, 3\), got 2",
        ),
        ((torch.zeros(2, 3),), {"dim": -3}, ValueError, "dim must be in"),
        ((torch.zeros(2, 3),), {"dim": 1.0}, TypeError, "dim must be an int"),
        (
            (torch.zeros(2, 3),),
            {"scale_dtype": torch.int8},
            TypeError,
            "scale_dtype must be a floating-point",
        ),
        ((torch.tensor([1.0, float("nan")]),), {}, ValueError, "x must be finite"),
    ],
)
def test_each_bad_argument_gets_a_clear_error(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        quantize_int8(*args, **kwargs)


def test_int8_tensor_checks_its_parts():
    from minitransformer.quantize import Int8Tensor

    values = torch.zeros(2, 3, dtype=torch.int8)
    with pytest.raises(TypeError, match="values must be an int8 tensor, got dtype torch.int64"):
        Int8Tensor(values.long(), torch.ones(2, 1))
    with pytest.raises(TypeError, match="scale must be a floating-point tensor"):
        Int8Tensor(values, torch.ones(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="scale must have 2 dimensions"):
        Int8Tensor(values, torch.ones(2))
    with pytest.raises(ValueError, match=r"scale \(2, 2\) must have values' shape \(2, 3\)"):
        Int8Tensor(values, torch.ones(2, 2))
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        Int8Tensor(values, torch.ones(2, 1)).dequantize(torch.int32)


def test_empty_inputs_round_trip():
    no_rows = quantize_int8(torch.zeros(0, 4))
    assert no_rows.values.shape == (0, 4) and no_rows.scale.shape == (0, 1)
    empty_rows = quantize_int8(torch.zeros(3, 0))
    assert empty_rows.values.shape == (3, 0)
    assert torch.equal(empty_rows.scale, torch.ones(3, 1, dtype=torch.bfloat16))
    assert empty_rows.dequantize().shape == (3, 0)


def test_follows_the_device_of_its_input(device):
    x = torch.randn(4, 5, 16, generator=torch.Generator().manual_seed(3)).to(device)
    q = quantize_int8(x, dim=-1)
    assert q.values.device == q.scale.device == x.device
    assert q.dequantize(torch.float64).dtype == torch.float64
    assert ((q.dequantize() - x).abs() <= q.scale.float() / 2 + 1e-6).all()
    cpu = quantize_int8(x.cpu(), dim=-1)
    assert torch.equal(q.values.cpu(), cpu.values) and torch.equal(q.scale.cpu(), cpu.scale)


# --- the int8 KV cache -------------------------------------------------------------------

from minitransformer.decoding import greedy_decode  # noqa: E402
from minitransformer.kv_cache import AttentionCache, KVCache  # noqa: E402
from minitransformer.kv_memory import kv_cache_bytes  # noqa: E402
from minitransformer.model import Transformer  # noqa: E402
from minitransformer.quantize import Int8AttentionCache, int8_kv_cache_bytes  # noqa: E402


def _model(seed=0, layers=2, heads=4, d_model=64):
    torch.manual_seed(seed)
    return Transformer(
        20,
        20,
        d_model=d_model,
        num_heads=heads,
        num_layers=layers,
        d_ff=128,
        dropout=0.0,
        max_len=64,
    ).eval()


def test_int8_cache_returns_what_was_appended_within_half_a_step():
    gen = torch.Generator().manual_seed(0)
    cache, reference = Int8AttentionCache(max_len=3), AttentionCache(max_len=3)
    for _ in range(5):  # outgrows the capacity: the int8 buffers and the scales double together
        k, v = torch.randn(2, 4, 1, 16, generator=gen), torch.randn(2, 4, 1, 16, generator=gen)
        got_k, got_v = cache.update(k, v)
        want_k, want_v = reference.update(k, v)
    assert cache.keys.dtype == torch.int8 and got_k.dtype == torch.float32
    for got, want, scales in (
        (got_k, want_k, cache.key_scales),
        (got_v, want_v, cache.value_scales),
    ):
        step = scales[:, :, : cache.length].float()
        assert ((got - want).abs() <= step / 2 + 1e-6).all()


def test_int8_cache_memory_is_exactly_one_byte_per_element_plus_the_scales():
    model, B, steps = _model(), 3, 12
    cache = KVCache.for_model(model, steps, Int8AttentionCache)
    memory = model.encode(torch.randint(3, 20, (B, 7)))
    with torch.no_grad():
        for t in range(steps):
            model.decode(torch.full((B, 1), 1 + t % 5), memory, cache=cache)
    layers, heads, head_dim = 2, 4, 16
    values = kv_cache_bytes(layers, heads, head_dim, steps, batch_size=B, bytes_per_element=1)
    scales = 2 * layers * B * heads * steps * 2  # K and V, one bfloat16 scale per position and head
    assert cache.self_attn_nbytes == values + scales
    assert int8_kv_cache_bytes(layers, heads, head_dim, steps, batch_size=B) == values + scales
    fp32 = KVCache.for_model(model, steps)
    with torch.no_grad():
        for t in range(steps):
            model.decode(torch.full((B, 1), 1 + t % 5), memory, cache=fp32)
    assert fp32.self_attn_nbytes == kv_cache_bytes(
        layers, heads, head_dim, steps, B, bytes_per_element=4
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_int8_cache_decodes_like_the_float_cache(seed):
    model = _model(seed)
    src = torch.randint(3, 20, (4, 9), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = greedy_decode(model, src, 16, bos_id=1, eos_id=None)
        int8 = greedy_decode(model, src, 16, bos_id=1, eos_id=None, cache_cls=Int8AttentionCache)
    # A random model's logits are close together, so a rare flip is possible in principle;
    # on these seeded cases the tokens agree exactly.
    assert torch.equal(full, int8)


def test_int8_cache_in_beam_search():
    from minitransformer.decoding import beam_search

    model = _model(1)
    src = torch.randint(3, 20, (3, 9), generator=torch.Generator().manual_seed(1))
    full = beam_search(model, src, 12, bos_id=1, eos_id=2, beam_size=3)
    int8 = beam_search(
        model, src, 12, bos_id=1, eos_id=2, beam_size=3, cache_cls=Int8AttentionCache
    )
    assert torch.equal(full, int8)  # as above: seeded cases without near-ties
