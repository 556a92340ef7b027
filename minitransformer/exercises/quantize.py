"""Checker for the exercise of the chapter "Where next" (``book/where_next``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from minitransformer.exercises._core import Case, checker, close, hard_wired, when
from minitransformer.quantize import QMAX

__all__ = ["check_quantize_rows"]


def _quantize(x: Tensor) -> tuple[Tensor, Tensor]:
    """int8 ``values = round(x / scale)`` and ``scale = max|row| / 127`` (1 for a zero row)."""
    absmax = x.abs().amax(dim=-1, keepdim=True)  # (R, 1)
    scale = torch.where(absmax > 0, absmax / QMAX, torch.ones_like(absmax))
    return torch.round(x / scale).to(torch.int8), scale


def _same_quantisation(got: Any, want: tuple[Tensor, Tensor]) -> bool:
    """The same int8 values, and scales within 0.1% (any positive scale for an all-zero row)."""
    (values, scale), (want_values, want_scale) = got, want
    scale = torch.as_tensor(scale)
    rows = want_values.ne(0).any(-1)  # the rows that are not all zero
    return (
        values.dtype == torch.int8
        and torch.equal(values, want_values)
        and scale.shape == want_scale.shape
        and bool((scale[~rows] > 0).all())
        and close(scale[rows], want_scale[rows], atol=0, rtol=1e-3)
    )


def _ratio(got: Any, x: Tensor) -> float:
    """max|x| / scale on the rows that are not all zero (127 when right)."""
    scale = torch.as_tensor(got[1], dtype=torch.float32)
    return float((x.abs().amax(-1, keepdim=True) / scale)[:5].median())


_QUANTIZE_MISTAKES = [
    when(
        lambda got: got[0].dtype != torch.int8,
        "values should be an int8 tensor, got {got[0].dtype}: round, then convert with "
        ".to(torch.int8)",
    ),
    when(
        lambda got: torch.as_tensor(got[1]).numel() == 1,
        "you use one scale for the whole tensor: a row of small numbers then rounds to zero. Take "
        "the maximum over the last dimension only (amax(dim=-1, keepdim=True))",
    ),
    when(
        lambda got, want: got[1].shape != want[1].shape,
        "scale has shape {got[1].shape}, expected {want[1].shape}: one scale per row, kept as a "
        "column (keepdim=True) so that it broadcasts",
    ),
    when(
        lambda got: not (torch.isfinite(got[1]).all() and (got[1][5] != 0).all()),
        "an all-zero row gives scale 0 and 0/0 = NaN: use scale 1 (or any positive number) for it",
    ),
    *(
        when(
            lambda got, x, q=q: abs(_ratio(got, x) - q) < 0.5,
            f"your scale is max|x| / {q}; with symmetric int8 in [-127, 127] it should be max|x| / "
            f"127, "
            "so that the largest magnitude maps to 127 exactly",
        )
        for q in (128, 255, 256)
    ),
    when(
        lambda got, x: close(got[1][:5], x[:5].amax(-1, keepdim=True) / QMAX, atol=0, rtol=1e-3),
        "take the maximum of |x|, not of x: a row's largest magnitude can be negative",
    ),
    when(
        lambda got, want: not close(got[1][:5], want[1][:5], atol=0, rtol=1e-3),
        "your scales differ from max|row| / 127",
    ),
    when(
        lambda got, x: torch.equal(got[0], torch.trunc(x / got[1]).to(torch.int8)),
        "you truncate x / scale (toward zero) instead of rounding it: the error can then reach a "
        "whole step; torch.round keeps it within half a step",
    ),
]


@checker(
    "int8 quantisation with one scale per row",
    reference=_quantize,
    mistakes=_QUANTIZE_MISTAKES,
    compare=_same_quantisation,
    returns=("the values", "the scale"),
    otherwise="The values should be round(x / scale)",
)
def check_quantize_rows(gen: torch.Generator) -> list[Case]:
    """Check ``fn(x)`` for ``x`` ``(R, C)``: int8 ``values = round(x / scale)`` ``(R, C)`` and
    float ``scale = max|row| / 127`` ``(R, 1)``."""
    scales = torch.tensor([[0.01], [0.1], [1.0], [10.0], [100.0], [3.0]])
    x = torch.randn(6, 16, generator=gen) * scales  # rows of very different sizes
    x[5] = 0.0  # an all-zero row: its scale must not be 0 (0/0 = NaN)
    x[2, 3] = -5.0  # the largest magnitude of row 2 is negative: abs() before max()
    wide = torch.randn(3, 40, generator=gen) * torch.tensor([[2.0], [0.5], [20.0]])
    return [
        Case("for x of shape (6, 16)", x=x),
        Case("for x of shape (3, 40)", x=wide, hint=hard_wired("the sizes")),
    ]
