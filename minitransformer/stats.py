"""Is a difference over seeds real? Welch's t-test (chapter "The paper's Table 3 at toy scale",
section "How large a difference counts").

An experiment trained with a few seeds per setting gives a few numbers per setting. Whether two
settings differ is a question about their means, asked of small samples whose spreads may
differ. Welch's t-test answers it:

* each sample's spread is its *sample* variance, ``s^2 = sum((x - mean)^2) / (n - 1)``
  (ddof = 1, the book's one convention, as in :func:`minitransformer.report.mean_sd`);
* the difference of the means ``mean_a - mean_b`` has the standard error
  ``se = sqrt(s_a^2 / n_a + s_b^2 / n_b)``, and ``t = (mean_a - mean_b) / se``;
* if both samples come from normal distributions with the same mean (their variances may
  differ), ``t`` follows Student's t distribution with the Welch–Satterthwaite degrees of
  freedom ``df = se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))``, which
  lie between ``min(n_a, n_b) - 1`` and ``n_a + n_b - 2``;
* the two-sided p-value is ``P(|T_df| >= |t|)``: the chance of a difference at least this large
  if the settings did not differ. A 5 % test calls the difference real when ``p < 0.05``.

With five seeds ``df`` is between 4 and 8, and the t distribution's tails are much heavier than
the normal's: ``|t| > 2`` is *not* a 5 % test (it needs ``|t| > 2.78`` at 4 degrees of freedom,
``|t| > 2.31`` at 8). The t distribution is computed here, from the regularised incomplete beta
function, so the package needs no SciPy; its tests compare it with
``scipy.stats.ttest_ind(a, b, equal_var=False)``.

Where the two samples share their seeds (the same seed drew the same training batches for
both settings), :func:`paired_t_test` tests the per-seed differences instead, with ``n - 1``
degrees of freedom (``scipy.stats.ttest_rel``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import SupportsFloat

from minitransformer._checks import finite_float

__all__ = ["TTest", "paired_t_test", "student_t_quantile", "student_t_sf", "welch_t_test"]

_EPS, _TINY, _MAX_TERMS = 1e-15, 1e-300, 500


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz's method); it
    converges fast for ``x < (a + 1) / (a + b + 2)``."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _MAX_TERMS + 1):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),  # the even step d_2m
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),  # the odd d_2m+1
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta fraction did not converge for a={a}, b={b}, x={x}")


def _log_beta_front(a: float, b: float, x: float, y: float) -> float:
    """``log(x^a y^b / B(a, b))`` with ``y = 1 - x`` given separately (exact where ``x`` is
    near 1). For a large ``a``, ``log Gamma(a + b) - log Gamma(a)`` comes from its asymptotic
    series rather than from the difference of two huge ``lgamma`` values."""
    log_x = math.log(x) if x < 0.5 else math.log1p(-y)
    log_y = math.log(y) if y < 0.5 else math.log1p(-x)
    if a > 1e4:  # Gamma(a + b) / Gamma(a) = a^b (1 + c1 / a + c2 / a^2 + O(a^-3))
        c1 = b * (b - 1) / 2
        c2 = b * (b - 1) * (b - 2) * (3 * b - 1) / 24
        ratio = b * math.log(a) + c1 / a + (c2 - c1 * c1 / 2) / (a * a)
    else:
        ratio = math.lgamma(a + b) - math.lgamma(a)
    return ratio - math.lgamma(b) + a * log_x + b * log_y


def _regularized_beta(a: float, b: float, x: float, y: float) -> float:
    """``I_x(a, b)``, the regularised incomplete beta function, for ``a, b > 0`` and
    ``0 <= x <= 1``, with ``y = 1 - x`` computed by the caller without cancellation."""
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    front = math.exp(_log_beta_front(a, b, x, y))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, y) / b  # I_x(a, b) = 1 - I_y(b, a)


def _two_sided_tail(t: float, df: float) -> float:
    """``P(|T| > |t|) = I_x(df / 2, 1 / 2)`` with ``x = df / (df + t^2)``."""
    t2 = t * t
    return _regularized_beta(df / 2.0, 0.5, df / (df + t2), t2 / (df + t2))


def student_t_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t distribution with ``df`` (real, > 0) degrees of freedom.

    Section "How large a difference counts" of the chapter "The paper's Table 3 at toy scale".
    From ``P(|T| > |t|) = I_x(df / 2, 1 / 2)`` with ``x = df / (df + t^2)``, the regularised
    incomplete beta function (a continued fraction); agrees with SciPy to a relative 1e-10 for
    df from 0.5 to 1e6, far out in the tail too (``tests/test_stats.py``).
    """
    t = finite_float("t", t)
    df = finite_float("df", df, low=0.0, low_open=True)
    tail = 0.5 * _two_sided_tail(t, df)  # P(T > |t|)
    return tail if t >= 0 else 1.0 - tail


def _upper_quantile(tail: float, df: float) -> float:
    """The ``q >= 0`` with ``P(T > q) = tail``, for ``0 < tail <= 0.5``, by bisection."""
    low, high = 0.0, 1.0
    while 0.5 * _two_sided_tail(high, df) > tail:
        low, high = high, 2.0 * high
    while high - low > 1e-13 * high:
        mid = 0.5 * (low + high)
        low, high = (mid, high) if 0.5 * _two_sided_tail(mid, df) > tail else (low, mid)
    return 0.5 * (low + high)


