"""Checkers for the chapter "Scaled dot-product attention" (``book/attention``): the attention
itself, the causal mask, and the shapes in cross-attention."""

from __future__ import annotations

import math
from functools import partial
from typing import Mapping

import torch
from torch import Tensor

from minitransformer.attention import causal_mask, scaled_dot_product_attention
from minitransformer.exercises._core import Case, ExerciseError, checker, close, like, raises, when

__all__ = ["check_attention", "check_causal_mask", "check_cross_attention_shapes"]


# --------------------------------------------------------------------------------------
# Exercise 1: scaled dot-product attention
# --------------------------------------------------------------------------------------


def _attention(query, key, value, mask=None, *, scale="sqrt", d_k=None, softmax_dim=-1,
               key_transposed=True, mask_mode="before"):
    """Attention written the way a learner might, right or wrong: ``scale`` "sqrt", "none" or
    "d_k"; ``mask_mode`` "before" (right), "after" the softmax, "ignored" or "inverted"."""
    d_k = d_k or query.shape[-1]
    scores = query @ (key.transpose(-2, -1) if key_transposed else key)
    scores = {"sqrt": scores / math.sqrt(d_k), "d_k": scores / d_k, "none": scores}[scale]
    if mask is not None and mask_mode in ("before", "inverted"):
        scores = scores.masked_fill(mask if mask_mode == "inverted" else ~mask, float("-inf"))
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ value, weights


_ATTENTION_MISTAKES = [
    when(lambda got: isinstance(got, Tensor),
         "you return only the output; return both the output and the weights: `return output, weights`"),
    when(lambda got: not (isinstance(got, (tuple, list)) and len(got) == 2),
         "your function returns a {got_type}; return a pair (output, weights)"),
    when(lambda got, want: got[1].shape == want[1].mT.shape != want[1].shape,
         "your weights are (B, S, T): you computed K Q^T. The scores have one row per query and one "
         "column per key: Q K^T, shape (B, T, S)"),
    like(partial(_attention, softmax_dim=2),  # on 3-D inputs dim=2 is right; on 4-D it is the queries
         "your softmax uses dim=2: right for 3-D inputs, but for 4-D ones dim=2 is the query axis. "
         "Use dim=-1"),
    like(partial(_attention, softmax_dim=-2),
         "your softmax normalises over the queries (dim=-2): each *row* of the weights, one query's "
         "weights over all keys, must sum to one, so use softmax(scores, dim=-1)"),
    like(partial(_attention, scale="none"),
         "you forgot the scaling: divide the scores Q K^T by sqrt(d_k), with d_k = query.shape[-1]"),
    like(partial(_attention, scale="d_k"),
         "you divide the scores by d_k; the paper divides by sqrt(d_k) (math.sqrt(d_k))"),
    like(partial(_attention, key_transposed=False),
         "you multiply the query by the key without transposing it (Q K): the scores are Q K^T, "
         "query @ key.transpose(-2, -1), shape (..., T, S). Your version only ran because S = d_k "
         "in this test"),
    like(partial(_attention, softmax_dim=-2, scale="none"),
         "two mistakes: the softmax runs over dim=-2 instead of dim=-1, and the scores are not "
         "divided by sqrt(d_k)"),
    like(partial(_attention, mask_mode="after"),
         "you apply the mask after the softmax (zeroing weights): the remaining weights of a row no "
         "longer sum to one. Mask the *scores* before the softmax: "
         "scores.masked_fill(~mask, float('-inf'))"),
    like(partial(_attention, mask_mode="ignored"),
         "your function ignores the mask: masked keys still get weight. Fill the scores where "
         "mask is False with -inf before the softmax"),
    like(partial(_attention, mask_mode="inverted"),
         "you use the opposite mask convention: in this course True means *may attend* (as in "
         "torch.nn.functional.scaled_dot_product_attention), so fill the scores where the mask is "
         "False: scores.masked_fill(~mask, float('-inf'))"),
    like(partial(_attention, d_k=4),  # d_k hard-wired from the first case
         "your scaling is right for d_k = 4 but not for d_k = 8: take d_k from the input, "
         "d_k = query.shape[-1]"),
    when(lambda got: not torch.isfinite(got[0]).all(),
         "your output contains inf or NaN {where}: exp() of large scores overflows. Use "
         "torch.softmax, or subtract the row maximum before exp()"),
    when(lambda got, want: close(got[1], want[1]),
         "your weights are right but the output is not: it is weights @ value, shape (B, T, d_v)"),
    when(lambda got, want, mask: mask is None and close(got[0], want[0]),
         "your output is right but the weights you return are not: return the softmax of the "
         "scaled scores, shape (B, T, S)"),
    when(lambda got, want, mask: close(got[0], want[0]),
         "with a mask, your output is right but the returned weights are not"),
    when(lambda got, mask: (got[1].double().masked_select(~mask).abs() > 1e-6).any(),
         "keys where the mask is False still get weight: fill their scores with -inf before the softmax"),
    when(lambda got: not close(got[1].double().sum(-1), torch.ones(got[1].shape[:-1], dtype=torch.float64)),
         "the rows of your weights do not sum to one: apply softmax(scores, dim=-1) to the scores"),
    raises(RuntimeError,
           "The scores need query (..., T, d_k) @ key^T (..., d_k, S): transpose the last two "
           "dimensions of the key with key.transpose(-2, -1) (key.T on a tensor with more than 2 "
           "dimensions reverses *all* of them, and transpose(1, 2) is only right for 3-D inputs)"),
]


