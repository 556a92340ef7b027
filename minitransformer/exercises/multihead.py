"""Checkers for the exercises of the chapter "Multi-head attention" (``book/multihead``).

* :func:`check_split_heads`: ``(B, T, h*d_k) -> (B, h, T, d_k)``;
* :func:`check_merge_heads`: ``(B, h, T, d_v) -> (B, T, h*d_v)``, the inverse;
* :func:`check_parameter_count`: count the parameters of a multi-head attention layer;
* :func:`check_multi_head_attention`: the multi-head forward pass built on the single-head
  :func:`~minitransformer.attention.scaled_dot_product_attention`.

Each compares with :mod:`minitransformer.attention` and recognises the usual mistakes (a
reshape without the transpose, heads that take every h-th feature, a forgotten ``W^O`` or
bias, heads that are never split, ...), each with its own hint.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from minitransformer.attention import (
    MultiHeadAttention,
    attention_parameter_count,
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from minitransformer.exercises._core import ExerciseError, attempt, checker, close, expect_shape

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_parameter_count",
    "check_multi_head_attention",
]


def _example(B: int = 2, T: int = 3, h: int = 4, d_k: int = 5) -> Tensor:
    """A tensor whose every entry is different, so any mix-up shows."""
    return torch.arange(B * T * h * d_k, dtype=torch.float32).view(B, T, h * d_k)


# --------------------------------------------------------------------------------------
# Exercise 1: split_heads
# --------------------------------------------------------------------------------------


@checker("split heads")
def check_split_heads(fn: Callable[[Tensor, int], Tensor]) -> None:
    """Check ``fn(x, num_heads)`` against :func:`minitransformer.attention.split_heads`."""
    B, T, h, d_k = 2, 3, 4, 5
    x = _example(B, T, h, d_k)
    got = attempt(fn, x, h)
    if isinstance(got, Tensor) and tuple(got.shape) == (B, T, h, d_k):
        raise ExerciseError(
            f"your result has shape {tuple(got.shape)} = (B, T, h, d_k): the heads must come "
            "before the positions, (B, h, T, d_k); finish with .transpose(1, 2)"
        )
    expect_shape(got, (B, h, T, d_k), f"split_heads(x, {h}) for x of shape {tuple(x.shape)}")
    want = split_heads(x, h)
    if close(got, want):
        again = attempt(fn, _example(1, 6, 2, 4), 2)  # another head count: no hard-coded 4
        if not close(again, split_heads(_example(1, 6, 2, 4), 2)):
            raise ExerciseError("your function works for 4 heads but not for num_heads=2: "
                                "compute d_k = x.shape[-1] // num_heads")
        return
    if close(got, x.view(B, h, T, d_k)):
        raise ExerciseError(
            "you reshaped (B, T, h*d_k) straight to (B, h, T, d_k): that cuts the *positions* "
            "apart. View it as (B, T, h, d_k) first, then swap dims 1 and 2 with .transpose(1, 2)"
        )
    if close(got, x.view(B, T, d_k, h).permute(0, 3, 1, 2)):
        raise ExerciseError(
            "your head i takes every h-th feature (i, i+h, i+2h, ...); head i must take the "
            "contiguous block of features i*d_k .. (i+1)*d_k - 1: view as (B, T, h, d_k), "
            "not (B, T, d_k, h)"
        )
    raise ExerciseError("your values differ from x.view(B, T, h, d_k).transpose(1, 2)")


# --------------------------------------------------------------------------------------
# Exercise 2: merge_heads
# --------------------------------------------------------------------------------------


@checker("merge heads")
def check_merge_heads(fn: Callable[[Tensor], Tensor]) -> None:
    """Check ``fn(heads)`` against :func:`minitransformer.attention.merge_heads`."""
    B, T, h, d_v = 2, 3, 4, 5
    x = _example(B, T, h, d_v)
    heads = split_heads(x, h)  # (B, h, T, d_v), not contiguous, as in a real forward pass
    got = attempt(fn, heads)
    expect_shape(got, (B, T, h * d_v), f"merge_heads(heads) for heads of shape {tuple(heads.shape)}")
    if close(got, x):
        return
    if close(got, heads.contiguous().view(B, T, h * d_v)):
        raise ExerciseError(
            "you reshaped (B, h, T, d_v) straight to (B, T, h*d_v), which mixes positions of "
            "different heads: first .transpose(1, 2) to (B, T, h, d_v), then .reshape(B, T, h*d_v)"
        )
    if close(got, heads.permute(0, 2, 3, 1).reshape(B, T, h * d_v)):
        raise ExerciseError(
            "your result interleaves the heads feature by feature; Concat(head_1, ..., head_h) "
            "puts head 1's d_v features first, then head 2's: transpose to (B, T, h, d_v) and "
            "reshape, without moving d_v before h"
        )
    raise ExerciseError("merge_heads(split_heads(x, h)) should give x back; yours does not")


# --------------------------------------------------------------------------------------
# Exercise 3: the parameter count
# --------------------------------------------------------------------------------------


@checker("parameter count of multi-head attention")
def check_parameter_count(fn: Callable[..., int]) -> None:
    """Check ``fn(d_model, num_heads, bias=True)`` against ``attention_parameter_count``."""
    cases = [(512, 8), (64, 1), (96, 12), (16, 16)]
    for d_model, h in cases:
        for bias in (True, False):
            got = attempt(fn, d_model, h, bias=bias)
            want = attention_parameter_count(d_model, h, bias=bias)
            if not isinstance(got, int) and not (isinstance(got, Tensor) and got.numel() == 1):
                raise ExerciseError(f"return a Python int, got {type(got).__name__}")
            got = int(got)
            if got == want:
                continue
            d = d_model
            where = f"(d_model={d_model}, num_heads={h}, bias={bias})"
            if got == 3 * d * d + (3 * d if bias else 0):
                raise ExerciseError(f"{where}: you counted W^Q, W^K and W^V but forgot the "
                                    "output projection W^O (h*d_v x d_model) and its bias")
            if bias and got == 4 * d * d:
                raise ExerciseError(f"{where}: you forgot the biases: each of the four "
                                    "projections has d_model of them")
            if not bias and got == 4 * d * d + 4 * d:
                raise ExerciseError(f"{where}: with bias=False there are no biases to count")
            full_width = attention_parameter_count(d, h, bias=bias, head_dim=d)
            if h > 1 and got in (full_width, h * want):
                raise ExerciseError(f"{where}: you gave every head d_model x d_model matrices; "
                                    "head i's W_i^Q is d_model x d_k with d_k = d_model / h, so "
                                    "the h heads together are d_model x d_model")
            raise ExerciseError(f"{where}: you counted {got} parameters, expected {want}; "
                                "list the four matrices and their biases with their shapes")


# --------------------------------------------------------------------------------------
# Exercise 4: the multi-head forward pass from the single-head function
# --------------------------------------------------------------------------------------


def _one_head(mha: MultiHeadAttention, query: Tensor, key: Tensor, value: Tensor,
              mask: Tensor | None) -> Tensor:
    """Mistake: one head of width d_model (the heads are never split)."""
    q, k, v = mha.w_q(query), mha.w_k(key), mha.w_v(value)
    m = None if mask is None else mask[:, 0] if mask.dim() == 4 else mask
    return mha.w_o(scaled_dot_product_attention(q, k, v, m)[0])


def _variants(mha: MultiHeadAttention, query: Tensor, key: Tensor, value: Tensor,
              mask: Tensor) -> list[tuple[Tensor, str]]:
    h = mha.num_heads
    q = split_heads(mha.w_q(query), h)
    k = split_heads(mha.w_k(key), h)
    v = split_heads(mha.w_v(value), h)
    heads = scaled_dot_product_attention(q, k, v, mask)[0]  # (B, h, T, d_v)
    B, _, T, d_v = heads.shape
    return [
        (merge_heads(heads),
         "you return the concatenated heads without the output projection: apply mha.w_o "
         "(W^O) to Concat(head_1, ..., head_h)"),
        (mha.w_o(heads.contiguous().view(B, T, h * d_v)),
         "your concatenation reshapes (B, h, T, d_v) straight to (B, T, h*d_v), which mixes "
         "positions; transpose(1, 2) first (or use merge_heads)"),
        (mha.w_o(merge_heads(scaled_dot_product_attention(q, k, v)[0])),
         "you ignore the mask: pass it on to scaled_dot_product_attention"),
        (_one_head(mha, query, key, value, mask),
         "you ran one attention of width d_model: split the projections into h heads of size "
         "d_k = d_model / h (split_heads) before attending, so each head has its own softmax"),
        (mha.w_o(merge_heads(scaled_dot_product_attention(
            q, split_heads(mha.w_k(value), h), split_heads(mha.w_v(key), h), mask)[0])),
         "keys and values are swapped: keys come from mha.w_k(key), values from mha.w_v(value)"),
        (mha.w_o(merge_heads(scaled_dot_product_attention(
            q, split_heads(mha.w_q(key), h), split_heads(mha.w_q(value), h), mask)[0])),
         "you project keys and values with W^Q; use mha.w_k for keys and mha.w_v for values"),
    ]


@checker("multi-head attention from the single-head function")
def check_multi_head_attention(fn: Callable[..., Tensor]) -> None:
    """Check ``fn(mha, query, key, value, mask=None) -> (B, T, d_model)`` against ``mha``.

    ``fn`` must use ``mha.w_q``, ``mha.w_k``, ``mha.w_v``, ``mha.w_o`` and
    :func:`~minitransformer.attention.scaled_dot_product_attention`; the check uses cross-attention with ``T != S`` and a
    mask, so that swapped arguments and an ignored mask show.
    """
    torch.manual_seed(0)
    d_model, h, B, T, S = 12, 3, 2, 4, 5
    mha = MultiHeadAttention(d_model, h).eval()
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(B, T, d_model, generator=gen)
    key = torch.randn(B, S, d_model, generator=gen)
    value = torch.randn(B, S, d_model, generator=gen)
    mask = causal_mask(S)[:T].expand(B, 1, T, S)  # (B, 1, T, S)
    with torch.no_grad():
        got = attempt(fn, mha, query, key, value, mask)
        expect_shape(got, (B, T, d_model), "the output for query (2, 4, 12), key/value (2, 5, 12)")
        want = mha(query, key, value, mask)[0]
        if close(got, want):
            return
        for wrong, hint in _variants(mha, query, key, value, mask):
            if close(got, wrong):
                raise ExerciseError(hint)
    raise ExerciseError("your output differs from MultiHeadAttention: project, split_heads, "
                        "attend per head with the mask, merge_heads, then apply w_o")
