"""The checkers of the chapter "Positional encoding" accept the reference answers and reject
each typical mistake with its own hint."""

from __future__ import annotations

import math

import pytest
import torch
from checker_helpers import rejects as _rejects
from checker_helpers import rejects_in_place, stub
from checker_helpers import verdict as _verdict

from minitransformer.exercises import (
    ExerciseError,
    check_pairs_with_full_period,
    check_rotary_embedding,
    check_shift_matrix,
    check_sinusoidal_encoding,
)
from minitransformer.positional import shift_matrix, sinusoidal_encoding


# ---------------------------------------------------------------- the encoding
def pe_reference(num_positions: int, d_model: int) -> torch.Tensor:
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angles = pos / 10000 ** (two_i / d_model)
    pe = torch.zeros(num_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)
    pe[:, 1::2] = torch.cos(angles)
    return pe


def _pe_variant(P, d, *, exponent=None, first="sin", halves=False, start=0):
    pos = torch.arange(start, start + P, dtype=torch.float64)[:, None]
    i = torch.arange(d // 2, dtype=torch.float64)
    exponent = (2 * i / d) if exponent is None else exponent(i, d)
    angles = pos / 10000**exponent
    s, c = torch.sin(angles), torch.cos(angles)
    a, b = (s, c) if first == "sin" else (c, s)
    if halves:
        return torch.cat([a, b], -1)
    pe = torch.zeros(P, d, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = a, b
    return pe


def test_encoding_accepts_reference_and_package(capsys) -> None:
    assert "Correct" in _verdict(capsys, check_sinusoidal_encoding, pe_reference)
    assert "Correct" in _verdict(
        capsys, check_sinusoidal_encoding, lambda P, d: sinusoidal_encoding(P, d)
    )
    assert "Not attempted" in _verdict(capsys, check_sinusoidal_encoding, stub)


def pe_column_index_exponent(P, d):
    j = torch.arange(d, dtype=torch.float64)
    angles = torch.arange(P, dtype=torch.float64)[:, None] / 10000 ** (j / d)
    return torch.where(j.long() % 2 == 0, torch.sin(angles), torch.cos(angles))


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda P, d: _pe_variant(P, d, first="cos"), "sin and cos are swapped"),
        (
            lambda P, d: _pe_variant(P, d, exponent=lambda i, d: i / d),
            "pair index i where the formula has 2i",
        ),
        (pe_column_index_exponent, "column index j"),
        (lambda P, d: _pe_variant(P, d, exponent=lambda i, d: -2 * i / d), "wrong sign"),
        (lambda P, d: _pe_variant(P, d, halves=True), "concatenated halves"),
        (lambda P, d: _pe_variant(P, d, start=1), "positions start at 1"),
        (lambda P, d: _pe_variant(P, d, exponent=lambda i, d: 2 * i / (d // 2)), "d_model/2"),
        (lambda P, d: pe_reference(P, d).T, "transposed"),
        (lambda P, d: _pe_variant(P, d, exponent=lambda i, d: 2 * i / 16), "wrong for d_model=64"),
        (lambda P, d: 2 * pe_reference(P, d), r"outside \[-1, 1\]"),
        (
            lambda P, d: torch.cat(
                [pe_reference(P, d)[:, :-1], torch.zeros(P, 1, dtype=torch.float64)], -1
            ),
            "even .sin. dimensions are right",
        ),
        (lambda P, d: pe_reference(P, d)[:, :-1], "shape"),
        (lambda P, d: pe_reference(P, d).numpy(), "torch.Tensor"),
        (lambda P, d: pe_reference(P, d) @ torch.ones(3), "raised RuntimeError"),
    ],
)
def test_encoding_rejects_typical_mistakes(wrong, hint: str) -> None:
    _rejects(check_sinusoidal_encoding, wrong, hint)


# ---------------------------------------------------------------- the shift matrix
def m_reference(k: int, d_model: int) -> torch.Tensor:
    M = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        a = k / 10000 ** (2 * i / d_model)
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.float64
        )
    return M


def _blocks(angle_of_pair, k, d, transpose=False, swap=False):
    M = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        a = angle_of_pair(k, i, d)
        c, s = math.cos(a), math.sin(a)
        block = [[s, -c], [c, s]] if swap else [[c, -s], [s, c]]
        block = torch.tensor(block, dtype=torch.float64)
        M[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = block.T if transpose else block
    return M


def _omega(i, d):
    return 10000 ** (-2 * i / d)


def test_shift_accepts_reference_and_package(capsys) -> None:
    assert "Correct" in _verdict(capsys, check_shift_matrix, m_reference)
    assert "Correct" in _verdict(capsys, check_shift_matrix, shift_matrix)
    # float32 is fine too
    assert "Correct" in _verdict(
        capsys, check_shift_matrix, lambda k, d: shift_matrix(k, d, dtype=torch.float32)
    )
    assert "Not attempted" in _verdict(capsys, check_shift_matrix, stub)


def m_dense_noise(k, d):
    return m_reference(k, d) + 0.01 * torch.ones(d, d, dtype=torch.float64)


def m_hardwired(k, d):
    return shift_matrix(5, 12) if (k, d) == (5, 12) else torch.eye(d)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda k, d: _blocks(lambda k, i, d: k * _omega(i, d), k, d, transpose=True), "wrong way"),
        (lambda k, d: m_reference(-k, d), "wrong way"),
        (lambda k, d: _blocks(lambda k, i, d: float(k), k, d), "every block uses the angle k"),
        (lambda k, d: _blocks(lambda k, i, d: float(k * i), k, d), r"angle is k \* i"),
        (lambda k, d: _blocks(lambda k, i, d: k / _omega(i, d), k, d), r"angle is k / w_i"),
        (lambda k, d: -m_reference(k, d), "wrong signs"),
        (m_dense_noise, "not block diagonal"),
        (m_hardwired, "not for k=-3"),
        (lambda k, d: torch.eye(d + 1), "shape"),
    ],
)
def test_shift_rejects_typical_mistakes(wrong, hint: str) -> None:
    _rejects(check_shift_matrix, wrong, hint)


