"""Shared helpers for the tests of the exercise checkers (tests/test_exercises_*.py)."""

from __future__ import annotations

import pytest

from minitransformer.exercises import ExerciseError


def verdict(capsys, check, fn) -> str:
    """Run ``check(fn)``, which must not raise and returns None; return what it printed."""
    assert check(fn) is None
    return capsys.readouterr().out


def rejects(check, fn, hint: str) -> None:
    """``check(fn)`` must raise ExerciseError whose message matches the regex ``hint``."""
    with pytest.raises(ExerciseError, match=hint):
        check(fn)


def stub(*args, **kwargs):
    """An untouched exercise stub."""
    raise NotImplementedError
