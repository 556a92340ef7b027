"""The checkers of the chapter "Inference" accept right answers (written independently of the
package) and reject each typical mistake with its own hint."""

from __future__ import annotations

import pytest
import torch
from checker_helpers import rejects as _rejects
from checker_helpers import rejects_in_place, stub
from checker_helpers import verdict as _verdict

from minitransformer.exercises import (
    ExerciseError,
    check_cache_append,
    check_kv_cache_bytes,
    check_online_softmax_step,
)
from minitransformer.kv_memory import kv_cache_bytes


# ------------------------------------------------------------------ KV-cache bytes
def bytes_reference(cfg, seq_len, batch_size, bytes_per_element):
    per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * bytes_per_element
    return batch_size * seq_len * per_token


def test_kv_bytes_accepts_reference_and_stub(capsys):
    assert "Correct" in _verdict(capsys, check_kv_cache_bytes, bytes_reference)
    assert "Not attempted yet" in _verdict(capsys, check_kv_cache_bytes, stub)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (lambda c, n, b, e: 2 * b * n * c.num_layers * c.num_heads * c.head_dim * e, "query heads"),
        (lambda c, n, b, e: b * n * c.num_layers * c.num_kv_heads * c.head_dim * e, "factor 2"),
        (
            lambda c, n, b, e: 2 * b * n * c.num_layers * c.num_kv_heads * c.head_dim,
            "counts elements",
        ),
        (lambda c, n, b, e: 2 * b * n * c.num_kv_heads * c.head_dim * e, "counts one layer"),
        (
            lambda c, n, b, e: 2 * n * c.num_layers * c.num_kv_heads * c.head_dim * e,
            "ignores batch_size",
        ),
        (lambda c, n, b, e: 2 * b * n * c.num_layers * c.d_model * e * 3, "expected"),
    ],
)
def test_kv_bytes_hints(wrong, hint):
    _rejects(check_kv_cache_bytes, wrong, hint)


def test_kv_bytes_rejects_non_numbers():
    _rejects(check_kv_cache_bytes, lambda c, n, b, e: "a lot", "number of bytes")


# ------------------------------------------------------------------ online softmax step
def step_reference(m, ell, acc, scores, values):
    m_new = torch.maximum(m, scores.max(dim=-1, keepdim=True).values)
    p = torch.exp(scores - m_new)
    scale = torch.exp(m - m_new)
    return m_new, scale * ell + p.sum(-1, keepdim=True), scale * acc + p @ values


def step_no_rescale(m, ell, acc, scores, values):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, ell + p.sum(-1, keepdim=True), acc + p @ values


def step_no_max(m, ell, acc, scores, values):
    p = torch.exp(scores)
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    return m_new, ell + p.sum(-1, keepdim=True), acc + p @ values


def step_block_max(m, ell, acc, scores, values):
    m_blk = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - m_blk)
    scale = torch.exp(m - m_blk)
    return m_blk, scale * ell + p.sum(-1, keepdim=True), scale * acc + p @ values


def step_normalised(m, ell, acc, scores, values):
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - m_new)
    scale = torch.exp(m - m_new)
    ell_new = scale * ell + p.sum(-1, keepdim=True)
    # keeps acc normalised: acc_new = (scale * ell * acc + p @ v) / ell_new
    acc_new = (scale * ell * acc + p @ values) / ell_new
    return m_new, ell_new, acc_new


def test_online_softmax_accepts_reference_and_stub(capsys):
    assert "Correct" in _verdict(capsys, check_online_softmax_step, step_reference)
    assert "Not attempted yet" in _verdict(capsys, check_online_softmax_step, stub)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (step_no_rescale, "exp\\(m - m_new\\)"),
        (step_no_max, "without subtracting the running maximum"),
        (step_block_max, "last block only"),
        (step_normalised, "divide by l only once"),
        (lambda m, ell, acc, s, v: (m, ell), "tuple"),
    ],
)
def test_online_softmax_hints(wrong, hint):
    _rejects(check_online_softmax_step, wrong, hint)


