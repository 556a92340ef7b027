"""Tests for minitransformer.positional (chapter "Positional encoding")."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.attention import scaled_dot_product_attention
from minitransformer.positional import (
    LearnedPositionalEmbedding,
    PositionalEncoding,
    angular_frequencies,
    rotary_embedding,
    shift_matrix,
    sinusoidal_encoding,
    wavelengths,
)

even_d = st.integers(min_value=1, max_value=64).map(lambda n: 2 * n)


# ---------------------------------------------------------------- values against the formula
def test_values_match_the_formula_at_random_positions_and_dimensions() -> None:
    gen = torch.Generator().manual_seed(0)
    d_model, P = 512, 2048
    pe = sinusoidal_encoding(P, d_model, dtype=torch.float64)
    assert pe.shape == (P, d_model)
    positions = torch.randint(0, P, (200,), generator=gen)
    dims = torch.randint(0, d_model, (200,), generator=gen)
    for pos, j in zip(positions.tolist(), dims.tolist(), strict=True):
        i = j // 2  # pair index: dimension j is 2i (sin) or 2i + 1 (cos)
        angle = pos / 10000 ** (2 * i / d_model)  # written as in the paper, with math
        want = math.sin(angle) if j % 2 == 0 else math.cos(angle)
        assert pe[pos, j].item() == pytest.approx(want, abs=1e-9), (pos, j)


def test_first_row_and_first_pair() -> None:
    pe = sinusoidal_encoding(10, 8, dtype=torch.float64)
    # Position 0: sin 0 = 0 in even dimensions, cos 0 = 1 in odd ones.
    assert torch.equal(pe[0], torch.tensor([0.0, 1.0] * 4, dtype=torch.float64))
    # Pair 0 has omega = 1: plain sin(pos), cos(pos).
    pos = torch.arange(10, dtype=torch.float64)
    torch.testing.assert_close(pe[:, 0], torch.sin(pos))
    torch.testing.assert_close(pe[:, 1], torch.cos(pos))


def test_default_dtype_and_float32_agrees_with_float64() -> None:
    pe32 = sinusoidal_encoding(100, 32)
    assert pe32.dtype == torch.get_default_dtype()
    torch.testing.assert_close(
        pe32.double(), sinusoidal_encoding(100, 32, dtype=torch.float64), atol=1e-6, rtol=0
    )


@settings(max_examples=30, deadline=None)
@given(P=st.integers(0, 300), d=even_d)
def test_range_is_within_minus_one_and_one(P: int, d: int) -> None:
    pe = sinusoidal_encoding(P, d, dtype=torch.float64)
    assert pe.shape == (P, d)
    assert bool((pe.abs() <= 1.0).all())
    # Each (sin, cos) pair lies on the unit circle, so every row has squared norm d / 2.
    torch.testing.assert_close((pe**2).sum(-1), torch.full((P,), d / 2, dtype=torch.float64))


# ---------------------------------------------------------------- wavelengths
@pytest.mark.parametrize("d_model", [2, 16, 64, 512])
def test_wavelengths_run_from_2pi_towards_10000_2pi(d_model: int) -> None:
    lam = wavelengths(d_model)
    assert lam.shape == (d_model // 2,)
    assert lam[0].item() == pytest.approx(2 * math.pi, rel=1e-12)
    ratio = 10000 ** (2 / d_model)
    # A geometric progression with ratio 10000^(2/d_model) ...
    torch.testing.assert_close(
        lam[1:] / lam[:-1], torch.full((d_model // 2 - 1,), ratio, dtype=torch.float64)
    )
    # ... whose last term is 2 pi * 10000^(1 - 2/d_model) and whose next term is 10000 * 2 pi.
    assert lam[-1].item() == pytest.approx(2 * math.pi * 10000 ** (1 - 2 / d_model), rel=1e-12)
    assert (lam[-1] * ratio).item() == pytest.approx(10000 * 2 * math.pi, rel=1e-12)
    assert bool((lam >= 2 * math.pi - 1e-12).all()) and bool((lam < 10000 * 2 * math.pi).all())


def test_wavelength_is_the_period_of_each_pair() -> None:
    d_model = 16
    omega = angular_frequencies(d_model)
    lam = wavelengths(d_model)
    torch.testing.assert_close(omega * lam, torch.full_like(omega, 2 * math.pi))
    # Pair 0 (omega = 1) returns to its value after 2 pi positions: sin(x + 2 pi) = sin(x).
    pe = sinusoidal_encoding(1, d_model, dtype=torch.float64)
    assert pe[0, 0].item() == pytest.approx(math.sin(0 + lam[0].item()), abs=1e-12)


# ---------------------------------------------------------------- the shift matrix
@settings(max_examples=50, deadline=None)
@given(pos=st.integers(0, 5000), k=st.integers(-3000, 3000), d=even_d)
def test_shift_property_pe_pos_plus_k_equals_pe_pos_times_m_k(pos: int, k: int, d: int) -> None:
    pos = max(pos, -k)  # keep pos + k >= 0
    pe = sinusoidal_encoding(pos + max(k, 0) + 1, d, dtype=torch.float64)
    M = shift_matrix(k, d)
    assert M.shape == (d, d) and M.dtype == torch.float64
    torch.testing.assert_close(pe[pos] @ M, pe[pos + k], atol=1e-9, rtol=0)


def test_shift_property_for_a_whole_table_at_once() -> None:
    d, P, k = 64, 200, 17
    pe = sinusoidal_encoding(P + k, d, dtype=torch.float64)
    torch.testing.assert_close(pe[:P] @ shift_matrix(k, d), pe[k:], atol=1e-9, rtol=0)


@settings(max_examples=30, deadline=None)
@given(j=st.integers(-500, 500), k=st.integers(-500, 500), d=even_d)
def test_shift_matrix_is_an_orthogonal_group_of_rotations(j: int, k: int, d: int) -> None:
    Mj, Mk = shift_matrix(j, d), shift_matrix(k, d)
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(Mk @ Mk.T, eye, atol=1e-12, rtol=0)  # orthogonal
    torch.testing.assert_close(Mk.T, shift_matrix(-k, d), atol=1e-12, rtol=0)  # inverse = -k
    torch.testing.assert_close(Mj @ Mk, shift_matrix(j + k, d), atol=1e-9, rtol=0)  # composes
    assert torch.linalg.det(Mk).item() == pytest.approx(1.0, abs=1e-9)  # rotation, no reflection


def test_shift_matrix_is_block_diagonal_with_2x2_rotations() -> None:
    d, k = 8, 3
    M = shift_matrix(k, d)
    omega = angular_frequencies(d)
    for i in range(d // 2):
        a = k * omega[i].item()
        block = torch.tensor(
            [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64
        )
        torch.testing.assert_close(M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2], block)
    mask = torch.block_diag(*[torch.ones(2, 2)] * (d // 2)).bool()
    assert bool((M[~mask] == 0).all())
    torch.testing.assert_close(shift_matrix(0, d), torch.eye(d, dtype=torch.float64))


# ---------------------------------------------------------------- dot products and distance
@settings(max_examples=30, deadline=None)
@given(p=st.integers(0, 2000), q=st.integers(0, 2000), k=st.integers(-300, 300), d=even_d)
def test_dot_product_depends_only_on_the_offset(p: int, q: int, k: int, d: int) -> None:
    p, q = max(p, -k), max(q, -k)
    pe = sinusoidal_encoding(max(p, q) + max(k, 0) + 1, d, dtype=torch.float64)
    dot_p = pe[p] @ pe[p + k]
    dot_q = pe[q] @ pe[q + k]
    assert dot_p.item() == pytest.approx(dot_q.item(), abs=1e-9)
    # Closed form: sum_i cos(k omega_i), symmetric in k.
    want = torch.cos(k * angular_frequencies(d)).sum()
    assert dot_p.item() == pytest.approx(want.item(), abs=1e-9)


def test_dot_product_is_largest_at_offset_zero() -> None:
    d = 128
    pe = sinusoidal_encoding(400, d, dtype=torch.float64)
    dots = pe[0] @ pe.T  # (400,)
    assert dots[0].item() == pytest.approx(d / 2)
    assert bool((dots[1:] < dots[0]).all())
    # Nearby positions are more similar than far ones on average (a notion of distance).
    assert dots[1:10].mean() > dots[10:50].mean() > dots[50:400].mean()


# ---------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("d_model", [1, 3, 7, 511, 0, -2])
def test_odd_or_non_positive_d_model_raises(d_model: int) -> None:
    with pytest.raises(ValueError, match=f"d_model={d_model}"):
        sinusoidal_encoding(10, d_model)
    with pytest.raises(ValueError, match=f"d_model={d_model}"):
        shift_matrix(1, d_model)
    with pytest.raises(ValueError, match=f"d_model={d_model}"):
        PositionalEncoding(d_model, 10)


def test_bad_types_and_negative_positions() -> None:
    with pytest.raises(TypeError):
        sinusoidal_encoding(10, 8.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_positions"):
        sinusoidal_encoding(-1, 8)


# ---------------------------------------------------------------- the modules
def test_positional_encoding_adds_the_table() -> None:
    torch.manual_seed(0)
    module = PositionalEncoding(d_model=16, max_len=50, dropout=0.0)
    x = torch.randn(3, 20, 16)
    out = module(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out, x + sinusoidal_encoding(20, 16)[None])
    # start offsets the positions (decoding one token at a time).
    torch.testing.assert_close(module(x[:, 5:6], start=5), out[:, 5:6])
    # The table is a buffer, not a parameter, and not saved.
    assert list(module.parameters()) == []
    assert "pe" not in module.state_dict()


def test_positional_encoding_dropout_only_in_training() -> None:
    torch.manual_seed(0)
    module = PositionalEncoding(d_model=16, max_len=50, dropout=0.5)
    x = torch.randn(2, 10, 16)
    module.eval()
    torch.testing.assert_close(module(x), x + sinusoidal_encoding(10, 16)[None])
    module.train()
    out = module(x)
    assert bool((out == 0).any())  # some entries dropped
    kept = out != 0
    torch.testing.assert_close(out[kept], 2.0 * (x + sinusoidal_encoding(10, 16)[None])[kept])


@pytest.mark.parametrize("cls", [PositionalEncoding, LearnedPositionalEmbedding])
def test_over_long_input_names_length_and_max_len(cls) -> None:
    module = cls(16, 12)  # the same (d_model, max_len) interface
    module(torch.zeros(1, 12, 16))  # exactly max_len is fine
    with pytest.raises(ValueError, match=r"T=13.*max_len=12"):
        module(torch.zeros(1, 13, 16))
    with pytest.raises(ValueError, match=r"T=4 \(starting at position 10\).*max_len=12"):
        module(torch.zeros(1, 4, 16), start=10)
    with pytest.raises(ValueError, match=r"\(B, T, d_model=16\).*\(1, 4, 8\)"):
        module(torch.zeros(1, 4, 8))
    with pytest.raises(ValueError, match=r"\(4, 16\)"):
        module(torch.zeros(4, 16))


def test_learned_embedding_adds_its_rows_and_learns_only_seen_positions() -> None:
    torch.manual_seed(0)
    module = LearnedPositionalEmbedding(max_len=30, d_model=8)
    x = torch.randn(2, 10, 8)
    torch.testing.assert_close(module(x), x + module.embedding.weight[:10])
    module(x).pow(2).sum().backward()
    grad = module.embedding.weight.grad
    assert bool((grad[:10].abs().sum(-1) > 0).all())
    # Positions 10..29 never occurred, so they get no gradient: they stay at their initial values.
    assert bool((grad[10:] == 0).all())


# ---------------------------------------------------------------- permutation equivariance
@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**16), T=st.integers(2, 12))
def test_attention_is_permutation_equivariant_until_positions_are_added(seed: int, T: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    d = 16
    x = torch.randn(1, T, d, generator=gen, dtype=torch.float64)
    perm = torch.randperm(T, generator=gen)
    out, _ = scaled_dot_product_attention(x, x, x)
    out_perm, _ = scaled_dot_product_attention(x[:, perm], x[:, perm], x[:, perm])
    torch.testing.assert_close(out_perm, out[:, perm])
    # With positions added, permuting the tokens is no longer the same as permuting the output
    # (unless perm happens to be the identity).
    if not torch.equal(perm, torch.arange(T)):
        pe = sinusoidal_encoding(T, d, dtype=torch.float64)
        y, y_perm = x + pe, x[:, perm] + pe
        out, _ = scaled_dot_product_attention(y, y, y)
        out_perm, _ = scaled_dot_product_attention(y_perm, y_perm, y_perm)
        assert not torch.allclose(out_perm, out[:, perm], atol=1e-6)


# ---------------------------------------------------------------- RoPE
@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(0, 3000),
    n=st.integers(0, 3000),
    shift=st.integers(0, 3000),
    d=even_d,
    seed=st.integers(0, 2**16),
)
def test_rope_score_depends_only_on_the_relative_position(
    m: int, n: int, shift: int, d: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, d, generator=gen, dtype=torch.float64)

    def score(pm: int, pn: int) -> float:
        qm = rotary_embedding(q, torch.tensor([pm]))
        kn = rotary_embedding(k, torch.tensor([pn]))
        return (qm @ kn.T).item()

    # Shifting both positions by the same amount leaves q_m . k_n unchanged ...
    assert score(m, n) == pytest.approx(score(m + shift, n + shift), abs=1e-9)
    # ... and the score is q @ M_(m - n) @ k^T, a function of m - n only.
    want = (q @ shift_matrix(m - n, d) @ k.T).item()
    assert score(m, n) == pytest.approx(want, abs=1e-9)


def test_rope_is_the_shift_matrix_per_position_and_keeps_norms() -> None:
    gen = torch.Generator().manual_seed(0)
    B, h, T, d = 2, 3, 12, 8
    x = torch.randn(B, h, T, d, generator=gen, dtype=torch.float64)
    r = rotary_embedding(x)
    assert r.shape == x.shape and r.dtype == x.dtype
    for m in range(T):
        torch.testing.assert_close(r[..., m, :], x[..., m, :] @ shift_matrix(m, d))
    torch.testing.assert_close(r.norm(dim=-1), x.norm(dim=-1))  # rotations keep lengths
    torch.testing.assert_close(r[..., 0, :], x[..., 0, :])  # position 0 is not rotated
    # Explicit positions: a window starting at 5 equals rows 5.. of the full sequence.
    torch.testing.assert_close(rotary_embedding(x[..., 5:, :], torch.arange(5, T)), r[..., 5:, :])


def test_rope_attention_scores_are_translation_invariant() -> None:
    gen = torch.Generator().manual_seed(1)
    T, d = 10, 16
    q = torch.randn(1, 2, T, d, generator=gen, dtype=torch.float64)
    k = torch.randn(1, 2, T, d, generator=gen, dtype=torch.float64)
    s0 = rotary_embedding(q) @ rotary_embedding(k).transpose(-2, -1)
    pos = torch.arange(100, 100 + T)
    s1 = rotary_embedding(q, pos) @ rotary_embedding(k, pos).transpose(-2, -1)
    torch.testing.assert_close(s0, s1, atol=1e-9, rtol=0)


def test_rope_bad_inputs() -> None:
    with pytest.raises(ValueError, match="d=7"):
        rotary_embedding(torch.zeros(2, 5, 7))
    with pytest.raises(ValueError, match=r"\(5,\)"):
        rotary_embedding(torch.zeros(2, 5, 8), torch.arange(4))
    with pytest.raises(ValueError, match=r"\(8,\)"):
        rotary_embedding(torch.zeros(8))


# ---------------------------------------------------------------- argument checks and devices
def test_numeric_parameters_must_be_finite_and_base_above_one() -> None:
    for bad in (0, -2.0, 1.0, float("nan"), float("inf")):  # base=0 used to give NaN
        with pytest.raises(ValueError, match="base"):
            sinusoidal_encoding(4, 8, base=bad)
        with pytest.raises(ValueError, match="base"):
            rotary_embedding(torch.zeros(3, 4), base=bad)
    with pytest.raises(ValueError, match="offset must be finite"):
        shift_matrix(float("inf"), 8)
    with pytest.raises(ValueError, match="dropout"):
        PositionalEncoding(8, 10, dropout=1.5)
    with pytest.raises(ValueError, match="max_len must be positive"):
        LearnedPositionalEmbedding(8, 0)
    with pytest.raises(TypeError, match="positional"):
        PositionalEncoding(8, 10, 0.1)  # dropout is keyword-only on both modules


def test_positions_and_start_must_be_integers_and_inputs_float() -> None:
    x = torch.randn(1, 3, 8)
    with pytest.raises(TypeError, match="positions must be an integer tensor"):
        rotary_embedding(x, torch.tensor([0.0, 1.0, 2.0]))
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        rotary_embedding(x.long())
    for module in (PositionalEncoding(8, 10), LearnedPositionalEmbedding(8, 10)):
        with pytest.raises(TypeError, match="start must be an int"):
            module(x, start=1.5)
        with pytest.raises(ValueError, match="start must be >= 0"):
            module(x, start=-1)
        with pytest.raises(TypeError, match="x must be a floating-point tensor"):
            module(x.long())
    assert rotary_embedding(torch.zeros(2, 0, 4)).shape == (2, 0, 4)  # no positions: empty


def test_rope_angles_are_float64_for_float32_inputs() -> None:
    """At position 100000 a float32 angle is off by ~0.004 rad; the rotation must be that of
    float64 angles, rounded once to float32."""
    x = torch.randn(1, 2, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    positions = torch.tensor([99_999, 100_000])
    want = rotary_embedding(x, positions)  # float64 throughout
    torch.testing.assert_close(
        rotary_embedding(x.float(), positions).double(), want, atol=1e-6, rtol=0
    )


def test_rope_follows_the_input_device_and_dtype(device) -> None:
    x = torch.randn(2, 3, 5, 8, generator=torch.Generator().manual_seed(1))
    got = rotary_embedding(x.to(device), torch.arange(7, 12, device=device))
    assert got.device == x.to(device).device and got.dtype == x.dtype
    torch.testing.assert_close(
        got.cpu(), rotary_embedding(x, torch.arange(7, 12)), atol=1e-6, rtol=0
    )
    pe = sinusoidal_encoding(6, 8, device=device)
    assert pe.device == got.device
    torch.testing.assert_close(pe.cpu(), sinusoidal_encoding(6, 8))
