"""The checkers of the chapter "The encoder–decoder picture" accept the reference answers and
reject each typical mistake with its own hint."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F
from checker_helpers import rejects, rejects_in_place, stub

from minitransformer.attention import causal_mask, padding_mask
from minitransformer.exercises import (
    ExerciseError,
    check_decoder_mask,
    check_encoder_layer,
    check_layer_parameters,
    check_next_token,
)

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
        (lambda lengths, T: ~mask_ref(lengths, T), "inverted"),
        (lambda lengths, T: causal_mask(T).expand(len(lengths), 1, T, T), "only causal"),
        (
            lambda lengths, T: padding_mask(lengths, T).expand(len(lengths), 1, T, T),
            "only hides padding",
        ),
        (lambda lengths, T: causal_mask(T).T & padding_mask(lengths, T), "upper-triangular"),
        (lambda lengths, T: causal_mask(T) | padding_mask(lengths, T), "OR"),
        (lambda lengths, T: mask_ref(lengths, T).int(), "boolean"),
        (lambda lengths, T: causal_mask(T), r"one \(T, T\) matrix"),
        (lambda lengths, T: mask_ref(lengths, T)[:, 0], "values are right but the shape"),
        (
            lambda lengths, T: mask_ref(lengths, T) & (torch.rand(len(lengths), 1, T, T) > 2),
            "differs from",
        ),
    ],
    ids=[
        "inverted",
        "causal-only",
        "padding-only",
        "triu",
        "or",
        "int",
        "2d",
        "no-head-dim",
        "other",
    ],
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
        (
            lambda d, f, dec: (2 if dec else 1) * 4 * d * d + 2 * d * f + (3 if dec else 2) * 2 * d,
            "biases",
        ),
        (lambda d, f, dec: count_ref(d, f, dec) - (3 if dec else 2) * 2 * d, "LayerNorms"),
        (lambda d, f, dec: count_ref(d, f, False), "looks like an encoder"),
        (lambda d, f, dec: count_ref(d, f, dec) - (2 * d if dec else 0), "third LayerNorm"),
        (
            lambda d, f, dec: count_ref(d, f, dec) - (4 * d * d + 4 * d if dec else 0),
            "cross-attention",
        ),
        (lambda d, f, dec: count_ref(d, f, dec) - d * d - d, r"W\^O"),
        (lambda d, f, dec: count_ref(d, f, dec) - d * f - f, "one of the FFN"),
        (lambda d, f, dec: count_ref(d, f, dec) + 1, "expected"),
        (lambda d, f, dec: "many", "should return a number"),
    ],
    ids=[
        "no-bias",
        "no-norm",
        "decoder-as-encoder",
        "no-norm3",
        "no-cross",
        "no-wo",
        "one-ffn",
        "off-by-one",
        "not-a-number",
    ],
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
        (
            lambda m, s, p: (
                m(s, p[:, :1])[:, -1].argmax(-1) * 0 + 3 + (m(s, p)[:, -1].argmax(-1) == 3).long()
            ),
            "differ from",
        ),
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
    assert all(
        isinstance(x, int)
        for case in check_layer_parameters.spec.cases()
        for x in case.inputs.values()
    )


# -- an encoder layer from its parts -----------------------------------------------------------


def layer_ref(layer, x, src_mask):
    """Post-LN written with torch.nn.functional around the layer's attention and FFN."""

    def norm(ln, z):
        return F.layer_norm(z, ln.normalized_shape, ln.weight, ln.bias, ln.eps)

    h = norm(layer.norm1, x + layer.self_attn(x, x, x, mask=src_mask, need_weights=False)[0])
    return norm(layer.norm2, h + layer.feed_forward.linear2(F.relu(layer.feed_forward.linear1(h))))


def with_dropout_modules(layer, x, src_mask):
    """The layer's own dropout modules, which do nothing in eval mode: right."""
    h = layer.norm1(x + layer.dropout1(layer.self_attn(x, x, x, src_mask)[0]))
    return layer.norm2(h + layer.dropout2(layer.feed_forward(h)))


def test_encoder_layer_accepts_reference_and_reports_stub(capsys) -> None:
    check_encoder_layer(layer_ref)
    check_encoder_layer(with_dropout_modules)
    assert capsys.readouterr().out.count("Correct") == 2
    check_encoder_layer(stub)
    assert capsys.readouterr().out.startswith("Not attempted yet")


