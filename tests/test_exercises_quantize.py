"""The int8 exercise checker accepts the reference and names each typical mistake."""

import pytest
import torch
from checker_helpers import rejects_in_place

from minitransformer.exercises import ExerciseError, check_quantize_rows
from minitransformer.quantize import quantize_int8


def reference(x):
    absmax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    return torch.round(x / scale).to(torch.int8), scale


def test_accepts_the_reference(capsys):
    check_quantize_rows(reference)
    assert "Correct" in capsys.readouterr().out


def test_accepts_the_package_function(capsys):
    def package(x):
        q = quantize_int8(x, scale_dtype=torch.float32)
        return q.values, q.scale.float()

    check_quantize_rows(package)
    assert "Correct" in capsys.readouterr().out


def test_untouched_stub_is_not_attempted(capsys):
    def stub(x):
        raise NotImplementedError

    check_quantize_rows(stub)
    assert "Not attempted yet" in capsys.readouterr().out


def _per_tensor(x):
    scale = x.abs().max() / 127
    return torch.round(x / scale).to(torch.int8), scale


def _by_128(x):
    absmax = x.abs().amax(-1, keepdim=True).clamp_min(1e-12)
    return torch.round(x / (absmax / 128)).to(torch.int8), absmax / 128


def _truncate(x):
    _, scale = reference(x)
    return (x / scale).to(torch.int8), scale


def _float_values(x):
    values, scale = reference(x)
    return values.float(), scale


def _zero_row_nan(x):
    scale = x.abs().amax(-1, keepdim=True) / 127
    return torch.round(x / scale).nan_to_num().to(torch.int8), scale


def _no_abs(x):
    absmax = x.amax(-1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / 127, torch.ones_like(absmax))
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def _no_keepdim(x):
    values, scale = reference(x)
    return values, scale.squeeze(-1)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (_per_tensor, "one scale for the whole tensor"),
        (_by_128, "max|x| / 128"),
        (_truncate, "truncate"),
        (_float_values, "int8 tensor"),
        (_zero_row_nan, "0/0"),
        (_no_abs, "maximum of |x|"),
        (_no_keepdim, "keepdim"),
    ],
)
def test_rejects_typical_mistakes_with_their_own_hint(wrong, hint):
    with pytest.raises(ExerciseError, match=hint.replace("|", r"\|")):
        check_quantize_rows(wrong)


def test_dividing_the_input_in_place_is_rejected():
    def in_place(x):
        _, scale = reference(x)
        x /= scale  # the caller's x now holds x / scale
        return torch.round(x).to(torch.int8), scale

    rejects_in_place(check_quantize_rows, in_place, "x", right=True)


def test_quantize_with_hard_wired_sizes_is_caught():
    def fitted(x):
        scale = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 127
        return torch.round(x / scale).to(torch.int8).reshape(6, 16), scale.reshape(6, 1)

    with pytest.raises(ExerciseError, match="hard-wire the sizes|raised"):
        check_quantize_rows(fitted)
