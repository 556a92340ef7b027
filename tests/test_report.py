"""minitransformer.report: numbers printed at a precision another CPU reproduces."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minitransformer.report import (
    RECORD_ENV,
    RoundingEdgeError,
    fmt,
    fmt_range,
    mean_sd,
    rounding_margin,
)


@pytest.mark.parametrize(
    ("value", "spec", "text"),
    [
        (0.6412, ".2f", "0.64"),
        (0.9991, ".1%", "99.9%"),
        (12345.6, ",.0f", "12,346"),
        (7.91e-3, ".2e", "7.91e-03"),
        (0.01234, ".3g", "0.0123"),
        (np.float32(0.25), ".1f", "0.2"),  # exactly on an edge: refused when strict (below)
        (torch.tensor(3.14159), ".3f", "3.142"),
        (0.25123, ">8.2f", "    0.25"),
        (-0.5123, "+.1%", "-51.2%"),
        (1234.5678, "_>12,.1f", "_____1,234.6"),
    ],
)
def test_formats_like_format(value, spec, text):
    assert fmt(value, spec, strict=False) == text == format(float(value), spec)


@pytest.mark.parametrize(
    ("value", "spec"),
    [(0.645, ".2f"), (0.64499, ".2f"), (0.99951, ".1%"), (1234.5, ".4g"), (2.5e-3, ".0e")],
)
def test_refuses_a_value_on_a_rounding_edge_when_strict(value, spec):
    with pytest.raises(RoundingEdgeError, match="rounding edge"):
        fmt(value, spec, strict=True)
    assert fmt(value, spec, strict=False) == format(value, spec)  # a replay only formats


def test_margin_and_spread_set_the_distance():
    # 0.6441 is 0.0009 from the edge 0.645, less than the default 0.1 unit (0.001 at .2f), so
    # it is refused; a margin of 0.05 units lets it through.
    with pytest.raises(RoundingEdgeError):
        fmt(0.6441, ".2f", strict=True)
    assert fmt(0.6441, ".2f", strict=True, margin=0.05) == "0.64"
    assert fmt(0.6412, ".2f", strict=True) == "0.64"
    with pytest.raises(RoundingEdgeError, match="needs 0.005"):
        fmt(0.6412, ".2f", strict=True, spread=0.005)


def test_strict_follows_the_recording_environment(monkeypatch):
    monkeypatch.setenv(RECORD_ENV, "1")
    with pytest.raises(RoundingEdgeError):
        fmt(0.645, ".2f")
    monkeypatch.setenv(RECORD_ENV, "0")
    assert fmt(0.645, ".2f") == "0.65"
    monkeypatch.delenv(RECORD_ENV)
    assert fmt(0.645, ".2f") == "0.65"


def test_integers_have_no_edge():
    assert fmt(3_152_384, ",d", strict=True) == "3,152,384"
    assert fmt(12.0, ",d", strict=True) == "12"
    assert rounding_margin(5, ",d") == math.inf
    with pytest.raises(ValueError, match="prints an integer"):
        fmt(12.5, ",d")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"value": float("nan")}, "finite"),
        ({"value": math.inf}, "finite"),
        ({"value": 1.0, "spec": "x"}, "spec must be a number format"),
        ({"value": 1.0, "margin": -1.0}, "margin and spread"),
    ],
)
def test_bad_input_is_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        fmt(**kwargs)


def test_range_and_mean_sd():
    assert fmt_range([0.662, 0.641, 0.65], strict=True) == "0.64–0.66"
    assert fmt_range([0.6412, 0.6413], strict=True) == "0.64"
    assert mean_sd([1.0, 2.0, 3.0], ".1f", strict=True) == "2.0 ± 1.0"  # ddof = 1
    assert mean_sd([0.1, 0.3], ".2f") == f"{0.2:.2f} ± {np.std([0.1, 0.3], ddof=1):.2f}"
    with pytest.raises(ValueError, match="at least 2"):
        mean_sd([1.0])
    with pytest.raises(ValueError, match="empty"):
        fmt_range([])


@given(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_subnormal=False),
    st.sampled_from([".0f", ".1f", ".2f", ".3f", ".1%", ".2e", ".3g"]),
)
def test_a_value_with_margin_prints_the_same_after_a_small_move(value, spec):
    """The guarantee: a value fmt accepts prints the same after any move below the margin."""
    try:
        text = fmt(value, spec, strict=True)
    except RoundingEdgeError:
        return
    move = 0.9 * rounding_margin(value, spec)
    if not math.isfinite(move) or move < 1e-9 * abs(value):  # no edge, or below resolution
        return
    for moved in (value - move, value + move):
        assert format(moved, "z" + spec) == text


def test_no_negative_zero():
    assert fmt(-1e-17, ".2f", strict=True) == fmt(1e-17, ".2f", strict=True) == "0.00"
    assert fmt(-0.0, ".1%", strict=True) == "0.0%"
