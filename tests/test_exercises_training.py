"""The checkers of the chapter "Training a Transformer" accept the reference solution, report an
untouched stub as not attempted, and reject each typical mistake with its own hint."""

from __future__ import annotations

import pytest
import torch
from checker_helpers import rejects, rejects_in_place

from minitransformer.exercises import (
    ExerciseError,
    check_noam_learning_rate,
    check_smoothed_targets,
    check_teacher_forcing,
)
from minitransformer.training import noam_learning_rate, smoothed_targets, teacher_forcing


def stub(*args, **kwargs):
    raise NotImplementedError


def verdict(capsys, check, fn) -> str:
    """Run a checker and return the line it printed."""
    check(fn)
    return capsys.readouterr().out.strip()


# ---------------------------------------------------------------------------- Noam schedule


def noam_reference(step, d_model, warmup_steps):
    return d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def test_noam_accepts_reference_and_package(capsys):
    assert verdict(capsys, check_noam_learning_rate, noam_reference).startswith("Correct")
    assert verdict(capsys, check_noam_learning_rate, noam_learning_rate).startswith("Correct")


def test_noam_accepts_tensor_result(capsys):
    tensor_noam = lambda s, d, w: torch.tensor(noam_reference(s, d, w))  # noqa: E731
    assert verdict(capsys, check_noam_learning_rate, tensor_noam).startswith("Correct")


def test_noam_not_attempted(capsys):
    assert verdict(capsys, check_noam_learning_rate, stub).startswith("Not attempted yet")


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda s, d, w: d**-0.5 * max(s**-0.5, s * w**-1.5), "minimum"),
        (lambda s, d, w: min(s**-0.5, s * w**-1.5), "d_model\\*\\*-0.5 is missing"),
        (lambda s, d, w: d**0.5 * min(s**-0.5, s * w**-1.5), "inverse square root"),
        (lambda s, d, w: d**-0.5 * min(s**-0.5, s * w**-0.5), "warmup_steps\\*\\*-1.5"),
        (lambda s, d, w: d**-0.5 * min(s**-1.0 * w**0.5, s * w**-1.5), "decay as step\\*\\*-0.5"),
        (lambda s, d, w: 2 * noam_reference(s, d, w), "2.0 times the paper's"),
        (lambda s, d, w: noam_reference(s, d, 2 * w), "peaks at step"),
        (lambda s, d, w: "fast", "should be a number"),
    ],
)
def test_noam_rejects_mistakes(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check_noam_learning_rate(wrong)


# ---------------------------------------------------------------------------- smoothed targets


def smooth_reference(target, num_classes, epsilon):
    one_hot = torch.nn.functional.one_hot(target, num_classes).float()
    return (1 - epsilon) * one_hot + epsilon / num_classes


def test_smoothed_accepts_reference_and_package(capsys):
    assert verdict(capsys, check_smoothed_targets, smooth_reference).startswith("Correct")
    assert verdict(capsys, check_smoothed_targets, smoothed_targets).startswith("Correct")


def test_smoothed_not_attempted(capsys):
    assert verdict(capsys, check_smoothed_targets, stub).startswith("Not attempted yet")


def _one_hot(t, V):
    return torch.nn.functional.one_hot(t, V).float()


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda t, V, e: (1 - e) * _one_hot(t, V) + e / (V - 1) * (1 - _one_hot(t, V)), "V - 1"),
        (lambda t, V, e: _one_hot(t, V), "one-hot targets"),
        (lambda t, V, e: e * _one_hot(t, V) + (1 - e) / V, "swapped"),
        (lambda t, V, e: (1 - e) * _one_hot(t, V) + e / V * (1 - _one_hot(t, V)), "its share"),
        (lambda t, V, e: smooth_reference(t, V, e).reshape(-1, V), "shape"),
        (lambda t, V, e: smooth_reference(t, V, 2 * e), "differ"),
        (lambda t, V, e: smooth_reference(t, V, e) * 1.1, "sum to one"),
        (lambda t, V, e: smooth_reference(t, V, max(e, 0.1)), "exactly one-hot"),
    ],
)
def test_smoothed_rejects_mistakes(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check_smoothed_targets(wrong)


# ---------------------------------------------------------------------------- teacher forcing


def test_teacher_forcing_accepts_reference_and_package(capsys):
    reference = lambda tgt: (tgt[:, :-1], tgt[:, 1:])  # noqa: E731
    assert verdict(capsys, check_teacher_forcing, reference).startswith("Correct")
    assert verdict(capsys, check_teacher_forcing, teacher_forcing).startswith("Correct")


def test_teacher_forcing_not_attempted(capsys):
    assert verdict(capsys, check_teacher_forcing, stub).startswith("Not attempted yet")


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda tgt: (tgt[:, 1:], tgt[:, :-1]), "swapped"),
        (lambda tgt: (tgt[:, :-1], tgt[:, :-1]), "identical"),
        (lambda tgt: (tgt, tgt[:, 1:]), "shape"),
        (lambda tgt: (tgt[:, 1:], tgt[:, 1:]), "identical"),
        (lambda tgt: (tgt[:, 1:], tgt[:, :-1].flip(1)), "tgt\\[:, :-1\\]"),
        (lambda tgt: (tgt[:, :-1], tgt[:, :-1].roll(1, 1)), "tgt\\[:, 1:\\]"),
        (lambda tgt: tgt, "pair"),
    ],
)
def test_teacher_forcing_rejects_mistakes(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check_teacher_forcing(wrong)


def test_teacher_forcing_that_strips_eos_in_place_is_rejected():
    """Hiding EOS from the decoder input in place also removed it from the labels (a view of the
    same tensor); the checker used to build its reference afterwards and accept it."""

    def strip_eos(tgt):
        decoder_input = tgt[:, :-1]
        decoder_input[decoder_input == 2] = 0  # writes into tgt, and so into the labels
        return decoder_input, tgt[:, 1:]

    message = rejects_in_place(check_teacher_forcing, strip_eos, "tgt", right=False)
    assert "your decoder input is not tgt without its last position" in message


def test_smoothed_targets_that_reuse_the_target_as_scratch_are_rejected():
    def scratch(target, num_classes, epsilon):
        out = smooth_reference(target, num_classes, epsilon)
        target.zero_()  # the caller's labels are gone
        return out

    rejects_in_place(check_smoothed_targets, scratch, "target", right=True)


def test_noam_takes_only_numbers():
    """Its inputs are Python numbers, which a function cannot change in place: no in-place test."""
    assert all(
        isinstance(x, (int, list))
        for case in check_noam_learning_rate.spec.cases()
        for x in case.inputs.values()
    )


def test_smoothing_without_num_classes_is_caught():
    # F.one_hot(target) makes max(target) + 1 classes: right only when the largest occurs
    def narrow(t, V, e):
        return (1 - e) * torch.nn.functional.one_hot(t).float() + e / V

    rejects(check_smoothed_targets, narrow, r"F.one_hot\(target\) without num_classes")


def test_teacher_forcing_with_hard_wired_sizes_is_caught():
    rejects(check_teacher_forcing, lambda tgt: (tgt[:, :4], tgt[:, 1:5]), "hard-wire the sizes")
