"""Numbers for the prose, printed at a precision that another CPU reproduces.

A measured number (a loss, an accuracy, a ratio) differs in its last bits from one CPU, thread
count or library version to the next. Printed at two decimals, 0.6449 and 0.6451 are "0.64"
and "0.65": a recorded output that sits on a rounding edge fails on the next machine.
:func:`fmt` formats a value like ``format()``, and *while the notebooks are being recorded*
(``scripts/run_notebooks.py`` sets ``MINITRANSFORMER_RECORD=1``) it refuses a value that lies
within a set distance of a rounding edge. The author then prints fewer digits, a bound ("above
0.6") or a range over seeds. At any other time (a replay, the HTML build, a learner's run) it
only formats: whether a replayed value still prints the same is what the tests compare.

The distance is ``margin`` units of the last printed digit (0.1 by default: at ``".2f"`` the
value must be at least 0.0005 from the nearest edge ``x.xx5``), or ``spread``, an absolute
amount by which the value is known to move (the seed-to-seed or CPU-to-CPU spread), whichever
is larger. Book: CONTRIBUTING.md, "Numbers in the text".
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from decimal import ROUND_FLOOR, Decimal

__all__ = ["RECORD_ENV", "RoundingEdgeError", "fmt", "fmt_range", "mean_sd", "rounding_margin"]

RECORD_ENV = "MINITRANSFORMER_RECORD"
"""The environment variable that makes :func:`fmt` strict; ``scripts/run_notebooks.py`` sets it."""

# A format spec as format() reads it, for numbers: [[fill]align][sign][z][#][0][width]
# [grouping][.precision][type].
_SPEC = re.compile(
    r"(?P<head>(?:.?[<>=^])?[-+ ]?)(?P<z>z?)(?P<tail>#?0?\d*[,_]?)"
    r"(?:\.(?P<precision>\d+))?(?P<type>[fFeE%gGd]?)"
)


class RoundingEdgeError(ValueError):
    """A value too close to a rounding edge to print reproducibly at the asked precision."""


def _parse(spec: str) -> re.Match[str]:
    match = _SPEC.fullmatch(spec)
    if match is None:
        raise ValueError(
            f"spec must be a number format such as '.2f', '>8.1%', '.3g', '+.2e', ',.0f' or "
            f"',d', got {spec!r}"
        )
    return match


def _last_digit(value: float, spec: str) -> int | None:
    """k such that one unit of the last printed digit of ``format(value, spec)`` is 10**k.

    None for an integer spec or a zero printed in scientific notation, which have no edge.
    """
    match = _parse(spec)
    kind = match["type"] or "g"
    if kind == "d":
        return None
    precision = int(match["precision"]) if match["precision"] is not None else 6
    if kind in "fF":
        return -precision
    if kind == "%":
        return -(precision + 2)
    if value == 0:
        return None  # 0 prints as 0 at any precision
    exponent = Decimal(abs(value)).adjusted()  # floor(log10|value|), exactly
    if kind in "eE":
        return exponent - precision
    return exponent - max(precision, 1) + 1  # g: significant digits


def rounding_margin(value: float, spec: str) -> float:
    """How far ``value`` is from the nearest value that prints differently at ``spec``.

    The result is an absolute distance: 0.0005 for 0.6445 at ``".2f"`` (the edge is 0.645),
    ``inf`` for an integer printed with ``"d"`` or ``",d"``, which has no edge. Computed in
    exact decimal arithmetic, so it is right for tiny and huge values too.
    """
    k = _last_digit(value, spec)
    if k is None:
        return math.inf
    exact = Decimal(value)
    scaled = exact.scaleb(-k)  # exact: the value in units of the last digit
    margin = abs(scaled - scaled.to_integral_value(ROUND_FLOOR) - Decimal("0.5")).scaleb(k)
    if _parse(spec)["type"] in "eEgG" or not _parse(spec)["type"]:
        # Below the value's power of ten the last digit is 10 times smaller: 1.00e+00 has its
        # lower edge at 0.9995 (9.99e-01 against 1.00e+00), not at 0.995.
        decade = Decimal(1).scaleb(abs(exact).adjusted())
        margin = min(margin, abs(exact) - decade + Decimal(5).scaleb(k - 2))
    return float(margin)


def _strict() -> bool:
    return os.environ.get(RECORD_ENV, "") not in ("", "0")


def fmt(
    value: float,
    spec: str = ".2f",
    *,
    margin: float = 0.1,
    spread: float = 0.0,
    strict: bool | None = None,
) -> str:
    """``format(value, spec)``, refused at record time if ``value`` sits on a rounding edge.

    Args:
        value: the number to print (a Python or NumPy number, or a 0-d tensor).
        spec: a format spec as for ``format()``: ``".2f"``, ``">8.1%"``, ``".3g"``,
            ``"+.2e"``, ``",.0f"``; ``",d"`` for an integer (which has no edge). Negative
            zero prints as zero.
        margin: the least distance to a rounding edge, in units of the last printed digit.
        spread: the least distance to a rounding edge in the value's own units: how far the
            value moves between seeds or CPUs, where that is known to exceed ``margin``.
        strict: refuse values on an edge; default: only while recording
            (``MINITRANSFORMER_RECORD=1``).

    Raises:
        RoundingEdgeError: when strict and the value is closer to an edge than allowed. The
            message says how close, and what to do instead.
        ValueError: for a NaN or infinite value, a negative margin or spread, or a spec this
            function does not understand.
    """
    parts = _parse(spec)
    number = float(value)
    if isinstance(value, int) and not isinstance(value, bool) and spec.endswith("d"):
        return format(value, spec)
    if not math.isfinite(number):
        raise ValueError(f"value must be finite, got {number!r}")
    if not (margin >= 0 and spread >= 0):
        raise ValueError(f"margin and spread must be >= 0, got margin={margin}, spread={spread}")
    if spec.endswith("d"):
        if number != round(number):
            raise ValueError(f"spec {spec!r} prints an integer, got {number!r}")
        return format(round(number), spec)
    # "z": a tiny negative number prints as "0.00", never as "-0.00".
    text = format(number, parts["head"] + "z" + spec[parts.end("z") :])
    if strict if strict is not None else _strict():
        k = _last_digit(number, spec)
        if k is not None:
            needed = max(margin * 10.0**k, spread)
            have = rounding_margin(number, spec)
            if have < needed:
                raise RoundingEdgeError(
                    f"{number!r} prints as {text!r} at {spec!r}, but it is only {have:.2g} from "
                    f"a rounding edge (needs {needed:.2g}): another CPU may print the next "
                    f"digit. Print fewer digits, a bound, or a range over seeds."
                )
    return text


def fmt_range(
    values: Iterable[float],
    spec: str = ".2f",
    *,
    margin: float = 0.1,
    spread: float = 0.0,
    strict: bool | None = None,
) -> str:
    """``"0.64–0.66"``: the smallest and largest of ``values``, each through :func:`fmt`.

    One value (or all equal) prints once. The keyword arguments are :func:`fmt`'s.
    """
    items = [float(v) for v in values]
    if not items:
        raise ValueError("values must not be empty")
    low, high = (
        fmt(v, spec, margin=margin, spread=spread, strict=strict) for v in (min(items), max(items))
    )
    return low if low == high else f"{low}–{high}"


def mean_sd(
    values: Iterable[float],
    spec: str = ".2f",
    *,
    margin: float = 0.1,
    spread: float = 0.0,
    strict: bool | None = None,
) -> str:
    """``"0.65 ± 0.01"``: the mean and the sample standard deviation (ddof = 1) of ``values``.

    The book's one convention for a spread over seeds is the sample standard deviation, with
    ``n - 1`` in the denominator. Both numbers go through :func:`fmt`, with its keyword
    arguments.
    """
    items = [float(v) for v in values]
    if len(items) < 2:
        raise ValueError(f"values must hold at least 2 numbers for a spread, got {len(items)}")
    mean = math.fsum(items) / len(items)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in items) / (len(items) - 1))
    mean_text, sd_text = (
        fmt(v, spec, margin=margin, spread=spread, strict=strict) for v in (mean, sd)
    )
    return f"{mean_text} ± {sd_text}"
