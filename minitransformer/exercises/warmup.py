"""Checker for the warm-up exercise: a numerically stable softmax (chapter "Warm-up")."""

from __future__ import annotations

from typing import Callable

import torch

from minitransformer.exercises._core import ExerciseError, attempt, checker, close, expect_shape


@checker("numerically stable softmax")
def check_softmax(softmax: Callable[..., torch.Tensor]) -> None:
    """Check ``softmax(x, dim=-1)`` against :func:`torch.softmax`.

    Hints name the usual mistakes: summing over the wrong axis, overflow for large inputs
    (no max subtraction), a changed shape, a missing normalisation.
    """
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)

    got = attempt(softmax, x)
    expect_shape(got, tuple(x.shape), "softmax(x) for x of shape (3, 4, 5)")
    want = torch.softmax(x, dim=-1)
    if not close(got, want):
        for wrong_dim in (0, 1):
            if close(got, torch.softmax(x, dim=wrong_dim)):
                raise ExerciseError(
                    f"your softmax normalises over dim {wrong_dim}; it should normalise over "
                    "the last dimension (dim=-1), so that each row sums to one"
                )
        if close(got, torch.exp(x)):
            raise ExerciseError("you return exp(x) without dividing by the row sums")
        sums = got.sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums)):
            raise ExerciseError(
                "the rows of your result do not sum to one: divide exp(x) by its sum over "
                "the last dimension (keepdim=True)"
            )
        raise ExerciseError("your values differ from torch.softmax(x, dim=-1)")

    # The same inputs shifted by a large constant: the answer must not change.
    big = attempt(softmax, x.float() + 1000.0)
    if not isinstance(big, torch.Tensor) or not torch.isfinite(big).all():
        raise ExerciseError(
            "your softmax overflows for large inputs (x + 1000 gives inf or NaN): subtract the "
            "row maximum before exp(); softmax(x - c) == softmax(x) for any constant c"
        )
    if not close(big, want.float(), atol=1e-4):
        raise ExerciseError("softmax(x + 1000) should equal softmax(x); it does not")

    dim0 = attempt(softmax, x, dim=0)
    if not close(dim0, torch.softmax(x, dim=0)):
        raise ExerciseError("your softmax ignores its `dim` argument")
