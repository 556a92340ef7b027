"""Checkers for the chapter "The paper's Table 3 at toy scale" (``book/ablations``)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from minitransformer.exercises._core import Case, checker, like, when
from minitransformer.model import Transformer, parameter_breakdown
from minitransformer.stats import student_t_sf, welch_t_test

__all__ = ["check_implied_vocabulary", "check_verdict", "check_welch_t"]


# -- the vocabulary a published parameter count implies -----------------------------------------


def _layers(config: dict[str, Any]) -> tuple[int, int]:
    """``(parameters outside the embedding, d_model)``, counted by the package on ``meta``."""
    with torch.device("meta"):
        counts = parameter_breakdown(Transformer(2, 2, **config))
    return counts["total"] - counts["embeddings"], config["d_model"]


def _implied_with(half_width: float = 5e5, matrices: int = 1, subtract: bool = True) -> Any:
    """The range of V, computed with a half-width, a number of V x d_model matrices and
    whether the layers' parameters are subtracted: the reference, and its mistakes."""

    def implied(config: dict[str, Any], millions: int) -> tuple[float, float]:
        others, d_model = _layers(config)
        rest = millions * 1e6 - (others if subtract else 0)
        return (rest - half_width) / (matrices * d_model), (rest + half_width) / (
            matrices * d_model
        )

    return implied


_implied = _implied_with()


def _rounded(got: Any, want: Any) -> bool:
    return all(g == math.floor(w) or g == math.ceil(w) for g, w in zip(got, want, strict=True))


_VOCAB_MISTAKES = [
    when(
        lambda got: not isinstance(got, (tuple, list)) or len(got) != 2,
        "return a pair (low, high): the smallest and the largest vocabulary that fit",
    ),
    like(
        lambda config, millions: _implied(config, millions)[::-1],
        "your pair is (high, low): return the smaller bound first",
    ),
    like(
        _implied_with(0.0),
        "you return the exact solution twice; the paper rounds its column to whole millions, "
        "so any count within half a million of `millions` * 1e6 fits: solve for "
        "`millions` * 1e6 - 5e5 and + 5e5",
    ),
    like(
        [_implied_with(1e6), _implied_with(5e4)],
        "your range has the wrong width: a count rounded to whole millions lies within half a "
        "million (5e5) of the printed number",
    ),
    like(
        [_implied_with(5e5, 3), _implied_with(5e5, 2)],
        "you count separate embedding matrices; the paper ties them (section 3.4): the source "
        "embedding, the target embedding and the output projection are one V x d_model matrix",
    ),
    like(
        _implied_with(5e5, subtract=False),
        "you divide the whole count by d_model; first subtract the parameters of the layers "
        "(count a model with any vocabulary, then take its V x d_model embedding away)",
    ),
    when(
        lambda got, want: _rounded(got, want),
        "you round the bounds to whole tokens; return them unrounded (floats)",
    ),
]


@checker(
    "the vocabulary a parameter count implies",
    reference=_implied,
    mistakes=_VOCAB_MISTAKES,
    returns=["low", "high"],
    atol=1e-6,
    rtol=1e-12,
    otherwise="With others the parameters outside the tied V x d_model embedding, a count "
    "printed as `millions` is V d_model + others within millions * 1e6 -+ 5e5",
)
def check_implied_vocabulary() -> list[Case]:
    """Check ``fn(config, millions) -> (low, high)``: the range of the shared vocabulary ``V``
    for which the model of ``config`` (options of :class:`~minitransformer.model.Transformer`)
    has a parameter count that rounds to ``millions`` million."""
    rows = [
        ({"num_layers": 6, "d_model": 512, "d_ff": 2048, "num_heads": 8}, 65),
        ({"num_layers": 2, "d_model": 512, "d_ff": 2048, "num_heads": 8}, 36),
        ({"num_layers": 6, "d_model": 256, "d_ff": 2048, "num_heads": 8}, 28),
        ({"num_layers": 6, "d_model": 1024, "d_ff": 4096, "num_heads": 16}, 213),
        ({"num_layers": 3, "d_model": 96, "d_ff": 200, "num_heads": 3}, 2),
    ]
    return [
        Case(
            f"for N={c['num_layers']}, d_model={c['d_model']}, d_ff={c['d_ff']} and {m}M",
            config=c,
            millions=m,
        )
        for c, m in rows
    ]


# -- Welch's t statistic and its degrees of freedom --------------------------------------------


