"""Tests for the single-head part of ``minitransformer.attention`` (and additive attention).

``scaled_dot_product_attention``, ``causal_mask`` and ``padding_mask`` are compared with
:func:`torch.nn.functional.scaled_dot_product_attention` (an independent implementation) and
with a float64 formula written out here, and their properties are checked with hypothesis:
rows of weights sum to one, keys and values can be permuted together, the causal mask makes
position t blind to later tokens, extreme scores stay finite, fully masked rows give zeros.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.attention import (
    AdditiveAttention,
    additive_attention,
    causal_mask,
    padding_mask,
    scaled_dot_product_attention,
)

SETTINGS = settings(max_examples=30, deadline=None)


# --------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------


def reference_weights(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d_k)) in float64 with -inf masking; fully masked rows -> 0."""
    scores = q.double() @ k.double().transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    return torch.nan_to_num(w, nan=0.0)  # a fully masked row is 0/0 = NaN: make it 0


@st.composite
def attention_case(draw, with_mask: bool | None = None):
    """Random shapes: up to two batch dims (each of q/k/v may have size 1 there, to test
    broadcasting), T, S, d_k, d_v in small ranges, and a random boolean mask whose shape is
    one of the broadcastable forms (T, S), (1, S), (T, 1), (..., T, S), (..., 1, S)."""
    n_batch = draw(st.integers(0, 2))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=n_batch, max_size=n_batch)))
    T, S = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    d_k, d_v = draw(st.integers(1, 8)), draw(st.integers(1, 8))

    def maybe_broadcast(shape):  # replace some batch sizes by 1
        return tuple(1 if draw(st.booleans()) else b for b in shape)

    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*maybe_broadcast(batch), T, d_k, generator=gen)
    k = torch.randn(*maybe_broadcast(batch), S, d_k, generator=gen)
    v = torch.randn(*maybe_broadcast(batch), S, d_v, generator=gen)
    q, k = q * draw(st.sampled_from([0.5, 1.0, 3.0])), k  # different score ranges

    use_mask = draw(st.booleans()) if with_mask is None else with_mask
    mask = None
    # The mask may broadcast up to the batch shape of q, k, v, but not beyond it.
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if use_mask:
        form = draw(st.sampled_from(["TS", "1S", "T1", "full", "batch1S"]))
        shape = {
            "TS": (T, S),
            "1S": (1, S),
            "T1": (T, 1),
            "full": batch + (T, S),
            "batch1S": maybe_broadcast(batch) + (1, S),
        }[form]
        p = draw(st.sampled_from([0.2, 0.5, 0.8]))
        mask = torch.rand(*shape, generator=gen) < p
    return q, k, v, mask


# --------------------------------------------------------------------------------------
# Reference equality
# --------------------------------------------------------------------------------------


@SETTINGS
@given(attention_case())
def test_matches_torch_sdpa(case):
    """Output equals torch.nn.functional.scaled_dot_product_attention (float32, atol 1e-5),
    including rows whose keys are all masked (torch returns zeros there too)."""
    q, k, v, mask = case
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    qe = q.expand(*batch, *q.shape[-2:])
    ke = k.expand(*batch, *k.shape[-2:])
    ve = v.expand(*batch, *v.shape[-2:])
    want = F.scaled_dot_product_attention(qe, ke, ve, attn_mask=mask)
    assert out.shape == batch + (q.shape[-2], v.shape[-1])
    full = batch + (q.shape[-2], k.shape[-2])
    assert torch.broadcast_shapes(weights.shape, full) == full  # (..., T, S), maybe unexpanded
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        weights.expand(full), reference_weights(qe, ke, mask).float(), atol=1e-5, rtol=1e-4
    )


