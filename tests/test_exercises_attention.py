"""The checkers of the chapter "Scaled dot-product attention" accept right answers (written
independently of the package, in several styles) and reject each typical mistake with its own
hint."""

from __future__ import annotations

import math

import pytest
import torch
from checker_helpers import rejects as _rejects
from checker_helpers import rejects_in_place, stub
from checker_helpers import verdict as _verdict

from minitransformer.attention import causal_mask, scaled_dot_product_attention
from minitransformer.exercises import (
    check_attention,
    check_causal_mask,
    check_cross_attention_shapes,
)


# ------------------------------------------------------------------ exercise 1: attention
def attention_reference(query, key, value, mask=None):
    """The textbook answer: -inf before softmax over the last axis."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ value, weights


def attention_einsum(query, key, value, mask=None):
    """Another right answer: einsum, torch.where with a large negative number, manual softmax."""
    scores = torch.einsum("...td,...sd->...ts", query, key) * query.shape[-1] ** -0.5
    if mask is not None:
        scores = torch.where(mask, scores, torch.tensor(-1e30, dtype=scores.dtype))
    e = torch.exp(scores - scores.amax(-1, keepdim=True))
    weights = e / e.sum(-1, keepdim=True)
    return torch.einsum("...ts,...sd->...td", weights, value), weights


def attention_renormalised(query, key, value, mask=None):
    """Mask after softmax *and* renormalise: mathematically the same as masking before."""
    weights = torch.softmax(query @ key.mT / math.sqrt(query.shape[-1]), dim=-1)
    if mask is not None:
        weights = weights * mask
        weights = weights / weights.sum(-1, keepdim=True)
    return weights @ value, weights


def make_attention(
    *,
    scale="sqrt",
    dim=-1,
    transpose=lambda k: k.transpose(-2, -1),
    mask_mode="before",
    returns="both",
    fixed_d_k=None,
):
    """A learner's attention with one deliberate mistake."""

    def attention(query, key, value, mask=None):
        d_k = fixed_d_k or query.shape[-1]
        scores = query @ transpose(key)
        if scale == "sqrt":
            scores = scores / math.sqrt(d_k)
        elif scale == "d_k":
            scores = scores / d_k
        if mask is not None and mask_mode == "before":
            scores = scores.masked_fill(~mask, float("-inf"))
        if mask is not None and mask_mode == "inverted":
            scores = scores.masked_fill(mask, float("-inf"))
        weights = torch.softmax(scores, dim=dim)
        if mask is not None and mask_mode == "after":
            weights = weights * mask
        out = weights @ value
        return {"both": (out, weights), "output": out, "swapped": (weights, out)}[returns]

    return attention


def test_attention_accepts_right_answers(capsys) -> None:
    for fn in (
        attention_reference,
        attention_einsum,
        attention_renormalised,
        scaled_dot_product_attention,
    ):
        verdict = _verdict(capsys, check_attention, fn)
        assert verdict.startswith("Correct: scaled dot-product attention")


def test_attention_stub_is_not_attempted(capsys) -> None:
    assert _verdict(capsys, check_attention, stub).startswith("Not attempted yet")


@pytest.mark.parametrize(
    "fn, hint",
    [
        (make_attention(dim=-2), r"normalises over the queries \(dim=-2\)"),
        (make_attention(dim=1), r"normalises over the queries \(dim=-2\)"),  # dim=1 of 3-D input
        (make_attention(scale="none"), r"forgot the scaling: divide .* by sqrt\(d_k\)"),
        (
            make_attention(scale="d_k"),
            r"divide the scores by d_k; the paper divides by sqrt\(d_k\)",
        ),
        (make_attention(transpose=lambda k: k), r"without transposing it \(Q K\)"),
        (make_attention(dim=-2, scale="none"), r"two mistakes"),
        (make_attention(mask_mode="after"), r"mask after the softmax .* no\s+longer sum to one"),
        (make_attention(mask_mode="ignored"), r"ignores the mask"),
        (make_attention(mask_mode="inverted"), r"opposite mask convention"),
        (make_attention(returns="output"), r"return both the output and the weights"),
        (make_attention(dim=2), r"softmax uses dim=2: right for 3-D inputs"),
        (make_attention(fixed_d_k=4), r"right for d_k = 4 but not for d_k = 8"),
        # key.T reverses all axes of a 3-D key: the product fails, the hint explains why.
        (
            make_attention(transpose=lambda k: k.T),
            r"key\.T on a tensor with more than 2 dimensions",
        ),
        # transpose(1, 2) is right for 3-D inputs only.
        (
            make_attention(transpose=lambda k: k.transpose(1, 2)),
            r"transpose\(1, 2\) is only right for 3-D",
        ),
    ],
    ids=[
        "dim-2",
        "dim1",
        "no-scale",
        "scale-d_k",
        "key-not-transposed",
        "two-mistakes",
        "mask-after-softmax",
        "mask-ignored",
        "mask-inverted",
        "output-only",
        "dim2-4d",
        "fixed-d_k",
        "key.T",
        "transpose12",
    ],
)
@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")
def test_attention_rejects_each_mistake_with_its_hint(fn, hint) -> None:
    _rejects(check_attention, fn, hint)


