"""Shared helpers for the tests of the exercise checkers (tests/test_exercises_*.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from minitransformer.exercises import ExerciseError


def verdict(capsys, check, fn) -> str:
    """Run ``check(fn)``, which must not raise and returns None; return what it printed."""
    assert check(fn) is None
    return capsys.readouterr().out


def rejects(check, fn, hint: str) -> None:
    """``check(fn)`` must raise ExerciseError whose message matches the regex ``hint``."""
    with pytest.raises(ExerciseError, match=hint):
        check(fn)


def rejects_in_place(check, fn, argument: str, right: bool) -> str:
    """``check(fn)`` must say that ``fn`` changed ``argument`` in place, and whether the answer
    was right apart from that; returns the message."""
    with pytest.raises(ExerciseError, match=rf"changed its argument `{argument}` in place") as err:
        check(fn)
    message = str(err.value)
    assert ("Apart from that, your answer is right." in message) == right, message
    assert ("Compared with the right answer: " in message) == (not right), message
    return message


def stub(*args, **kwargs):
    """An untouched exercise stub."""
    raise NotImplementedError


def global_rng_states() -> tuple:
    """The global random states a learner's notebook depends on: torch (CPU), random, NumPy."""
    kind, keys, *rest = np.random.get_state()
    return torch.random.get_rng_state(), random.getstate(), (kind, keys.copy(), *rest)


def same_rng_states(a: tuple, b: tuple) -> bool:
    (kind_a, keys_a, *rest_a), (kind_b, keys_b, *rest_b) = a[2], b[2]
    return (
        torch.equal(a[0], b[0])
        and a[1] == b[1]
        and kind_a == kind_b
        and np.array_equal(keys_a, keys_b)
        and rest_a == rest_b
    )