def test_shift_hint_for_swapped_cos_and_sin() -> None:
    # Blocks [[sin, -cos], [cos, sin]]: cos and sin exchanged; no special hint but a clear verdict.
    with pytest.raises(ExerciseError, match="differs from PE"):
        check_shift_matrix(lambda k, d: _blocks(lambda k, i, d: k * _omega(i, d), k, d, swap=True))


# ---------------------------------------------------------------- pairs that complete a period
def pairs_reference(d_model: int, length: float) -> int:
    # 2 pi 10000^(2i/d) <= L  <=>  i <= (d/2) log(L / 2 pi) / log(10000)
    if length < 2 * math.pi:
        return 0
    i_max = math.floor(d_model / 2 * math.log(length / (2 * math.pi)) / math.log(10000))
    return min(i_max + 1, d_model // 2)


def test_pairs_accepts_reference(capsys) -> None:
    assert "Correct" in _verdict(capsys, check_pairs_with_full_period, pairs_reference)
    assert "Not attempted" in _verdict(capsys, check_pairs_with_full_period, stub)

    # A brute-force count over the table is a right answer too.
    def brute(d, L):
        lam = 2 * math.pi / 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        return int((lam <= L).sum())

    assert "Correct" in _verdict(capsys, check_pairs_with_full_period, brute)
    assert pairs_reference(512, 512.0) == 123


def pairs_no_cap(d_model, length):
    if length < 2 * math.pi:
        return 0
    return math.floor(d_model / 2 * math.log(length / (2 * math.pi)) / math.log(10000)) + 1


def pairs_no_2pi(d_model, length):
    lam = 10000 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return int((lam <= length).sum())


def pairs_no_plus_one(d_model, length):
    if length < 2 * math.pi:
        return 0
    pairs = math.floor(d_model / 2 * math.log(length / (2 * math.pi)) / math.log(10000))
    return min(pairs, d_model // 2)


def pairs_negative(d_model, length):
    pairs = math.floor(d_model / 2 * math.log(length / (2 * math.pi)) / math.log(10000)) + 1
    return min(pairs, d_model // 2)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda d, L: 2 * pairs_reference(d, L), "counted dimensions"),
        (pairs_no_2pi, "forgot the factor 2 pi"),
        (pairs_no_cap, "only d_model/2"),
        (pairs_no_plus_one, "off by one"),
        (pairs_negative, "cannot be negative"),
        (lambda d, L: float(pairs_reference(d, L)) + 0.5, "should return an int"),
        (lambda d, L: pairs_reference(d, L) + 7, "solve"),
    ],
)
def test_pairs_rejects_typical_mistakes(wrong, hint: str) -> None:
    _rejects(check_pairs_with_full_period, wrong, hint)


def test_pairs_wants_an_int_and_accepts_integer_tensors(capsys) -> None:
    # the hint says an int: a float count, even a whole one, is refused
    _rejects(
        check_pairs_with_full_period,
        lambda d, L: float(pairs_reference(d, L)),
        "should return an int",
    )
    assert "Correct" in _verdict(
        capsys, check_pairs_with_full_period, lambda d, L: torch.tensor(pairs_reference(d, L))
    )


# ---------------------------------------------------------------- RoPE
def rope_reference(x: torch.Tensor) -> torch.Tensor:
    T, d = x.shape[-2], x.shape[-1]
    out = x.clone()
    for m in range(T):
        for i in range(d // 2):
            a = m / 10000 ** (2 * i / d)
            x0, x1 = x[..., m, 2 * i], x[..., m, 2 * i + 1]
            out[..., m, 2 * i] = x0 * math.cos(a) + x1 * math.sin(a)
            out[..., m, 2 * i + 1] = -x0 * math.sin(a) + x1 * math.cos(a)
    return out


def test_rope_accepts_reference_and_package(capsys) -> None:
    from minitransformer.positional import rotary_embedding

    assert "Correct" in _verdict(capsys, check_rotary_embedding, rope_reference)
    assert "Correct" in _verdict(capsys, check_rotary_embedding, rotary_embedding)
    # Via the shift matrix, row by row: the definition in the chapter.
    assert "Correct" in _verdict(
        capsys,
        check_rotary_embedding,
        lambda x: torch.stack(
            [x[..., m, :] @ shift_matrix(m, x.shape[-1]) for m in range(x.shape[-2])], -2
        ),
    )
    assert "Not attempted" in _verdict(capsys, check_rotary_embedding, stub)


def _rope(x, angle, halves=False):
    T, d = x.shape[-2], x.shape[-1]
    m = torch.arange(T, dtype=torch.float64)[:, None]
    i = torch.arange(d // 2, dtype=torch.float64)[None, :]
    a = angle(m, i, d)
    c, s = torch.cos(a), torch.sin(a)
    if halves:
        x0, x1 = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([x0 * c + x1 * s, -x0 * s + x1 * c], -1)
    out = x.clone()
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out[..., 0::2], out[..., 1::2] = x0 * c + x1 * s, -x0 * s + x1 * c
    return out


def rope_only_for_d8(x):
    return rope_reference(x) if x.shape[-1] == 8 else x


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda x: _rope(x, lambda m, i, d: -m / 10000 ** (2 * i / d)), "wrong way"),
        (lambda x: _rope(x, lambda m, i, d: m / 10000 ** (2 * i / d), halves=True), r"i \+ d/2"),
        (lambda x: _rope(x, lambda m, i, d: m + 0 * i), "same angle m"),
        (
            lambda x: _rope(x, lambda m, i, d: m / 10000 ** (i / d)),
            "uses i where the formula has 2i",
        ),
        (
            lambda x: x + sinusoidal_encoding(x.shape[-2], x.shape[-1], dtype=x.dtype),
            "added the sinusoidal",
        ),
        (lambda x: x.clone(), "unchanged"),
        (lambda x: 2 * rope_reference(x), "length of the vectors"),
        (lambda x: _rope(x, lambda m, i, d: (m + 1) / 10000 ** (2 * i / d)), "position 0"),
        (rope_only_for_d8, r"shape \(5, 32\)"),
        (lambda x: rope_reference(x)[..., :-1], "shape"),
    ],
)
def test_rope_rejects_typical_mistakes(wrong, hint: str) -> None:
    _rejects(check_rotary_embedding, wrong, hint)


def test_rope_that_rotates_its_input_in_place_is_rejected() -> None:
    def in_place(x):
        x.copy_(rope_reference(x))  # the caller's queries are rotated too
        return x

    rejects_in_place(check_rotary_embedding, in_place, "x", right=True)


def test_encoding_shift_and_pairs_take_only_numbers() -> None:
    """Their inputs are Python numbers, which a function cannot change in place."""
    for check in (check_sinusoidal_encoding, check_shift_matrix, check_pairs_with_full_period):
        assert all(
            isinstance(x, (int, float)) for case in check.spec.cases() for x in case.inputs.values()
        )