# ------------------------------------------------------------------ cache append
def append_reference(keys, values, length, new_k, new_v):
    n = new_k.shape[2]
    keys[:, :, length : length + n] = new_k
    values[:, :, length : length + n] = new_v
    return length + n


def append_narrow(keys, values, length, new_k, new_v):
    """Another right answer: narrow(...).copy_()."""
    n = new_k.size(2)
    keys.narrow(2, length, n).copy_(new_k)
    values.narrow(2, length, n).copy_(new_v)
    return length + n


def append_cat(keys, values, length, new_k, new_v):
    torch.cat([keys[:, :, :length], new_k], dim=2)  # result thrown away: buffers untouched
    return length + new_k.shape[2]


def append_off_by_one(keys, values, length, new_k, new_v):
    n = new_k.shape[2]
    keys[:, :, length + 1 : length + 1 + n] = new_k
    values[:, :, length + 1 : length + 1 + n] = new_v
    return length + n


def append_at_zero(keys, values, length, new_k, new_v):
    n = new_k.shape[2]
    keys[:, :, :n] = new_k
    values[:, :, :n] = new_v
    return length + n


def append_keys_only(keys, values, length, new_k, new_v):
    n = new_k.shape[2]
    keys[:, :, length : length + n] = new_k
    return length + n


def append_wrong_length(keys, values, length, new_k, new_v):
    append_reference(keys, values, length, new_k, new_v)
    return length + 1


def test_append_accepts_right_answers_and_stub(capsys):
    assert "Correct" in _verdict(capsys, check_cache_append, append_reference)
    assert "Correct" in _verdict(capsys, check_cache_append, append_narrow)
    assert "Not attempted yet" in _verdict(capsys, check_cache_append, stub)


@pytest.mark.parametrize(
    "wrong, hint",
    [
        (append_cat, "in place"),
        (append_off_by_one, "first free slot"),
        (append_at_zero, "overwrote position 0"),
        (append_keys_only, "values buffer"),
        (append_wrong_length, "new length"),
    ],
)
def test_append_hints(wrong, hint):
    _rejects(check_cache_append, wrong, hint)


def test_append_wrong_dimension_is_rejected():
    def along_heads(keys, values, length, new_k, new_v):  # positions along dim 1: shapes clash
        n = new_k.shape[2]
        keys[:, length : length + n] = new_k.transpose(1, 2)
        values[:, length : length + n] = new_v.transpose(1, 2)
        return length + n

    with pytest.raises(ExerciseError, match="raised RuntimeError"):
        check_cache_append(along_heads)


def test_online_softmax_step_that_shifts_the_scores_in_place_is_rejected():
    def in_place(m, ell, acc, scores, values):
        m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
        scores -= m_new  # the caller's scores change
        p, scale = scores.exp(), torch.exp(m - m_new)
        return m_new, scale * ell + p.sum(-1, keepdim=True), scale * acc + p @ values

    rejects_in_place(check_online_softmax_step, in_place, "scores", right=True)


def test_append_may_write_the_buffers_but_not_the_new_keys():
    def frees_new_k(keys, values, length, new_k, new_v):
        n = append_reference(keys, values, length, new_k, new_v)
        new_k.zero_()  # "free" the step's keys: the caller's tensor is zeroed
        return n

    rejects_in_place(check_cache_append, frees_new_k, "new_k", right=True)


def test_kv_bytes_takes_only_numbers_and_a_frozen_config():
    """A ModelConfig is a frozen dataclass and the rest are ints: nothing can change in place."""
    import dataclasses

    for case in check_kv_cache_bytes.spec.cases():
        config, *numbers = case.inputs.values()
        assert config.__dataclass_params__.frozen and dataclasses.is_dataclass(config)
        assert all(isinstance(x, int) for x in numbers)


def test_kv_bytes_as_a_float_is_caught():
    def as_float(c, n, b, e):
        return float(kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, n, b, e))

    _rejects(check_kv_cache_bytes, as_float, "return a Python int")