def test_matches_torch_sdpa_causal_flag():
    """causal_mask(T) gives what torch computes with is_causal=True."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen) for _ in range(3))
    out, _ = scaled_dot_product_attention(q, k, v, causal_mask(7))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-4)


def test_formula_by_hand():
    """A 2-token example small enough to do on paper: weights = softmax(q.k / sqrt(2))."""
    q = torch.tensor([[1.0, 0.0]])
    k = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    v = torch.tensor([[10.0], [20.0]])
    out, w = scaled_dot_product_attention(q, k, v)
    a = math.exp(1 / math.sqrt(2))
    w0, w1 = a / (a + 1), 1 / (a + 1)
    torch.testing.assert_close(w, torch.tensor([[w0, w1]]))
    torch.testing.assert_close(out, torch.tensor([[10 * w0 + 20 * w1]]))


def test_gradients_match_torch_and_gradcheck():
    """Backward pass: float64 gradcheck, and gradients equal to torch's (with a mask that
    fully masks one row: no NaN may leak into the gradients)."""
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 5, 3, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 5, 2, generator=gen, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 4, 5, generator=gen) < 0.6
    mask[0, 1] = False  # one fully masked row
    mask[:, :, 0] |= torch.tensor([False, True, True, True])  # the other rows see something
    assert torch.autograd.gradcheck(
        lambda q, k, v: scaled_dot_product_attention(q, k, v, mask)[0], (q, k, v)
    )
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out2 = F.scaled_dot_product_attention(q2, k2, v2, attn_mask=mask)
    grads2 = torch.autograd.grad(out2.sum(), (q2, k2, v2))
    for g, g2 in zip(grads, grads2, strict=False):
        assert torch.isfinite(g).all()
        torch.testing.assert_close(g, g2)


# --------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------


@SETTINGS
@given(attention_case())
def test_rows_sum_to_one(case):
    """Every row of the weights sums to one, except fully masked rows, which are all zero;
    masked entries get exactly zero weight."""
    q, k, v, mask = case
    _, w = scaled_dot_product_attention(q, k, v, mask)
    assert (w >= 0).all()
    sums = w.sum(-1)
    if mask is None:
        torch.testing.assert_close(sums, torch.ones_like(sums))
    else:
        m = mask.expand_as(w)
        visible = m.any(-1)
        torch.testing.assert_close(sums[visible], torch.ones_like(sums[visible]))
        assert (sums[~visible] == 0).all()
        assert (w[~m] == 0).all()


@SETTINGS
@given(attention_case(), st.randoms(use_true_random=False))
def test_permuting_keys_and_values_together_changes_nothing(case, rnd):
    """Attention is a weighted *set* operation over the S keys: permuting key/value rows
    (and the mask columns) together leaves the output unchanged and permutes the weights."""
    q, k, v, mask = case
    S = k.shape[-2]
    perm = list(range(S))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    out, w = scaled_dot_product_attention(q, k, v, mask)
    pmask = mask if mask is None or mask.shape[-1] == 1 else mask[..., perm]
    out_p, w_p = scaled_dot_product_attention(q, k[..., perm, :], v[..., perm, :], pmask)
    torch.testing.assert_close(out_p, out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(w_p, w[..., perm], atol=1e-6, rtol=1e-5)


@SETTINGS
@given(attention_case(with_mask=False), st.randoms(use_true_random=False))
def test_permuting_queries_permutes_outputs(case, rnd):
    """Each query row is answered independently: permuting the queries permutes the output."""
    q, k, v, _ = case
    perm = list(range(q.shape[-2]))
    rnd.shuffle(perm)
    perm = torch.tensor(perm)
    out, _ = scaled_dot_product_attention(q, k, v)
    out_p, _ = scaled_dot_product_attention(q[..., perm, :], k, v)
    torch.testing.assert_close(out_p, out[..., perm, :], atol=1e-6, rtol=1e-5)


@SETTINGS
@given(st.integers(1, 8), st.integers(0, 7), st.integers(0, 2**31 - 1))
def test_causal_mask_hides_the_future(T, t, seed):
    """Self-attention with the causal mask: changing the tokens after position t leaves the
    outputs at positions 0..t unchanged (and does change later ones, generically)."""
    t = min(t, T - 1)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, 4, generator=gen)
    w_q, w_k, w_v = (torch.randn(4, 4, generator=gen) for _ in range(3))

    def self_attention(x):
        return scaled_dot_product_attention(x @ w_q, x @ w_k, x @ w_v, causal_mask(T))[0]

    y = x.clone()
    y[:, t + 1 :] = torch.randn(2, T - t - 1, 4, generator=gen) * 5
    out_x, out_y = self_attention(x), self_attention(y)
    torch.testing.assert_close(out_y[:, : t + 1], out_x[:, : t + 1], atol=0, rtol=0)
    if t + 1 < T:
        assert not torch.allclose(out_y[:, t + 1 :], out_x[:, t + 1 :])


@SETTINGS
@given(attention_case(with_mask=False), st.floats(0.1, 10.0))
def test_scale_moves_between_query_and_key(case, c):
    """Only q.k matters: multiplying queries by c and dividing keys by c changes nothing."""
    q, k, v, _ = case
    out, w = scaled_dot_product_attention(q, k, v)
    out_c, w_c = scaled_dot_product_attention(q * c, k / c, v)
    torch.testing.assert_close(w_c, w, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_c, out, atol=1e-5, rtol=1e-4)


def test_uses_one_over_sqrt_dk():
    """The scaling is 1/sqrt(d_k) with d_k = query.shape[-1], not 1/d_k and not none."""
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(3, 16, generator=gen), torch.randn(5, 16, generator=gen)
    _, w = scaled_dot_product_attention(q, k, torch.randn(5, 2, generator=gen))
    torch.testing.assert_close(w, torch.softmax(q @ k.T / 4.0, dim=-1))


# --------------------------------------------------------------------------------------
# Extremes and dtypes
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scores_around_1e4_stay_finite(dtype):
    """Scores of order 1e4 (exp would overflow) give finite, correct, one-hot-like weights."""
    gen = torch.Generator().manual_seed(3)
    d_k = 16
    q = torch.randn(2, 3, d_k, generator=gen, dtype=dtype)
    k = torch.randn(2, 4, d_k, generator=gen, dtype=dtype)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    q = q * (1e4 / scores.abs().max())  # now the largest |score| is 1e4
    v = torch.randn(2, 4, 5, generator=gen, dtype=dtype)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)
    assert 0.99e4 < scores.abs().max() < 1.01e4 and not torch.isfinite(scores.exp()).all()
    out, w = scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    torch.testing.assert_close(w, reference_weights(q, k, None).to(dtype))
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, dtype=dtype))


def test_float64_matches_torch_to_1e_12():
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 5, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, 6, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, 6, 4, generator=gen, dtype=torch.float64)
    mask = torch.rand(5, 6, generator=gen) < 0.7
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert out.dtype == w.dtype == torch.float64
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize(
    "dtype, atol",
    [(torch.float16, 2e-3), (torch.bfloat16, 2e-2)],  # eps(fp16) ~ 1e-3, eps(bf16) ~ 8e-3
)
def test_half_precision_at_its_tolerance(dtype, atol):
    """float16/bfloat16 agree with the float64 result to their own precision, keep their
    dtype, and stay finite for large scores (score ~ 1e4 with d_k = 64: the unscaled q.k is
    8e4, beyond float16's maximum of 65504, so the scaling must come before the product)."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 64, generator=gen)
    k = torch.randn(2, 6, 64, generator=gen)
    v = torch.randn(2, 6, 8, generator=gen)
    mask = causal_mask(6)[-4:]  # (4, 6), every row sees something
    out, w = scaled_dot_product_attention(q.to(dtype), k.to(dtype), v.to(dtype), mask)
    assert out.dtype == w.dtype == dtype
    want_w = reference_weights(q.to(dtype), k.to(dtype), mask)
    torch.testing.assert_close(w.double(), want_w, atol=atol, rtol=0)
    torch.testing.assert_close(out.double(), want_w @ v.to(dtype).double(), atol=4 * atol, rtol=0)

    big_q = torch.zeros(1, 64, dtype=dtype)
    big_q[0, 0] = 200.0
    big_k = torch.zeros(3, 64, dtype=dtype)
    big_k[:, 0] = torch.tensor([400.0, 200.0, -400.0])  # scores 1e4, 5e3, -1e4
    out, w = scaled_dot_product_attention(big_q, big_k, torch.eye(3, dtype=dtype))
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
    assert w.tolist() == [[1.0, 0.0, 0.0]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("S", [64, 1024])
def test_half_precision_is_as_accurate_as_torchs_attention(dtype, S):
    """Against the exact (float64) attention of the same rounded inputs, the output's error is
    at most torch's own in that dtype, times 1.5 plus one unit in the last place: the scores,
    softmax and sum are taken in float32, as torch's CPU kernel does, so that what is left is
    the rounding of the result. The weights are the float32 weights rounded once."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(2, 4, n, 64, generator=gen).to(dtype) for n in (128, S, S))
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    torch_error = (F.scaled_dot_product_attention(q, k, v).double() - exact).abs().max().item()
    out, w = scaled_dot_product_attention(q, k, v)
    assert out.dtype == w.dtype == dtype
    ulp = torch.finfo(dtype).eps * exact.abs().max().item()
    assert (out.double() - exact).abs().max().item() <= 1.5 * torch_error + ulp
    exact_w = reference_weights(q, k, None)
    assert (w.double() - exact_w).abs().max().item() <= torch.finfo(dtype).eps


# --------------------------------------------------------------------------------------
# Masks
# --------------------------------------------------------------------------------------


def test_fully_masked_row_gives_zeros():
    gen = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(3, 4, generator=gen), torch.randn(5, 4, generator=gen), torch.randn(5, 2)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1] = False
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert (w[1] == 0).all() and (out[1] == 0).all()
    assert torch.isfinite(out).all()
    torch.testing.assert_close(w[[0, 2]].sum(-1), torch.ones(2))
    # Everything masked: all zeros, no NaN.
    out, w = scaled_dot_product_attention(q, k, v, torch.zeros(3, 5, dtype=torch.bool))
    assert (out == 0).all() and (w == 0).all()


def test_masked_keys_get_exactly_zero_weight_and_do_not_matter():
    """Changing the value (or key) of a masked position leaves the output exactly unchanged."""
    gen = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 5, 4), torch.randn(2, 5, 3)
    mask = padding_mask(torch.tensor([3, 5]), 5)[:, 0]  # (B, 1, S): batch 0 hides keys 3, 4
    out, w = scaled_dot_product_attention(q, k, v, mask)
    assert (w[0, :, 3:] == 0).all()
    k2, v2 = k.clone(), v.clone()
    k2[0, 3:] = 1e3
    v2[0, 3:] = -1e3
    out2, _ = scaled_dot_product_attention(q, k2, v2, mask)
    assert torch.equal(out2[0], out[0])


def test_causal_mask_values():
    m = causal_mask(4)
    assert m.dtype == torch.bool and m.shape == (4, 4)
    assert m.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]
    assert causal_mask(0).shape == (0, 0)
    assert causal_mask(torch.tensor(3)).shape == (3, 3)  # a 0-d integer tensor is fine


def test_padding_mask_values_and_combination():
    m = padding_mask(torch.tensor([2, 4, 0]), 4)
    assert m.dtype == torch.bool and m.shape == (3, 1, 1, 4)
    assert m[:, 0, 0].tolist() == [
        [True, True, False, False],
        [True, True, True, True],
        [False, False, False, False],
    ]
    assert torch.equal(padding_mask([2, 4, 0], 4), m)  # a list works too
    both = padding_mask(torch.tensor([2, 4, 0]), 4) & causal_mask(4)
    assert both.shape == (3, 1, 4, 4)
    assert both[0, 0].tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, False, False],
        [True, True, False, False],
    ]
    # Used on (B, h, T, S) scores: padded keys get no weight, the empty sequence gives zeros.
    q, k, v = torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 8), torch.randn(3, 2, 4, 5)
    out, w = scaled_dot_product_attention(q, k, v, both)
    assert (w[0, :, :, 2:] == 0).all()
    assert (out[2] == 0).all()
    torch.testing.assert_close(w[1].sum(-1), torch.ones(2, 4))


# --------------------------------------------------------------------------------------
# Bad input: each case raises the error the docstring promises, naming the shapes
# --------------------------------------------------------------------------------------

Q, K, V = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)


@pytest.mark.parametrize(
    "args, error, message",
    [
        (
            (Q, torch.randn(2, 5, 3), V),
            ValueError,
            r"query \(\.\.\., T, d_k\) = \(2, 3, 4\) and key .*\(2, 5, 3\) must have the same d_k",
        ),
        (
            (Q, K, torch.randn(2, 4, 6)),
            ValueError,
            r"key .*\(2, 5, 4\) and value .*\(2, 4, 6\) must have the same length S",
        ),
        ((torch.randn(4), K, V), ValueError, r"at least 2 dimensions .*query \(4,\)"),
        (
            (torch.randn(3, 3, 4), K, V),
            ValueError,
            r"batch\) dimensions .* do not broadcast: query \(3, 3, 4\)",
        ),
        (
            (Q, K, V.double()),
            ValueError,
            r"same dtype, got torch.float32, torch.float32 and torch.float64",
        ),
        (
            (Q.long(), K, V),
            TypeError,
            r"query must be a floating-point tensor, got dtype torch.int64",
        ),
        ((Q.tolist(), K, V), TypeError, r"query must be a torch.Tensor, got list"),
        (
            (torch.randn(2, 3, 0), torch.randn(2, 5, 0), V),
            ValueError,
            r"d_k >= 1 features, got query \(2, 3, 0\) and key \(2, 5, 0\)",
        ),
    ],
    ids=["d_k", "S", "ndim", "batch", "dtype", "integer", "not-a-tensor", "d_k-zero"],
)
def test_bad_inputs(args, error, message):
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(*args)


@pytest.mark.parametrize(
    "mask, error, message",
    [
        (
            torch.ones(3, 4, dtype=torch.bool),
            ValueError,
            r"mask of shape \(3, 4\) does not broadcast to the score shape "
            r"\(\.\.\., T, S\) = \(2, 3, 5\) of query \(2, 3, 4\) and key \(2, 5, 4\)",
        ),
        (
            torch.ones(5, 3, dtype=torch.bool),
            ValueError,
            r"mask of shape \(5, 3\) does not broadcast",
        ),  # transposed
        # A (B, 1, 1, S) padding mask with 3-D inputs would broadcast to (B, B, T, S): refused.
        (
            torch.ones(2, 1, 1, 5, dtype=torch.bool),
            ValueError,
            r"mask of shape \(2, 1, 1, 5\) does not broadcast",
        ),
        (torch.zeros(3, 5), TypeError, r"mask must be a boolean tensor .* got dtype torch.float32"),
        (torch.ones(3, 5, dtype=torch.long), TypeError, r"boolean tensor .* got dtype torch.int64"),
        ([[True] * 5] * 3, TypeError, r"mask must be a torch.Tensor, got list"),
    ],
    ids=["wrong-S", "transposed", "extra-dims", "float", "int", "list"],
)
def test_bad_masks(mask, error, message):
    with pytest.raises(error, match=message):
        scaled_dot_product_attention(Q, K, V, mask)


def test_bad_mask_arguments():
    with pytest.raises(ValueError, match="size must be >= 0, got -1"):
        causal_mask(-1)
    with pytest.raises(TypeError, match="size must be an int, got float"):
        causal_mask(3.0)
    with pytest.raises(
        ValueError, match=r"lengths must have 1 dimensions \(B,\), got shape \(2, 1\)"
    ):
        padding_mask(torch.tensor([[1], [2]]), 3)
    with pytest.raises(ValueError, match=r"lengths \[1, 4\] must lie in \[0, max_len=3\]"):
        padding_mask(torch.tensor([1, 4]), 3)
    with pytest.raises(ValueError, match=r"lengths \[-1, 2\] must lie in"):
        padding_mask(torch.tensor([-1, 2]), 3)
    with pytest.raises(
        TypeError, match="lengths must be an integer tensor, got dtype torch.float32"
    ):
        padding_mask(torch.tensor([1.0, 2.0]), 3)
    with pytest.raises(TypeError, match="max_len must be an int, got float"):
        padding_mask(torch.tensor([1, 2]), 3.0)
    with pytest.raises(ValueError, match="max_len must be >= 0, got -2"):
        padding_mask(torch.tensor([], dtype=torch.long), -2)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 3), max_size=4), min_size=1, max_size=3))
def test_broadcast_helper_agrees_with_torch_broadcast_shapes(shapes):
    """The plain-Python check used in the hot path gives torch's answer (None = error)."""
    from minitransformer.attention import _broadcast_shape

    try:
        want = tuple(torch.broadcast_shapes(*map(tuple, shapes)))
    except RuntimeError:
        want = None
    assert _broadcast_shape(*map(tuple, shapes)) == want


# --------------------------------------------------------------------------------------
# In-place masking, dropout, empty inputs
# --------------------------------------------------------------------------------------


def test_in_place_path_without_gradient_equals_the_autograd_path():
    """Without a gradient the scores are masked and softmaxed in place; the results must be
    those of the out-of-place path, fully masked rows and broadcast masks included."""
    gen = torch.Generator().manual_seed(8)
    q, k, v = (
        torch.randn(2, 3, 4, 6, generator=gen),
        torch.randn(2, 3, 5, 6),
        torch.randn(2, 3, 5, 2),
    )
    mask = torch.rand(2, 1, 4, 5, generator=gen) < 0.5
    mask[0, 0, 1] = False  # a fully masked row
    with torch.no_grad():
        out, w = scaled_dot_product_attention(q, k, v, mask)
    q.requires_grad_()
    out_g, w_g = scaled_dot_product_attention(q, k, v, mask)
    assert w_g.requires_grad
    assert torch.equal(out, out_g.detach()) and torch.equal(w, w_g.detach())
    assert (w[0, :, 1] == 0).all() and (out[0, :, 1] == 0).all()


def test_a_mask_wider_than_the_scores_broadcasts_with_the_value_batch():
    """Query and key shared over a batch that only the values (and the mask) have: the
    (1, T, S) scores cannot hold the (3, T, S) mask in place, so masking goes out of place."""
    gen = torch.Generator().manual_seed(9)
    q, k, v = torch.randn(1, 4, 3, generator=gen), torch.randn(1, 5, 3), torch.randn(3, 5, 2)
    mask = torch.rand(3, 4, 5, generator=gen) < 0.6
    mask[1, 2] = False
    with torch.no_grad():
        out, w = scaled_dot_product_attention(q, k, v, mask)
    want = F.scaled_dot_product_attention(q.expand(3, 4, 3), k.expand(3, 5, 3), v, attn_mask=mask)
    torch.testing.assert_close(out, want, atol=1e-6, rtol=1e-5)
    assert w.shape == (3, 4, 5) and (w[1, 2] == 0).all()


def test_dropout_acts_on_the_weights_once_and_the_output_uses_them():
    gen = torch.Generator().manual_seed(10)
    q, k, v = torch.randn(2, 6, 4, generator=gen), torch.randn(2, 7, 4), torch.randn(2, 7, 3)
    _, plain = scaled_dot_product_attention(q, k, v)
    torch.manual_seed(0)
    out, dropped = scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    kept = dropped != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(dropped[kept], 2 * plain[kept])  # survivors scaled by 1 / (1 - p)
    torch.testing.assert_close(out, dropped @ v)
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:  # Q K^T and weights V: two products only
        scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert counter.get_total_flops() == 2 * 2 * (6 * 7 * 4 + 6 * 7 * 3)
    for bad in (1.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="dropout_p"):
            scaled_dot_product_attention(q, k, v, dropout_p=bad)


def test_empty_inputs_give_empty_or_zero_outputs():
    """S = 0: every query row sees no key, so (as for a fully masked row) the output is 0;
    T = 0 and B = 0 give empty outputs of the documented shapes."""
    q = torch.randn(2, 3, 4)
    out, w = scaled_dot_product_attention(q, torch.randn(2, 0, 4), torch.randn(2, 0, 5))
    assert out.shape == (2, 3, 5) and w.shape == (2, 3, 0) and (out == 0).all()
    out, w = scaled_dot_product_attention(
        torch.randn(2, 0, 4), torch.randn(2, 3, 4), torch.randn(2, 3, 5)
    )
    assert out.shape == (2, 0, 5) and w.shape == (2, 0, 3)
    out, w = scaled_dot_product_attention(
        torch.randn(0, 3, 4), torch.randn(0, 3, 4), torch.randn(0, 3, 5)
    )
    assert out.shape == (0, 3, 5) and w.shape == (0, 3, 3)


# --------------------------------------------------------------------------------------
# Additive (Bahdanau) attention
# --------------------------------------------------------------------------------------


def additive_case(seed: int = 0, batch: tuple[int, ...] = (2,), T=3, S=5, d_q=4, d_k=6, d_a=7):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, T, d_q, generator=gen, dtype=torch.float64)
    k = torch.randn(*batch, S, d_k, generator=gen, dtype=torch.float64)
    v = torch.randn(*batch, S, 2, generator=gen, dtype=torch.float64)
    w_q = torch.randn(d_q, d_a, generator=gen, dtype=torch.float64) / math.sqrt(d_q)
    w_k = torch.randn(d_k, d_a, generator=gen, dtype=torch.float64) / math.sqrt(d_k)
    w_s = torch.randn(d_a, generator=gen, dtype=torch.float64)
    return q, k, v, w_q, w_k, w_s


def additive_reference(q, k, v, w_q, w_k, w_s, mask=None):
    """The formula written out, one (query, key) pair at a time, in float64."""
    T, S = q.shape[-2], k.shape[-2]
    scores = torch.empty(*q.shape[:-2], T, S, dtype=torch.float64)
    for t in range(T):
        for s in range(S):
            hidden = torch.tanh(q[..., t, :] @ w_q + k[..., s, :] @ w_k)  # (..., d_a)
            scores[..., t, s] = hidden @ w_s
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.nan_to_num(torch.softmax(scores, dim=-1), nan=0.0)
    return weights @ v, weights


@pytest.mark.parametrize("seed", range(3))
def test_additive_attention_matches_the_formula(seed):
    case = additive_case(seed)
    out, w = additive_attention(*case)
    want_out, want_w = additive_reference(*case)
    # float64, O(1) values, a handful of operations per entry: rounding error ~1e-15.
    torch.testing.assert_close(w, want_w, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, dtype=torch.float64))


