"""The checker of the warm-up chapter accepts right answers, reports an untouched stub, and
rejects each typical mistake with its own hint."""

from __future__ import annotations

import pytest
import torch
from checker_helpers import rejects, rejects_in_place, stub, verdict

from minitransformer.exercises import check_softmax


def softmax_reference(x, dim=-1):
    e = torch.exp(x - x.amax(dim=dim, keepdim=True))
    return e / e.sum(dim=dim, keepdim=True)


def test_softmax_accepts_right_answers_and_reports_the_stub(capsys) -> None:
    for fn in (softmax_reference, torch.softmax, lambda x, dim=-1: x.softmax(dim)):
        assert verdict(capsys, check_softmax, fn) == "Correct: numerically stable softmax.\n"
    assert verdict(capsys, check_softmax, stub).startswith("Not attempted yet")


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda x, dim=-1: torch.softmax(x, dim=0), r"normalises over dim 0"),
        (lambda x, dim=-1: torch.softmax(x, dim=1), r"normalises over dim 1"),
        (lambda x, dim=-1: torch.exp(x), r"exp\(x\) without dividing by the row sums"),
        (
            lambda x, dim=-1: torch.exp(x) / torch.exp(x).sum(dim, keepdim=True),
            r"overflows for large inputs \(x \+ 1000 gives inf or NaN\)",
        ),
        (lambda x, dim=-1: 2 * softmax_reference(x, dim), r"do not sum to one"),
        (lambda x, dim=-1: softmax_reference(x, -1), r"ignores its `dim` argument"),
        (lambda x, dim=-1: softmax_reference(x, dim)[..., :-1], r"has shape \(3, 4, 4\), expected"),
        (lambda x, dim=-1: softmax_reference(x, dim).flip(-1), r"differs from the right answer in"),
    ],
    ids=["dim0", "dim1", "exp-only", "overflow", "not-normalised", "dim-ignored", "shape", "other"],
)
def test_softmax_rejects_each_mistake_with_its_hint(wrong, hint) -> None:
    rejects(check_softmax, wrong, hint)


def test_softmax_that_shifts_its_input_in_place_is_rejected() -> None:
    def shifted_in_place(x, dim=-1):
        x -= x.amax(dim=dim, keepdim=True)  # the caller's x changes
        e = torch.exp(x)
        return e / e.sum(dim=dim, keepdim=True)

    rejects_in_place(check_softmax, shifted_in_place, "x", right=True)
