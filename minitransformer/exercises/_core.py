"""The machinery shared by every checker: attempt detection, hints and the verdict."""

from __future__ import annotations

import functools
import traceback
from typing import Any, Callable

import torch


class ExerciseError(AssertionError):
    """A learner's answer is wrong; the message says what is likely wrong and how to fix it."""

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: the hint alone, without the checker's internals. When the
        learner's own function crashed, its traceback comes first, since it points at the bug."""
        lines: list[str] = []
        if self.__cause__ is not None:
            lines += "".join(traceback.format_exception(self.__cause__)).rstrip().splitlines()
            lines += ["", "The checker says:"]
        return lines + [f"ExerciseError: {self}"]


class NotAttempted(Exception):
    """Raised inside a checker when the learner's stub still raises ``NotImplementedError``."""


def attempt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call the learner's function; an untouched stub becomes :class:`NotAttempted`.

    Any other exception is reported as a wrong answer that names the exception.
    """
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        raise NotAttempted from None
    except Exception as exc:  # the learner's code crashed: say how
        raise ExerciseError(
            f"your function raised {type(exc).__name__}: {exc}. "
            "The traceback above shows the line; a shape mismatch is the usual cause."
        ) from exc


def checker(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Turn a function that raises :class:`ExerciseError` on mistakes into a checker.

    The decorated checker prints one verdict line, ``Correct: <name>.`` or
    ``Not attempted yet: <name>. ...``, and returns ``None`` (so a notebook cell that ends with
    the call shows only that line); a wrong answer propagates the :class:`ExerciseError`.
    """

    def decorate(check: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(check)
        def run(*args: Any, **kwargs: Any) -> None:
            try:
                check(*args, **kwargs)
            except NotAttempted:
                print(f"Not attempted yet: {name}. Replace the `raise NotImplementedError` "
                      "in the stub with your code and run this cell again.")
                return
            print(f"Correct: {name}.")

        return run

    return decorate


def expect_shape(result: Any, shape: tuple[int, ...], what: str = "the result") -> None:
    """Raise :class:`ExerciseError` unless ``result`` is a tensor of exactly ``shape``."""
    if not isinstance(result, torch.Tensor):
        raise ExerciseError(f"{what} should be a torch.Tensor, got {type(result).__name__}")
    if tuple(result.shape) != tuple(shape):
        raise ExerciseError(f"{what} has shape {tuple(result.shape)}, expected {tuple(shape)}")


def close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    """Same shape and values within ``atol`` (NaN never counts as close)."""
    return (
        isinstance(a, torch.Tensor)
        and a.shape == b.shape
        and bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=1e-4))
    )
