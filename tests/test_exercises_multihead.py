"""The checkers of the chapter "Multi-head attention" accept right answers (written
independently of the package, in several styles) and reject each typical mistake with its own
hint."""

from __future__ import annotations

import math

import pytest
import torch
from checker_helpers import rejects as _rejects
from checker_helpers import rejects_in_place, stub
from checker_helpers import verdict as _verdict

from minitransformer.attention import scaled_dot_product_attention
from minitransformer.exercises import (
    check_merge_heads,
    check_multi_head_attention,
    check_parameter_count,
    check_split_heads,
)


# ------------------------------------------------------------------ exercise 1: split heads
def split_reference(x, num_heads):
    B, T, D = x.shape
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)


def split_with_chunks(x, num_heads):
    """Another right answer: cut the features into h chunks and stack them as a new dim 1."""
    return torch.stack(x.chunk(num_heads, dim=-1), dim=1)


@pytest.mark.parametrize("fn", [split_reference, split_with_chunks])
def test_split_heads_accepts_right_answers(capsys, fn):
    assert "Correct: split heads" in _verdict(capsys, check_split_heads, fn)


def test_split_heads_stub_is_not_attempted(capsys):
    assert "Not attempted yet: split heads" in _verdict(capsys, check_split_heads, stub)


@pytest.mark.parametrize(
    "wrong,hint",
    [
        (lambda x, h: x.view(x.shape[0], h, x.shape[1], x.shape[2] // h), "straight to"),
        (
            lambda x, h: x.view(x.shape[0], x.shape[1], x.shape[2] // h, h).permute(0, 3, 1, 2),
            "every h-th feature",
        ),
        (lambda x, h: x.view(x.shape[0], x.shape[1], h, x.shape[2] // h), r"\(B, T, h, d_k\)"),
        (
            lambda x, h: x.view(x.shape[0], x.shape[1], 4, x.shape[2] // 4).transpose(1, 2),
            "num_heads=2",
        ),
        # the result is named after the chapter's stub, my_split_heads (not the package's
        # split_heads)
        (
            lambda x, h: x.transpose(1, 2),
            r"my_split_heads\(x, 4\) for x of shape \(2, 3, 20\) has shape",
        ),
        (lambda x, h: split_reference(x, h) + 1, "differ"),
    ],
)
def test_split_heads_rejects_mistakes_with_their_hint(wrong, hint):
    _rejects(check_split_heads, wrong, hint)


# ------------------------------------------------------------------ exercise 2: merge heads
def merge_reference(heads):
    B, h, T, d_v = heads.shape
    return heads.transpose(1, 2).reshape(B, T, h * d_v)


def merge_with_cat(heads):
    return torch.cat(heads.unbind(dim=1), dim=-1)


@pytest.mark.parametrize("fn", [merge_reference, merge_with_cat])
def test_merge_heads_accepts_right_answers(capsys, fn):
    assert "Correct: merge heads" in _verdict(capsys, check_merge_heads, fn)


def test_merge_heads_stub_is_not_attempted(capsys):
    assert "Not attempted yet: merge heads" in _verdict(capsys, check_merge_heads, stub)


@pytest.mark.parametrize(
    "wrong,hint",
    [
        (lambda x: x.reshape(x.shape[0], x.shape[2], -1), "straight to"),
        (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), "interleaves"),
        (lambda x: x.transpose(1, 2), r"my_merge_heads\(heads\) for heads .* has shape"),
        (
            lambda x: merge_reference(x).flip(-1),
            r"my_merge_heads\(split_heads\(x, h\)\) should give x back",
        ),
    ],
)
def test_merge_heads_rejects_mistakes_with_their_hint(wrong, hint):
    _rejects(check_merge_heads, wrong, hint)


# ------------------------------------------------------------------ exercise 3: parameter count
def count_reference(d_model, num_heads, bias=True):
    d_k = d_model // num_heads
    per_projection = d_model * num_heads * d_k  # h blocks of d_model x d_k
    return 4 * per_projection + (4 * d_model if bias else 0)


def test_parameter_count_accepts_right_answer(capsys):
    assert "Correct: parameter count" in _verdict(capsys, check_parameter_count, count_reference)


def test_parameter_count_accepts_counting_a_real_module(capsys):
    def by_counting(d_model, num_heads, bias=True):
        module = torch.nn.MultiheadAttention(d_model, num_heads, bias=bias)
        return sum(p.numel() for p in module.parameters())

    assert "Correct" in _verdict(capsys, check_parameter_count, by_counting)


def test_parameter_count_stub_is_not_attempted(capsys):
    assert "Not attempted yet" in _verdict(capsys, check_parameter_count, stub)


@pytest.mark.parametrize(
    "wrong,hint",
    [
        (
            lambda d, h, bias=True: 3 * d * d + (3 * d if bias else 0),
            "forgot the output projection",
        ),
        (lambda d, h, bias=True: 4 * d * d, "forgot the biases"),
        (lambda d, h, bias=True: 4 * d * d + 4 * d, "no biases"),
        (
            lambda d, h, bias=True: h * (4 * d * d + (4 * d if bias else 0)),
            "every head d_model x d_model",
        ),
        (
            lambda d, h, bias=True: 3 * h * d * d + h * d * d + (3 * h * d + d if bias else 0),
            "every head d_model x d_model",
        ),
        (lambda d, h, bias=True: 4 * d * d + 4 * d + 1, "expected"),
        (lambda d, h, bias=True: 4.0 * d * d, "Python int"),
    ],
)
def test_parameter_count_rejects_mistakes_with_their_hint(wrong, hint):
    _rejects(check_parameter_count, wrong, hint)


# ------------------------------------------------------------------ exercise 4: MHA forward
def mha_reference(mha, query, key, value, mask=None):
    """Written as the paper states it: a loop over heads, each a single-head attention."""
    d_k = mha.d_k
    heads = []
    for i in range(mha.num_heads):
        cols = slice(i * d_k, (i + 1) * d_k)
        q = mha.w_q(query)[..., cols]
        k = mha.w_k(key)[..., cols]
        v = mha.w_v(value)[..., cols]
        m = None if mask is None else mask[:, 0]  # (B, 1, T, S) -> (B, T, S)
        heads.append(scaled_dot_product_attention(q, k, v, m)[0])
    return mha.w_o(torch.cat(heads, dim=-1))


def mha_vectorised(mha, query, key, value, mask=None):
    B, T, _ = query.shape
    h, d_k = mha.num_heads, mha.d_k
    q = mha.w_q(query).view(B, T, h, d_k).transpose(1, 2)
    k = mha.w_k(key).view(B, -1, h, d_k).transpose(1, 2)
    v = mha.w_v(value).view(B, -1, h, d_k).transpose(1, 2)
    out, _ = scaled_dot_product_attention(q, k, v, mask)
    return mha.w_o(out.transpose(1, 2).reshape(B, T, h * d_k))


@pytest.mark.parametrize("fn", [mha_reference, mha_vectorised])
def test_multi_head_attention_accepts_right_answers(capsys, fn):
    assert "Correct: multi-head attention" in _verdict(capsys, check_multi_head_attention, fn)


def test_multi_head_attention_stub_is_not_attempted(capsys):
    assert "Not attempted yet" in _verdict(capsys, check_multi_head_attention, stub)


def _vectorised_with(
    *,
    w_o=True,
    transpose=True,
    mask=True,
    split=True,
    swap_kv=False,
    k_proj="w_k",
    scale_by_d_model=False,
):
    def fn(mha, query, key, value, m=None):
        B, T, D = query.shape
        h = mha.num_heads if split else 1
        d_k = D // h
        kin, vin = (value, key) if swap_kv else (key, value)
        q = mha.w_q(query).view(B, T, h, d_k).transpose(1, 2)
        k = getattr(mha, k_proj)(kin).view(B, -1, h, d_k).transpose(1, 2)
        v_proj = getattr(mha, "w_v" if k_proj == "w_k" else k_proj)
        v = v_proj(vin).view(B, -1, h, d_k).transpose(1, 2)
        if scale_by_d_model:  # the sdpa scales by sqrt(d_k); this rescales to sqrt(d_model)
            q = q * math.sqrt(d_k) / math.sqrt(D)
        out, _ = scaled_dot_product_attention(q, k, v, m if mask else None)
        out = out.transpose(1, 2).reshape(B, T, D) if transpose else out.reshape(B, T, D)
        return mha.w_o(out) if w_o else out

    return fn


@pytest.mark.parametrize(
    "kwargs,hint",
    [
        (dict(w_o=False), "without the output projection"),
        (dict(transpose=False), "mixes positions"),
        (dict(mask=False), "ignore the mask"),
        (dict(split=False), "one attention of width d_model"),
        (dict(swap_kv=True), "swapped"),
        (dict(k_proj="w_q"), "with W\\^Q"),
        (dict(scale_by_d_model=True), "differs from MultiHeadAttention"),
    ],
)
def test_multi_head_attention_rejects_mistakes_with_their_hint(kwargs, hint):
    _rejects(check_multi_head_attention, _vectorised_with(**kwargs), hint)


def test_multi_head_attention_reports_a_wrong_shape():
    _rejects(check_multi_head_attention, lambda mha, q, k, v, m=None: q[:, :, :4], "has shape")


def test_split_heads_that_reshapes_its_input_in_place_is_rejected():
    def in_place(x, num_heads):
        B, T, D = x.shape
        x.data = x.view(B, T, num_heads, D // num_heads).transpose(1, 2)  # the caller's x changes
        return x

    rejects_in_place(check_split_heads, in_place, "x", right=True)


def test_merge_heads_that_transposes_its_input_in_place_is_rejected():
    def in_place(heads):
        B, h, T, d_v = heads.shape
        return heads.transpose_(1, 2).reshape(B, T, h * d_v)  # transpose_ changes the caller's view

    rejects_in_place(check_merge_heads, in_place, "heads", right=True)


def test_multi_head_attention_that_changes_the_layer_cannot_fool_the_checker():
    """Zeroing W^O's bias inside the function changed the layer the checker then used for its
    reference, which agreed."""

    def no_bias(mha, query, key, value, mask=None):
        mha.w_o.bias.zero_()
        return mha_vectorised(mha, query, key, value, mask)

    rejects_in_place(check_multi_head_attention, no_bias, "mha", right=False)


def test_parameter_count_takes_only_numbers():
    """Its inputs are Python numbers, which a function cannot change in place: no in-place test."""
    assert all(
        isinstance(x, int)
        for case in check_parameter_count.spec.cases()
        for x in case.inputs.values()
    )


def test_merge_heads_with_hard_wired_sizes_is_caught():
    _rejects(check_merge_heads, lambda h: h.transpose(1, 2).reshape(2, 3, 20), "hard-wire")
