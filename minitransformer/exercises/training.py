"""Checkers for the exercises of the chapter "Training a Transformer" (``book/training``).

* :func:`check_noam_learning_rate`: the warm-up schedule of section 5.3 of the paper;
* :func:`check_smoothed_targets`: the label-smoothed target distribution;
* :func:`check_teacher_forcing`: splitting a target into decoder input and labels.

Each compares the learner's function with the package's own
(:mod:`minitransformer.training`) and names the usual mistake when they differ.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from minitransformer.exercises._core import ExerciseError, attempt, checker, close, expect_shape
from minitransformer.training import noam_learning_rate, smoothed_targets

__all__ = ["check_noam_learning_rate", "check_smoothed_targets", "check_teacher_forcing"]


def _as_float(value: object, what: str) -> float:
    try:
        return float(value)  # accepts Python numbers, numpy scalars and 0-d tensors
    except (TypeError, ValueError):
        raise ExerciseError(
            f"{what} should be a number, got {type(value).__name__}"
        ) from None


@checker("the warm-up (Noam) learning-rate schedule")
def check_noam_learning_rate(noam: Callable[[int, int, int], float]) -> None:
    """Check ``noam(step, d_model, warmup_steps)`` for ``step >= 1`` against the paper's formula.

    Hints name the usual mistakes: ``max`` instead of ``min``, a missing or inverted
    ``d_model**-0.5``, the wrong power of ``warmup_steps`` in the warm-up arm, a decay that is
    not ``step**-0.5``.
    """
    cases = [
        (512, 4000, [1, 10, 1000, 3999, 4000, 4001, 8000, 16000, 100000]),
        (64, 50, [1, 2, 25, 50, 51, 200, 800]),
    ]
    for d_model, warmup, steps in cases:
        got = [_as_float(attempt(noam, s, d_model, warmup), f"noam({s}, {d_model}, {warmup})")
               for s in steps]
        want = [noam_learning_rate(s, d_model, warmup) for s in steps]
        if all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want)):
            continue

        def matches(variant: Callable[[int], float]) -> bool:
            return all(math.isclose(g, variant(s), rel_tol=1e-6) for g, s in zip(got, steps))

        d, w = d_model, warmup
        if matches(lambda s: d**-0.5 * max(s**-0.5, s * w**-1.5)):
            raise ExerciseError(
                "you take max(...) of the two arms; the schedule is their minimum: the linear "
                "arm step * warmup_steps**-1.5 is the smaller one during warm-up, the decay arm "
                "step**-0.5 after it"
            )
        if matches(lambda s: min(s**-0.5, s * w**-1.5)):
            raise ExerciseError(
                "the factor d_model**-0.5 is missing: wider models get smaller learning rates"
            )
        if matches(lambda s: d**0.5 * min(s**-0.5, s * w**-1.5)):
            raise ExerciseError(
                "you multiply by d_model**0.5; the paper multiplies by d_model**-0.5 (the "
                "inverse square root)"
            )
        if matches(lambda s: d**-0.5 * min(s**-0.5, s * w**-0.5)) or matches(
            lambda s: d**-0.5 * min(s**-0.5, s / w)
        ):
            raise ExerciseError(
                "the warm-up arm should be step * warmup_steps**-1.5, so that both arms meet "
                "at step = warmup_steps (where step**-0.5 = step * warmup_steps**-1.5)"
            )
        peak_step = steps[max(range(len(steps)), key=got.__getitem__)]
        if peak_step != warmup:
            raise ExerciseError(
                f"for d_model={d_model}, warmup_steps={warmup} your rate peaks at step "
                f"{peak_step} among the steps tried; it should peak at step = warmup_steps"
            )
        late = [s for s in steps if s >= warmup]
        if not all(
            math.isclose(got[steps.index(s)] * s**0.5, got[steps.index(late[0])] * late[0] ** 0.5,
                         rel_tol=1e-6)
            for s in late
        ):
            raise ExerciseError(
                "after warm-up the rate should decay as step**-0.5 (4x the steps, half the rate)"
            )
        ratios = {round(g / wt, 6) for g, wt in zip(got, want) if wt}
        if len(ratios) == 1:
            raise ExerciseError(
                f"your schedule has the right shape but is {ratios.pop()} times the paper's: "
                "check the constant factor (d_model**-0.5, nothing else)"
            )
        raise ExerciseError(
            f"noam(step, {d_model}, {warmup}) differs from the paper: for steps {steps} you "
            f"return {[f'{g:.3g}' for g in got]}, expected {[f'{x:.3g}' for x in want]}"
        )


@checker("label-smoothed targets")
def check_smoothed_targets(smooth: Callable[[torch.Tensor, int, float], torch.Tensor]) -> None:
    """Check ``smooth(target, num_classes, epsilon)`` against
    :func:`minitransformer.training.smoothed_targets` (PyTorch's convention).

    Hints name the usual mistakes: spreading epsilon over the ``V - 1`` wrong classes only, not
    giving the true class its share ``epsilon / V``, swapping the roles of ``epsilon`` and
    ``1 - epsilon``, returning plain one-hot targets, a wrong shape.
    """
    target = torch.tensor([[0, 3, 5], [2, 2, 1]])  # (B, T) = (2, 3)
    V, eps = 6, 0.2
    got = attempt(smooth, target, V, eps)
    expect_shape(got, (2, 3, V), f"smooth(target, {V}, {eps}) for target of shape (2, 3)")
    want = smoothed_targets(target, V, eps)
    if not close(got, want):
        one_hot = torch.nn.functional.one_hot(target, V).float()
        others = (1 - eps) * one_hot + eps / (V - 1) * (1 - one_hot)
        if close(got, others):
            raise ExerciseError(
                "you spread epsilon over the V - 1 wrong classes only (1 - epsilon on the true "
                "class). That variant exists, but here we follow PyTorch's "
                "CrossEntropyLoss(label_smoothing=...): epsilon is spread uniformly over all V "
                "classes, so the true class gets 1 - epsilon + epsilon / V"
            )
        if close(got, one_hot):
            raise ExerciseError(
                "you return the one-hot targets: move epsilon of the mass to a uniform "
                "distribution over the V classes"
            )
        if close(got, eps * one_hot + (1 - eps) / V):
            raise ExerciseError(
                "epsilon and 1 - epsilon are swapped: the one-hot part keeps 1 - epsilon, the "
                "uniform part gets epsilon"
            )
        if close(got, (1 - eps) * one_hot + eps / V * (1 - one_hot)):
            raise ExerciseError(
                "the rows sum to 1 - epsilon + epsilon / V, not 1: the true class also gets "
                "its share epsilon / V of the uniform part, on top of 1 - epsilon"
            )
        sums = got.double().sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums)):
            raise ExerciseError("each target distribution (last dimension) must sum to one")
        raise ExerciseError(
            "your targets differ from (1 - epsilon) * one_hot(target, V) + epsilon / V"
        )
    plain = attempt(smooth, torch.tensor([4]), 5, 0.0)
    if not close(plain, torch.nn.functional.one_hot(torch.tensor([4]), 5).float()):
        raise ExerciseError("with epsilon = 0 the targets must be exactly one-hot")


@checker("teacher forcing: decoder input and labels")
def check_teacher_forcing(split: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Check ``split(tgt) -> (decoder_input, labels)`` for ``tgt`` = ``[BOS, y..., EOS, PAD...]``.

    Hints name the usual mistakes: no shift at all, input and labels swapped, a shift that
    drops the wrong end, a wrong shape.
    """
    tgt = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])  # BOS=1, EOS=2, PAD=0; (B, T + 1)
    out = attempt(split, tgt)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise ExerciseError("return a pair (decoder_input, labels)")
    decoder_input, labels = out
    expect_shape(decoder_input, (2, 4), "decoder_input for tgt of shape (2, 5)")
    expect_shape(labels, (2, 4), "labels for tgt of shape (2, 5)")
    if torch.equal(decoder_input, tgt[:, 1:]) and torch.equal(labels, tgt[:, :-1]):
        raise ExerciseError(
            "decoder input and labels are swapped: the decoder reads [BOS, y...] and learns to "
            "predict [y..., EOS], the same tokens one step later"
        )
    if torch.equal(decoder_input, labels):
        raise ExerciseError(
            "decoder input and labels are identical: then position t would be trained to "
            "output the token it reads, a copy. The labels are the input shifted left by one"
        )
    if not torch.equal(decoder_input, tgt[:, :-1]):
        raise ExerciseError(
            "the decoder input should be tgt without its last position, tgt[:, :-1]: it starts "
            "with BOS and never needs to read the final token"
        )
    if not torch.equal(labels, tgt[:, 1:]):
        raise ExerciseError(
            "the labels should be tgt without its first position (BOS), tgt[:, 1:]: the token "
            "that follows each input position"
        )
