"""The checkers of the chapter "The paper's Table 3 at toy scale" accept right answers written
without the package, report an untouched stub as not attempted, and reject each typical mistake
with its own hint."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats
import torch
from checker_helpers import rejects, rejects_in_place, stub, verdict
from test_table3 import by_hand

from minitransformer.exercises import (
    check_implied_vocabulary,
    check_verdict,
    check_welch_t,
)

# ------------------------------------------------------------------ the implied vocabulary


def implied_by_hand(config, millions):
    """The count of tests/test_table3.py, with the embedding taken out, solved for V."""
    d_model = config["d_model"]
    others = by_hand(config["num_layers"], d_model, config["d_ff"], config["num_heads"], vocab=0)
    return (
        (millions * 1e6 - 5e5 - others) / d_model,
        (millions * 1e6 + 5e5 - others) / d_model,
    )


def test_implied_vocabulary_accepts_a_count_by_hand(capsys) -> None:
    out = verdict(capsys, check_implied_vocabulary, implied_by_hand)
    assert out.startswith("Correct")
    as_list = lambda c, m: list(implied_by_hand(c, m))  # noqa: E731
    assert verdict(capsys, check_implied_vocabulary, as_list).startswith("Correct")


def test_implied_vocabulary_not_attempted(capsys) -> None:
    assert verdict(capsys, check_implied_vocabulary, stub).startswith("Not attempted yet")


def _scaled(matrices=1, half=5e5, subtract=True):
    def wrong(config, millions):
        d_model = config["d_model"]
        others = by_hand(
            config["num_layers"], d_model, config["d_ff"], config["num_heads"], vocab=0
        )
        rest = millions * 1e6 - (others if subtract else 0)
        return (rest - half) / (matrices * d_model), (rest + half) / (matrices * d_model)

    return wrong


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda c, m: implied_by_hand(c, m)[::-1], r"\(high, low\)"),
        (_scaled(half=0), "exact solution twice"),
        (_scaled(half=1e6), "wrong width"),
        (_scaled(matrices=3), "ties them"),
        (_scaled(matrices=2), "ties them"),
        (_scaled(subtract=False), "first subtract the parameters of the layers"),
        (lambda c, m: tuple(round(x) for x in implied_by_hand(c, m)), "unrounded"),
        (lambda c, m: implied_by_hand(c, m)[0], r"return a pair \(low, high\)"),
        (lambda c, m: (40000.0, 41000.0), "low .*differs|low for N=6"),
    ],
)
def test_implied_vocabulary_rejects_mistakes(wrong, hint) -> None:
    rejects(check_implied_vocabulary, wrong, hint)


def test_implied_vocabulary_rejects_a_changed_config() -> None:
    def pops(config, millions):
        answer = implied_by_hand(config, millions)
        config.pop("d_ff")
        return answer

    rejects_in_place(check_implied_vocabulary, pops, "config", right=True)


# ------------------------------------------------------------------------- Welch's t and df


def welch_numpy(a, b):
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    return float(t), float(df)


def welch_scipy(a, b):
    result = scipy.stats.ttest_ind(a.numpy(), b.numpy(), equal_var=False)
    return result.statistic, result.df


def welch_torch(a, b):
    va, vb = a.var() / a.numel(), b.var() / b.numel()  # torch's var: ddof = 1 by default
    df = (va + vb) ** 2 / (va**2 / (a.numel() - 1) + vb**2 / (b.numel() - 1))
    return (a.mean() - b.mean()) / (va + vb).sqrt(), df


@pytest.mark.parametrize("right", [welch_numpy, welch_scipy, welch_torch])
def test_welch_accepts_independent_answers(capsys, right) -> None:
    assert verdict(capsys, check_welch_t, right).startswith("Correct")


def test_welch_not_attempted(capsys) -> None:
    assert verdict(capsys, check_welch_t, stub).startswith("Not attempted yet")


def _welch_variant(ddof=1, pooled=False, df_rule="welch", sign=1, se_of_mean=True):
    def wrong(a, b):
        a, b = a.numpy(), b.numpy()
        na, nb = a.size, b.size
        sa2, sb2 = a.var(ddof=ddof), b.var(ddof=ddof)
        va, vb = (sa2 / na, sb2 / nb) if se_of_mean else (sa2, sb2)
        if pooled:
            sp2 = ((na - 1) * sa2 + (nb - 1) * sb2) / (na + nb - 2)
            se = math.sqrt(sp2 * (1 / na + 1 / nb))
        else:
            se = math.sqrt(va + vb)
        wa, wb = sa2 / na, sb2 / nb
        df = {
            "welch": (wa + wb) ** 2 / (wa**2 / (na - 1) + wb**2 / (nb - 1)),
            "pooled": na + nb - 2,
            "min": min(na, nb) - 1,
            "n": (wa + wb) ** 2 / (wa**2 / na + wb**2 / nb),
        }[df_rule]
        return sign * (a.mean() - b.mean()) / se, float(df)

    return wrong


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (_welch_variant(sign=-1), "wrong sign"),
        (_welch_variant(ddof=0), "population variance"),
        (_welch_variant(pooled=True, df_rule="pooled"), "Student's t-test"),
        (_welch_variant(se_of_mean=False), r"s / sqrt\(n\)"),
        (_welch_variant(df_rule="pooled"), "your t is right but not the degrees of freedom"),
        (_welch_variant(df_rule="min"), "your t is right but not the degrees of freedom"),
        (_welch_variant(df_rule="n"), "divided by n - 1, not by n"),
        (lambda a, b: welch_numpy(a, b)[0], "should return a pair"),
        (lambda a, b: (2.0, 8.0), "t for 3 and 7 seeds is 2, expected"),
    ],
)
def test_welch_rejects_mistakes(wrong, hint) -> None:
    rejects(check_welch_t, wrong, hint)


def test_welch_rejects_centring_in_place() -> None:
    def centres(a, b):
        answer = welch_numpy(a, b)
        a -= a.mean()
        return answer

    rejects_in_place(check_welch_t, centres, "a", right=True)


# ----------------------------------------------------------------------- the 5 % verdict


def verdict_scipy(a, b, lower_is_better):
    result = scipy.stats.ttest_ind(a.numpy(), b.numpy(), equal_var=False)
    if result.pvalue >= 0.05:
        return "not resolved"
    a_lower = a.mean() < b.mean()
    return "better" if a_lower == lower_is_better else "worse"


def test_verdict_accepts_an_independent_answer(capsys) -> None:
    assert verdict(capsys, check_verdict, verdict_scipy).startswith("Correct")


def test_verdict_not_attempted(capsys) -> None:
    assert verdict(capsys, check_verdict, stub).startswith("Not attempted yet")


def _rule(test):
    def wrong(a, b, lower_is_better):
        if not test(a.numpy(), b.numpy()):
            return "not resolved"
        a_lower = a.mean() < b.mean()
        return "better" if a_lower == lower_is_better else "worse"

    return wrong


def _welch_p(a, b, alternative="two-sided"):
    return scipy.stats.ttest_ind(a, b, equal_var=False).pvalue


def _t(a, b):
    return scipy.stats.ttest_ind(a, b, equal_var=False).statistic


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (_rule(lambda a, b: abs(_t(a, b)) > 2), "beyond two standard errors"),
        (_rule(lambda a, b: _welch_p(a, b) / 2 < 0.05), "one-sided p-value"),
        (lambda a, b, lower: verdict_scipy(a, b, False), "a lower mean is better"),
        (_rule(lambda a, b: scipy.stats.ttest_ind(a, b).pvalue < 0.05), "pooled-variance"),
        (lambda a, b, lower: "clearly better", "return one of the strings"),
        (lambda a, b, lower: "not resolved", "Compare Welch's two-sided p-value with 0.05"),
    ],
)
def test_verdict_rejects_mistakes(wrong, hint) -> None:
    rejects(check_verdict, wrong, hint)


def test_verdict_cases_cover_every_answer() -> None:
    """The cases have every verdict, so a constant answer cannot pass."""
    spec = check_verdict.spec
    answers = {verdict_scipy(**case.inputs) for case in spec.cases()}
    assert answers == {"better", "worse", "not resolved"}


def test_verdict_rejects_sorting_in_place() -> None:
    def sorts(a, b, lower_is_better):
        answer = verdict_scipy(a, b, lower_is_better)
        b.copy_(b.sort().values)
        return answer

    rejects_in_place(check_verdict, sorts, "b", right=True)


def test_checkers_leave_torch_default_dtype_alone() -> None:
    before = torch.get_default_dtype()
    check_welch_t(welch_numpy)
    assert torch.get_default_dtype() == before