def _welch(a: Tensor, b: Tensor) -> tuple[float, float]:
    result = welch_t_test(a, b)
    return result.t, result.df


def _moments(a: Tensor, b: Tensor, ddof: int = 1) -> tuple[float, float, float, float, int, int]:
    na, nb = a.numel(), b.numel()
    va = float(a.double().var(correction=ddof)) / na
    vb = float(b.double().var(correction=ddof)) / nb
    return float(a.double().mean()), float(b.double().mean()), va, vb, na, nb


def _welch_with(ddof: int = 1, df: str = "welch", se: str = "welch", sign: int = 1) -> Any:
    def wrong(a: Tensor, b: Tensor) -> tuple[float, float]:
        ma, mb, va, vb, na, nb = _moments(a, b, ddof)
        if se == "pooled":  # Student's t: one variance for both samples
            pooled = ((na - 1) * va * na + (nb - 1) * vb * nb) / (na + nb - 2)
            error = math.sqrt(pooled * (1 / na + 1 / nb))
        elif se == "sd":  # the standard deviations, not the standard errors of the means
            error = math.sqrt(va * na + vb * nb)
        else:
            error = math.sqrt(va + vb)
        freedom = {
            "welch": (va + vb) ** 2 / (va**2 / (na - 1) + vb**2 / (nb - 1)),
            "pooled": na + nb - 2.0,
            "min": min(na, nb) - 1.0,
            "n": (va + vb) ** 2 / (va**2 / na + vb**2 / nb),
        }[df]
        return sign * (ma - mb) / error, freedom

    return wrong


_WELCH_MISTAKES = [
    like(
        _welch_with(sign=-1),
        "your t has the wrong sign: t = (mean_a - mean_b) / se, positive when a's mean is larger",
    ),
    like(
        _welch_with(ddof=0),
        "you use the population variance (ddof = 0: np.var's default, "
        "torch.var(correction=0)); the sample variance divides by n - 1",
    ),
    like(
        _welch_with(se="pooled", df="pooled"),
        "that is Student's t-test, with one pooled variance and n_a + n_b - 2 degrees of "
        "freedom; Welch's test keeps the two variances apart: se = sqrt(s_a^2 / n_a + "
        "s_b^2 / n_b), and the Welch-Satterthwaite degrees of freedom",
    ),
    like(
        _welch_with(se="sd"),
        "you divide by sqrt(s_a^2 + s_b^2); the standard error of a mean is s / sqrt(n): "
        "se = sqrt(s_a^2 / n_a + s_b^2 / n_b)",
    ),
    like(
        [_welch_with(df="pooled"), _welch_with(df="min")],
        "your t is right but not the degrees of freedom: Welch-Satterthwaite gives df = "
        "se^4 / ((s_a^2 / n_a)^2 / (n_a - 1) + (s_b^2 / n_b)^2 / (n_b - 1))",
    ),
    like(
        _welch_with(df="n"),
        "in the degrees of freedom each term (s^2 / n)^2 is divided by n - 1, not by n",
    ),
]


@checker(
    "Welch's t statistic and degrees of freedom",
    reference=_welch,
    mistakes=_WELCH_MISTAKES,
    returns=["t", "df"],
    atol=1e-9,
    rtol=1e-9,
    otherwise="t = (mean_a - mean_b) / sqrt(s_a^2 / n_a + s_b^2 / n_b) with sample variances "
    "(ddof = 1), and the Welch-Satterthwaite degrees of freedom",
)
def check_welch_t(gen: torch.Generator) -> list[Case]:
    """Check ``fn(a, b) -> (t, df)`` for two 1-d float64 tensors of per-seed results against
    :func:`~minitransformer.stats.welch_t_test`."""
    cases = []
    for na, nb, sd_a, sd_b, shift in ((3, 7, 0.1, 0.01, -0.2), (5, 5, 0.04, 0.02, 0.05)):
        a = 0.3 + sd_a * torch.randn(na, generator=gen, dtype=torch.float64)
        b = 0.3 + shift + sd_b * torch.randn(nb, generator=gen, dtype=torch.float64)
        cases.append(Case(f"for {na} and {nb} seeds", a=a, b=b))
    a = 90 + 5 * torch.randn(6, generator=gen, dtype=torch.float64)
    b = 80 + 12 * torch.randn(4, generator=gen, dtype=torch.float64)
    cases.append(Case("for accuracies in %, 6 and 4 seeds", a=a, b=b))
    return cases


