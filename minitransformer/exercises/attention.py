"""Checkers for the exercises of the chapter "Scaled dot-product attention" (``book/attention``).

* :func:`check_attention`: implement ``softmax(Q K^T / sqrt(d_k)) V`` with a mask;
* :func:`check_causal_mask`: build the ``(T, T)`` causal mask;
* :func:`check_cross_attention_shapes`: a shape-reasoning exercise on cross-attention.

Each compares with :mod:`minitransformer.attention` and recognises the usual mistakes (softmax
over the wrong axis, no scaling, the mask applied after the softmax, a transposed key, the
opposite mask convention, ...), each with its own hint.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch
from torch import Tensor

from minitransformer.attention import causal_mask, scaled_dot_product_attention
from minitransformer.exercises._core import ExerciseError, attempt, checker, close, expect_shape

__all__ = ["check_attention", "check_causal_mask", "check_cross_attention_shapes"]


# --------------------------------------------------------------------------------------
# Exercise 1: scaled dot-product attention
# --------------------------------------------------------------------------------------


def _attention_variant(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    *,
    scale: str = "sqrt",
    softmax_dim: int = -1,
    key_transposed: bool = True,
    mask_mode: str = "before",
) -> Tensor:
    """Attention written the way a learner might, right or wrong; returns the output.

    ``scale``: "sqrt" (right), "none" or "d_k"; ``key_transposed=False`` computes ``Q K``
    instead of ``Q K^T``; ``mask_mode``: "before" (right: -inf before softmax), "after"
    (weights zeroed after softmax, not renormalised), "ignored", "inverted" (True = blocked).
    """
    d_k = q.shape[-1]
    kt = k.transpose(-2, -1) if key_transposed else k
    scores = q @ kt
    if scale == "sqrt":
        scores = scores / math.sqrt(d_k)
    elif scale == "d_k":
        scores = scores / d_k
    if mask is not None and mask_mode == "before":
        scores = scores.masked_fill(~mask, float("-inf"))
    if mask is not None and mask_mode == "inverted":
        scores = scores.masked_fill(mask, float("-inf"))
    weights = torch.softmax(scores, dim=softmax_dim)
    if mask is not None and mask_mode == "after":
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v


# (keyword arguments of _attention_variant, hint), most specific first.
_ATTENTION_MISTAKES: list[tuple[dict[str, Any], str]] = [
    (dict(softmax_dim=-2),
     "your softmax normalises over the queries (dim=-2): each *row* of the weights, one query's "
     "weights over all keys, must sum to one, so use softmax(scores, dim=-1)"),
    (dict(scale="none"),
     "you forgot the scaling: divide the scores Q K^T by sqrt(d_k), with d_k = query.shape[-1]"),
    (dict(scale="d_k"),
     "you divide the scores by d_k; the paper divides by sqrt(d_k) (math.sqrt(d_k))"),
    (dict(key_transposed=False),
     "you multiply the query by the key without transposing it (Q K): the scores are Q K^T, "
     "query @ key.transpose(-2, -1), shape (..., T, S). Your version only ran because S = d_k "
     "in this test"),
    (dict(softmax_dim=-2, scale="none"),
     "two mistakes: the softmax runs over dim=-2 instead of dim=-1, and the scores are not "
     "divided by sqrt(d_k)"),
]

_MASK_MISTAKES: list[tuple[dict[str, Any], str]] = [
    (dict(mask_mode="after"),
     "you apply the mask after the softmax (zeroing weights): the remaining weights of a row no "
     "longer sum to one. Mask the *scores* before the softmax: "
     "scores.masked_fill(~mask, float('-inf'))"),
    (dict(mask_mode="ignored"),
     "your function ignores the mask: masked keys still get weight. Fill the scores where "
     "mask is False with -inf before the softmax"),
    (dict(mask_mode="inverted"),
     "you use the opposite mask convention: in this course True means *may attend* (as in "
     "torch.nn.functional.scaled_dot_product_attention), so fill the scores where the mask is "
     "False: scores.masked_fill(~mask, float('-inf'))"),
]


def _call_attention(fn: Callable[..., Any], q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                    where: str) -> tuple[Tensor, Tensor]:
    """Call the learner's function and unpack ``(output, weights)`` with helpful errors."""
    try:
        result = attempt(fn, q, k, v, mask)
    except ExerciseError as err:
        if not isinstance(err.__cause__, RuntimeError):  # not a shape error: keep the message
            raise
        raise ExerciseError(
            f"{err} {where}: query {tuple(q.shape)}, key {tuple(k.shape)}, value "
            f"{tuple(v.shape)}. The scores need query (..., T, d_k) @ key^T (..., d_k, S): "
            "transpose the last two dimensions of the key with key.transpose(-2, -1) "
            "(key.T on a tensor with more than 2 dimensions reverses *all* of them, and "
            "transpose(1, 2) is only right for 3-D inputs)"
        ) from err.__cause__
    if isinstance(result, Tensor):
        raise ExerciseError("return both the output and the weights: `return output, weights`")
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise ExerciseError(f"return a pair (output, weights), got {type(result).__name__}")
    return result[0], result[1]