def test_attention_rejects_transposed_scores() -> None:
    def k_q_transpose(query, key, value, mask=None):  # K Q^T: weights (B, S, T)
        w = torch.softmax(key @ query.mT / math.sqrt(query.shape[-1]), dim=-1)
        return torch.zeros(query.shape[:-1] + value.shape[-1:]), w

    _rejects(check_attention, k_q_transpose, r"you computed K Q\^T")


def test_attention_rejects_wrong_output_with_right_weights() -> None:
    def no_values(query, key, value, mask=None):
        out, w = attention_reference(query, key, value, mask)
        return out * 2, w

    _rejects(check_attention, no_values, r"weights are right but the output is not")

    def bad_weights(query, key, value, mask=None):
        out, w = attention_reference(query, key, value, mask)
        return out, w * 0.5  # e.g. returning the scores or a stale tensor

    _rejects(check_attention, bad_weights, r"output is right but the weights you return are not")


def test_attention_rejects_overflow_on_large_scores() -> None:
    def naive_softmax(query, key, value, mask=None):
        scores = query @ key.mT / math.sqrt(query.shape[-1])
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        e = torch.exp(scores * 10)  # exp of scores ~ 1000: overflows even in float64
        w = e / e.sum(-1, keepdim=True)
        return w @ value, w

    _rejects(check_attention, naive_softmax, r"differs|inf or NaN")


def test_attention_scaling_the_query_in_place_cannot_fool_the_checker() -> None:
    """The query scaled in place, then the scores scaled again: 1/d_k overall. The checker used to
    compute its reference from the scaled query afterwards and say "Correct"."""

    def scaled_twice(query, key, value, mask=None):
        query /= math.sqrt(query.shape[-1])
        return make_attention()(query, key, value, mask)

    message = rejects_in_place(check_attention, scaled_twice, "query", right=False)
    assert message.endswith(
        "you divide the scores by d_k; the paper divides by sqrt(d_k) (math.sqrt(d_k))"
    )


def test_attention_right_but_in_place_is_rejected_for_the_change_not_for_the_scaling() -> None:
    """A right answer that scales the query in place used to get "you forgot the scaling"."""

    def scaled_in_place(query, key, value, mask=None):
        query /= math.sqrt(query.shape[-1])
        return make_attention(scale="none")(query, key, value, mask)

    message = rejects_in_place(check_attention, scaled_in_place, "query", right=True)
    assert "forgot the scaling" not in message


def test_attention_crash_in_learner_code_is_reported() -> None:
    def typo(query, key, value, mask=None):
        return undefined_name  # noqa: F821

    _rejects(check_attention, typo, r"your function raised NameError")


def test_attention_mistakes_are_distinguishable() -> None:
    """The checker's 3-D inputs (without and with a mask) tell every mistake that can show there
    apart from the right answer and from the other mistakes (otherwise a hint could name the
    wrong mistake); a mistake that cannot show on a case gives the right answer there."""
    spec = check_attention.spec
    for case in spec.cases()[:2]:
        right = spec.call(spec.reference, case.inputs)[0]
        outs = [right]
        for mistake in spec.mistakes:
            for wrong in mistake.wrong:
                out = spec.call(wrong, case.inputs)[0]
                if not torch.allclose(out, right):
                    outs.append(out)
        assert len(outs) >= 6  # the reference and at least the five unmasked mistakes
        for i in range(len(outs)):
            for j in range(i):
                assert not torch.allclose(outs[i], outs[j], atol=1e-3)


# ------------------------------------------------------------------ exercise 2: causal mask
def test_causal_mask_accepts_right_answers(capsys) -> None:
    answers = [
        causal_mask,
        lambda n: torch.tril(torch.ones(n, n)).bool(),
        lambda n: torch.arange(n)[None, :] <= torch.arange(n)[:, None],
        lambda n: ~torch.ones(n, n, dtype=torch.bool).triu(1),
    ]
    for fn in answers:
        assert _verdict(capsys, check_causal_mask, fn).startswith("Correct: causal mask")
    assert _verdict(capsys, check_causal_mask, stub).startswith("Not attempted yet")


@pytest.mark.parametrize(
    "fn, hint",
    [
        (lambda n: torch.ones(n, n, dtype=torch.bool).tril(-1), r"leaves out the diagonal"),
        (
            lambda n: torch.ones(n, n, dtype=torch.bool).triu(1),
            r"opposite convention \(True = blocked",
        ),
        (lambda n: torch.ones(n, n, dtype=torch.bool).triu(), r"your mask is transposed"),
        (lambda n: torch.ones(n, n).tril(), r"dtype torch.float32; return a boolean tensor"),
        (
            lambda n: torch.zeros(n, n).masked_fill(
                torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf")
            ),
            r"additive float mask \(0 and -inf\)",
        ),
        (
            lambda n: torch.ones(n, n + 1, dtype=torch.bool).tril(),
            r"has shape \(5, 6\), expected \(5, 5\)",
        ),
        (lambda n: torch.ones(n, n, dtype=torch.bool), r"True exactly where column <= row"),
        (
            lambda n: torch.ones(5, 5, dtype=torch.bool).tril(),
            r"causal_mask\(1\) has shape \(5, 5\)",
        ),
    ],
    ids=[
        "no-diagonal",
        "inverted",
        "transposed",
        "float",
        "additive",
        "shape",
        "all-true",
        "hard-wired",
    ],
)
def test_causal_mask_rejects_each_mistake_with_its_hint(fn, hint) -> None:
    _rejects(check_causal_mask, fn, hint)


