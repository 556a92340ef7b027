"""Checkers for the chapter "A real translation" (``book/translation``)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minitransformer.exercises._core import Case, checker, hard_wired, like, raises, when
from minitransformer.training import average_checkpoints
from minitransformer.translation import brevity_penalty, ngram_matches

__all__ = ["check_brevity_penalty", "check_ngram_matches", "check_average_checkpoints"]


# -- the brevity penalty ---------------------------------------------------------------------


_BP_MISTAKES = [
    raises(
        ZeroDivisionError,
        "an empty output (hyp_len = 0) divides by zero: its penalty is 0, the limit of "
        "exp(1 - ref_len / hyp_len) as hyp_len goes to 0",
    ),
    like(
        lambda c, r: math.exp(1 - c / r) if c < r else 1.0,
        "the ratio is upside down: the exponent is 1 - ref_len / hyp_len, which goes to minus "
        "infinity as the output gets shorter",
    ),
    like(
        lambda c, r: math.exp(1 - r / c) if c else 0.0,
        "you penalise long outputs too: the penalty is 1 when hyp_len >= ref_len (precision "
        "already punishes words that should not be there)",
    ),
    like(
        lambda c, r: min(1.0, c / r) if r else 1.0,
        "the penalty is exponential, exp(1 - ref_len / hyp_len), not the length ratio",
    ),
    when(
        lambda got: isinstance(got, bool) or not isinstance(got, (int, float)),
        "brevity_penalty(hyp_len, ref_len) should be a number, got {got_type}",
    ),
]


@checker(
    "BLEU's brevity penalty",
    reference=brevity_penalty,
    mistakes=_BP_MISTAKES,
    returns="bp({hyp_len}, {ref_len})",
    otherwise="It should be 1 for hyp_len >= ref_len, else exp(1 - ref_len / hyp_len) (0 for an "
    "empty output)",
    atol=1e-12,
    rtol=1e-9,
)
def check_brevity_penalty() -> list[Case]:
    """Check ``fn(hyp_len, ref_len)`` against
    :func:`~minitransformer.translation.brevity_penalty`."""
    return [
        Case("for an output shorter than the references", hyp_len=8, ref_len=10),
        Case("for an output as long as the references", hyp_len=10, ref_len=10),
        Case("for an output longer than the references", hyp_len=13, ref_len=10),
        Case("for a much shorter output", hyp_len=1, ref_len=4, hint=hard_wired("the lengths")),
        Case("for an empty output", hyp_len=0, ref_len=5),
    ]


# -- clipped n-gram counts -------------------------------------------------------------------


def _grams(tokens: list[str], n: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def _unclipped(h: list[str], r: list[str], n: int) -> tuple[int, int]:
    ref = set(_grams(r, n))
    hyp = _grams(h, n)
    return sum(g in ref for g in hyp), len(hyp)


def _distinct(h: list[str], r: list[str], n: int) -> tuple[int, int]:
    hyp, ref = set(_grams(h, n)), set(_grams(r, n))
    return len(hyp & ref), len(hyp)


def _over_reference(h: list[str], r: list[str], n: int) -> tuple[int, int]:
    hyp, ref = Counter(_grams(h, n)), Counter(_grams(r, n))
    return sum((hyp & ref).values()), sum(ref.values())


_NGRAM_MISTAKES = [
    like(
        _unclipped,
        "you count every n-gram of the hypothesis that occurs in the reference, however often "
        "it repeats: clip each n-gram's count at the number of times it occurs in the reference "
        "(otherwise 'the the the the' scores 4 of 4 against 'the cat')",
    ),
    like(
        _distinct,
        "you count distinct n-grams: an n-gram that the hypothesis repeats counts each time, "
        "up to its count in the reference",
    ),
    like(
        _over_reference,
        "the total is the number of n-grams of the hypothesis (a precision), not of the reference",
    ),
    when(
        lambda got: not (isinstance(got, tuple) and len(got) == 2),
        "return a tuple (matches, total), got {got_type}",
    ),
]


@checker(
    "BLEU's clipped n-gram counts",
    reference=ngram_matches,
    mistakes=_NGRAM_MISTAKES,
    returns="(matches, total)",
    otherwise="matches counts each n-gram of the hypothesis at most as often as it occurs in "
    "the reference; total is the number of n-grams of the hypothesis",
)
def check_ngram_matches() -> list[Case]:
    """Check ``fn(hypothesis, reference, n) -> (matches, total)`` on token lists against
    :func:`~minitransformer.translation.ngram_matches`."""
    ref = ["Montag", ",", "1", ".", "März", "2021"]
    return [
        Case(
            "for unigrams", hypothesis=["Montag", ",", "1", ".", "Mai", "2021"], reference=ref, n=1
        ),
        Case(
            "for bigrams", hypothesis=["Montag", ",", "1", ".", "Mai", "2021"], reference=ref, n=2
        ),
        Case(
            "for a hypothesis that repeats a word",
            hypothesis=["the", "the", "the", "the"],
            reference=["the", "cat", "sat", "on", "the", "mat"],
            n=1,
        ),
        Case(
            "for a repeated bigram",
            hypothesis=["der", "1", ".", "der", "1", "."],
            reference=["der", "1", ".", "Mai"],
            n=2,
        ),
        Case(
            "for one German compound and n = 2: it has no bigram",
            hypothesis=["dreiundzwanzig"],
            reference=["dreiundzwanzig"],
            n=2,
        ),
    ]


# -- checkpoint averaging ----------------------------------------------------------------------


def _in_order(fn: Callable[..., Any], states: list[dict[str, Tensor]]) -> list[Any]:
    """The averaged entries in the order of ``states[0]``: a missing name is a KeyError."""
    got = fn(states)
    return [got[name] for name in states[0]]


_AVERAGE_MISTAKES = [
    like(
        lambda states: states[-1],
        "you return the last checkpoint: average every entry over all the checkpoints",
    ),
    like(
        lambda states: {k: sum(s[k] for s in states) for k in states[0]},
        "you sum the checkpoints: divide by their number",
    ),
    like(
        lambda states: {k: (states[0][k] + states[-1][k]) / 2 for k in states[0]},
        "you average the first and the last checkpoint only: use all of them",
    ),
    raises(KeyError, "your result lacks a parameter of the state dicts: average every entry"),
]


def _states(gen: torch.Generator, k: int) -> list[dict[str, Tensor]]:
    return [
        {
            "encoder.weight": torch.randn(3, 4, generator=gen),
            "encoder.bias": torch.randn(4, generator=gen),
            "output.weight": torch.randn(2, 3, generator=gen),
        }
        for _ in range(k)
    ]


@checker(
    "checkpoint averaging",
    reference=average_checkpoints,
    mistakes=_AVERAGE_MISTAKES,
    observe=_in_order,
    returns="the averaged entries",
    otherwise="Each entry should be the mean of that entry over the checkpoints",
    atol=1e-6,
    rtol=1e-5,
)
def check_average_checkpoints(gen: torch.Generator) -> list[Case]:
    """Check ``fn(states) -> state`` on lists of state dicts against
    :func:`~minitransformer.training.average_checkpoints`."""
    return [
        Case("for 5 checkpoints", states=_states(gen, 5)),
        Case("for 3 checkpoints", states=_states(gen, 3), hint=hard_wired("the number 5")),
        Case("for one checkpoint", states=_states(gen, 1)),
    ]