def _diagnose(got: Tensor, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
              mistakes: list[tuple[dict[str, Any], str]]) -> None:
    """Raise the hint of the first known mistake that reproduces ``got``."""
    for kwargs, hint in mistakes:
        try:
            wrong = _attention_variant(q, k, v, mask, **kwargs)
        except RuntimeError:  # this mistake cannot even run on these shapes
            continue
        if close(got, wrong):
            raise ExerciseError(hint)


@checker("scaled dot-product attention")
def check_attention(fn: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Check ``fn(query, key, value, mask=None) -> (output, weights)``.

    Compared with :func:`minitransformer.attention.scaled_dot_product_attention` on 3-D and
    4-D inputs, with and without a boolean mask (True = may attend) in which every query sees
    at least one key. Hints name the usual mistakes: softmax over the wrong axis, no scaling
    (or 1/d_k), the key not transposed, the mask applied after the softmax, ignored or
    inverted, code that only works for 3-D inputs or a fixed d_k.
    """
    gen = torch.Generator().manual_seed(0)
    # Case A: (B, T, d_k) with S = d_k, so that the "key not transposed" mistake still runs.
    B, T, S, d_k, d_v = 2, 3, 4, 4, 5
    q = torch.randn(B, T, d_k, generator=gen, dtype=torch.float64)
    k = torch.randn(B, S, d_k, generator=gen, dtype=torch.float64)
    v = torch.randn(B, S, d_v, generator=gen, dtype=torch.float64)
    where = "on 3-D inputs without a mask"

    out, weights = _call_attention(fn, q, k, v, None, where)
    if isinstance(weights, Tensor) and tuple(weights.shape) == (B, S, T) != (B, T, S):
        raise ExerciseError(
            f"your weights have shape {(B, S, T)} = (B, S, T): you computed K Q^T. The scores "
            "have one row per query and one column per key: Q K^T, shape (B, T, S)"
        )
    expect_shape(out, (B, T, d_v), f"the output for query {(B, T, d_k)} and value {(B, S, d_v)}")
    expect_shape(weights, (B, T, S), f"the weights for query {(B, T, d_k)} and key {(B, S, d_k)}")
    want_out, want_w = scaled_dot_product_attention(q, k, v)
    if not close(out, want_out):
        _diagnose(out, q, k, v, None, _ATTENTION_MISTAKES)
        if close(weights, want_w):
            raise ExerciseError("your weights are right but the output is not: it is "
                                "weights @ value, shape (B, T, d_v)")
        sums = weights.double().sum(-1)
        if not torch.allclose(sums, torch.ones_like(sums)):
            raise ExerciseError("the rows of your weights do not sum to one: apply "
                                "softmax(scores, dim=-1) to the scores")
        raise ExerciseError(f"your output differs from softmax(Q K^T / sqrt(d_k)) V {where}")
    if not close(weights, want_w):
        raise ExerciseError("your output is right but the weights you return are not: return "
                            "the softmax of the scaled scores, shape (B, T, S)")

    # Case B: the same shapes with a mask. Every row has a True (may attend) and a False.
    mask = torch.tensor([[[True, True, False, False],
                          [True, False, True, False],
                          [False, True, True, True]],
                         [[True, False, False, False],
                          [False, True, True, False],
                          [True, True, True, False]]])  # (B, T, S)
    where = "with a mask"
    out, weights = _call_attention(fn, q, k, v, mask, where)
    expect_shape(out, (B, T, d_v), "the output with a mask")
    want_out, want_w = scaled_dot_product_attention(q, k, v, mask)
    if not close(out, want_out):
        _diagnose(out, q, k, v, mask, _MASK_MISTAKES)
        if isinstance(weights, Tensor) and weights.shape == want_w.shape:
            if (weights.double()[~mask].abs() > 1e-6).any():
                raise ExerciseError("keys where the mask is False still get weight: fill their "
                                    "scores with -inf before the softmax")
        raise ExerciseError(f"your output differs from the masked attention {where} "
                            "(mask True = may attend)")
    if not close(weights, want_w):
        raise ExerciseError("with a mask, your output is right but the returned weights are not")

    # Case C: 4-D (B, h, T, d_k) inputs, T != S != d_k, larger scores, a (T, S) mask.
    B, h, T, S, d_k, d_v = 2, 3, 5, 7, 8, 3
    q = 8.0 * torch.randn(B, h, T, d_k, generator=gen, dtype=torch.float64)
    k = 8.0 * torch.randn(B, h, S, d_k, generator=gen, dtype=torch.float64)
    v = torch.randn(B, h, S, d_v, generator=gen, dtype=torch.float64)
    mask = causal_mask(S)[S - T:]  # (T, S): query t sees keys 0 .. t + S - T
    where = "on 4-D (B, h, T, d_k) inputs with a (T, S) mask"
    out, weights = _call_attention(fn, q, k, v, mask, where)
    expect_shape(out, (B, h, T, d_v), f"the output {where}")
    want_out, _ = scaled_dot_product_attention(q, k, v, mask)
    if not close(out, want_out):
        if not torch.isfinite(out).all():
            raise ExerciseError(f"your output contains inf or NaN {where} (scores up to about "
                                "100): use torch.softmax, or subtract the row maximum before exp()")
        if close(out, _attention_variant(q, k, v, mask, softmax_dim=2)):
            raise ExerciseError("your softmax uses dim=2: right for 3-D inputs, but for 4-D "
                                "ones dim=2 is the query axis. Use dim=-1")
        for wrong_d_k in (4, 5):  # d_k hard-wired from case A
            scores = q @ k.transpose(-2, -1) / math.sqrt(wrong_d_k)
            w = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
            if close(out, w @ v):
                raise ExerciseError("your scaling is right for d_k = 4 but not for d_k = 8: take "
                                    "d_k from the input, d_k = query.shape[-1]")
        raise ExerciseError(f"your function is right on 3-D inputs but wrong {where}: use "
                            "negative dimensions (transpose(-2, -1), softmax(dim=-1))")


# --------------------------------------------------------------------------------------
# Exercise 2: the causal mask
# --------------------------------------------------------------------------------------


@checker("causal mask")
def check_causal_mask(fn: Callable[[int], Tensor]) -> None:
    """Check ``fn(size) -> (size, size)`` boolean mask, True on and below the diagonal.

    Hints name the usual mistakes: a float or additive (-inf) mask instead of a boolean one,
    the diagonal left out, the upper triangle (transposed), the opposite convention
    (True = blocked), a wrong shape.
    """
    for size in (5, 1, 8):
        got = attempt(fn, size)
        want = causal_mask(size)
        if isinstance(got, Tensor) and got.shape == want.shape and got.dtype != torch.bool:
            if got.is_floating_point() and torch.isinf(got).any():
                raise ExerciseError(
                    "you return an additive float mask (0 and -inf); this course's masks are "
                    "boolean, True = may attend: return torch.ones(size, size, dtype=torch.bool)"
                    ".tril() or equivalent"
                )
            raise ExerciseError(f"your mask has dtype {got.dtype}; return a boolean tensor "
                                "(dtype=torch.bool), True = may attend")
        expect_shape(got, (size, size), f"causal_mask({size})")
        if torch.equal(got, want):
            continue
        ones = torch.ones(size, size, dtype=torch.bool)
        if torch.equal(got, ones.tril(-1)):
            raise ExerciseError("your mask leaves out the diagonal: position t may attend to "
                                "itself, so the mask is True on *and* below the diagonal")
        if torch.equal(got, ones.triu(1)):
            raise ExerciseError(
                "you use the opposite convention (True = blocked, as torch.nn.MultiheadAttention "
                "does): here True means *may attend*, so the future (above the diagonal) is False"
            )
        if torch.equal(got, ones.triu()):
            raise ExerciseError(
                "your mask is transposed: row t is query t and column s is key s; query t may "
                "see keys s <= t, so the True entries are on and *below* the diagonal"
            )
        raise ExerciseError(f"causal_mask({size}) should be True exactly where column <= row, "
                            f"got {got.int().tolist()}")


# --------------------------------------------------------------------------------------
# Exercise 3: shape reasoning for cross-attention
# --------------------------------------------------------------------------------------

_SHAPE_NAMES = ("query", "key", "value", "weights", "output", "source_mask")


def _cross_attention_shapes(B: int, h: int, T: int, S: int, d_model: int) -> dict[str, tuple[int, ...]]:
    """The right answer of the shape exercise."""
    d_k = d_v = d_model // h
    return {
        "query": (B, h, T, d_k),
        "key": (B, h, S, d_k),
        "value": (B, h, S, d_v),
        "weights": (B, h, T, S),
        "output": (B, h, T, d_v),
        "source_mask": (B, 1, 1, S),
    }


def _as_shape(x: Any, name: str) -> tuple[int, ...]:
    if isinstance(x, torch.Size):
        return tuple(x)
    if isinstance(x, (tuple, list)) and all(isinstance(n, int) and not isinstance(n, bool) for n in x):
        return tuple(x)
    raise ExerciseError(f"shapes['{name}'] should be a tuple of ints like (2, 8, 5, 64), "
                        f"got {x!r}")


def _shape_hint(name: str, got: tuple[int, ...], want: tuple[int, ...], p: Mapping[str, int]) -> str:
    """A hint for one wrong shape, recognising the usual confusions."""
    B, h, T, S, d_model = p["B"], p["h"], p["T"], p["S"], p["d_model"]
    d_k = d_model // h
    prefix = f"shapes['{name}'] is {got}, expected {want} for {dict(p)}: "
    if name != "source_mask" and len(got) == 3:
        return prefix + ("per-head tensors keep the head axis: (B, h, length, d_k); only "
                         "merge_heads brings back (B, length, d_model)")
    if name in ("query", "key", "value") and len(got) == 4 and got[-1] == d_model != d_k:
        return prefix + f"each head works in d_k = d_v = d_model / h = {d_k} dimensions, not d_model"
    if name == "query" and got == (B, h, S, d_k):
        return prefix + ("the queries come from the decoder, whose length is T; only keys and "
                         "values come from the encoder output (length S)")
    if name in ("key", "value") and len(got) == 4 and got[2] == T:
        return prefix + (f"the {name}s come from the encoder output, so their length is the "
                         "source length S, not the decoder's T")
    if name == "weights" and got == (B, h, S, T):
        return prefix + ("the weights have one row per query and one column per key: "
                         "(B, h, T, S), like Q K^T")
    if name == "weights" and got == (B, h, T, T):
        return prefix + ("in cross-attention the keys are the S encoder positions: the weights "
                         "are (B, h, T, S); (T, T) is decoder self-attention")
    if name == "output" and len(got) == 4 and got[2] == S:
        return prefix + ("weights @ value sums over the S keys: one output row per *query*, so "
                         "the length is T")
    if name == "source_mask":
        if got in ((B, 1, T, S), (B, h, T, S)):
            return prefix + ("a padding mask depends only on which source positions are "
                             "padding, the same for every head and query: give those axes size "
                             "1 and let broadcasting do the rest, (B, 1, 1, S)")
        if got in ((B, S), (B, 1, S)):
            return prefix + ("a (B, S) or (B, 1, S) mask does not line up with (B, h, T, S) "
                             "scores under broadcasting (trailing axes are matched first): add "
                             "the head and query axes, (B, 1, 1, S)")
        if len(got) == 4 and got[-1] == T:
            return prefix + ("the source padding mask hides encoder positions, i.e. *keys*: its "
                             "last axis has length S")
    return prefix + "think about which sequence each tensor comes from and which axis is summed"


@checker("shapes in cross-attention")
def check_cross_attention_shapes(fn: Callable[..., Mapping[str, Any]]) -> None:
    """Check ``fn(B, h, T, S, d_model) -> dict`` of the per-head shapes in cross-attention.

    The dict maps ``"query"``, ``"key"``, ``"value"``, ``"weights"``, ``"output"`` and
    ``"source_mask"`` to shape tuples. Tried on several sizes (T != S), so that nothing can be
    hard-wired; hints name the usual confusions (T and S swapped, d_model for d_k, weights
    transposed, the output length, the mask's broadcast axes).
    """
    for p in (dict(B=2, h=8, T=5, S=7, d_model=512), dict(B=3, h=4, T=9, S=6, d_model=64),
              dict(B=1, h=2, T=3, S=11, d_model=10)):
        got = attempt(fn, **p)
        if not isinstance(got, Mapping):
            raise ExerciseError(f"return a dict of shapes, got {type(got).__name__}")
        missing = [n for n in _SHAPE_NAMES if n not in got]
        if missing:
            raise ExerciseError(f"your dict lacks the keys {missing}")
        want = _cross_attention_shapes(**p)
        for name in _SHAPE_NAMES:
            shape = _as_shape(got[name], name)
            if shape != want[name]:
                raise ExerciseError(_shape_hint(name, shape, want[name], p))
