"""Checkers for the exercises of the chapter "Positional encoding" (``book/positional``).

* :func:`check_sinusoidal_encoding`: build the paper's table ``PE``;
* :func:`check_shift_matrix`: build the rotation ``M_k`` with ``PE[pos + k] = PE[pos] @ M_k``;
* :func:`check_pairs_with_full_period`: a reasoning exercise on the wavelengths;
* :func:`check_rotary_embedding`: rotate queries and keys (RoPE).

Each compares with :mod:`minitransformer.positional` and recognises the usual mistakes.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from minitransformer.exercises._core import ExerciseError, attempt, checker, close, expect_shape
from minitransformer.positional import (
    _rotation_blocks,
    angular_frequencies,
    rotary_embedding,
    shift_matrix,
    sinusoidal_encoding,
)


def _table(P: int, d: int, omega: torch.Tensor, first: str = "sin", layout: str = "interleaved",
           start: int = 0) -> torch.Tensor:
    """A sinusoid table built in one of the ways a learner might (for recognising mistakes)."""
    pos = torch.arange(start, start + P, dtype=torch.float64)[:, None]
    angles = pos * omega[None, :]  # (P, d/2)
    a, b = (torch.sin(angles), torch.cos(angles)) if first == "sin" else (torch.cos(angles), torch.sin(angles))
    if layout == "halves":
        return torch.cat([a, b], dim=-1)
    out = torch.empty(P, d, dtype=torch.float64)
    out[:, 0::2], out[:, 1::2] = a, b
    return out


def _table_per_dimension(P: int, d: int, exponent_of_dim: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Interleaved sin/cos where column ``j`` uses ``pos / 10000 ** exponent_of_dim(j)``."""
    j = torch.arange(d, dtype=torch.float64)
    angles = torch.arange(P, dtype=torch.float64)[:, None] / torch.pow(10000.0, exponent_of_dim(j))[None, :]
    return torch.where(j.long() % 2 == 0, torch.sin(angles), torch.cos(angles))


