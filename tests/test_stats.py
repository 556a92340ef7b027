"""Welch's t-test of minitransformer.stats against SciPy (a test-only reference): the statistic,
the Welch–Satterthwaite degrees of freedom, the two-sided p-value, the t distribution's tail
and quantiles; and the errors for input the test cannot take."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.stats import (
    TTest,
    paired_t_test,
    student_t_quantile,
    student_t_sf,
    welch_t_test,
)

samples = st.lists(
    st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_subnormal=False),
    min_size=2,
    max_size=12,
)


def spread(xs: list[float]) -> bool:
    return max(xs) - min(xs) > 1e-6 * max(1.0, max(abs(x) for x in xs))


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # SciPy's, on near-equal samples
@settings(max_examples=80, deadline=None)
@given(samples, samples)
def test_welch_matches_scipy(a, b) -> None:
    if not (spread(a) or spread(b)):
        return  # no spread at all: the test is undefined (checked below)
    ours = welch_t_test(a, b)
    ref = scipy.stats.ttest_ind(a, b, equal_var=False)
    assert ours.t == pytest.approx(ref.statistic, rel=1e-9, abs=1e-9)
    assert ours.df == pytest.approx(ref.df, rel=1e-9)
    assert ours.p == pytest.approx(ref.pvalue, rel=1e-8, abs=1e-13)
    assert ours.diff == pytest.approx(np.mean(a) - np.mean(b), rel=1e-9, abs=1e-9)
    assert (ours.n_a, ours.n_b) == (len(a), len(b))


def test_welch_on_seed_like_samples_and_the_five_seed_df_range() -> None:
    """Five seeds a side, spreads as in the chapter: df lies in [4, 8], sample SDs use ddof=1."""
    gen = np.random.default_rng(0)
    for _ in range(50):
        a = gen.normal(0.2, gen.uniform(0.005, 0.2), 5)
        b = gen.normal(0.25, gen.uniform(0.005, 0.2), 5)
        ours, ref = welch_t_test(a, b), scipy.stats.ttest_ind(a, b, equal_var=False)
        assert 4 - 1e-12 <= ours.df <= 8 + 1e-12
        assert ours.t == pytest.approx(ref.statistic, rel=1e-10)
        assert ours.p == pytest.approx(ref.pvalue, rel=1e-9)
        se = math.sqrt(a.var(ddof=1) / 5 + b.var(ddof=1) / 5)
        assert ours.se == pytest.approx(se, rel=1e-12)


def test_welch_takes_lists_arrays_and_tensors_alike() -> None:
    a, b = [0.1, 0.3, 0.2, 0.25], [0.5, 0.45, 0.6]
    want = welch_t_test(a, b)
    assert welch_t_test(np.array(a), np.array(b)) == want
    assert welch_t_test(torch.tensor(a, dtype=torch.float64), b) == want
    assert welch_t_test(b, a).t == -want.t and welch_t_test(b, a).p == want.p


def test_welch_is_not_a_z_test() -> None:
    """|t| = 2.5 with 5 seeds a side is not significant at 5 %: the t tail is heavier."""
    a = [1.0, 2.0, 3.0, 4.0, 5.0]
    shift = 2.5 * math.sqrt(2 * np.var(a, ddof=1) / 5)
    result = welch_t_test([x + shift for x in a], a)
    assert result.t == pytest.approx(2.5) and result.df == pytest.approx(8.0)
    assert result.p == pytest.approx(2 * scipy.stats.t.sf(2.5, 8), rel=1e-10)
    assert 0.03 < result.p < 0.05 and result.significant(0.05)
    assert not welch_t_test([x + 0.8 * shift for x in a], a).significant(0.05)
    assert 2 * scipy.stats.norm.sf(2.0) < 0.05 < 2 * scipy.stats.t.sf(2.0, 8)


@pytest.mark.parametrize("df", [0.5, 1, 1.5, 2, 3.7, 4, 8, 30, 1e3, 1e6])
@pytest.mark.parametrize("t", [-40, -3, -1, -1e-3, 0, 1e-4, 0.5, 2, 2.776, 6, 50, 1e4])
def test_student_t_sf_matches_scipy(t, df) -> None:
    want = scipy.stats.t.sf(t, df)
    assert student_t_sf(t, df) == pytest.approx(want, rel=1e-10, abs=1e-300)


def test_far_tail_keeps_its_relative_digits() -> None:
    for t, df in [(30.0, 8.0), (100.0, 4.0), (1e3, 20.0)]:
        assert student_t_sf(t, df) == pytest.approx(scipy.stats.t.sf(t, df), rel=1e-10)


@pytest.mark.parametrize("df", [1, 2.5, 4, 4.4, 8, 100])
@pytest.mark.parametrize("p", [1e-9, 0.01, 0.025, 0.3, 0.5, 0.9, 0.975, 0.995])
def test_student_t_quantile_matches_scipy(p, df) -> None:
    assert student_t_quantile(p, df) == pytest.approx(scipy.stats.t.ppf(p, df), rel=1e-10)


def test_interval_is_the_t_interval() -> None:
    a, b = [0.12, 0.1, 0.14, 0.11, 0.13], [0.2, 0.15, 0.3, 0.17, 0.16]
    result = welch_t_test(a, b)
    q = scipy.stats.t.ppf(0.975, result.df)
    low, high = result.interval(0.95)
    assert low == pytest.approx(result.diff - q * result.se, rel=1e-10)
    assert high == pytest.approx(result.diff + q * result.se, rel=1e-10)
    # the 95 % interval excludes 0 exactly when the 5 % test rejects
    assert (high < 0) == result.significant(0.05)
    assert isinstance(result, TTest)


@pytest.mark.parametrize(
    "a, b, error, message",
    [
        ([1.0], [1.0, 2.0], ValueError, "a needs at least 2 values"),
        ([1.0, 2.0], [], ValueError, "b needs at least 2 values"),
        ([1.0, float("nan")], [1.0, 2.0], ValueError, r"a\[1\] must be finite"),
        ([1.0, 2.0], [1.0, float("inf")], ValueError, r"b\[1\] must be finite"),
        ([1.0, 1.0], [2.0, 2.0, 2.0], ValueError, "no spread"),
        ("12", [1.0, 2.0], TypeError, "a must be a sequence of numbers"),
        (3.0, [1.0, 2.0], TypeError, "a must be a sequence of numbers"),
        ([1.0, "x"], [1.0, 2.0], TypeError, r"a\[1\] must be a real number"),
        ([1.0, 2.0], [True, False], TypeError, r"b\[0\] must be a real number"),
    ],
)
def test_bad_samples_get_clear_errors(a, b, error, message) -> None:
    with pytest.raises(error, match=message):
        welch_t_test(a, b)


@pytest.mark.filterwarnings("ignore:Precision loss occurred")  # SciPy's, on [1, 1, 1]
def test_one_sample_without_spread_is_fine() -> None:
    """A setting whose seeds all agree (accuracy 100 %) can still be compared."""
    result = welch_t_test([1.0, 1.0, 1.0], [0.9, 0.95, 0.85])
    ref = scipy.stats.ttest_ind([1.0, 1.0, 1.0], [0.9, 0.95, 0.85], equal_var=False)
    assert result.df == pytest.approx(ref.df) and result.p == pytest.approx(ref.pvalue)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: student_t_sf(1.0, 0.0), "df must be > 0"),
        (lambda: student_t_sf(float("nan"), 3.0), "t must be finite"),
        (lambda: student_t_quantile(1.0, 3.0), "probability must be in"),
        (lambda: student_t_quantile(0.0, 3.0), "probability must be in"),
        (lambda: student_t_quantile(0.5, -1.0), "df must be > 0"),
        (lambda: welch_t_test([1, 2], [3, 5]).interval(1.0), "confidence must be in"),
        (lambda: welch_t_test([1, 2], [3, 5]).significant(0.0), "alpha must be in"),
    ],
)
def test_bad_parameters_get_clear_errors(call, message) -> None:
    with pytest.raises(ValueError, match=message):
        call()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(min_value=2, max_value=10).flatmap(
        lambda n: st.tuples(
            st.lists(st.floats(-1e3, 1e3, allow_subnormal=False), min_size=n, max_size=n),
            st.lists(st.floats(-1e3, 1e3, allow_subnormal=False), min_size=n, max_size=n),
        )
    )
)
def test_paired_matches_scipy(pair) -> None:
    a, b = pair
    d = [x - y for x, y in zip(a, b, strict=True)]
    if not spread(d):
        return
    ours, ref = paired_t_test(a, b), scipy.stats.ttest_rel(a, b)
    assert ours.t == pytest.approx(ref.statistic, rel=1e-8, abs=1e-9)
    assert ours.df == ref.df == len(a) - 1
    assert ours.p == pytest.approx(ref.pvalue, rel=1e-7, abs=1e-13)


def test_pairing_resolves_a_shared_seed_effect() -> None:
    """Seeds that move both settings alike hide a small shift from Welch, not from pairs."""
    seed_effect = [0.0, 0.3, -0.2, 0.5, -0.4]
    a = [0.1 + e + 0.01 * i for i, e in enumerate(seed_effect)]
    b = [e + 0.01 * (i % 2) for i, e in enumerate(seed_effect)]
    assert welch_t_test(a, b).p > 0.5 and paired_t_test(a, b).p < 1e-3


@pytest.mark.parametrize(
    "a, b, message",
    [
        ([1.0, 2.0], [1.0, 2.0, 3.0], "must pair up"),
        ([1.0, 2.0], [0.0, 1.0], "a - b has no spread"),
        ([1.0], [1.0], "a needs at least 2 values"),
    ],
)
def test_paired_refuses_what_it_cannot_test(a, b, message) -> None:
    with pytest.raises(ValueError, match=message):
        paired_t_test(a, b)
