"""Checkers for the chapter "Positional encoding" (``book/positional``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minitransformer.exercises._core import Case, checker, close, like, when
from minitransformer.positional import (
    rotary_embedding,
    shift_matrix,
    sinusoidal_encoding,
    wavelengths,
)

__all__ = [
    "check_sinusoidal_encoding",
    "check_shift_matrix",
    "check_pairs_with_full_period",
    "check_rotary_embedding",
]


def _omega(i: Tensor, d: int, two_i: bool = True) -> Tensor:
    """The frequency ``10000^(-2i/d)`` of pair ``i``; without ``two_i``, ``10000^(-i/d)``."""
    return torch.pow(10000.0, -(2 * i if two_i else i) / d)


def _table(
    P: int,
    d: int,
    *,
    frequency: Callable[[Tensor, int], Tensor] = _omega,
    first: str = "sin",
    halves: bool = False,
    start: int = 0,
    per_column: bool = False,
) -> Tensor:
    """A sinusoid table ``(P, d)`` built the way a learner might, right or wrong."""
    pos = torch.arange(start, start + P, dtype=torch.float64)[:, None]
    if per_column:  # column j uses 10000^(-j/d): the two columns of a pair get two frequencies
        angles = pos * _omega(torch.arange(d, dtype=torch.float64), d, two_i=False)  # (P, d)
        return torch.where(torch.arange(d) % 2 == 0, angles.sin(), angles.cos())
    angles = pos * frequency(torch.arange(d // 2, dtype=torch.float64), d)  # (P, d/2)
    a, b = (angles.sin(), angles.cos()) if first == "sin" else (angles.cos(), angles.sin())
    return torch.cat([a, b], -1) if halves else torch.stack([a, b], -1).flatten(-2)  # interleaved


_ENCODING_MISTAKES = [
    when(
        lambda got, num_positions, d_model: got.shape == (d_model, num_positions),
        "your table has shape (d_model, num_positions) = {got.shape}: it is transposed. One row "
        "per position, one column per dimension: shape (num_positions, d_model)",
    ),
    like(
        lambda P, d: _table(P, d, first="cos"),
        "sin and cos are swapped: the even dimensions 2i hold sin(pos * w_i), the odd dimensions "
        "2i+1 hold cos(pos * w_i); row 0 should read 0, 1, 0, 1, ...",
    ),
    like(
        lambda P, d: _table(P, d, frequency=lambda i, d: _omega(i, d, two_i=False)),
        "your exponent uses the pair index i where the formula has 2i: w_i = 10000^(-2i/d_model), "
        "so the wavelengths reach (almost) 10000 * 2 pi, not only 100 * 2 pi",
    ),
    like(
        lambda P, d: _table(P, d, per_column=True),
        "your exponent uses the column index j for both columns of a pair: the sin in column 2i "
        "and the cos in column 2i+1 share one frequency, 10000^(-2i/d_model) (use 2*(j//2), not "
        "j)",
    ),
    like(
        lambda P, d: _table(P, d, frequency=lambda i, d: 1 / _omega(i, d)),
        "your exponent has the wrong sign: pos is divided by 10000^(2i/d_model), i.e. multiplied "
        "by 10000^(-2i/d_model); the frequencies should fall from 1 to about 1/10000",
    ),
    like(
        lambda P, d: _table(P, d, halves=True),
        "you put all the sines first and all the cosines after (concatenated halves); the paper "
        "interleaves them: dimension 2i is sin, dimension 2i+1 is cos of the same frequency",
    ),
    like(
        lambda P, d: _table(P, d, start=1),
        "your positions start at 1; the first position is pos = 0 (row 0 is 0, 1, 0, 1, ...)",
    ),
    like(
        lambda P, d: _table(P, d, frequency=lambda i, d: _omega(i, d // 2)),
        "you divided the exponent by d_model/2 (the number of pairs) instead of d_model: w_i = "
        "10000^(-2i/d_model)",
    ),
    when(
        lambda got: got.abs().max() > 1 + 1e-6,
        "some values are outside [-1, 1]: every entry is a sin or a cos",
    ),
    when(
        lambda got, want: got.shape == want.shape and close(got[:, ::2], want[:, ::2], atol=1e-4),
        "the even (sin) dimensions are right but the odd ones are not: dimension 2i+1 is cos(pos "
        "* w_i) with the same w_i as dimension 2i",
    ),
]


@checker(
    "sinusoidal positional encoding",
    mistakes=_ENCODING_MISTAKES,
    returns="the table",
    atol=1e-4,
    reference=lambda P, d: sinusoidal_encoding(P, d, dtype=torch.float64),
    otherwise="The formula is PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = "
    "cos(pos / 10000^(2i/d)); compare row 1 with it",
)
def check_sinusoidal_encoding() -> list[Case]:
    """Check ``fn(num_positions, d_model)`` against
    :func:`~minitransformer.positional.sinusoidal_encoding`, shape ``(num_positions, d_model)``."""
    return [
        Case("for num_positions=60, d_model=16", num_positions=60, d_model=16),
        Case(
            "for num_positions=7, d_model=64",
            num_positions=7,
            d_model=64,
            hint="Your table is right for d_model=16 but wrong for d_model=64: use d_model in "
            "the exponent, not a fixed number",
        ),
    ]


def _rotations(angle: Callable[[float, Tensor, int], Any]) -> list[Callable[[float, int], Tensor]]:
    """The block-diagonal rotations by ``angle(k, i, d)`` in block ``i``, and their transposes."""

    def matrix(k: float, d: int) -> Tensor:
        blocks = (
            [[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]]
            for a in angle(k, torch.arange(d // 2, dtype=torch.float64), d).tolist()
        )
        return torch.block_diag(*(torch.tensor(b, dtype=torch.float64) for b in blocks))

    return [matrix, lambda k, d: matrix(k, d).T]


_SHIFT_MISTAKES = [
    like(
        lambda k, d: shift_matrix(-k, d),
        "your rotation turns the wrong way: you built M_(-k), the transpose. PE is a row vector "
        "multiplied on the left, (sin a, cos a) @ B = (sin(a+b), cos(a+b)) needs B = [[cos b, "
        "-sin b], [sin b, cos b]]; check the sign of the sines with the addition formulas",
    ),
    when(
        lambda got, want: close(got.abs(), want.abs(), atol=1e-6),
        "the entries have the right sizes but wrong signs: expand sin(a+b) and cos(a+b) and read "
        "off which entry of each 2x2 block gets -sin(k w_i)",
    ),
    like(
        _rotations(lambda k, i, d: k + 0 * i),
        "every block uses the angle k; block i must rotate by k * w_i, w_i = 10000^(-2i/d_model), "
        "the frequency of the pair (2i, 2i+1)",
    ),
    like(
        _rotations(lambda k, i, d: k * i),
        "your angle is k * i; block i must rotate by k * w_i with w_i = 10000^(-2i/d_model)",
    ),
    like(
        _rotations(lambda k, i, d: k / _omega(i, d)),
        "your angle is k / w_i; it is k * w_i (the pair turns by w_i per position)",
    ),
    when(
        lambda got, d_model: (
            (got * (1 - torch.block_diag(*[torch.ones(2, 2)] * (d_model // 2)))).abs().max() > 1e-6
        ),
        "your matrix is not block diagonal: pair (2i, 2i+1) only mixes with itself, so every "
        "entry outside the 2x2 diagonal blocks is 0",
    ),
]


@checker(
    "shift matrix M_k",
    reference=shift_matrix,
    mistakes=_SHIFT_MISTAKES,
    returns="M_k",
    atol=1e-6,
    otherwise="PE[pos] @ M differs from PE[pos + k]; build one 2x2 rotation per "
    "pair and place them with torch.block_diag",
)
def check_shift_matrix() -> list[Case]:
    """Check ``fn(k, d_model)``, the ``(d_model, d_model)`` matrix with
    ``PE[pos + k] == PE[pos] @ M``, against :func:`~minitransformer.positional.shift_matrix`."""
    later = (
        "Your matrix works for k=5, d_model=12 but not for k={k}, d_model={d_model}: the "
        "angle of block i is k * w_i with w_i = 10000^(-2i/d_model)"
    )
    return [Case("for k=5, d_model=12", k=5, d_model=12)] + [
        Case(f"for k={k}, d_model={d}", k=k, d_model=d, hint=later)
        for k, d in ((-3, 8), (17, 32), (0, 4))
    ]


def _pairs(d_model: int, length: float, two_pi: bool = True) -> int:
    """How many pairs have a wavelength ``2 pi 10000^(2i/d_model) <= length``."""
    return int((wavelengths(d_model) / (1 if two_pi else 2 * math.pi) <= length).sum())


_PAIRS_MISTAKES = [
    when(
        lambda got: not isinstance(got, int) or isinstance(got, bool),
        "{where} should return an int (a count of pairs), got {got!r}",
    ),
    like(
        lambda d, L: 2 * _pairs(d, L),
        "{where} = {got} = 2 x {want}: you counted dimensions, but a sin and a cos share one "
        "wavelength; count pairs",
    ),
    like(
        lambda d, L: _pairs(d, L, two_pi=False),
        "{where} = {got}, expected {want}: the wavelength is 2 pi * 10000^(2i/d_model), you "
        "forgot the factor 2 pi",
    ),
    when(
        lambda got, d_model: got > d_model // 2,
        lambda where, got, d_model: (
            f"{where} = {got}, but there are only d_model/2 = {d_model // 2} pairs: cap the count"
        ),
    ),
    when(
        lambda got: got < 0,
        "{where} = {got}: a count cannot be negative (if even the shortest wavelength 2 pi "
        "exceeds the length, the answer is 0)",
    ),
    when(
        lambda got, want: abs(got - want) == 1,
        "{where} = {got}, expected {want}: off by one. Pair i completes a period when 2 pi * "
        "10000^(2i/d_model) <= length; count the integers i >= 0 (i = 0 included) that satisfy "
        "it, i.e. floor(...) + 1, capped at d_model/2",
    ),
]


@checker(
    "pairs that complete a period",
    reference=_pairs,
    mistakes=_PAIRS_MISTAKES,
    returns="",
    otherwise="To find it, solve 2 pi * 10000^(2i/d_model) <= length for i",
)
def check_pairs_with_full_period() -> list[Case]:
    """Check ``fn(d_model, length)``: how many of the ``d_model / 2`` sinusoid pairs complete at
    least one full period (wavelength ``<= length``) within ``length`` positions."""
    return [
        Case(f"fn({d}, {L})", d_model=d, length=L)
        for d, L in (
            (512, 512.0),
            (512, 100.0),
            (64, 1000.0),
            (128, 6.0),
            (128, 1.0),
            (16, 1e6),
            (512, 2048.0),
            (256, 50.0),
        )
    ]


def _rope(
    x: Tensor, angle: Callable[[Tensor, Tensor, int], Tensor], halves: bool = False
) -> Tensor:
    """Rotate the pairs of ``x`` ``(..., T, d)`` by ``angle(position, pair index, d)``; ``halves``
    pairs feature ``i`` with ``i + d/2``."""
    T, d = x.shape[-2:]
    m, i = torch.arange(T, dtype=torch.float64)[:, None], torch.arange(d // 2, dtype=torch.float64)
    a = angle(m, i, d)  # (T, d/2)
    u, v = (x[..., : d // 2], x[..., d // 2 :]) if halves else (x[..., 0::2], x[..., 1::2])
    one, two = u * a.cos() + v * a.sin(), -u * a.sin() + v * a.cos()  # (..., T, d/2)
    return torch.cat([one, two], -1) if halves else torch.stack([one, two], -1).flatten(-2)


_ROPE_MISTAKES = [
    like(
        lambda x: _rope(x, lambda m, i, d: -m * _omega(i, d)),
        "your rotation turns the wrong way (by -m w_i): the result is x[m] @ M_(-m). Scores then "
        "depend on n - m instead of m - n; use (a cos + b sin, -a sin + b cos) for a pair (a, b), "
        "the row vector times the block of shift_matrix",
    ),
    like(
        lambda x: _rope(x, lambda m, i, d: m * _omega(i, d), halves=True),
        "you paired feature i with feature i + d/2 (the layout of GPT-NeoX and Hugging Face's "
        "Llama); this exercise uses the interleaved pairs (2i, 2i+1) of the proposition",
    ),
    like(
        lambda x: _rope(x, lambda m, i, d: m + 0 * i),
        "every pair turns by the same angle m; pair i must turn by m * w_i with w_i = "
        "10000^(-2i/d), as in the sinusoidal encoding",
    ),
    like(
        lambda x: _rope(x, lambda m, i, d: m * _omega(i, d, two_i=False)),
        "your frequency uses i where the formula has 2i: w_i = 10000^(-2i/d)",
    ),
    like(
        lambda x: x + sinusoidal_encoding(x.shape[-2], x.shape[-1], dtype=x.dtype),
        "you added the sinusoidal encoding; RoPE rotates each pair instead (the result must have "
        "the same length as x at every position)",
    ),
    like(
        lambda x: x,
        "your function returns x unchanged: rotate the vector at position m by the angles m * w_i",
    ),
    when(
        lambda got, x: got.shape == x.shape and not close(got.norm(dim=-1), x.norm(dim=-1), 1e-6),
        "your result changes the length of the vectors; a rotation keeps it: use cos and sin of "
        "the same angle in each pair",
    ),
    when(
        lambda got, x: not close(got[..., 0, :], x[..., 0, :], atol=1e-6),
        "position 0 should not be rotated (its angle is 0); do positions start at 0?",
    ),
]


@checker(
    "rotary position embedding",
    reference=rotary_embedding,
    mistakes=_ROPE_MISTAKES,
    atol=1e-6,
    returns="fn(x)",
    otherwise="The pair (x[2i], x[2i+1]) at position m should become the row vector times "
    "R(m * w_i), as in rotary_embedding",
)
def check_rotary_embedding(gen: torch.Generator) -> list[Case]:
    """Check ``fn(x)``, RoPE of ``x`` ``(..., T, d)`` at positions ``0 .. T-1``, against
    :func:`~minitransformer.positional.rotary_embedding`."""
    return [
        Case(
            "for x of shape (B, h, T, d) = (2, 3, 10, 8)",
            x=torch.randn(2, 3, 10, 8, generator=gen, dtype=torch.float64),
        ),
        Case(
            "for x of shape (T, d) = (5, 32)",
            x=torch.randn(5, 32, generator=gen, dtype=torch.float64),
            hint="Right for d = 8 but wrong for x of shape (5, 32): use the feature size of x "
            "(x.shape[-1]) in the frequencies, and T = x.shape[-2]",
        ),
    ]
