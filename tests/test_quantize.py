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
    dtype=st.sampled_from([torch.float16, torch.float32]),
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


def test_zero_slices_round_trip_exactly():
    x = torch.zeros(2, 3, 4)
    q = quantize_int8(x)
    assert torch.equal(q.dequantize(), x)


def test_memory_is_one_byte_per_value_plus_the_scales():
    B, h, S, d_k = 2, 4, 10, 16
    q = quantize_int8(torch.randn(B, h, S, d_k), dim=-1)  # float16 scales: 2 bytes per (B, h, S)
    assert q.nbytes == B * h * S * d_k * 1 + B * h * S * 2


def test_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        quantize_int8(torch.arange(4))
    with pytest.raises(ValueError, match="not finite"):
        quantize_int8(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="does not fit"):
        quantize_int8(torch.tensor([1e9, 1.0]), scale_dtype=torch.float16)
