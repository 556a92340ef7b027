"""The engine behind every checker (minitransformer/exercises/_core.py), on a toy checker, and the
properties every checker of the package must have: the reference passes, a stub is "not
attempted", each known mistake's own implementation gets its own hint, and the learner's global
random state is left as it was."""

from __future__ import annotations

import contextlib
import random
import re

import numpy as np
import pytest
import torch
from checker_helpers import (
    global_rng_states,
    rejects,
    rejects_in_place,
    same_rng_states,
    stub,
    verdict,
)

import minitransformer.exercises as exercises
from minitransformer.exercises import (
    Case,
    ExerciseError,
    checker,
    close,
    like,
    raises,
    seeded,
    when,
)

_TOY_MISTAKES = [
    like(lambda x, c: x + c, "you added c; multiply x by c"),
    like(lambda x, c: x * 2, "you multiply by 2, not by c"),  # right for c = 2: skipped there
    like(lambda x, c: 1 / 0, "never reported: this mistake cannot even run"),
    when(
        lambda got, x: got.shape != x.shape, "the result has shape {got.shape}, not x's {x.shape}"
    ),
    when(lambda got: got[0, 0] == 42, lambda got, c: f"42 is not {c} times anything here"),
    when(lambda got: got.no_such_attribute, "never reported: this predicate raises"),
    raises(ZeroDivisionError, "Do not divide by c."),
]


@checker(
    "toy scaling", reference=lambda x, c: x * c, mistakes=_TOY_MISTAKES, returns="scale(x, {c})"
)
def check_toy(gen: torch.Generator) -> list[Case]:
    """Check ``fn(x, c) -> x * c``."""
    x = torch.randn(2, 3, generator=gen)
    return [Case("for c = 2", x=x, c=2.0), Case("for c = 3", x=x, c=3.0, otherwise="Multiply by c")]


def test_verdicts(capsys) -> None:
    assert verdict(capsys, check_toy, lambda x, c: x * c) == "Correct: toy scaling.\n"
    assert verdict(capsys, check_toy, lambda x, c: (x * c).double()) == "Correct: toy scaling.\n"
    assert verdict(capsys, check_toy, stub).startswith("Not attempted yet: toy scaling. Replace")


def test_the_first_matching_mistake_gives_the_hint() -> None:
    rejects(check_toy, lambda x, c: x + c, r"^you added c; multiply x by c$")
    rejects(check_toy, lambda x, c: x * 2, r"^you multiply by 2, not by c$")  # shows for c = 3
    rejects(check_toy, lambda x, c: x[0], r"^the result has shape \(3,\), not x's \(2, 3\)$")
    rejects(check_toy, lambda x, c: torch.full_like(x, 42.0), r"^42 is not 2.0 times anything")


def test_an_unexplained_answer_gets_a_description_of_the_difference() -> None:
    def one_entry_off(x, c):
        y = x * c
        y[0, 1] += 0.5
        return y

    rejects(
        check_toy,
        one_entry_off,
        r"^scale\(x, 2.0\) for c = 2 differs from the right answer "
        r"in 1 of 6 entries, by up to 0.5; the first at \[0, 1\]: \S+ instead of \S+$",
    )
    rejects(
        check_toy,
        lambda x, c: x * c if c == 2 else x * c + 1,
        r"^scale\(x, 3.0\) for c = 3 differs .* in 6 of 6 entries, by up to 1; .*\. "
        r"Multiply by c$",
    )
    rejects(check_toy, lambda x, c: (x * c).long(), r"dtype torch.int64, expected torch.float32$")
    rejects(check_toy, lambda x, c: (x * c).tolist(), r"should be a torch.Tensor, got list$")
    rejects(
        check_toy,
        lambda x, c: x * c / 0,
        r"holds inf or NaN in 6 of 6 entries, the first at \[0, 0\]",
    )
    rejects(
        exercises.check_teacher_forcing,
        lambda tgt: tgt,
        r"your function should return a pair \(the decoder input, the labels\), got Tensor",
    )
    rejects(
        exercises.check_online_softmax_step,
        lambda m, norm, acc, s, v: (m, norm),
        r"the tuple \(m, l, acc\)",
    )