def student_t_quantile(probability: float, df: float) -> float:
    """The ``q`` with ``P(T <= q) = probability``, for Student's t with ``df`` degrees of freedom.

    ``student_t_quantile(0.975, 4)`` is 2.776: a two-sided 95 % interval of a difference with
    4 degrees of freedom reaches 2.776 standard errors either side. Found by bisection on the
    tail probability, to a relative 1e-12. Section "How large a difference counts".
    """
    p = finite_float("probability", probability, low=0.0, high=1.0, low_open=True, high_open=True)
    df = finite_float("df", df, low=0.0, low_open=True)
    if p < 0.5:  # by symmetry, from the lower tail's own mass (1 - p would lose its digits)
        return -_upper_quantile(p, df)
    return _upper_quantile(1.0 - p, df)


@dataclass(frozen=True)
class TTest:
    """The result of :func:`welch_t_test` or :func:`paired_t_test`: the difference
    ``mean_a - mean_b``, its standard error ``se``, the statistic ``t = diff / se``, the
    degrees of freedom ``df`` (Welch–Satterthwaite's, or ``n - 1`` for pairs), the two-sided
    p-value ``p``, and the sample sizes."""

    diff: float
    se: float
    t: float
    df: float
    p: float
    n_a: int
    n_b: int

    def interval(self, confidence: float = 0.95) -> tuple[float, float]:
        """The two-sided ``confidence`` interval of ``mean_a - mean_b``:
        ``diff -+ q se``, with ``q`` the t quantile at ``(1 + confidence) / 2`` and ``df``."""
        c = finite_float("confidence", confidence, low=0.0, high=1.0, low_open=True, high_open=True)
        q = student_t_quantile(0.5 + 0.5 * c, self.df)
        return self.diff - q * self.se, self.diff + q * self.se

    def significant(self, alpha: float = 0.05) -> bool:
        """Whether the two-sided test at level ``alpha`` rejects equal means: ``p < alpha``."""
        return self.p < finite_float("alpha", alpha, low=0.0, high=1.0, low_open=True)


def _sample(name: str, values: Iterable[SupportsFloat]) -> list[float]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of numbers, got {type(values).__name__}")
    items = [finite_float(f"{name}[{i}]", v) for i, v in enumerate(values)]
    if len(items) < 2:
        raise ValueError(f"{name} needs at least 2 values for a variance, got {len(items)}")
    return items


def _mean_and_variance(items: list[float]) -> tuple[float, float]:
    """The mean and the sample variance (ddof = 1), summed exactly with :func:`math.fsum`."""
    mean = math.fsum(items) / len(items)
    return mean, math.fsum((x - mean) ** 2 for x in items) / (len(items) - 1)


def welch_t_test(a: Iterable[SupportsFloat], b: Iterable[SupportsFloat]) -> TTest:
    """Welch's two-sided t-test of equal means for two independent samples ``a`` and ``b``
    (the module docstring has the formulas). Section "How large a difference counts" of the
    chapter "The paper's Table 3 at toy scale".

    Args:
        a, b: the per-seed results of two settings (lists, NumPy arrays or 1-d tensors of
            finite numbers), at least 2 each; their sizes may differ.

    Returns:
        A :class:`TTest`; ``t > 0`` when ``a``'s mean is the larger. The same statistic,
        degrees of freedom and p-value as ``scipy.stats.ttest_ind(a, b, equal_var=False)``.

    Raises:
        TypeError: a sample that is not a sequence of real numbers.
        ValueError: fewer than 2 values, a NaN or infinite value, or two samples without any
            spread (all values of ``a`` equal and all of ``b`` equal), for which the test is
            undefined.
    """
    xs, ys = _sample("a", a), _sample("b", b)
    (mean_a, var_a), (mean_b, var_b) = _mean_and_variance(xs), _mean_and_variance(ys)
    na, nb = len(xs), len(ys)
    va, vb = var_a / na, var_b / nb  # the squared standard errors of the two means
    if va + vb == 0.0:
        raise ValueError(
            f"a and b have no spread (every value of a is {xs[0]!r}, every value of b "
            f"{ys[0]!r}): the t statistic is undefined"
        )
    se = math.sqrt(va + vb)
    diff = mean_a - mean_b
    t = diff / se
    df = (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1))
    p = min(1.0, 2.0 * student_t_sf(abs(t), df))
    return TTest(diff=diff, se=se, t=t, df=df, p=p, n_a=na, n_b=nb)


def paired_t_test(a: Iterable[SupportsFloat], b: Iterable[SupportsFloat]) -> TTest:
    """The paired two-sided t-test of equal means: ``a[i]`` and ``b[i]`` are results of the
    same seed (the same training batches). Section "How large a difference counts".

    The differences ``d = a - b`` are one sample: ``t = mean(d) / (s_d / sqrt(n))`` with the
    sample standard deviation ``s_d`` (ddof = 1), referred to Student's t with ``n - 1``
    degrees of freedom; the same as ``scipy.stats.ttest_rel(a, b)``. Where the seeds' results
    for two settings are correlated it resolves smaller differences than
    :func:`welch_t_test`, which ignores the pairing.

    Raises:
        TypeError, ValueError: as :func:`welch_t_test`; also for samples of different sizes,
            and for differences without spread (all equal).
    """
    xs, ys = _sample("a", a), _sample("b", b)
    if len(xs) != len(ys):
        raise ValueError(f"a and b must pair up, got {len(xs)} and {len(ys)} values")
    mean, var = _mean_and_variance([x - y for x, y in zip(xs, ys, strict=True)])
    if var == 0.0:
        raise ValueError(
            f"a - b has no spread (every difference is {xs[0] - ys[0]!r}): the t statistic "
            "is undefined"
        )
    n = len(xs)
    se = math.sqrt(var / n)
    t = mean / se
    p = min(1.0, 2.0 * student_t_sf(abs(t), n - 1.0))
    return TTest(diff=mean, se=se, t=t, df=n - 1.0, p=p, n_a=n, n_b=n)
