"""Checkers for the chapter "Scaled dot-product attention" (``book/attention``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch
from torch import Tensor

from minitransformer.attention import causal_mask, scaled_dot_product_attention
from minitransformer.exercises._core import (
    Case,
    ExerciseError,
    Mistake,
    checker,
    close,
    like,
    raises,
    when,
)

__all__ = ["check_attention", "check_causal_mask", "check_cross_attention_shapes"]


def _attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: str = "sqrt",
    d_k: int | None = None,
    softmax_dim: int = -1,
    transposed: bool = True,
    mask_mode: str = "before",
) -> tuple[Tensor, Tensor]:
    """Attention written the way a learner might, right or wrong: ``scale`` "sqrt", "none" or
    "d_k"; ``mask_mode`` "before" (right), "after" the softmax, "ignored" or "inverted"."""
    d_k = d_k or query.shape[-1]
    scores = query @ (key.transpose(-2, -1) if transposed else key)
    scores = {"sqrt": scores / math.sqrt(d_k), "d_k": scores / d_k, "none": scores}[scale]
    if mask is not None and mask_mode in ("before", "inverted"):
        scores = scores.masked_fill(mask if mask_mode == "inverted" else ~mask, float("-inf"))
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, weights


_ATTENTION_MISTAKES = [
    when(
        lambda got: isinstance(got, Tensor),
        "you return only the output; return both the output and the weights: `return output, "
        "weights`",
    ),
    when(
        lambda got, want: got[1].shape == want[1].mT.shape != want[1].shape,
        "your weights are (B, S, T): you computed K Q^T. The scores have one row per query and "
        "one column per key: Q K^T, shape (B, T, S)",
    ),
    like(
        partial(_attention, softmax_dim=2),  # right on 3-D inputs; on 4-D ones, the query axis
        "your softmax uses dim=2: right for 3-D inputs, but for 4-D ones dim=2 is the query axis. "
        "Use dim=-1",
    ),
    like(
        partial(_attention, softmax_dim=-2),
        "your softmax normalises over the queries (dim=-2): each *row* of the weights, one "
        "query's weights over all keys, must sum to one, so use softmax(scores, dim=-1)",
    ),
    like(
        partial(_attention, scale="none"),
        "you forgot the scaling: divide the scores Q K^T by sqrt(d_k), with d_k = query.shape[-1]",
    ),
    like(
        partial(_attention, scale="d_k"),
        "you divide the scores by d_k; the paper divides by sqrt(d_k) (math.sqrt(d_k))",
    ),
    like(
        partial(_attention, transposed=False),
        "you multiply the query by the key without transposing it (Q K): the scores are Q K^T, "
        "query @ key.transpose(-2, -1), shape (..., T, S). Your version only ran because S = d_k "
        "in this test",
    ),
    like(
        partial(_attention, softmax_dim=-2, scale="none"),
        "two mistakes: the softmax runs over dim=-2 instead of dim=-1, and the scores are not "
        "divided by sqrt(d_k)",
    ),
    like(
        partial(_attention, mask_mode="after"),
        "you apply the mask after the softmax (zeroing weights): the remaining weights of a row "
        "no longer sum to one. Mask the *scores* before the softmax: scores.masked_fill(~mask, "
        "float('-inf'))",
    ),
    like(
        partial(_attention, mask_mode="ignored"),
        "your function ignores the mask: masked keys still get weight. Fill the scores where mask "
        "is False with -inf before the softmax",
    ),
    like(
        partial(_attention, mask_mode="inverted"),
        "you use the opposite mask convention: in this course True means *may attend* (as in "
        "torch.nn.functional.scaled_dot_product_attention), so fill the scores where the mask is "
        "False: scores.masked_fill(~mask, float('-inf'))",
    ),
    like(
        partial(_attention, d_k=4),  # d_k hard-wired from the first case
        "your scaling is right for d_k = 4 but not for d_k = 8: take d_k from the input, d_k = "
        "query.shape[-1]",
    ),
    when(
        lambda got: not torch.isfinite(got[0]).all(),
        "your output contains inf or NaN {where}: exp() of large scores overflows. Use "
        "torch.softmax, or subtract the row maximum before exp()",
    ),
    when(
        lambda got, want: close(got[1], want[1]),
        "your weights are right but the output is not: it is weights @ value, shape (B, T, d_v)",
    ),
    when(
        lambda got, want, mask: mask is None and close(got[0], want[0]),
        "your output is right but the weights you return are not: return the softmax of the "
        "scaled scores, shape (B, T, S)",
    ),
    when(
        lambda got, want: close(got[0], want[0]),
        "with a mask, your output is right but the returned weights are not",
    ),
    when(
        lambda got, want, mask: (
            got[1].shape == want[1].shape and (got[1].masked_select(~mask).abs() > 1e-6).any()
        ),
        "keys where the mask is False still get weight: fill their scores with -inf before the "
        "softmax",
    ),
    when(
        lambda got, want: (
            got[1].shape == want[1].shape
            and not close(got[1].sum(-1), torch.ones(got[1].shape[:-1]))
        ),
        "the rows of your weights do not sum to one: apply softmax(scores, dim=-1) to the scores",
    ),
    raises(
        RuntimeError,
        "The scores need query (..., T, d_k) @ key^T (..., d_k, S): transpose the last two "
        "dimensions of the key with key.transpose(-2, -1) (key.T on a tensor with more than 2 "
        "dimensions reverses *all* of them, and transpose(1, 2) is only right for 3-D inputs)",
    ),
]


@checker(
    "scaled dot-product attention",
    mistakes=_ATTENTION_MISTAKES,
    reference=lambda q, k, v, mask: scaled_dot_product_attention(q, k, v, mask=mask),
    returns=("the output", "the weights"),
)
def check_attention(gen: torch.Generator) -> list[Case]:
    """Check ``fn(query, key, value, mask=None) -> (output, weights)``, 3-D or 4-D, mask True =
    may attend, against :func:`~minitransformer.attention.scaled_dot_product_attention`."""
    B, T, S, d_k, d_v = 2, 3, 4, 4, 5  # S = d_k, so that "the key not transposed" still runs
    q, k, v = (
        torch.randn(B, n, d, generator=gen, dtype=torch.float64)
        for n, d in ((T, d_k), (S, d_k), (S, d_v))
    )
    mask = torch.tensor(
        [
            [[1, 1, 0, 0], [1, 0, 1, 0], [0, 1, 1, 1]],  # every query sees a key and
            [[1, 0, 0, 0], [0, 1, 1, 0], [1, 1, 1, 0]],
        ]
    ).bool()  # misses one
    B, h, T, S, d_k, d_v = 2, 3, 5, 7, 8, 3  # 4-D, T != S != d_k, scores up to about 100
    q4, k4, v4 = (
        s * torch.randn(B, h, n, d, generator=gen, dtype=torch.float64)
        for s, n, d in ((8.0, T, d_k), (8.0, S, d_k), (1.0, S, d_v))
    )
    return [
        Case(
            "on 3-D inputs without a mask",
            query=q,
            key=k,
            value=v,
            mask=None,
            otherwise="Compare with softmax(Q K^T / sqrt(d_k)) V",
        ),
        Case(
            "with a mask",
            query=q,
            key=k,
            value=v,
            mask=mask,
            otherwise="Mask the scores before the softmax (mask True = may attend)",
        ),
        Case(
            "on 4-D (B, h, T, d_k) inputs with a (T, S) mask",
            query=q4,
            key=k4,
            value=v4,
            mask=causal_mask(S)[S - T :],  # (T, S): query t sees keys 0 .. t + S - T
            otherwise="Your function is right on 3-D inputs only: use negative dimensions "
            "(transpose(-2, -1), softmax(dim=-1))",
        ),
    ]


_CAUSAL_MASK_MISTAKES = [
    when(
        lambda got, want: got.shape == want.shape and got.isinf().any(),
        "you return an additive float mask (0 and -inf); this course's masks are boolean, True = "
        "may attend: return torch.ones(size, size, dtype=torch.bool).tril() or equivalent",
    ),
    when(
        lambda got, want: got.shape == want.shape and got.dtype != torch.bool,
        "your mask has dtype {got.dtype}; return a boolean tensor (dtype=torch.bool), True = may "
        "attend",
    ),
    like(
        lambda size: torch.ones(size, size, dtype=torch.bool).tril(-1),
        "your mask leaves out the diagonal: position t may attend to itself, so the mask is True "
        "on *and* below the diagonal",
    ),
    like(
        lambda size: torch.ones(size, size, dtype=torch.bool).triu(1),
        "you use the opposite convention (True = blocked, as torch.nn.MultiheadAttention does): "
        "here True means *may attend*, so the future (above the diagonal) is False",
    ),
    like(
        lambda size: torch.ones(size, size, dtype=torch.bool).triu(),
        "your mask is transposed: row t is query t and column s is key s; query t may see keys s "
        "<= t, so the True entries are on and *below* the diagonal",
    ),
]


@checker(
    "causal mask",
    reference=causal_mask,
    mistakes=_CAUSAL_MASK_MISTAKES,
    returns="causal_mask({size})",
    otherwise="It should be True exactly where column <= row",
)
def check_causal_mask() -> list[Case]:
    """Check ``fn(size) -> (size, size)`` boolean mask, True on and below the diagonal."""
    return [Case(size=5), Case(size=1), Case(size=8)]


_SHAPE_NAMES = ("query", "key", "value", "weights", "output", "source_mask")


def _cross_attention_shapes(B: int, h: int, T: int, S: int, d_model: int) -> dict[str, tuple]:
    d_k = d_v = d_model // h  # the keyword arguments, as the learner's function gets them
    return {
        "query": (B, h, T, d_k),
        "key": (B, h, S, d_k),
        "value": (B, h, S, d_v),
        "weights": (B, h, T, S),
        "output": (B, h, T, d_v),
        "source_mask": (B, 1, 1, S),
    }


def _one_shape(fn: Callable[..., Any], name: str, d_k: int, **sizes: int) -> tuple[int, ...]:
    """``fn(**sizes)[name]`` as a tuple, one shape at a time (``d_k`` is for the hints)."""
    shapes = fn(**sizes)
    if not isinstance(shapes, Mapping):
        raise ExerciseError(
            f"your function should return a dict of shapes, got {type(shapes).__name__}"
        )
    if missing := [n for n in _SHAPE_NAMES if n not in shapes]:
        raise ExerciseError(f"your dict lacks the keys {missing}")
    if isinstance(shapes[name], (tuple, list)) and all(type(n) is int for n in shapes[name]):
        return tuple(shapes[name])
    raise ExerciseError(
        f"shapes['{name}'] should be a tuple of ints like (2, 8, 5, 64), got {shapes[name]!r}"
    )


def _entry(test: Callable[..., bool], text: str) -> Mistake:
    """A mistake in one entry: the hint names it, shows it and what it should be, then ``text``."""
    return when(test, "shapes['{name}'] is {got}, expected {want} {where}: " + text)


_SHAPE_MISTAKES = [
    _entry(
        lambda got, name: name != "source_mask" and len(got) == 3,
        "per-head tensors keep the head axis: (B, h, length, d_k); only merge_heads brings back "
        "(B, length, d_model)",
    ),
    _entry(
        lambda got, name, d_model, d_k: (
            name in ("query", "key", "value") and len(got) == 4 and got[-1] == d_model != d_k
        ),
        "each head works in d_k = d_v = d_model / h = {d_k} dimensions, not d_model",
    ),
    _entry(
        lambda got, name, B, h, S, d_k: name == "query" and got == (B, h, S, d_k),
        "the queries come from the decoder, whose length is T; only keys and values come from "
        "the encoder output (length S)",
    ),
    _entry(
        lambda got, name, T: name in ("key", "value") and len(got) == 4 and got[2] == T,
        "the {name}s come from the encoder output, so their length is the source length S, not "
        "the decoder's T",
    ),
    _entry(
        lambda got, name, B, h, T, S: name == "weights" and got == (B, h, S, T),
        "the weights have one row per query and one column per key: (B, h, T, S), like Q K^T",
    ),
    _entry(
        lambda got, name, B, h, T: name == "weights" and got == (B, h, T, T),
        "in cross-attention the keys are the S encoder positions: the weights are (B, h, T, S); "
        "(T, T) is decoder self-attention",
    ),
    _entry(
        lambda got, name, S: name == "output" and len(got) == 4 and got[2] == S,
        "weights @ value sums over the S keys: one output row per *query*, so the length is T",
    ),
    _entry(
        lambda got, name, B, h, T, S: name == "source_mask" and got in ((B, 1, T, S), (B, h, T, S)),
        "a padding mask depends only on which source positions are padding, the same for every "
        "head and query: give those axes size 1 and let broadcasting do the rest, (B, 1, 1, S)",
    ),
    _entry(
        lambda got, name, B, S: name == "source_mask" and got in ((B, S), (B, 1, S)),
        "a (B, S) or (B, 1, S) mask does not line up with (B, h, T, S) scores under "
        "broadcasting (trailing axes are matched first): add the head and query axes, "
        "(B, 1, 1, S)",
    ),
    _entry(
        lambda got, name, T: name == "source_mask" and len(got) == 4 and got[-1] == T,
        "the source padding mask hides encoder positions, i.e. *keys*: its last axis has length S",
    ),
]


@checker(
    "shapes in cross-attention",
    reference=_cross_attention_shapes,
    mistakes=_SHAPE_MISTAKES,
    observe=_one_shape,
    returns="shapes['{name}']",
    otherwise="Think about which sequence each tensor comes from and which axis is summed",
)
def check_cross_attention_shapes() -> list[Case]:
    """Check ``fn(B, h, T, S, d_model) -> dict`` of the per-head shapes in cross-attention, keys
    ``"query"``, ``"key"``, ``"value"``, ``"weights"``, ``"output"``, ``"source_mask"``."""
    sizes: list[dict[str, Any]] = [
        dict(B=2, h=8, T=5, S=7, d_model=512),  # T != S, so that
        dict(B=3, h=4, T=9, S=6, d_model=64),  # nothing is
        dict(B=1, h=2, T=3, S=11, d_model=10),
    ]  # hard-wired
    return [
        Case(f"for {p}", name=name, d_k=p["d_model"] // p["h"], **p)
        for p in sizes
        for name in _SHAPE_NAMES
    ]
