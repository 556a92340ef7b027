"""Checkers for the chapter "Multi-head attention" (``book/multihead``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from minitransformer.attention import (
    MultiHeadAttention,
    attention_parameter_count,
    causal_mask,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)
from minitransformer.exercises._core import Case, checker, hard_wired, like, seeded, when

__all__ = [
    "check_split_heads",
    "check_merge_heads",
    "check_parameter_count",
    "check_multi_head_attention",
]


def _example(B: int, T: int, h: int, d_k: int) -> Tensor:
    """``(B, T, h * d_k)`` whose every entry is different, so any mix-up shows."""
    return torch.arange(B * T * h * d_k, dtype=torch.float32).view(B, T, h * d_k)


_SPLIT_MISTAKES = [
    when(
        lambda got, x, num_heads: got.shape == (*x.shape[:2], num_heads, x.shape[2] // num_heads),
        "your result is (B, T, h, d_k): the heads must come before the positions, (B, h, T, d_k); "
        "finish with .transpose(1, 2)",
    ),
    like(
        lambda x, num_heads: x.view(x.shape[0], num_heads, x.shape[1], -1),
        "you reshaped (B, T, h*d_k) straight to (B, h, T, d_k): that cuts the *positions* apart. "
        "View it as (B, T, h, d_k) first, then swap dims 1 and 2 with .transpose(1, 2)",
    ),
    like(
        lambda x, num_heads: x.view(*x.shape[:2], -1, num_heads).permute(0, 3, 1, 2),
        "your head i takes every h-th feature (i, i+h, i+2h, ...); head i must take the "
        "contiguous block of features i*d_k .. (i+1)*d_k - 1: view as (B, T, h, d_k), not (B, T, "
        "d_k, h)",
    ),
]


@checker(
    "split heads",
    reference=split_heads,
    mistakes=_SPLIT_MISTAKES,
    returns="my_split_heads(x, {num_heads})",
    otherwise="The answer is x.view(B, T, h, d_k).transpose(1, 2)",
)
def check_split_heads() -> list[Case]:
    """Check ``fn(x, num_heads)``, ``(B, T, h*d_k) -> (B, h, T, d_k)``, against
    :func:`~minitransformer.attention.split_heads`."""
    return [
        Case("for x of shape (2, 3, 20)", x=_example(2, 3, 4, 5), num_heads=4),
        Case(
            "for x of shape (1, 6, 8)",
            x=_example(1, 6, 2, 4),
            num_heads=2,
            hint="Your function works for 4 heads but not for num_heads=2: compute "
            "d_k = x.shape[-1] // num_heads",
        ),
    ]


_MERGE_MISTAKES = [
    like(
        lambda heads: heads.contiguous().view(heads.shape[0], heads.shape[2], -1),
        "you reshaped (B, h, T, d_v) straight to (B, T, h*d_v), which mixes positions of "
        "different heads: first .transpose(1, 2) to (B, T, h, d_v), then .reshape(B, T, h*d_v)",
    ),
    like(
        lambda heads: heads.permute(0, 2, 3, 1).reshape(heads.shape[0], heads.shape[2], -1),
        "your result interleaves the heads feature by feature; Concat(head_1, ..., head_h) puts "
        "head 1's d_v features first, then head 2's: transpose to (B, T, h, d_v) and reshape, "
        "without moving d_v before h",
    ),
]


@checker(
    "merge heads",
    reference=merge_heads,
    mistakes=_MERGE_MISTAKES,
    returns="my_merge_heads(heads)",
    otherwise="my_merge_heads(split_heads(x, h)) should give x back; yours does not",
)
def check_merge_heads() -> list[Case]:
    """Check ``fn(heads)``, ``(B, h, T, d_v) -> (B, T, h*d_v)``, against
    :func:`~minitransformer.attention.merge_heads`."""
    heads = split_heads(_example(2, 3, 4, 5), 4)  # not contiguous, as in a real forward pass
    return [
        Case("for heads of shape (2, 4, 3, 5)", heads=heads),
        Case(
            "for heads of shape (3, 2, 5, 4)",
            heads=split_heads(_example(3, 5, 2, 4), 2),
            hint=hard_wired("the sizes"),
        ),
    ]


_COUNT_MISTAKES = [
    when(lambda got: not isinstance(got, int), "your count is a {got_type}; return a Python int"),
    like(
        lambda d, h, bias: 3 * d * d + (3 * d if bias else 0),
        "{where}: you counted W^Q, W^K and W^V but forgot the output projection W^O (h*d_v x "
        "d_model) and its bias",
    ),
    like(
        lambda d, h, bias: 4 * d * d,
        "{where}: you forgot the biases: each of the four projections has d_model of them",
    ),
    like(
        lambda d, h, bias: 4 * d * d + 4 * d,
        "{where}: with bias=False there are no biases to count",
    ),
    when(
        lambda got, want, d_model, num_heads, bias: (
            num_heads > 1
            and got
            in (
                num_heads * want,
                attention_parameter_count(d_model, num_heads, bias=bias, head_dim=d_model),
            )
        ),
        "{where}: you gave every head d_model x d_model matrices; head i's W_i^Q is d_model x d_k "
        "with d_k = d_model / h, so the h heads together are d_model x d_model",
    ),
]


@checker(
    "parameter count of multi-head attention",
    mistakes=_COUNT_MISTAKES,
    returns="the count",
    reference=lambda d_model, h, bias: attention_parameter_count(d_model, h, bias=bias),
    otherwise="List the four matrices and their biases with their shapes",
)
def check_parameter_count() -> list[Case]:
    """Check ``fn(d_model, num_heads, bias=True)`` against
    :func:`~minitransformer.attention.attention_parameter_count`."""
    return [
        Case(f"(d_model={d}, num_heads={h}, bias={bias})", d_model=d, num_heads=h, bias=bias)
        for d, h in ((512, 8), (64, 1), (96, 12), (16, 16))
        for bias in (True, False)
    ]


def _heads(
    mha: MultiHeadAttention,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None,
    w_k: nn.Module | None = None,
    w_v: nn.Module | None = None,
) -> Tensor:
    """``(B, h, T, d_v)``: every head's attention, with ``w_k``/``w_v`` in place of the layer's."""
    q, k, v = (
        split_heads(w(x), mha.num_heads)
        for w, x in ((mha.w_q, query), (w_k or mha.w_k, key), (w_v or mha.w_v, value))
    )
    return scaled_dot_product_attention(q, k, v, mask=mask)[0]


def _one_wide_head(
    mha: MultiHeadAttention, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None
) -> Tensor:
    mask = mask[:, 0] if mask is not None and mask.dim() == 4 else mask
    q, k, v = mha.w_q(query), mha.w_k(key), mha.w_v(value)  # (B, T or S, d_model): never split
    return mha.w_o(scaled_dot_product_attention(q, k, v, mask=mask)[0])


_MHA_MISTAKES = [
    like(
        lambda mha, q, k, v, mask: merge_heads(_heads(mha, q, k, v, mask)),
        "you return the concatenated heads without the output projection: apply mha.w_o (W^O) to "
        "Concat(head_1, ..., head_h)",
    ),
    like(
        lambda mha, q, k, v, mask: mha.w_o(_heads(mha, q, k, v, mask).contiguous().view(q.shape)),
        "your concatenation reshapes (B, h, T, d_v) straight to (B, T, h*d_v), which mixes "
        "positions; transpose(1, 2) first (or use merge_heads)",
    ),
    like(
        lambda mha, q, k, v, mask: mha.w_o(merge_heads(_heads(mha, q, k, v, None))),
        "you ignore the mask: pass it on to scaled_dot_product_attention",
    ),
    like(
        _one_wide_head,
        "you ran one attention of width d_model: split the projections into h heads of size d_k = "
        "d_model / h (split_heads) before attending, so each head has its own softmax",
    ),
    like(
        lambda mha, q, k, v, mask: mha.w_o(merge_heads(_heads(mha, q, v, k, mask))),
        "keys and values are swapped: keys come from mha.w_k(key), values from mha.w_v(value)",
    ),
    like(
        lambda mha, q, k, v, mask: mha.w_o(
            merge_heads(_heads(mha, q, k, v, mask, w_k=mha.w_q, w_v=mha.w_q))
        ),
        "you project keys and values with W^Q; use mha.w_k for keys and mha.w_v for values",
    ),
]


@checker(
    "multi-head attention from the single-head function",
    mistakes=_MHA_MISTAKES,
    reference=lambda mha, q, k, v, mask: mha(q, k, v, mask=mask)[0],
    returns="the output",
    otherwise="It differs from MultiHeadAttention: project, split_heads, attend per head with "
    "the mask, merge_heads, then apply w_o",
)
def check_multi_head_attention(gen: torch.Generator) -> list[Case]:
    """Check ``fn(mha, query, key, value, mask=None) -> (B, T, d_model)``, built from ``mha``'s
    projections and the single-head function, against ``mha`` itself (cross-attention, T != S)."""
    d_model, h, B, T, S = 12, 3, 2, 4, 5
    # float64: a right answer differs from mha's own output by rounding only (sums of 12 terms,
    # about 1e-15), a wrong one by about 0.1, so the default tolerance (1e-5) tells them apart
    # on any CPU.
    mha = seeded(0, lambda: MultiHeadAttention(d_model, h).double().eval())
    query, key, value = (
        torch.randn(B, n, d_model, generator=gen, dtype=torch.float64) for n in (T, S, S)
    )
    return [
        Case(
            "for query (2, 4, 12), key/value (2, 5, 12)",
            mha=mha,
            query=query,
            key=key,
            value=value,
            mask=causal_mask(S)[:T].expand(B, 1, T, S),
        )
    ]