def variant(layer, x, src_mask, *, first=None, second=None, ffn_input=None, mask=True):
    """Post-LN, or a learner's variant: ``first(layer, x, attention)`` and ``second(layer, h,
    ffn)`` combine each sub-layer's input and output, ``ffn_input(x, h)`` feeds the FFN."""
    attention = layer.self_attn(x, x, x, src_mask if mask else None)[0]
    h = first(layer, x, attention) if first else layer.norm1(x + attention)
    out = layer.feed_forward(ffn_input(x, h) if ffn_input else h)
    return second(layer, h, out) if second else layer.norm2(h + out)


def pre_ln(layer, x, src_mask):
    z = layer.norm1(x)
    h = x + layer.self_attn(z, z, z, src_mask)[0]
    return h + layer.feed_forward(layer.norm2(h))


def in_train_mode(layer, x, src_mask):
    layer.train()  # dropout on in the attention and the FFN
    return variant(layer, x, src_mask)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (pre_ln, "pre-LN"),
        (partial(variant, first=lambda layer, x, a: layer.norm1(a)), "residual connection"),
        (partial(variant, second=lambda layer, h, o: layer.norm2(o)), "residual connection"),
        (
            partial(
                variant,
                first=lambda layer, x, a: layer.norm2(x + a),
                second=lambda layer, h, o: layer.norm1(h + o),
            ),
            "swapped",
        ),
        (partial(variant, second=lambda layer, h, o: h + o), "a LayerNorm is missing"),
        (partial(variant, ffn_input=lambda x, h: x), "reads the layer's input x"),
        (partial(variant, mask=False), r"you ignore src_mask for x \(3, 6, 16\) with padding"),
        (
            partial(variant, first=lambda layer, x, a: layer.norm1(x + F.dropout(a, 0.1))),
            "dropout is still on",
        ),
        (in_train_mode, "dropout is still on"),
        (
            lambda layer, x, m: layer.norm1(x + layer.self_attn(x, x, x, m)),
            r"returns a pair \(output, weights\)",
        ),
        (
            lambda layer, x, m: variant(layer, x, m) * 1.01,
            r"differs from the right answer .* It differs from layer\(x, src_mask\)",
        ),
    ],
    ids=[
        "pre-ln",
        "no-residual-attn",
        "no-residual-ffn",
        "norms-swapped",
        "no-norm2",
        "ffn-reads-x",
        "mask-ignored",
        "f-dropout",
        "train-mode",
        "tuple",
        "other",
    ],
)
def test_encoder_layer_hints(wrong, hint) -> None:
    with pytest.raises(ExerciseError, match=hint):
        check_encoder_layer(wrong)


def test_encoder_layer_that_changes_its_input_in_place_is_rejected() -> None:
    def adds_in_place(layer, x, src_mask):
        x += layer.self_attn(x, x, x, src_mask)[0]  # the residual addition, into the caller's x
        h = layer.norm1(x)
        return layer.norm2(h + layer.feed_forward(h))

    rejects_in_place(check_encoder_layer, adds_in_place, "x", right=True)


def test_encoder_layer_that_changes_the_layer_in_place_is_rejected() -> None:
    def rescales_the_norm(layer, x, src_mask):
        out = layer_ref(layer, x, src_mask)
        with torch.no_grad():
            layer.norm2.weight.mul_(2.0)  # the caller's layer is changed for good
        return out

    rejects_in_place(check_encoder_layer, rescales_the_norm, "layer", right=True)


def test_decoder_mask_with_hard_wired_sizes_is_caught():
    rejects(
        check_decoder_mask,
        lambda lengths, T: causal_mask(5) & padding_mask(lengths, 5),
        "hard-wire the sizes",
    )


@pytest.mark.parametrize(
    "drop",
    [
        lambda model, src, prefix: model(torch.full_like(src, 3), prefix),  # no source
        lambda model, src, prefix: model(src, prefix[:, 1:]),  # no BOS
        lambda model, src, prefix: model(src, prefix[:, -1:]),  # the last token alone
    ],
    ids=["without the source", "without BOS", "the last token alone"],
)
def test_next_token_that_drops_part_of_the_input_is_caught(drop):
    rejects(
        check_next_token,
        lambda model, src, prefix: drop(model, src, prefix)[:, -1].argmax(-1),
        "differs from the right answer",
    )