def test_a_crash_names_the_exception_and_the_inputs() -> None:
    with pytest.raises(
        ExerciseError,
        match=r"^your function raised ZeroDivisionError: division by "
        r"zero \(for c = 2: x \(2, 3\), c 2.0\)\. Do not divide by c\.$",
    ) as err:
        check_toy(lambda x, c: 1 / 0)
    assert isinstance(err.value.__cause__, ZeroDivisionError)
    rejects(check_toy, lambda x, c: x @ x, r"raised RuntimeError: .* mismatch is the usual cause")


def test_a_wrong_field_in_a_predicate_is_a_bug_of_the_checker_and_fails_loudly() -> None:
    @checker("typo", reference=lambda x: x, mistakes=[when(lambda got, y: True, "never")])
    def check_typo() -> list[Case]:
        return [Case(x=torch.zeros(2))]

    with pytest.raises(TypeError, match=r"asks for \['y'\]"):
        check_typo(lambda x: x + 1)


def test_a_case_hint_comes_before_the_mistakes() -> None:
    @checker(
        "hint first", reference=lambda n: n + 1, mistakes=[like(lambda n: n, "you forgot the 1")]
    )
    def check_hint() -> list[Case]:
        return [Case("for n = 1", n=1), Case("for n = 2", n=2, hint="Works for n = 1 only")]

    rejects(check_hint, lambda n: n, r"^you forgot the 1$")
    rejects(check_hint, lambda n: 2, r"^the result for n = 2 is 2, expected 3\. Works for n = 1")


# ------------------------------------------------------------------ copies and in-place changes
def test_the_reference_sees_pristine_inputs_and_in_place_changes_are_named() -> None:
    def scale_in_place(x, c):  # the right numbers, but the caller's x is changed
        x *= c
        return x

    def add_in_place(x, c):
        x += c
        return x

    rejects_in_place(check_toy, scale_in_place, "x", right=True)
    message = rejects_in_place(check_toy, add_in_place, "x", right=False)
    assert message.endswith("Compared with the right answer: you added c; multiply x by c")


def test_a_module_whose_parameters_change_is_an_input_changed_in_place() -> None:
    @checker("layer", reference=lambda layer, x: layer(x))
    def check_layer() -> list[Case]:
        return [Case(layer=seeded(0, lambda: torch.nn.Linear(3, 2)), x=torch.ones(1, 3))]

    def retrains(layer, x):
        layer.weight.mul_(1.0)  # the same numbers: not a change
        out = layer(x)
        layer.bias.add_(1.0)
        return out

    rejects_in_place(check_layer, retrains, "layer", right=True)


def test_may_modify_lets_a_function_write_into_its_buffer(capsys) -> None:
    @checker(
        "fill",
        reference=lambda buf, v: buf.fill_(v),
        may_modify=["buf"],
        observe=lambda fn, buf, v: (fn(buf, v), buf)[1],
    )
    def check_fill() -> list[Case]:
        return [Case(buf=torch.zeros(3), v=2.0)]

    assert verdict(capsys, check_fill, lambda buf, v: buf.fill_(v)).startswith("Correct")
    rejects(check_fill, lambda buf, v: torch.full_like(buf, v), r"differs from the right answer")


def test_a_generator_passed_as_an_input_may_be_drawn_from(capsys) -> None:
    """A sampling exercise hands the learner a generator: consuming it is no in-place change. The
    learner and the reference get copies in the same state, so the same draws agree."""

    @checker("sample", reference=lambda n, gen: torch.randint(10, (n,), generator=gen))
    def check_sample() -> list[Case]:
        return [Case(n=5, gen=torch.Generator().manual_seed(3))]

    assert verdict(
        capsys, check_sample, lambda n, gen: torch.randint(10, (n,), generator=gen)
    ).startswith("Correct")


# ------------------------------------------------------------------ global random state
def _noisy(fn):
    """``fn``, drawing from every global generator first, as a learner's code might."""

    def wrapped(*args, **kwargs):
        torch.rand(3), random.random(), np.random.rand(2)
        return fn(*args, **kwargs)

    return wrapped


@pytest.mark.parametrize(
    "fn",
    [lambda x, c: x * c, lambda x, c: x + c, stub, lambda x, c: 1 / 0],
    ids=["right", "wrong", "stub", "crash"],
)
def test_a_checker_leaves_the_global_random_state_as_it_was(fn, capsys) -> None:
    torch.manual_seed(1), random.seed(1), np.random.seed(1)
    before = global_rng_states()
    with contextlib.suppress(ExerciseError):
        check_toy(_noisy(fn))
    assert same_rng_states(before, global_rng_states())


