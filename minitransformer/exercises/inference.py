"""Checkers for the chapter "Inference: the KV cache and the cost of attention"
(``book/inference``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minitransformer.exercises._core import Case, ExerciseError, checker, close, like, when
from minitransformer.flash import online_softmax_step
from minitransformer.kv_memory import MODEL_CONFIGS, kv_cache_bytes

__all__ = ["check_kv_cache_bytes", "check_online_softmax_step", "check_cache_append"]


def _bytes(
    c: Any,
    seq_len: int,
    batch: int,
    bpe: int,
    *,
    heads: int | None = None,
    factor: int = 2,
    layers: int | None = None,
    width: int | None = None,
) -> int:
    """``factor x batch x seq_len x layers x width x bytes``, with one factor changed: a mistake."""
    per_layer = width or (heads or c.num_kv_heads) * c.head_dim  # numbers per position, layer
    return factor * batch * seq_len * (layers or c.num_layers) * per_layer * bpe


_BYTES_MISTAKES = [
    when(
        lambda got: not isinstance(got, (int, float)) or isinstance(got, bool),
        "cache_bytes should return a number of bytes, got {got_type}",
    ),
    when(
        lambda got: not isinstance(got, int),
        "your count is a {got_type}; return a Python int: bytes are whole",
    ),
    like(
        lambda c, n, b, e: _bytes(c, n, b, e, heads=c.num_heads),
        "{where} counts the {config.num_heads} query heads; the cache stores only the "
        "{config.num_kv_heads} key/value heads (config.num_kv_heads): with grouped-query "
        "attention several query heads share one K and one V",
    ),
    like(
        lambda c, n, b, e: _bytes(c, n, b, e, factor=1),
        "{where} is half the right value: each position stores a key AND a value vector, so the "
        "formula starts with a factor 2",
    ),
    like(
        lambda c, n, b, e: _bytes(c, n, b, 1),
        "{where} counts elements, not bytes: multiply by bytes_per_element ({bytes_per_element} "
        "here)",
    ),
    like(
        lambda c, n, b, e: _bytes(c, n, b, e, layers=1),
        "{where} counts one layer; every decoder layer keeps its own K and V ({config.num_layers} "
        "layers here)",
    ),
    like(
        lambda c, n, b, e: _bytes(c, n, 1, e),
        "{where} ignores batch_size: every sequence has its own cache",
    ),
    like(
        lambda c, n, b, e: _bytes(c, n, b, e, width=c.d_model),
        lambda where, config: (
            f"{where} uses d_model = {config.d_model}; one position stores "
            f"num_kv_heads x head_dim = {config.num_kv_heads * config.head_dim} numbers per "
            "layer for K (and as many for V)"
        ),
    ),
]


@checker(
    "KV-cache bytes of a model",
    mistakes=_BYTES_MISTAKES,
    returns="",
    reference=lambda c, n, b, e: kv_cache_bytes(c.num_layers, c.num_kv_heads, c.head_dim, n, b, e),
    otherwise="It should be 2 x batch x seq_len x layers x KV heads x head_dim x bytes per element",
)
def check_kv_cache_bytes() -> list[Case]:
    """Check ``fn(config, seq_len, batch_size, bytes_per_element)``, the KV-cache bytes of a
    ``ModelConfig`` (its sliding window ignored), against the package's ``kv_cache_bytes``."""
    cases = [
        ("llama-3-8b", 1000, 3, 4),  # tells the usual mistakes apart: GQA, 4 bytes, batch 3
        ("llama-2-70b", 4096, 1, 2),
        ("llama-2-7b", 4096, 8, 2),
        ("gpt2-small", 1024, 2, 1),
    ]
    return [
        Case(
            f"cache_bytes({name}, seq_len={n}, batch_size={b}, bytes_per_element={e})",
            config=MODEL_CONFIGS[name],
            seq_len=n,
            batch_size=b,
            bytes_per_element=e,
        )
        for name, n, b, e in cases
    ]


BLOCK = 4  # keys per block of the online softmax


