"""Checkers for the chapter "Training a Transformer" (``book/training``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minitransformer.exercises._core import Case, checker, hard_wired, like, when
from minitransformer.training import noam_learning_rate, smoothed_targets, teacher_forcing

__all__ = ["check_noam_learning_rate", "check_smoothed_targets", "check_teacher_forcing"]


def _rates(fn: Callable[..., Any], steps: list[int], d_model: int, warmup_steps: int) -> list[Any]:
    """The learning rates ``fn`` gives at ``steps``: the whole curve is compared."""
    return [fn(s, d_model, warmup_steps) for s in steps]


def _peak(got: list[float], steps: list[int]) -> int:
    return steps[max(range(len(steps)), key=got.__getitem__)]


def _decays_as_inverse_sqrt(got: list[float], steps: list[int], warmup_steps: int) -> bool:
    late = [g * s**0.5 for g, s in zip(got, steps, strict=True) if s >= warmup_steps]
    return all(abs(x - late[0]) <= 1e-6 * abs(late[0]) for x in late)


_NOAM_MISTAKES = [
    when(
        lambda got: not all(isinstance(g, (int, float)) and not isinstance(g, bool) for g in got),
        "noam(step, d_model, warmup_steps) should be a number, got {got[0].__class__.__name__}",
    ),
    like(
        lambda s, d, w: d**-0.5 * max(s**-0.5, s * w**-1.5),
        "you take max(...) of the two arms; the schedule is their minimum: the linear arm step * "
        "warmup_steps**-1.5 is the smaller one during warm-up, the decay arm step**-0.5 after it",
    ),
    like(
        lambda s, d, w: min(s**-0.5, s * w**-1.5),
        "the factor d_model**-0.5 is missing: wider models get smaller learning rates",
    ),
    like(
        lambda s, d, w: d**0.5 * min(s**-0.5, s * w**-1.5),
        "you multiply by d_model**0.5; the paper multiplies by d_model**-0.5 (the inverse square "
        "root)",
    ),
    like(
        [
            lambda s, d, w: d**-0.5 * min(s**-0.5, s * w**-0.5),
            lambda s, d, w: d**-0.5 * min(s**-0.5, s / w),
        ],
        "the warm-up arm should be step * warmup_steps**-1.5, so that both arms meet at step = "
        "warmup_steps (where step**-0.5 = step * warmup_steps**-1.5)",
    ),
    when(
        lambda got, steps, warmup_steps: _peak(got, steps) != warmup_steps,
        lambda got, steps, d_model, warmup_steps: (
            f"for d_model={d_model}, warmup_steps="
            f"{warmup_steps} your rate peaks at step {_peak(got, steps)} among the steps tried; it "
            "should peak at step = warmup_steps"
        ),
    ),
    when(
        lambda got, steps, warmup_steps: not _decays_as_inverse_sqrt(got, steps, warmup_steps),
        "after warm-up the rate should decay as step**-0.5 (4x the steps, half the rate)",
    ),
    when(
        lambda got, want: len({round(g / w, 6) for g, w in zip(got, want, strict=True)}) == 1,
        lambda got, want: (
            f"your schedule has the right shape but is {round(got[0] / want[0], 6)} "
            "times the paper's: check the constant factor (d_model**-0.5, nothing else)"
        ),
    ),
]


@checker(
    "the warm-up (Noam) learning-rate schedule",
    reference=noam_learning_rate,
    mistakes=_NOAM_MISTAKES,
    observe=_rates,
    atol=0.0,
    rtol=1e-6,
    returns="noam(step, {d_model}, {warmup_steps})",
    otherwise="It differs from the paper's d_model**-0.5 * min(step**-0.5, "
    "step * warmup_steps**-1.5)",
)
def check_noam_learning_rate() -> list[Case]:
    """Check ``fn(step, d_model, warmup_steps)`` for ``step >= 1`` against
    :func:`~minitransformer.training.noam_learning_rate`, the paper's formula."""
    return [
        Case(f"for steps {steps}", steps=steps, d_model=d, warmup_steps=w)
        for d, w, steps in (
            (512, 4000, [1, 10, 1000, 3999, 4000, 4001, 8000, 16000, 100000]),
            (64, 50, [1, 2, 25, 50, 51, 200, 800]),
        )
    ]


def _one_hot(target: Tensor, V: int) -> Tensor:
    return torch.nn.functional.one_hot(target, V).float()  # (..., V)