def test_seeded_builds_reproducibly_and_puts_the_generator_back() -> None:
    before = torch.random.get_rng_state()
    a, b = (seeded(0, lambda: torch.nn.Linear(2, 2)).weight for _ in range(2))
    assert torch.equal(a, b) and torch.equal(before, torch.random.get_rng_state())


# ------------------------------------------------------------------ the hint as IPython shows it
def test_rendering_puts_the_mistake_first_and_each_sentence_on_its_own_line() -> None:
    err = ExerciseError(
        "you apply the mask after the softmax (zeroing weights): the weights no "
        "longer sum to one. Mask the *scores* before the softmax; see the section "
        "on masks"
    )
    assert err._render_traceback_() == [
        "ExerciseError: you apply the mask after the softmax (zeroing weights): the weights no "
        "longer sum to one.",
        "    Mask the *scores* before the softmax;",
        "    see the section on masks",
    ]


def test_rendering_a_crash_shows_the_learners_traceback_without_the_engines_frames() -> None:
    def learner(x, c):
        return x @ x  # the learner's bug

    with pytest.raises(ExerciseError) as err:
        check_toy(learner)
    lines = err.value._render_traceback_()
    assert lines[0].startswith("Traceback") and any("return x @ x" in line for line in lines)
    assert not any("_core.py" in line for line in lines)
    assert lines[lines.index("The checker says:") + 1].startswith("ExerciseError: your function")


def test_close_refuses_to_compare_different_shapes() -> None:
    assert close(torch.ones(2), torch.ones(2) + 1e-7)
    with pytest.raises(ValueError, match=r"shapes \(2,\) and \(3,\)"):
        close(torch.ones(2), torch.ones(3))


# ------------------------------------------------------------------ every checker of the package
CHECKERS = [getattr(exercises, name) for name in exercises.__all__ if name.startswith("check_")]
IDS = [check.__name__ for check in CHECKERS]


def _pattern(hint: str) -> str:
    """A regex for the text of a format-string hint: its fields match anything."""
    return "^" + ".*".join(re.escape(part) for part in re.split(r"\{[^{}]*\}", hint)) + "$"


def test_the_package_has_every_checker_of_the_book() -> None:
    assert len(CHECKERS) == 32  # 26, the three of the ablations chapter, three of translation


@pytest.mark.parametrize("check", CHECKERS, ids=IDS)
def test_the_reference_is_correct_and_a_stub_is_not_attempted(check, capsys) -> None:
    assert verdict(capsys, check, check.spec.reference) == f"Correct: {check.name}.\n"
    assert verdict(capsys, check, stub).startswith(f"Not attempted yet: {check.name}.")


@pytest.mark.parametrize("check", CHECKERS, ids=IDS)
def test_each_known_mistake_gets_its_own_hint(check) -> None:
    """Every implementation in a like(...) row, run as the learner's answer, is reported with that
    row's hint: no earlier row and no earlier case hides it."""
    for mistake in check.spec.mistakes:
        for wrong in mistake.wrong:
            with pytest.raises(ExerciseError) as err:
                check(wrong)
            if isinstance(mistake.hint, str):
                assert re.match(_pattern(mistake.hint), str(err.value)), str(err.value)


@pytest.mark.parametrize("check", CHECKERS, ids=IDS)
def test_hints_are_distinct(check) -> None:
    hints = [m.hint for m in check.spec.mistakes if isinstance(m.hint, str)]
    assert len(hints) == len(set(hints))


@pytest.mark.parametrize("check", CHECKERS, ids=IDS)
def test_the_global_random_state_is_unchanged_after_each_checker(check) -> None:
    torch.manual_seed(7), random.seed(7), np.random.seed(7)
    before = global_rng_states()
    first_mistake = [w for m in check.spec.mistakes for w in m.wrong][:1]
    noisy = _noisy(check.spec.reference), _noisy(lambda *args, **kwargs: None)
    for fn in (check.spec.reference, stub, *noisy, *first_mistake):
        with contextlib.suppress(ExerciseError):
            check(fn)
        assert same_rng_states(before, global_rng_states()), fn