def _fold(step: Callable[..., Any], scores: Tensor, values: Tensor) -> tuple[Any, Any, Any]:
    """``(m, ell, acc)`` after feeding ``step`` the blocks of ``scores`` ``(T, S)`` and ``values``
    ``(S, d_v)`` one after the other, from the empty statistics."""
    m = torch.full((len(scores), 1), float("-inf"), dtype=scores.dtype)  # (T, 1)
    ell, acc = torch.zeros_like(m), torch.zeros(len(scores), values.shape[1], dtype=values.dtype)
    for start in range(0, scores.shape[1], BLOCK):
        out = step(m, ell, acc, scores[:, start : start + BLOCK], values[start : start + BLOCK])
        if not isinstance(out, tuple) or len(out) != 3:
            raise ExerciseError(
                f"your step returns {type(out).__name__}; it should return the tuple (m, l, acc)"
            )
        m, ell, acc = out
    return m, ell, acc


def _no_rescale(
    m: Tensor, ell: Tensor, acc: Tensor, scores: Tensor, values: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    p = torch.exp(scores - m_new)
    return m_new, ell + p.sum(-1, keepdim=True), acc + p @ values


def _output_wrong(got: tuple[Tensor, ...], scores: Tensor, values: Tensor) -> bool:
    return not close(got[2] / got[1], torch.softmax(scores, -1) @ values)  # acc / ell at the end


def _unrescaled(got: tuple[Tensor, ...], scores: Tensor, values: Tensor) -> bool:
    _, ell, acc = _fold(_no_rescale, scores, values)
    return close(got[1], ell) or close(got[2] / got[1], acc / ell)


_STEP_MISTAKES = [
    when(
        lambda got, scores: scores.max() > 100 and not torch.cat(got[1:], -1).isfinite().all(),
        "scores around 1000 overflow: compute exp(scores - m_new), never exp(scores)",
    ),
    when(
        lambda got, want, scores: (
            not close(got[0], want[0]) and close(got[0], scores[:, -BLOCK:].amax(-1, keepdim=True))
        ),
        "m is the maximum of the last block only; keep the running maximum: "
        "m_new = max(m, max of the block's scores)",
    ),
    when(
        lambda got, want: not close(got[0], want[0]),
        "m should be the largest score seen so far in each row",
    ),
    when(
        lambda got, scores, values: close(got[2], torch.softmax(scores, -1) @ values),
        "you divide by the normaliser inside the step; keep acc unnormalised (the sum of "
        "exp(s - m) * v) and divide by l only once, after the last block",
    ),
    when(
        lambda got, scores, values: (
            _output_wrong(got, scores, values) and _unrescaled(got, scores, values)
        ),
        "when the maximum grows from m to m_new, the old l and acc were computed with exp(s - m): "
        "multiply both by exp(m - m_new) before adding the new block",
    ),
    when(
        lambda got, want, scores, values: (
            _output_wrong(got, scores, values) and not close(got[1], want[1])
        ),
        "l should be the running sum of exp(s - m) over all keys seen so far, rescaled to the "
        "current maximum m",
    ),
    when(_output_wrong, "acc / l after the last block differs from softmax(scores) @ values"),
    when(
        lambda got, scores: close(got[1], torch.exp(scores).sum(-1, keepdim=True)),
        "you compute exp(scores) without subtracting the running maximum: right for small scores, "
        "inf for scores around 1000; use exp(scores - m_new)",
    ),
    when(
        lambda scores: scores.max() < 100,
        "acc / l is right but l and acc are scaled differently from exp(s - m) with m the running "
        "maximum; keep them relative to m so that they cannot overflow",
    ),
]


@checker(
    "one step of the online softmax",
    reference=online_softmax_step,
    mistakes=_STEP_MISTAKES,
    observe=_fold,
    returns=("the running maximum m", "the running normaliser l", "the running output acc"),
)
def check_online_softmax_step(gen: torch.Generator) -> list[Case]:
    """Check ``fn(m, l, acc, scores, values) -> (m, l, acc)``, ``m``, ``l`` ``(T, 1)``, ``acc``
    ``(T, d_v)``, ``scores`` ``(T, S_blk)``, ``values`` ``(S_blk, d_v)``, folded over blocks of
    keys, against :func:`~minitransformer.flash.online_softmax_step`."""
    # Block offsets 0, 6, 2: the running max grows at the second block (old sums must be
    # rescaled) and not at the third (the block's own max is then not the running max).
    offsets = torch.tensor([0.0, 6.0, 2.0], dtype=torch.float64).repeat_interleave(BLOCK)
    scores = torch.randn(4, 3 * BLOCK, generator=gen, dtype=torch.float64) + offsets  # (T, S)
    values = torch.randn(3 * BLOCK, 3, generator=gen, dtype=torch.float64)  # (S, d_v)
    return [
        Case("for scores (4, 12) in blocks of 4 keys", scores=scores, values=values),
        Case(
            "for the same scores + 1000",
            scores=scores + 1000.0,
            values=values,
            otherwise="With all scores shifted by 1000 the output should not change",
        ),
    ]


def _append(keys: Tensor, values: Tensor, length: int, new_k: Tensor, new_v: Tensor) -> int:
    n = new_k.shape[2]
    keys[:, :, length : length + n] = new_k  # (B, h_kv, n, d) into positions length .. length+n-1
    values[:, :, length : length + n] = new_v
    return length + n


_APPEND_MISTAKES = [
    when(
        lambda got, keys, values: torch.equal(got[1], keys) and torch.equal(got[2], values),
        "the buffers are unchanged: write the new keys into them in place, e.g. "
        "keys[:, :, length:length + n] = new_k (torch.cat builds a new tensor and copies the "
        "whole cache every step, which is what preallocation avoids)",
    ),
    when(
        lambda got, keys: got[1].shape != keys.shape,
        "the keys buffer was replaced; write into it in place",
    ),
    when(
        lambda got, length, new_k: (
            new_k.shape[2] == 1 and torch.equal(got[1][:, :, length + 1 : length + 2], new_k)
        ),
        lambda length: (
            f"the new key went to position {length + 1}; the first free slot is "
            f"position `length` = {length} (positions 0..length-1 are filled)"
        ),
    ),
    when(
        lambda got, length, new_k: length and torch.equal(got[1][:, :, : new_k.shape[2]], new_k),
        "the new key overwrote position 0; write at position `length`",
    ),
    when(
        lambda got, want: not torch.equal(got[1], want[1]),
        "after {where}, the keys buffer does not hold the expected values: positions are "
        "dimension 2 of (B, h_kv, max_len, d), and new_k goes to positions length .. "
        "length + n - 1",
    ),
    when(
        lambda got, want: not torch.equal(got[2], want[2]),
        "the keys are right but the values buffer is not: append both",
    ),
    when(
        lambda got, want: got[0] != want[0],
        lambda got, length, new_k: (
            f"your function returns {got[0]!r}; return the new length: "
            f"{length} + {new_k.shape[2]} = {length + new_k.shape[2]}"
        ),
    ),
]


@checker(
    "appending one step to a preallocated KV cache",
    reference=_append,
    mistakes=_APPEND_MISTAKES,
    may_modify=("keys", "values"),  # and compare them afterwards:
    observe=lambda fn, keys, values, **step: (fn(keys, values, *step.values()), keys, values),
    returns=("the returned length", "the keys buffer", "the values buffer"),
)
def check_cache_append(gen: torch.Generator) -> list[Case]:
    """Check ``fn(keys, values, length, new_k, new_v) -> length + n``: ``new_k``/``new_v``
    ``(B, h_kv, n, d)`` written in place into the ``(B, h_kv, max_len, d)`` buffers, at
    ``length``."""
    keys, values = torch.zeros(2, 3, 8, 4), torch.zeros(2, 3, 8, 4)  # (B, h_kv, max_len, d)
    cases, length = [], 0
    for n in (1, 1, 3, 1):  # four steps, each from the buffers the previous ones filled
        new_k, new_v = (torch.randn(2, 3, n, 4, generator=gen) for _ in range(2))  # (B, h_kv, n, d)
        cases.append(
            Case(
                f"appending {n} position(s) at length {length}",
                keys=keys.clone(),
                values=values.clone(),
                length=length,
                new_k=new_k,
                new_v=new_v,
            )
        )
        length = _append(keys, values, length, new_k, new_v)
    return cases