@checker("sinusoidal positional encoding")
def check_sinusoidal_encoding(fn: Callable[[int, int], torch.Tensor]) -> None:
    """Check ``fn(num_positions, d_model)`` against :func:`~minitransformer.positional.sinusoidal_encoding`.

    Hints name the usual mistakes: sin and cos swapped, the exponent using ``i`` or the
    column index instead of ``2i``, a positive exponent (multiplying instead of dividing),
    all sines before all cosines, positions counted from 1, a transposed table.
    """
    P, d = 60, 16
    got = attempt(fn, P, d)
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (d, P):
        raise ExerciseError(
            f"your table has shape {(d, P)}: it is transposed. One row per position, one column "
            "per dimension: shape (num_positions, d_model)"
        )
    expect_shape(got, (P, d), f"fn({P}, {d})")
    want = sinusoidal_encoding(P, d, dtype=torch.float64)
    if close(got, want, atol=1e-4):
        other = attempt(fn, 7, 64)  # another size: nothing may be hard-wired
        expect_shape(other, (7, 64), "fn(7, 64)")
        if not close(other, sinusoidal_encoding(7, 64, dtype=torch.float64), atol=1e-4):
            raise ExerciseError("your table is right for d_model=16 but wrong for d_model=64: "
                                "use d_model in the exponent, not a fixed number")
        return
    omega = angular_frequencies(d)
    i = torch.arange(d // 2, dtype=torch.float64)
    two_i = 2 * i
    wrong = [
        (_table(P, d, omega, first="cos"),
         "sin and cos are swapped: the even dimensions 2i hold sin(pos * w_i), the odd dimensions "
         "2i+1 hold cos(pos * w_i); row 0 should read 0, 1, 0, 1, ..."),
        (_table(P, d, torch.pow(10000.0, -i / d)),
         "your exponent uses the pair index i where the formula has 2i: w_i = 10000^(-2i/d_model), "
         "so the wavelengths reach (almost) 10000 * 2 pi, not only 100 * 2 pi"),
        (_table_per_dimension(P, d, lambda j: j / d),
         "your exponent uses the column index j for both columns of a pair: the sin in column 2i "
         "and the cos in column 2i+1 share one frequency, 10000^(-2i/d_model) (use 2*(j//2), "
         "not j)"),
        (_table(P, d, torch.pow(10000.0, two_i / d)),
         "your exponent has the wrong sign: pos is divided by 10000^(2i/d_model), i.e. multiplied "
         "by 10000^(-2i/d_model); the frequencies should fall from 1 to about 1/10000"),
        (_table(P, d, omega, layout="halves"),
         "you put all the sines first and all the cosines after (concatenated halves); the paper "
         "interleaves them: dimension 2i is sin, dimension 2i+1 is cos of the same frequency"),
        (_table(P, d, omega, start=1),
         "your positions start at 1; the first position is pos = 0 (row 0 is 0, 1, 0, 1, ...)"),
        (_table(P, d, torch.pow(10000.0, -two_i / (d // 2))),
         "you divided the exponent by d_model/2 (the number of pairs) instead of d_model: "
         "w_i = 10000^(-2i/d_model)"),
    ]
    for table, hint in wrong:
        if close(got, table, atol=1e-4):
            raise ExerciseError(hint)
    if got.abs().max() > 1 + 1e-6:
        raise ExerciseError("some values are outside [-1, 1]: every entry is a sin or a cos")
    if close(got[:, 0::2], want[:, 0::2], atol=1e-4):
        raise ExerciseError("the even (sin) dimensions are right but the odd ones are not: "
                            "dimension 2i+1 is cos(pos * w_i) with the same w_i as dimension 2i")
    raise ExerciseError("your values differ from the formula PE(pos, 2i) = sin(pos / 10000^(2i/d)), "
                        "PE(pos, 2i+1) = cos(pos / 10000^(2i/d)); compare row 1 with the formula")


@checker("shift matrix M_k")
def check_shift_matrix(fn: Callable[[int, int], torch.Tensor]) -> None:
    """Check ``fn(k, d_model)``: a ``(d_model, d_model)`` matrix with ``PE[pos + k] == PE[pos] @ M``.

    Hints name the usual mistakes: the rotation turning the wrong way (a transposed block,
    i.e. ``M_(-k)``, or a column-vector convention), the same angle for every pair, the
    angle ``k * i`` instead of ``k * w_i``, cos and sin exchanged, a wrong shape.
    """
    d, k = 12, 5
    got = attempt(fn, k, d)
    expect_shape(got, (d, d), f"fn(k={k}, d_model={d})")
    got = got.double()
    pe = sinusoidal_encoding(40, d, dtype=torch.float64)
    if close(pe[:30] @ got, pe[k : k + 30], atol=1e-6):
        for k2, d2 in ((-3, 8), (17, 32), (0, 4)):
            other = attempt(fn, k2, d2)
            expect_shape(other, (d2, d2), f"fn(k={k2}, d_model={d2})")
            if not close(other.double(), shift_matrix(k2, d2), atol=1e-6):
                raise ExerciseError(
                    f"your matrix works for k={k}, d_model={d} but not for k={k2}, d_model={d2}: "
                    "the angle of block i is k * w_i with w_i = 10000^(-2i/d_model)"
                )
        return
    want = shift_matrix(k, d)
    if close(got, want.T, atol=1e-6):
        raise ExerciseError(
            "your rotation turns the wrong way: you built M_(-k), the transpose. PE is a row "
            "vector multiplied on the left, (sin a, cos a) @ B = (sin(a+b), cos(a+b)) needs "
            "B = [[cos b, -sin b], [sin b, cos b]]; check the sign of the sines with the "
            "addition formulas"
        )
    if close(got.abs(), want.abs(), atol=1e-6):
        raise ExerciseError(
            "the entries have the right sizes but wrong signs: expand sin(a+b) and cos(a+b) "
            "and read off which entry of each 2x2 block gets -sin(k w_i)"
        )
    if close(pe[:30] @ got.T, pe[k : k + 30], atol=1e-6):
        raise ExerciseError("you built M for column vectors (M @ PE[pos]); here PE[pos] is a row "
                            "vector and the product is PE[pos] @ M: transpose your matrix")
    omega = angular_frequencies(d)
    pairs = torch.arange(d // 2, dtype=torch.float64)
    wrong = [
        (torch.block_diag(*_rotation_blocks(torch.full((d // 2,), float(k), dtype=torch.float64))),
         "every block uses the angle k; block i must rotate by k * w_i, w_i = 10000^(-2i/d_model), "
         "the frequency of the pair (2i, 2i+1)"),
        (torch.block_diag(*_rotation_blocks(k * pairs)),
         "your angle is k * i; block i must rotate by k * w_i with w_i = 10000^(-2i/d_model)"),
        (torch.block_diag(*_rotation_blocks(k / omega)),
         "your angle is k / w_i; it is k * w_i (the pair turns by w_i per position)"),
    ]
    for matrix, hint in wrong:
        if close(got, matrix, atol=1e-6) or close(got, matrix.T, atol=1e-6):
            raise ExerciseError(hint)
    off_block = ~torch.block_diag(*[torch.ones(2, 2)] * (d // 2)).bool()
    if got[off_block].abs().max() > 1e-6:
        raise ExerciseError("your matrix is not block diagonal: pair (2i, 2i+1) only mixes with "
                            "itself, so every entry outside the 2x2 diagonal blocks is 0")
    raise ExerciseError("PE[pos] @ M differs from PE[pos + k]; build one 2x2 rotation per pair "
                        "and place them with torch.block_diag")


def _pairs_with_full_period(d_model: int, length: float) -> int:
    lam = 2 * math.pi * torch.pow(torch.tensor(10000.0, dtype=torch.float64),
                                  torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    return int((lam <= length).sum())


@checker("pairs that complete a period")
def check_pairs_with_full_period(fn: Callable[[int, float], int]) -> None:
    """Check ``fn(d_model, length)``: how many of the ``d_model / 2`` sinusoid pairs complete
    at least one full period (wavelength ``<= length``) within ``length`` positions.

    Hints name the usual mistakes: counting dimensions instead of pairs, forgetting the
    factor 2 pi in the wavelength, an off-by-one (the pair i = 0 counts), not capping at
    ``d_model / 2``, rounding up.
    """
    cases = [(512, 512.0), (512, 100.0), (64, 1000.0), (128, 6.0), (128, 1.0), (16, 10.0**6), (512, 2048.0), (256, 50.0)]
    for d, L in cases:
        got = attempt(fn, d, L)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, float) and got.is_integer():
            got = int(got)
        if not isinstance(got, int) or isinstance(got, bool):
            raise ExerciseError(f"fn({d}, {L}) should return an int (a count of pairs), got {got!r}")
        want = _pairs_with_full_period(d, L)
        if got == want:
            continue
        lam_no_2pi = torch.pow(torch.tensor(10000.0, dtype=torch.float64),
                               torch.arange(0, d, 2, dtype=torch.float64) / d)
        if want and got == 2 * want:
            raise ExerciseError(f"fn({d}, {L}) = {got} = 2 x {want}: you counted dimensions, "
                                "but a sin and a cos share one wavelength; count pairs")
        if got == int((lam_no_2pi <= L).sum()):
            raise ExerciseError(f"fn({d}, {L}) = {got}, expected {want}: the wavelength is "
                                "2 pi * 10000^(2i/d_model), you forgot the factor 2 pi")
        if got > d // 2:
            raise ExerciseError(f"fn({d}, {L}) = {got}, but there are only d_model/2 = {d // 2} "
                                "pairs: cap the count")
        if got < 0:
            raise ExerciseError(f"fn({d}, {L}) = {got}: a count cannot be negative (if even the "
                                "shortest wavelength 2 pi exceeds the length, the answer is 0)")
        if abs(got - want) == 1:
            raise ExerciseError(
                f"fn({d}, {L}) = {got}, expected {want}: off by one. Pair i completes a period "
                "when 2 pi * 10000^(2i/d_model) <= length; count the integers i >= 0 (i = 0 "
                "included) that satisfy it, i.e. floor(...) + 1, capped at d_model/2"
            )
        raise ExerciseError(f"fn({d}, {L}) = {got}, expected {want}: solve "
                            "2 pi * 10000^(2i/d_model) <= length for i")


def _rope_variant(x: torch.Tensor, angle_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                  halves: bool = False) -> torch.Tensor:
    """Rotate pairs of features of ``x`` ``(..., T, d)`` by ``angle_of(positions, pair_index)``."""
    T, d = x.shape[-2], x.shape[-1]
    angles = angle_of(torch.arange(T, dtype=torch.float64)[:, None],
                      torch.arange(d // 2, dtype=torch.float64)[None, :])  # (T, d/2)
    cos, sin = torch.cos(angles), torch.sin(angles)
    a, b = (x[..., : d // 2], x[..., d // 2 :]) if halves else (x[..., 0::2], x[..., 1::2])
    first, second = a * cos + b * sin, -a * sin + b * cos
    if halves:
        return torch.cat([first, second], dim=-1)
    out = torch.empty_like(x)
    out[..., 0::2], out[..., 1::2] = first, second
    return out


@checker("rotary position embedding")
def check_rotary_embedding(fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Check ``fn(x)``: RoPE of ``x`` ``(..., T, d)`` at positions ``0 .. T-1``, against
    :func:`~minitransformer.positional.rotary_embedding`.

    Hints name the usual mistakes: rotating the wrong way, one angle for every pair, the
    frequency with ``i`` instead of ``2i``, pairing feature ``i`` with ``i + d/2`` instead of
    ``(2i, 2i+1)``, adding the encoding instead of rotating, ignoring the position.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 10, 8, generator=gen, dtype=torch.float64)  # (B, h, T, d)
    got = attempt(fn, x.clone())
    expect_shape(got, tuple(x.shape), "fn(x) for x of shape (B, h, T, d) = (2, 3, 10, 8)")
    got = got.double()
    want = rotary_embedding(x)
    if close(got, want, atol=1e-6):
        other = torch.randn(5, 32, generator=gen, dtype=torch.float64)  # (T, d), no batch
        got_other = attempt(fn, other.clone())
        expect_shape(got_other, (5, 32), "fn(x) for x of shape (T, d) = (5, 32)")
        if not close(got_other.double(), rotary_embedding(other), atol=1e-6):
            raise ExerciseError("right for d = 8 but wrong for x of shape (5, 32): use the feature "
                                "size of x (x.shape[-1]) in the frequencies, and T = x.shape[-2]")
        return
    T, d = x.shape[-2], x.shape[-1]
    omega = lambda i: torch.pow(10000.0, -2 * i / d)  # noqa: E731
    wrong = [
        (_rope_variant(x, lambda m, i: -m * omega(i)),
         "your rotation turns the wrong way (by -m w_i): the result is x[m] @ M_(-m). Scores then "
         "depend on n - m instead of m - n; use (a cos + b sin, -a sin + b cos) for a pair (a, b), "
         "the row vector times the block of shift_matrix"),
        (_rope_variant(x, lambda m, i: m * omega(i), halves=True),
         "you paired feature i with feature i + d/2 (the layout of GPT-NeoX and Hugging Face's "
         "Llama); this exercise uses the interleaved pairs (2i, 2i+1) of the proposition"),
        (_rope_variant(x, lambda m, i: m + 0 * i),
         "every pair turns by the same angle m; pair i must turn by m * w_i with "
         "w_i = 10000^(-2i/d), as in the sinusoidal encoding"),
        (_rope_variant(x, lambda m, i: m * torch.pow(10000.0, -i / d)),
         "your frequency uses i where the formula has 2i: w_i = 10000^(-2i/d)"),
        (x + sinusoidal_encoding(T, d, dtype=torch.float64),
         "you added the sinusoidal encoding; RoPE rotates each pair instead (the result must have "
         "the same length as x at every position)"),
        (x, "your function returns x unchanged: rotate the vector at position m by the angles m * w_i"),
    ]
    for table, hint in wrong:
        if close(got, table, atol=1e-6):
            raise ExerciseError(hint)
    if not torch.allclose(got.norm(dim=-1), x.norm(dim=-1), atol=1e-6):
        raise ExerciseError("your result changes the length of the vectors; a rotation keeps it: "
                            "use cos and sin of the same angle in each pair")
    if not close(got[..., 0, :], x[..., 0, :], atol=1e-6):
        raise ExerciseError("position 0 should not be rotated (its angle is 0); do positions start at 0?")
    raise ExerciseError("your values differ from rotary_embedding: the pair (x[2i], x[2i+1]) at "
                        "position m should become the row vector times R(m * w_i)")