def test_causal_mask_and_shapes_take_only_numbers() -> None:
    """Their inputs are Python ints, which a function cannot change in place: no in-place test."""
    for check in (check_causal_mask, check_cross_attention_shapes):
        assert all(
            isinstance(x, int)
            for case in check.spec.cases()
            for x in case.inputs.values()
            if not isinstance(x, str)
        )


# ------------------------------------------------------------------ exercise 3: shapes
def shapes_reference(B, h, T, S, d_model):
    d_k = d_model // h
    return {
        "query": (B, h, T, d_k),
        "key": (B, h, S, d_k),
        "value": (B, h, S, d_k),
        "weights": (B, h, T, S),
        "output": (B, h, T, d_k),
        "source_mask": (B, 1, 1, S),
    }


def test_shapes_reference_agrees_with_the_package() -> None:
    """The expected answer is what the package really produces (and the mask broadcasts)."""
    B, h, T, S, d_model = 2, 2, 3, 4, 8
    want = shapes_reference(B, h, T, S, d_model)
    q, k, v = (torch.zeros(want[n]) for n in ("query", "key", "value"))
    mask = torch.ones(want["source_mask"], dtype=torch.bool)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert tuple(out.shape) == want["output"] and tuple(weights.shape) == want["weights"]


def test_shapes_accepts_right_answers(capsys) -> None:
    assert _verdict(capsys, check_cross_attention_shapes, shapes_reference).startswith("Correct")

    def as_lists_and_sizes(B, h, T, S, d_model):
        ans = shapes_reference(B, h, T, S, d_model)
        ans["query"] = list(ans["query"])
        ans["key"] = torch.Size(ans["key"])
        return ans

    assert _verdict(capsys, check_cross_attention_shapes, as_lists_and_sizes).startswith("Correct")
    assert _verdict(capsys, check_cross_attention_shapes, stub).startswith("Not attempted yet")


def _with(**changes):
    def fn(B, h, T, S, d_model):
        ans = shapes_reference(B, h, T, S, d_model)
        d_k = d_model // h
        env = dict(B=B, h=h, T=T, S=S, d_model=d_model, d_k=d_k)
        for name, shape in changes.items():
            ans[name] = tuple(env[x] if isinstance(x, str) else x for x in shape)
        return ans

    return fn


@pytest.mark.parametrize(
    "fn, hint",
    [
        (
            _with(key=("B", "h", "T", "d_k")),
            r"keys come from the encoder output, so their length is the\s+source length S",
        ),
        (_with(value=("B", "h", "T", "d_k")), r"values come from the encoder output"),
        (_with(query=("B", "h", "S", "d_k")), r"queries come from the decoder, whose length is T"),
        (
            _with(query=("B", "h", "T", "d_model")),
            r"d_k = d_v = d_model / h = 64 dimensions, not d_model",
        ),
        (_with(query=("B", "T", "d_k")), r"keep the head axis"),
        (_with(weights=("B", "h", "S", "T")), r"one row per query and one column per key"),
        (_with(weights=("B", "h", "T", "T")), r"\(T, T\) is decoder self-attention"),
        (
            _with(output=("B", "h", "S", "d_k")),
            r"sums over the S keys: one output row per \*query\*",
        ),
        (_with(source_mask=("B", 1, "T", "S")), r"same for every head and query"),
        (_with(source_mask=("B", "S")), r"does not line up with \(B, h, T, S\)"),
        (_with(source_mask=("B", 1, 1, "T")), r"its\s+last axis has length S"),
        (_with(output=(2, 8, 5, 64)), r"expected \(3, 4, 9, 16\)"),  # hard-wired first case
        (lambda **p: [(1, 2)], r"return a dict of shapes, got list"),
        (lambda **p: {"query": (1,)}, r"lacks the keys \['key', 'value'"),
        (
            lambda **p: {**shapes_reference(**p), "query": "B, h, T, d_k"},
            r"should be a tuple of ints",
        ),
    ],
    ids=[
        "key-T",
        "value-T",
        "query-S",
        "d_model",
        "no-heads",
        "weights-ST",
        "weights-TT",
        "output-S",
        "mask-T",
        "mask-2d",
        "mask-last-T",
        "hard-wired",
        "not-dict",
        "missing",
        "not-ints",
    ],
)
def test_shapes_rejects_each_mistake_with_its_hint(fn, hint) -> None:
    _rejects(check_cross_attention_shapes, fn, hint)