@checker("scaled dot-product attention", mistakes=_ATTENTION_MISTAKES, returns=("the output", "the weights"),
         reference=lambda query, key, value, mask: scaled_dot_product_attention(query, key, value, mask=mask))
def check_attention(gen):
    """Check ``fn(query, key, value, mask=None) -> (output, weights)`` against
    :func:`~minitransformer.attention.scaled_dot_product_attention`, on 3-D and 4-D inputs, with
    and without a boolean mask (True = may attend) in which every query sees at least one key.
    """
    B, T, S, d_k, d_v = 2, 3, 4, 4, 5  # S = d_k, so that "the key not transposed" still runs
    q = torch.randn(B, T, d_k, generator=gen, dtype=torch.float64)
    k = torch.randn(B, S, d_k, generator=gen, dtype=torch.float64)
    v = torch.randn(B, S, d_v, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[[True, True, False, False], [True, False, True, False], [False, True, True, True]],
                         [[True, False, False, False], [False, True, True, False], [True, True, True, False]]])
    B, h, T, S, d_k, d_v = 2, 3, 5, 7, 8, 3  # 4-D, T != S != d_k, scores up to about 100
    q4 = 8.0 * torch.randn(B, h, T, d_k, generator=gen, dtype=torch.float64)
    k4 = 8.0 * torch.randn(B, h, S, d_k, generator=gen, dtype=torch.float64)
    v4 = torch.randn(B, h, S, d_v, generator=gen, dtype=torch.float64)
    return [
        Case("on 3-D inputs without a mask", query=q, key=k, value=v, mask=None,
             otherwise="Compare with softmax(Q K^T / sqrt(d_k)) V"),
        Case("with a mask", query=q, key=k, value=v, mask=mask,
             otherwise="Mask the scores before the softmax (mask True = may attend)"),
        Case("on 4-D (B, h, T, d_k) inputs with a (T, S) mask", query=q4, key=k4, value=v4,
             mask=causal_mask(S)[S - T:],  # (T, S): query t sees keys 0 .. t + S - T
             otherwise="Your function is right on 3-D inputs only: use negative dimensions "
                       "(transpose(-2, -1), softmax(dim=-1))"),
    ]


# --------------------------------------------------------------------------------------
# Exercise 2: the causal mask
# --------------------------------------------------------------------------------------

_CAUSAL_MASK_MISTAKES = [
    when(lambda got, want: got.shape == want.shape and got.is_floating_point() and torch.isinf(got).any(),
         "you return an additive float mask (0 and -inf); this course's masks are boolean, True = "
         "may attend: return torch.ones(size, size, dtype=torch.bool).tril() or equivalent"),
    when(lambda got, want: got.shape == want.shape and got.dtype != torch.bool,
         "your mask has dtype {got.dtype}; return a boolean tensor (dtype=torch.bool), True = may attend"),
    like(lambda size: torch.ones(size, size, dtype=torch.bool).tril(-1),
         "your mask leaves out the diagonal: position t may attend to itself, so the mask is True "
         "on *and* below the diagonal"),
    like(lambda size: torch.ones(size, size, dtype=torch.bool).triu(1),
         "you use the opposite convention (True = blocked, as torch.nn.MultiheadAttention does): "
         "here True means *may attend*, so the future (above the diagonal) is False"),
    like(lambda size: torch.ones(size, size, dtype=torch.bool).triu(),
         "your mask is transposed: row t is query t and column s is key s; query t may see keys "
         "s <= t, so the True entries are on and *below* the diagonal"),
]


@checker("causal mask", reference=causal_mask, mistakes=_CAUSAL_MASK_MISTAKES, returns="causal_mask({size})",
         otherwise="It should be True exactly where column <= row")
def check_causal_mask():
    """Check ``fn(size) -> (size, size)`` boolean mask, True on and below the diagonal."""
    return [Case(size=5), Case(size=1), Case(size=8)]


# --------------------------------------------------------------------------------------
# Exercise 3: shape reasoning for cross-attention
# --------------------------------------------------------------------------------------