# -- the verdict of a 5 % test -------------------------------------------------------------


def _verdict_from(p: float, diff: float, lower_is_better: bool, alpha: float = 0.05) -> str:
    if not p < alpha:
        return "not resolved"
    return "better" if (diff < 0) == lower_is_better else "worse"


def _verdict(a: Tensor, b: Tensor, lower_is_better: bool) -> str:
    result = welch_t_test(a, b)
    return _verdict_from(result.p, result.diff, lower_is_better)


def _z_rule(a: Tensor, b: Tensor, lower_is_better: bool) -> str:
    result = welch_t_test(a, b)
    return _verdict_from(0.0 if abs(result.t) > 2 else 1.0, result.diff, lower_is_better)


def _one_sided(a: Tensor, b: Tensor, lower_is_better: bool) -> str:
    result = welch_t_test(a, b)
    p = student_t_sf(abs(result.t), result.df)
    return _verdict_from(p, result.diff, lower_is_better)


def _higher_is_better(a: Tensor, b: Tensor, lower_is_better: bool) -> str:
    return _verdict(a, b, False)


def _student(a: Tensor, b: Tensor, lower_is_better: bool) -> str:
    t, df = _welch_with(se="pooled", df="pooled")(a, b)
    return _verdict_from(2 * student_t_sf(abs(t), df), t, lower_is_better)


_VERDICTS = ("better", "worse", "not resolved")
_VERDICT_MISTAKES = [
    when(
        lambda got: got not in _VERDICTS,
        "return one of the strings 'better', 'worse' or 'not resolved', got {got!r}",
    ),
    like(
        _z_rule,
        "you call a difference real beyond two standard errors; with five seeds that is not a "
        "5 % test: Student's t with the Welch degrees of freedom needs |t| > 2.3 to 2.8. Call "
        "it real when Welch's two-sided p-value is below 0.05",
    ),
    like(
        _one_sided,
        "you use a one-sided p-value, P(T > |t|); the question 'do the settings differ?' is "
        "two-sided: p = 2 P(T > |t|)",
    ),
    like(
        _higher_is_better,
        "for a loss (lower_is_better=True) a lower mean is better: the direction depends on the "
        "metric",
    ),
    like(
        _student,
        "you use Student's pooled-variance test; the seeds' spreads differ between settings, "
        "which Welch's test allows for",
    ),
]


def _with_t(base: Tensor, other: Tensor, t: float) -> tuple[Tensor, Tensor]:
    """``other`` shifted so that Welch's t of ``(base, other)`` is exactly ``t``."""
    result = welch_t_test(base, other)
    return base, other + result.diff - t * result.se


@checker(
    "the verdict of a 5 % Welch test",
    reference=_verdict,
    mistakes=_VERDICT_MISTAKES,
    returns="the verdict",
    otherwise="Compare Welch's two-sided p-value with 0.05, then read the direction from the "
    "difference of the means and the metric",
)
def check_verdict(gen: torch.Generator) -> list[Case]:
    """Check ``fn(a, b, lower_is_better) -> 'better' | 'worse' | 'not resolved'``: is setting
    ``a`` better than ``b`` at the 5 % level of Welch's two-sided t-test?"""

    def seeds(n: int, sd: float) -> Tensor:
        return sd * torch.randn(n, generator=gen, dtype=torch.float64)

    rows = [  # (t, n_a, sd_a, n_b, sd_b, lower_is_better), in the order that tells mistakes apart
        (1.95, 5, 1.0, 5, 1.0, False),  # one-sided p < 0.05 < two-sided
        (-2.2, 5, 1.0, 5, 0.02, True),  # |t| > 2, but df near 4: not resolved
        (3.4, 5, 1.0, 5, 1.2, True),  # a higher loss: clearly worse
        (-4.0, 5, 0.5, 5, 0.4, True),  # a lower loss: clearly better
        (1.9, 3, 1.0, 9, 0.1, False),  # Student's pooled test calls it real
        (0.4, 4, 1.0, 6, 2.0, True),
    ]
    cases = []
    for t, na, sd_a, nb, sd_b, lower in rows:
        a, b = _with_t(seeds(na, sd_a), seeds(nb, sd_b), t)
        metric = "a loss" if lower else "an accuracy"
        cases.append(Case(f"for {metric}, {na} and {nb} seeds", a=a, b=b, lower_is_better=lower))
    return cases
