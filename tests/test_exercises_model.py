"""The checkers of the chapter "The encoder–decoder picture" accept the reference answers and
reject each typical mistake with its own hint."""

from __future__ import annotations

import pytest
import torch

from minitransformer.attention import causal_mask, padding_mask
from minitransformer.exercises import (
    ExerciseError,
    check_decoder_mask,
    check_layer_parameters,
    check_next_token,
)

from checker_helpers import rejects_in_place

# -- decoder mask ------------------------------------------------------------------------------


def mask_ref(lengths, T):
    return causal_mask(T) & padding_mask(lengths, T)


def test_decoder_mask_accepts_reference_and_reports_stub(capsys) -> None:
    check_decoder_mask(mask_ref)
    assert capsys.readouterr().out.startswith("Correct")

    def stub(lengths, T):
        raise NotImplementedError

    check_decoder_mask(stub)
    assert capsys.readouterr().out.startswith("Not attempted yet")


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda l, T: ~mask_ref(l, T), "inverted"),
        (lambda l, T: causal_mask(T).expand(len(l), 1, T, T), "only causal"),
        (lambda l, T: padding_mask(l, T).expand(len(l), 1, T, T), "only hides padding"),
        (lambda l, T: causal_mask(T).T & padding_mask(l, T), "upper-triangular"),
        (lambda l, T: causal_mask(T) | padding_mask(l, T), "OR"),
        (lambda l, T: mask_ref(l, T).int(), "boolean"),
        (lambda l, T: causal_mask(T), r"one \(T, T\) matrix"),
        (lambda l, T: mask_ref(l, T)[:, 0], "values are right but the shape"),
        (lambda l, T: mask_ref(l, T) & (torch.rand(len(l), 1, T, T) > 2), "differs from"),
    ],
    ids=["inverted", "causal-only", "padding-only", "triu", "or", "int", "2d", "no-head-dim", "other"],
)
def test_decoder_mask_hints(wrong, hint) -> None:
    torch.manual_seed(0)
    with pytest.raises(ExerciseError, match=hint):
        check_decoder_mask(wrong)


# -- layer parameters --------------------------------------------------------------------------


def count_ref(d, d_ff, decoder):
    attention = 4 * (d * d + d)
    ffn = 2 * d * d_ff + d_ff + d
    return (2 if decoder else 1) * attention + ffn + (3 if decoder else 2) * 2 * d


def test_layer_parameters_accepts_reference(capsys) -> None:
    check_layer_parameters(count_ref)
    check_layer_parameters(lambda d, f, dec: torch.tensor(count_ref(d, f, dec)))
    assert capsys.readouterr().out.count("Correct") == 2


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda d, f, dec: (2 if dec else 1) * 4 * d * d + 2 * d * f + (3 if dec else 2) * 2 * d,
         "biases"),
        (lambda d, f, dec: count_ref(d, f, dec) - (3 if dec else 2) * 2 * d, "LayerNorms"),
        (lambda d, f, dec: count_ref(d, f, False), "looks like an encoder"),
        (lambda d, f, dec: count_ref(d, f, dec) - (2 * d if dec else 0), "third LayerNorm"),
        (lambda d, f, dec: count_ref(d, f, dec) - (4 * d * d + 4 * d if dec else 0), "cross-attention"),
        (lambda d, f, dec: count_ref(d, f, dec) - d * d - d, r"W\^O"),
        (lambda d, f, dec: count_ref(d, f, dec) - d * f - f, "one of the FFN"),
        (lambda d, f, dec: count_ref(d, f, dec) + 1, "expected"),
        (lambda d, f, dec: "many", "should return a number"),
    ],
    ids=["no-bias", "no-norm", "decoder-as-encoder", "no-norm3", "no-cross", "no-wo", "one-ffn",
         "off-by-one", "not-a-number"],
)
def test_layer_parameters_hints(wrong, hint) -> None:
    with pytest.raises(ExerciseError, match=hint):
        check_layer_parameters(wrong)


# -- next token --------------------------------------------------------------------------------


def next_ref(model, src, prefix):
    with torch.no_grad():
        return model(src, prefix)[:, -1].argmax(-1)


def test_next_token_accepts_reference_and_via_encode_decode(capsys) -> None:
    check_next_token(next_ref)

    def via_encode_decode(model, src, prefix):
        memory = model.encode(src)
        return model.decode(prefix, memory)[:, -1].argmax(-1)

    check_next_token(via_encode_decode)
    assert capsys.readouterr().out.count("Correct") == 2


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda m, s, p: m(s, p)[:, -1], r"the logits themselves"),
        (lambda m, s, p: m(s, p).argmax(-1), "one prediction per position"),
        (lambda m, s, p: m(s, p)[:, 0].argmax(-1), "first position"),
        (lambda m, s, p: m(s, p)[:, -1].argmin(-1), "argmin"),
        (lambda m, s, p: m(s, p[:, :1])[:, -1].argmax(-1) * 0 + 3 + (m(s, p)[:, -1].argmax(-1) == 3).long(),
         "differ from"),
        (lambda m, s, p: m(s, p)[:, -1].argmax(0), "shape"),
    ],
    ids=["logits", "all-positions", "first", "argmin", "other", "wrong-dim"],
)
def test_next_token_hints(wrong, hint) -> None:
    with pytest.raises(ExerciseError, match=hint):
        check_next_token(wrong)


def test_decoder_mask_that_changes_the_lengths_in_place_is_rejected() -> None:
    def pads_in_place(lengths, T):
        lengths.neg_().add_(T)  # now the number of padding positions: the caller's lengths are gone
        return causal_mask(T) & padding_mask(T - lengths, T)

    rejects_in_place(check_decoder_mask, pads_in_place, "lengths", right=True)


def test_next_token_that_changes_the_source_in_place_is_rejected() -> None:
    def frees_the_source(model, src, prefix):
        ids = next_ref(model, src, prefix)
        src.zero_()  # "free" the batch: the caller's source ids are gone
        return ids

    rejects_in_place(check_next_token, frees_the_source, "src", right=True)


def test_layer_parameters_take_only_numbers() -> None:
    """Its inputs are Python numbers, which a function cannot change in place: no in-place test."""
    assert all(isinstance(x, int) for case in check_layer_parameters.spec.cases()
               for x in case.inputs.values())
