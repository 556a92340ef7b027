"""Checkers for the exercises of the chapter "Inference: the KV cache and the cost of attention"
(``book/inference``).

* :func:`check_kv_cache_bytes`: the KV-cache memory of a published model;
* :func:`check_online_softmax_step`: one step of the online softmax behind FlashAttention;
* :func:`check_cache_append`: appending one decoding step to a preallocated cache.

Each compares the learner's function with the package's own (:mod:`minitransformer.kv_memory`,
:mod:`minitransformer.flash`) and names the usual mistake when they differ.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from minitransformer.exercises._core import ExerciseError, attempt, checker, close, expect_shape
from minitransformer.flash import online_softmax_step
from minitransformer.kv_memory import MODEL_CONFIGS, ModelConfig, kv_cache_bytes

__all__ = ["check_kv_cache_bytes", "check_online_softmax_step", "check_cache_append"]


@checker("KV-cache bytes of a model")
def check_kv_cache_bytes(cache_bytes: Callable[[ModelConfig, int, int, int], int]) -> None:
    """Check ``cache_bytes(config, context, batch_size, bytes_per_element)``.

    ``config`` is a :class:`~minitransformer.kv_memory.ModelConfig` (``num_layers``,
    ``num_heads``, ``num_kv_heads``, ``head_dim``, ...); ignore its sliding window. Hints name
    the usual mistakes: query heads instead of KV heads, a missing factor 2 for K and V, a
    missing bytes per element, layers or batch left out, ``d_model`` in place of
    ``num_kv_heads * head_dim``.
    """
    cases = [  # the first one tells the usual mistakes apart: GQA, 4 bytes, batch 3
        ("llama-3-8b", 1000, 3, 4),
        ("llama-2-70b", 4096, 1, 2),
        ("llama-2-7b", 4096, 8, 2),
        ("gpt2-small", 1024, 2, 1),
    ]
    for name, context, batch, bpe in cases:
        cfg = MODEL_CONFIGS[name]
        got = attempt(cache_bytes, cfg, context, batch, bpe)
        if isinstance(got, Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, (int, float)):
            raise ExerciseError(
                f"cache_bytes should return a number of bytes, got {type(got).__name__}"
            )
        want = kv_cache_bytes(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, context, batch, bpe)
        if got == want:
            continue
        call = f"cache_bytes({name}, context={context}, batch_size={batch}, bytes_per_element={bpe})"
        if cfg.num_kv_heads != cfg.num_heads and got == want * cfg.num_heads // cfg.num_kv_heads:
            raise ExerciseError(
                f"{call} counts the {cfg.num_heads} query heads; the cache stores only the "
                f"{cfg.num_kv_heads} key/value heads (config.num_kv_heads): with grouped-query "
                "attention several query heads share one K and one V"
            )
        if got * 2 == want:
            raise ExerciseError(
                f"{call} is half the right value: each position stores a key AND a value "
                "vector, so the formula starts with a factor 2"
            )
        if got * bpe == want and bpe != 1:
            raise ExerciseError(
                f"{call} counts elements, not bytes: multiply by bytes_per_element ({bpe} here)"
            )
        if got * cfg.num_layers == want:
            raise ExerciseError(
                f"{call} counts one layer; every decoder layer keeps its own K and V "
                f"({cfg.num_layers} layers here)"
            )
        if batch > 1 and got * batch == want:
            raise ExerciseError(f"{call} ignores batch_size: every sequence has its own cache")
        if got == want // (cfg.num_kv_heads * cfg.head_dim) * cfg.d_model and (
                cfg.d_model != cfg.num_kv_heads * cfg.head_dim):
            raise ExerciseError(
                f"{call} uses d_model = {cfg.d_model}; one position stores num_kv_heads x "
                f"head_dim = {cfg.num_kv_heads * cfg.head_dim} numbers per layer for K (and "
                "as many for V)"
            )
        raise ExerciseError(
            f"{call} returned {got:,}, expected {want:,} = 2 x batch x context x layers x "
            "KV heads x head_dim x bytes per element"
        )


@checker("one step of the online softmax")
def check_online_softmax_step(
    step: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], tuple[Tensor, Tensor, Tensor]],
) -> None:
    """Check ``step(m, l, acc, scores, values) -> (m, l, acc)`` by folding blocks of keys.

    Shapes: ``m``, ``l`` ``(T, 1)``; ``acc`` ``(T, d_v)``; ``scores`` ``(T, S_blk)``;
    ``values`` ``(S_blk, d_v)``. After the last block ``acc / l`` must equal
    ``softmax(scores) @ values``. Hints name the usual mistakes: the old sums not rescaled
    when the maximum grows, no maximum subtracted (overflow), the maximum of the block instead
    of the running one, normalising inside the step.
    """
    gen = torch.Generator().manual_seed(0)
    T, S, d_v, block = 4, 12, 3, 4
    # Block offsets 0, 6, 2: the running max grows at the second block (old sums must be
    # rescaled) and not at the third (the block's own max is then not the running max).
    offsets = torch.tensor([0.0, 6.0, 2.0], dtype=torch.float64).repeat_interleave(block)
    scores = torch.randn(T, S, generator=gen, dtype=torch.float64) + offsets
    values = torch.randn(S, d_v, generator=gen, dtype=torch.float64)

    def fold(fn, s, v):
        m = torch.full((T, 1), float("-inf"), dtype=torch.float64)
        l = torch.zeros(T, 1, dtype=torch.float64)
        acc = torch.zeros(T, d_v, dtype=torch.float64)
        for start in range(0, S, block):
            out = fn(m, l, acc, s[:, start:start + block], v[start:start + block])
            if not isinstance(out, tuple) or len(out) != 3:
                raise ExerciseError("step should return the tuple (m, l, acc)")
            m, l, acc = out
        return m, l, acc

    m, l, acc = attempt(fold, step, scores, values)
    expect_shape(m, (T, 1), "the running maximum m")
    expect_shape(l, (T, 1), "the running normaliser l")
    expect_shape(acc, (T, d_v), "the running output acc")
    want_out = torch.softmax(scores, dim=-1) @ values
    want_m, want_l, want_acc = fold(online_softmax_step, scores, values)
    if not close(m, want_m):
        if close(m, scores[:, -block:].amax(-1, keepdim=True)):
            raise ExerciseError(
                "m is the maximum of the last block only; keep the running maximum: "
                "m_new = max(m, max of the block's scores)"
            )
        raise ExerciseError("m should be the largest score seen so far in each row")
    if close(acc, want_out) and not close(acc, want_acc):
        raise ExerciseError(
            "you divide by the normaliser inside the step; keep acc unnormalised (the sum of "
            "exp(s - m) * v) and divide by l only once, after the last block"
        )
    if not close(acc / l, want_out):
        # Without rescaling, the earlier blocks keep weights computed with an older, smaller max.
        def no_rescale(m0, l0, a0, s, v):
            m1 = torch.maximum(m0, s.amax(-1, keepdim=True))
            p = torch.exp(s - m1)
            return m1, l0 + p.sum(-1, keepdim=True), a0 + p @ v

        _, l_bad, acc_bad = fold(no_rescale, scores, values)
        if close(acc / l, acc_bad / l_bad) or close(l, l_bad):
            raise ExerciseError(
                "when the maximum grows from m to m_new, the old l and acc were computed with "
                "exp(s - m): multiply both by exp(m - m_new) before adding the new block"
            )
        if not close(l, want_l):
            raise ExerciseError(
                "l should be the running sum of exp(s - m) over all keys seen so far, "
                "rescaled to the current maximum m"
            )
        raise ExerciseError("acc / l after the last block differs from softmax(scores) @ values")
    if not close(acc, want_acc) or not close(l, want_l):
        if close(l, torch.exp(scores).sum(-1, keepdim=True)):
            raise ExerciseError(
                "you compute exp(scores) without subtracting the running maximum: right for "
                "small scores, inf for scores around 1000; use exp(scores - m_new)"
            )
        raise ExerciseError(
            "acc / l is right but l and acc are scaled differently from exp(s - m) with m the "
            "running maximum; keep them relative to m so that they cannot overflow"
        )
    # Large scores: without subtracting the maximum, exp overflows to inf.
    big_m, big_l, big_acc = attempt(fold, step, scores + 1000.0, values)
    if not (torch.isfinite(big_l).all() and torch.isfinite(big_acc).all()):
        raise ExerciseError(
            "scores around 1000 overflow: compute exp(scores - m_new), never exp(scores)"
        )
    if not close(big_acc / big_l, want_out):
        raise ExerciseError("with all scores shifted by 1000 the output should not change")


@checker("appending one step to a preallocated KV cache")
def check_cache_append(append: Callable[[Tensor, Tensor, int, Tensor, Tensor], int]) -> None:
    """Check ``append(keys, values, length, new_k, new_v) -> new_length``.

    ``keys``/``values`` are preallocated buffers ``(B, h_kv, capacity, d)`` of which the first
    ``length`` positions are filled; ``new_k``/``new_v`` are ``(B, h_kv, n, d)``. The function
    must write the new positions into the buffers *in place*, at positions
    ``length .. length + n - 1`` along dimension 2, and return ``length + n``. Hints name the
    usual mistakes: a ``torch.cat`` that leaves the buffers untouched, an off-by-one position,
    writing at position 0, a forgotten value buffer, the wrong returned length.
    """
    gen = torch.Generator().manual_seed(0)
    B, h_kv, capacity, d = 2, 3, 8, 4
    keys = torch.zeros(B, h_kv, capacity, d)
    values = torch.zeros(B, h_kv, capacity, d)
    want_k = torch.zeros_like(keys)
    want_v = torch.zeros_like(values)
    length = 0
    for n in (1, 1, 3, 1):
        new_k = torch.randn(B, h_kv, n, d, generator=gen)
        new_v = torch.randn(B, h_kv, n, d, generator=gen)
        pointer = keys.data_ptr()
        got_length = attempt(append, keys, values, length, new_k, new_v)
        want_k[:, :, length:length + n] = new_k
        want_v[:, :, length:length + n] = new_v
        if keys.data_ptr() != pointer:
            raise ExerciseError("the keys buffer was replaced; write into it in place")
        if isinstance(got_length, Tensor) and got_length.numel() == 1:
            got_length = int(got_length.item())
        if torch.equal(keys, torch.zeros_like(keys)) and torch.equal(values,
                                                                      torch.zeros_like(values)):
            raise ExerciseError(
                "the buffers are unchanged: write the new keys into them in place, e.g. "
                "keys[:, :, length:length + n] = new_k (torch.cat builds a new tensor and "
                "copies the whole cache every step, which is what preallocation avoids)"
            )
        if not torch.equal(keys, want_k):
            if n == 1 and length + 1 < capacity and torch.equal(keys[:, :, length + 1:length + 2],
                                                                new_k):
                raise ExerciseError(
                    f"the new key went to position {length + 1}; the first free slot is "
                    f"position `length` = {length} (positions 0..length-1 are filled)"
                )
            if length > 0 and torch.equal(keys[:, :, :n], new_k):
                raise ExerciseError(
                    "the new key overwrote position 0; write at position `length`"
                )
            raise ExerciseError(
                f"after appending {n} position(s) at length {length}, the keys buffer does "
                "not hold the expected values: positions are dimension 2 of (B, h_kv, "
                "capacity, d), and new_k goes to positions length .. length + n - 1"
            )
        if not torch.equal(values, want_v):
            raise ExerciseError("the keys are right but the values buffer is not: append both")
        if got_length != length + n:
            raise ExerciseError(
                f"return the new length: {length} + {n} = {length + n}, got {got_length!r}"
            )
        length = got_length
