"""Checker for the warm-up exercise: a numerically stable softmax (chapter "Warm-up")."""

from __future__ import annotations

import torch

from minitransformer.exercises._core import Case, checker, close, like, when

__all__ = ["check_softmax"]

_SOFTMAX_MISTAKES = [
    like(
        lambda x, dim: torch.softmax(x, dim=0),
        "your softmax normalises over dim 0; it should normalise over the last dimension "
        "(dim=-1), so that each row sums to one",
    ),
    like(
        lambda x, dim: torch.softmax(x, dim=1),
        "your softmax normalises over dim 1; it should normalise over the last dimension "
        "(dim=-1), so that each row sums to one",
    ),
    like(lambda x, dim: torch.exp(x), "you return exp(x) without dividing by the row sums"),
    when(
        lambda got, x: x.max() > 100 and not torch.isfinite(got).all(),
        "your softmax overflows for large inputs (x + 1000 gives inf or NaN): subtract the row "
        "maximum before exp(); softmax(x - c) == softmax(x) for any constant c",
    ),
    when(
        lambda got, x: got.shape == x.shape and not close(got.sum(-1), torch.ones(x.shape[:-1])),
        "the rows of your result do not sum to one: divide exp(x) by its sum over the last "
        "dimension (keepdim=True)",
    ),
]


@checker(
    "numerically stable softmax",
    reference=torch.softmax,
    mistakes=_SOFTMAX_MISTAKES,
    returns="softmax(x, dim={dim})",
)
def check_softmax(gen: torch.Generator) -> list[Case]:
    """Check ``fn(x, dim=-1)`` against :func:`torch.softmax`, also for inputs around 1000."""
    x = torch.randn(3, 4, 5, generator=gen, dtype=torch.float64)
    return [
        Case(
            "for x of shape (3, 4, 5)",
            x=x,
            dim=-1,
            otherwise="Compare with torch.softmax(x, dim=-1)",
        ),
        Case(
            "for x + 1000 (float32)",
            x=x.float() + 1000.0,
            dim=-1,
            otherwise="softmax(x + 1000) should equal softmax(x); it does not",
        ),
        Case("for dim=0", x=x, dim=0, hint="Your softmax ignores its `dim` argument"),
    ]
