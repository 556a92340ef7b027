"""Argument checks shared by every module, so that the same mistake gets the same error.

The conventions (CONTRIBUTING.md, "Errors"):

* ``TypeError`` when an argument has the wrong *kind*: not a tensor, not an int, a float tensor
  where token ids are expected, an integer tensor where a float one is expected, a non-boolean
  mask.
* ``ValueError`` when the kind is right but the value is not: a size of 0, a NaN, a shape that
  does not fit.

Every message starts with the argument's name and shows the value or shape it got. The checks
are plain Python (no tensor operations beyond reading ``.shape`` and ``.dtype``), so they cost
microseconds and can run on every call.
"""

from __future__ import annotations

import math
import numbers
import operator

import torch
from torch import Tensor

__all__ = [
    "shape_of",
    "as_int",
    "positive_int",
    "finite_float",
    "probability",
    "tensor",
    "ID_DTYPES",
    "ids",
    "module",
]


def shape_of(x: object) -> str:
    """``(2, 3)`` for a tensor, the type name for anything else (for messages)."""
    return str(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__


def as_int(name: str, value: object) -> int:
    """``value`` as a Python int: ints, NumPy ints and 0-d integer tensors pass; bools do not."""
    if isinstance(value, bool) or (isinstance(value, Tensor) and value.dtype == torch.bool):
        raise TypeError(f"{name} must be an int, got bool {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]  # TypeError is handled
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def positive_int(name: str, value: object, *, allow_zero: bool = False) -> int:
    """``value`` as an int ``>= 1`` (``>= 0`` with ``allow_zero``); else TypeError/ValueError."""
    n = as_int(name, value)
    if n < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {n}")
    return n


def finite_float(
    name: str,
    value: object,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """``value`` as a finite float, optionally within ``[low, high]`` (``low_open`` and
    ``high_open`` exclude the ends)."""
    if isinstance(value, Tensor) and value.dim() == 0 and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise ValueError(f"{name} must be finite, got {x}")
    below = low is not None and (x <= low if low_open else x < low)
    above = high is not None and (x >= high if high_open else x > high)
    if below or above:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
        if low is not None and high is not None:
            where = f"in {lo}, {hi}"
        elif low is not None:
            where = f"{'>' if low_open else '>='} {low:g}"
        else:
            where = f"{'<' if high_open else '<='} {high:g}"
        raise ValueError(f"{name} must be {where}, got {x:g}")
    return x


def probability(name: str, value: object) -> float:
    """A dropout-style probability in ``[0, 1)``."""
    return finite_float(name, value, low=0.0, high=1.0, high_open=True)


_KINDS = {
    "float": (lambda d: d.is_floating_point, "a floating-point"),
    "int": (lambda d: not (d.is_floating_point or d.is_complex or d == torch.bool), "an integer"),
    "bool": (lambda d: d == torch.bool, "a boolean"),
}


def tensor(
    name: str,
    x: object,
    *,
    kind: str | None = None,
    ndim: int | None = None,
    what: str | None = None,
) -> Tensor:
    """Check that ``x`` is a tensor of the given dtype ``kind`` ("float", "int" or "bool") and
    number of dimensions. ``what`` describes the expected shape in the message, e.g. "(B, S)".
    Returns ``x``."""
    if not isinstance(x, Tensor):
        shape = f" {what}" if what else ""
        raise TypeError(f"{name} must be a torch.Tensor{shape}, got {type(x).__name__}")
    if kind is not None:
        ok, article = _KINDS[kind]
        if not ok(x.dtype):
            raise TypeError(f"{name} must be {article} tensor, got dtype {x.dtype}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(
            f"{name} must have {ndim} dimensions{f' {what}' if what else ''}, "
            f"got shape {tuple(x.shape)}"
        )
    return x


#: The integer dtypes accepted for token ids and indices: those torch can index with once
#: converted to int64 (uint8 must be converted: torch reads a uint8 index as a mask). The
#: unsigned 16-, 32- and 64-bit types are refused (torch has few operations for them).
ID_DTYPES = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


def ids(
    name: str,
    x: object,
    *,
    ndim: int | None = None,
    what: str | None = None,
    low: int | None = 0,
    high: int | None = None,
    within: str = "the vocabulary",
) -> Tensor:
    """The one rule for token ids and indices: ``x`` must be a tensor of one of
    :data:`ID_DTYPES` (TypeError naming ``name`` otherwise: floats, bools, uint16/32/64) and of
    ``ndim`` dimensions; it comes back as int64 (the same tensor when it already is), before
    any arithmetic or indexing. Every element must lie in ``[low, high)`` (None: unbounded),
    negative ids included: a ValueError names ``name``, the range found and ``within`` (what
    the range is of). One ``aminmax`` pass, skipped on the meta device."""
    tensor(name, x, what=what)
    assert isinstance(x, Tensor)  # checked just above (for the type checker)
    if x.dtype not in ID_DTYPES:  # the kind first, then the shape, as tensor() does
        raise TypeError(
            f"{name} must be an integer tensor of ids (int8, int16, int32, int64 or uint8), "
            f"got dtype {x.dtype}"
        )
    tensor(name, x, ndim=ndim, what=what)
    x = x.long()  # no copy for int64
    if x.numel() and x.device.type != "meta" and (low is not None or high is not None):
        lo, hi = (int(v) for v in torch.aminmax(x))
        if (low is not None and lo < low) or (high is not None and hi >= high):
            bounds = f"[{'-inf' if low is None else low}, {'inf' if high is None else high})"
            raise ValueError(f"{name} holds ids in [{lo}, {hi}], outside {within} {bounds}")
    return x


def module(name: str, obj: object) -> torch.nn.Module:
    """Check that ``obj`` is a ``torch.nn.Module`` (a model, a layer); returns it."""
    if not isinstance(obj, torch.nn.Module):
        raise TypeError(f"{name} must be a torch.nn.Module, got {type(obj).__name__}")
    return obj