def test_additive_attention_masks_and_fully_masked_rows():
    case = additive_case(1)
    mask = torch.tensor(
        [[True, True, False, False, True], [False] * 5, [True, False, False, False, False]]
    )  # (T, S); query 1 sees nothing
    out, w = additive_attention(*case, mask)
    want_out, want_w = additive_reference(*case, mask)
    torch.testing.assert_close(w, want_w, rtol=0, atol=1e-12)
    torch.testing.assert_close(out, want_out, rtol=0, atol=1e-12)
    assert (w[:, ~mask] == 0).all()
    assert (w[:, 1] == 0).all() and (out[:, 1] == 0).all()
    assert (w[:, 2, 0] == 1).all()


def test_additive_attention_broadcasts_batch_dims_and_takes_gradients():
    q, k, v, w_q, w_k, w_s = additive_case(2, batch=(2, 1))
    k = k.expand(2, 3, *k.shape[-2:])  # (2, 3, S, d_k)
    out, w = additive_attention(q, k, v, w_q, w_k, w_s)
    assert out.shape == (2, 3, 3, 2) and w.shape == (2, 3, 3, 5)
    small = additive_case(3, batch=(), T=2, S=3, d_q=2, d_k=3, d_a=2)
    small = tuple(x.clone().requires_grad_() for x in small)
    assert torch.autograd.gradcheck(lambda *xs: additive_attention(*xs)[0], small)


