"""Checker for the exercise of the chapter "Where next" (``book/where_next``): int8 quantisation.

:func:`check_quantize_rows` checks a learner's ``quantize(x) -> (values, scale)`` that stores
``x`` as int8 with one absmax scale per row, against :func:`minitransformer.quantize.quantize_int8`,
and recognises the usual mistakes: a single scale for the whole tensor, dividing by 128 or 255
instead of 127, truncating instead of rounding, float values, and 0/0 on an all-zero row.
"""

from __future__ import annotations

from typing import Callable

import torch

from minitransformer.exercises._core import ExerciseError, attempt, checker
from minitransformer.quantize import QMAX

__all__ = ["check_quantize_rows"]


@checker("int8 quantisation with one scale per row")
def check_quantize_rows(quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Check ``quantize(x)`` for ``x`` of shape ``(R, C)``: it must return int8 ``values``
    ``(R, C)`` and float ``scale`` ``(R, 1)`` with ``scale = max|row| / 127`` and
    ``values = round(x / scale)``, so that ``values * scale`` is within ``scale / 2`` of ``x``."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=gen) * torch.tensor([0.01, 0.1, 1.0, 10.0, 100.0, 3.0])[:, None]
    x[5] = 0.0  # an all-zero row: its scale must not be 0 (0/0 = NaN)
    x[2, 3] = -5.0  # the largest magnitude of row 2 is negative: abs() before max()

    result = attempt(quantize, x)
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ExerciseError("return a pair (values, scale)")
    values, scale = result
    if not isinstance(values, torch.Tensor) or values.dtype != torch.int8:
        raise ExerciseError(
            f"values should be an int8 tensor, got {getattr(values, 'dtype', type(values).__name__)}: "
            "round, then convert with .to(torch.int8)"
        )
    if values.shape != x.shape:
        raise ExerciseError(f"values have shape {tuple(values.shape)}, expected {tuple(x.shape)}")
    scale = torch.as_tensor(scale, dtype=torch.float32)
    if scale.numel() == 1:
        raise ExerciseError(
            "you use one scale for the whole tensor: a row of small numbers then rounds to zero. "
            "Take the maximum over the last dimension only (amax(dim=-1, keepdim=True))"
        )
    if scale.shape != (x.shape[0], 1):
        raise ExerciseError(
            f"scale has shape {tuple(scale.shape)}, expected {(x.shape[0], 1)}: one scale per row, "
            "kept as a column (keepdim=True) so that it broadcasts"
        )
    if not torch.isfinite(scale).all() or (scale[5] == 0).any():
        raise ExerciseError(
            "an all-zero row gives scale 0 and 0/0 = NaN: use scale 1 (or any positive number) for it"
        )
    absmax = x.abs().amax(dim=-1, keepdim=True)
    want_scale = torch.where(absmax > 0, absmax / QMAX, scale)
    rows = slice(0, 5)
    if not torch.allclose(scale[rows], want_scale[rows], rtol=1e-3):
        ratio = float((absmax[rows] / scale[rows]).median())
        if abs(ratio - 128) < 0.5 or abs(ratio - 255) < 0.5 or abs(ratio - 256) < 0.5:
            raise ExerciseError(
                f"your scale is max|x| / {ratio:.0f}; with symmetric int8 in [-127, 127] it should be "
                "max|x| / 127, so that the largest magnitude maps to 127 exactly"
            )
        if torch.allclose(scale[rows], x[rows].amax(-1, keepdim=True) / QMAX, rtol=1e-3):
            raise ExerciseError("take the maximum of |x|, not of x: a row's largest magnitude can be negative")
        raise ExerciseError("your scales differ from max|row| / 127")
    want = torch.round(x / scale).clamp(-QMAX, QMAX)
    got = values.to(torch.float32)
    if not torch.equal(got, want):
        if torch.equal(got, torch.trunc(x / scale)):
            raise ExerciseError(
                "you truncate x / scale (toward zero) instead of rounding it: the error can then reach "
                "a whole step; torch.round keeps it within half a step"
            )
        raise ExerciseError("your values differ from round(x / scale)")
    error = (got * scale - x).abs()
    if not (error <= scale / 2 + 1e-6).all():  # implied by the checks above; kept as the contract
        raise ExerciseError("the round-trip error exceeds half a step somewhere")