_SHAPE_NAMES = ("query", "key", "value", "weights", "output", "source_mask")


def _cross_attention_shapes(B: int, h: int, T: int, S: int, d_model: int) -> dict[str, tuple[int, ...]]:
    """The right answer of the shape exercise."""
    d_k = d_v = d_model // h
    return {"query": (B, h, T, d_k), "key": (B, h, S, d_k), "value": (B, h, S, d_v),
            "weights": (B, h, T, S), "output": (B, h, T, d_v), "source_mask": (B, 1, 1, S)}


def _one_shape(fn, name, **sizes):
    """``fn(**sizes)[name]`` as a tuple; a malformed answer gets its own hint."""
    shapes = fn(**sizes)
    if not isinstance(shapes, Mapping):
        raise ExerciseError(f"your function should return a dict of shapes, got {type(shapes).__name__}")
    missing = [n for n in _SHAPE_NAMES if n not in shapes]
    if missing:
        raise ExerciseError(f"your dict lacks the keys {missing}")
    shape = shapes[name]
    if isinstance(shape, (tuple, list)) and all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        return tuple(shape)
    raise ExerciseError(f"shapes['{name}'] should be a tuple of ints like (2, 8, 5, 64), got {shape!r}")


_WRONG = "shapes['{name}'] is {got}, expected {want} {where}: "
_SHAPE_MISTAKES = [
    when(lambda got, name: name != "source_mask" and len(got) == 3,
         _WRONG + "per-head tensors keep the head axis: (B, h, length, d_k); only merge_heads brings "
                  "back (B, length, d_model)"),
    when(lambda got, name, h, d_model: name in ("query", "key", "value") and len(got) == 4
         and got[-1] == d_model != d_model // h,
         lambda name, got, want, where, d_model, h: f"shapes['{name}'] is {got}, expected {want} {where}: "
         f"each head works in d_k = d_v = d_model / h = {d_model // h} dimensions, not d_model"),
    when(lambda got, name, B, h, S, d_model: name == "query" and got == (B, h, S, d_model // h),
         _WRONG + "the queries come from the decoder, whose length is T; only keys and values come "
                  "from the encoder output (length S)"),
    when(lambda got, name, T: name in ("key", "value") and len(got) == 4 and got[2] == T,
         _WRONG + "the {name}s come from the encoder output, so their length is the source length S, "
                  "not the decoder's T"),
    when(lambda got, name, B, h, T, S: name == "weights" and got == (B, h, S, T),
         _WRONG + "the weights have one row per query and one column per key: (B, h, T, S), like Q K^T"),
    when(lambda got, name, B, h, T: name == "weights" and got == (B, h, T, T),
         _WRONG + "in cross-attention the keys are the S encoder positions: the weights are "
                  "(B, h, T, S); (T, T) is decoder self-attention"),
    when(lambda got, name, S: name == "output" and len(got) == 4 and got[2] == S,
         _WRONG + "weights @ value sums over the S keys: one output row per *query*, so the length is T"),
    when(lambda got, name, B, h, T, S: name == "source_mask" and got in ((B, 1, T, S), (B, h, T, S)),
         _WRONG + "a padding mask depends only on which source positions are padding, the same for "
                  "every head and query: give those axes size 1 and let broadcasting do the rest, "
                  "(B, 1, 1, S)"),
    when(lambda got, name, B, S: name == "source_mask" and got in ((B, S), (B, 1, S)),
         _WRONG + "a (B, S) or (B, 1, S) mask does not line up with (B, h, T, S) scores under "
                  "broadcasting (trailing axes are matched first): add the head and query axes, "
                  "(B, 1, 1, S)"),
    when(lambda got, name, T: name == "source_mask" and len(got) == 4 and got[-1] == T,
         _WRONG + "the source padding mask hides encoder positions, i.e. *keys*: its last axis has "
                  "length S"),
]


@checker("shapes in cross-attention", reference=_cross_attention_shapes, mistakes=_SHAPE_MISTAKES,
         observe=_one_shape, returns="shapes['{name}']",
         otherwise="Think about which sequence each tensor comes from and which axis is summed")
def check_cross_attention_shapes():
    """Check ``fn(B, h, T, S, d_model) -> dict`` of the per-head shapes in cross-attention: the
    keys ``"query"``, ``"key"``, ``"value"``, ``"weights"``, ``"output"`` and ``"source_mask"``,
    each a shape tuple. Tried on several sizes (T != S), so that nothing can be hard-wired."""
    sizes = (dict(B=2, h=8, T=5, S=7, d_model=512), dict(B=3, h=4, T=9, S=6, d_model=64),
             dict(B=1, h=2, T=3, S=11, d_model=10))
    return [Case(f"for {p}", name=name, **p) for p in sizes for name in _SHAPE_NAMES]