def test_additive_attention_module_is_the_function_with_its_weights():
    torch.manual_seed(0)
    layer = AdditiveAttention(4, 6, 8).double()
    q, k, v, *_ = additive_case(4)
    mask = torch.ones(3, 5, dtype=torch.bool).tril()
    got = layer(q, k, v, mask)
    want = additive_attention(
        q, k, v, layer.w_query.weight.T, layer.w_key.weight.T, layer.w_score.weight[0], mask
    )
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert "hidden_dim=8" in repr(layer)
    # PyTorch's default initialisation: variance 1 / (3 fan_in), uniform within 1/sqrt(fan_in).
    assert layer.w_key.weight.abs().max() <= 1 / math.sqrt(6)
    got[0].sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layer.parameters())


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"query": [[1.0]]}, TypeError, "query must be a torch.Tensor"),
        ({"key": torch.ones(2, 5, 6, dtype=torch.long)}, TypeError, "key must be a floating"),
        ({"w_score": torch.ones(7, 1, dtype=torch.float64)}, ValueError, "w_score must have"),
        ({"w_query": torch.ones(5, 7, dtype=torch.float64)}, ValueError, "w_query must have"),
        ({"w_key": torch.ones(6, 3, dtype=torch.float64)}, ValueError, "w_key must have"),
        ({"value": torch.ones(2, 4, 2, dtype=torch.float64)}, ValueError, "same length S"),
        ({"query": torch.ones(4, dtype=torch.float64)}, ValueError, "at least 2 dimensions"),
        ({"query": torch.ones(3, 3, 4, dtype=torch.float64)}, ValueError, "do not broadcast"),
        ({"w_score": torch.ones(7)}, ValueError, "same dtype"),
        ({"mask": torch.ones(3, 5)}, TypeError, "mask must be a boolean"),
        ({"mask": torch.ones(4, 2, 3, 5, dtype=torch.bool)}, ValueError, "does not broadcast"),
    ],
)
def test_additive_attention_bad_inputs(change, error, message):
    names = ("query", "key", "value", "w_query", "w_key", "w_score")
    kwargs = dict(zip(names, additive_case(0), strict=True))
    kwargs.update(change)
    with pytest.raises(error, match=message):
        additive_attention(**kwargs)


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((0, 4, 4), ValueError, "query_dim must be positive"),
        ((4, 4.0, 4), TypeError, "key_dim must be an int"),
        ((4, 4, -1), ValueError, "hidden_dim must be positive"),
    ],
)
def test_additive_attention_module_bad_sizes(args, error, message):
    with pytest.raises(error, match=message):
        AdditiveAttention(*args)