_SMOOTHING_MISTAKES = [
    like(
        lambda t, V, e: (1 - e) * _one_hot(t, V) + e / (V - 1) * (1 - _one_hot(t, V)),
        "you spread epsilon over the V - 1 wrong classes only (1 - epsilon on the true class). "
        "That variant exists, but here we follow PyTorch's CrossEntropyLoss(label_smoothing=...): "
        "epsilon is spread uniformly over all V classes, so the true class gets 1 - epsilon + "
        "epsilon / V",
    ),
    like(
        lambda t, V, e: _one_hot(t, V),
        "you return the one-hot targets: move epsilon of the mass to a uniform distribution over "
        "the V classes",
    ),
    like(
        lambda t, V, e: e * _one_hot(t, V) + (1 - e) / V,
        "epsilon and 1 - epsilon are swapped: the one-hot part keeps 1 - epsilon, the uniform "
        "part gets epsilon",
    ),
    like(
        lambda t, V, e: (1 - e) * _one_hot(t, V) + e / V * (1 - _one_hot(t, V)),
        "the rows sum to 1 - epsilon + epsilon / V, not 1: the true class also gets its share "
        "epsilon / V of the uniform part, on top of 1 - epsilon",
    ),
    when(
        lambda got, want: got.shape[:-1] == want.shape[:-1] and got.shape[-1] < want.shape[-1],
        lambda got, num_classes: (
            f"your targets have {got.shape[-1]} classes, not num_classes = {num_classes}: "
            "F.one_hot(target) without num_classes makes only max(target) + 1 of them, so "
            "pass num_classes"
        ),
    ),
    when(
        lambda got: not torch.allclose(got.double().sum(-1), torch.ones((), dtype=torch.float64)),
        "each target distribution (last dimension) must sum to one",
    ),
]


@checker(
    "label-smoothed targets",
    reference=smoothed_targets,
    mistakes=_SMOOTHING_MISTAKES,
    returns="smooth(target, {num_classes}, {epsilon})",
    otherwise="The targets are (1 - epsilon) * one_hot(target, V) + epsilon / V",
)
def check_smoothed_targets() -> list[Case]:
    """Check ``fn(target, num_classes, epsilon)`` against
    :func:`~minitransformer.training.smoothed_targets` (PyTorch's convention)."""
    return [
        Case(
            "for target of shape (2, 3)",
            target=torch.tensor([[0, 3, 5], [2, 2, 1]]),
            num_classes=6,
            epsilon=0.2,
        ),
        Case(
            "for target [4]",
            target=torch.tensor([4]),
            num_classes=5,
            epsilon=0.0,
            hint="With epsilon = 0 the targets must be exactly one-hot",
        ),
        Case(  # the largest class does not occur: F.one_hot(target) alone is too narrow
            "for target [[1, 0], [2, 1]] with 7 classes",
            target=torch.tensor([[1, 0], [2, 1]]),
            num_classes=7,
            epsilon=0.1,
        ),
    ]


_TEACHER_FORCING_MISTAKES = [
    like(
        lambda tgt: (tgt[:, 1:], tgt[:, :-1]),
        "decoder input and labels are swapped: the decoder reads [BOS, y...] and learns to "
        "predict [y..., EOS], the same tokens one step later",
    ),
    when(
        lambda got, want: got[0].shape == want[0].shape and torch.equal(got[0], got[1]),
        "decoder input and labels are identical: then position t would be trained to output the "
        "token it reads, a copy. The labels are the input shifted left by one",
    ),
    when(
        lambda got, want: got[0].shape == want[0].shape and not torch.equal(got[0], want[0]),
        "your decoder input is not tgt without its last position, tgt[:, :-1]: it starts with BOS "
        "and never needs to read the final token",
    ),
    when(
        lambda got, want: got[1].shape == want[1].shape and not torch.equal(got[1], want[1]),
        "your labels are not tgt without its first position (BOS), tgt[:, 1:]: the token that "
        "follows each input position",
    ),
]


@checker(
    "teacher forcing: decoder input and labels",
    reference=teacher_forcing,
    mistakes=_TEACHER_FORCING_MISTAKES,
    returns=("the decoder input", "the labels"),
)
def check_teacher_forcing() -> list[Case]:
    """Check ``fn(tgt) -> (decoder_input, labels)`` for ``tgt`` = ``[BOS, y..., EOS, PAD...]``
    against :func:`~minitransformer.training.teacher_forcing`."""
    tgt = torch.tensor([[1, 5, 6, 7, 2], [1, 8, 2, 0, 0]])  # BOS 1, EOS 2, PAD 0
    longer = torch.tensor([[1, 9, 2, 0, 0, 0, 0], [1, 4, 4, 5, 6, 7, 2], [1, 3, 2, 0, 0, 0, 0]])
    return [
        Case("for tgt of shape (2, 5)", tgt=tgt),
        Case("for tgt of shape (3, 7)", tgt=longer, hint=hard_wired("the sizes")),
    ]
