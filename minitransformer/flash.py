"""Tiled attention with an online softmax: FlashAttention's idea in plain PyTorch.

Explained in the chapter "Inference: the KV cache and the cost of attention"
(``book/inference``), section "FlashAttention's idea".

Naive attention materialises the full ``(T, S)`` score matrix (and a second one for the
softmax weights). :func:`tiled_attention` instead walks over the keys and values in blocks of
``block_size`` positions and keeps, for every query row, only three running quantities:

* ``m``: the largest score seen so far,
* ``l``: the normaliser ``sum_j exp(s_j - m)`` over the keys seen so far,
* ``acc``: the unnormalised output ``sum_j exp(s_j - m) v_j`` over the keys seen so far.

When a new block raises the maximum from ``m`` to ``m'``, the old ``l`` and ``acc`` are
rescaled by ``exp(m - m')``; at the end ``acc / l`` is exactly ``softmax(scores) @ V``. The
largest intermediate is a ``(T, block_size)`` score block instead of ``(T, S)``.

FlashAttention (Dao et al., 2022) does the same inside one fused GPU kernel, with the tiles
held in on-chip SRAM; the saving there is memory *traffic*. Here, in plain PyTorch on a CPU, we
can only show the other half of the idea: the same result with far less memory.

Shape letters: B batch (any leading dimensions), T queries, S keys/values, d_k, d_v.
"""

from __future__ import annotations

import math
import weakref
from typing import Any, Callable

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minitransformer.attention import check_qkv

__all__ = ["online_softmax_step", "tiled_attention", "peak_memory_bytes"]


def online_softmax_step(
    m: Tensor, l: Tensor, acc: Tensor, scores: Tensor, values: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one block of keys into the running softmax statistics (section "FlashAttention's idea").

    Args:
        m: ``(..., T, 1)`` running maximum of the scores seen so far (``-inf`` before the first
            block).
        l: ``(..., T, 1)`` running normaliser ``sum exp(s - m)``.
        acc: ``(..., T, d_v)`` running unnormalised output ``sum exp(s - m) v``.
        scores: ``(..., T, S_blk)`` the scores of the new block (masked entries ``-inf``).
        values: ``(..., S_blk, d_v)`` the values of the new block.

    Returns:
        The updated ``(m, l, acc)``. After the last block, ``acc / l`` is the attention output.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # (..., T, 1)
    # A row that has seen only masked keys keeps m_new = -inf; use 0 there so that
    # exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
    m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
    # exp_ works in place on the fresh difference: one (T, S_blk) tile less, inputs untouched.
    p = (scores - m_safe).exp_()  # (..., T, S_blk) unnormalised block weights
    correction = torch.exp(m - m_safe)  # (..., T, 1) rescales what was summed under the old max
    l_new = correction * l + p.sum(dim=-1, keepdim=True)
    # correction * acc + p @ values, accumulated into the fresh product (one (T, d_v) less)
    acc_new = torch.matmul(p, values).addcmul_(correction, acc)  # (..., T, d_v)
    return m_new, l_new, acc_new


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    block_size: int = 64,
    causal: bool = False,
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V computed block by block, never forming the ``(T, S)`` matrix.

    Section "FlashAttention's idea" of the chapter ``book/inference`` derives the online
    softmax this relies on (:func:`online_softmax_step`).

    Args:
        query: ``(..., T, d_k)``.
        key: ``(..., S, d_k)``.
        value: ``(..., S, d_v)``. Leading (batch, head) dimensions must be equal.
        block_size: number of key/value positions processed at once; any positive integer
            (it need not divide ``S``).
        causal: if True, query ``t`` attends to keys ``0..t`` only: the top-left aligned
            causal mask of :func:`torch.nn.functional.scaled_dot_product_attention` with
            ``is_causal=True`` (``torch.ones(T, S).tril()``).

    Returns:
        ``(..., T, d_v)``, equal to ``scaled_dot_product_attention(query, key, value)`` up to
        floating-point rounding. A query row with no visible key (``S == 0``) gives zeros.

    Raises:
        ValueError: for mismatched shapes or a non-positive ``block_size``.
    """
    if not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    check_qkv(query, key, value)  # the same checks and messages as the naive version
    if not (query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
        raise ValueError(
            "query, key and value must have the same leading (batch, head) dimensions, got "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )

    T, d_k = query.shape[-2], query.shape[-1]
    S, d_v = key.shape[-2], value.shape[-1]
    lead = query.shape[:-2]
    # Scale the queries once (T x d_k) rather than every score block.
    q = query * (1.0 / math.sqrt(d_k))
    m = torch.full((*lead, T, 1), float("-inf"), dtype=query.dtype, device=query.device)
    l = torch.zeros((*lead, T, 1), dtype=query.dtype, device=query.device)
    acc = torch.zeros((*lead, T, d_v), dtype=query.dtype, device=query.device)
    rows = torch.arange(T, device=query.device)[:, None]  # (T, 1) query positions (causal)

    # With the top-left causal mask, key j is visible to some query only if j <= T - 1.
    stop = min(S, T) if causal else S
    for start in range(0, stop, block_size):
        end = min(start + block_size, stop)
        k_blk = key[..., start:end, :]  # (..., S_blk, d_k)
        v_blk = value[..., start:end, :]  # (..., S_blk, d_v)
        scores = torch.matmul(q, k_blk.transpose(-2, -1))  # (..., T, S_blk): the only score tile
        if causal:
            cols = torch.arange(start, end, device=query.device)[None, :]  # (1, S_blk)
            scores = scores.masked_fill(cols > rows, float("-inf"))  # key after query: hidden
        m, l, acc = online_softmax_step(m, l, acc, scores, v_blk)

    # A row that saw no key at all has l = 0 and acc = 0: clamping l gives 0, not 0/0 = NaN.
    return acc / l.clamp_min(torch.finfo(l.dtype).tiny)


class _MemoryTracker(TorchDispatchMode):
    """Count the bytes of tensor storages created while active, and their running peak.

    Every ATen operator passes through :meth:`__torch_dispatch__`; each storage an operator
    returns that did not exist before is counted when it appears and released when the last
    Python tensor object using it is garbage collected (reference counting makes that moment
    deterministic). Storages that already existed (inputs, parameters) are ignored.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live: dict[int, list[int]] = {}  # storage address -> [bytes, tensor objects alive]
        self.external: set[int] = set()  # storages that existed before: not counted
        self.current = 0
        self.peak = 0

    def _release(self, address: int) -> None:
        entry = self.live.get(address)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.current -= entry[0]
            del self.live[address]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for x in tree_leaves((args, kwargs or {})):
            if isinstance(x, torch.Tensor):
                address = x.untyped_storage().data_ptr()
                if address not in self.live:
                    self.external.add(address)
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            address = storage.data_ptr()
            if address == 0 or (address in self.external and address not in self.live):
                continue
            if address in self.live:
                self.live[address][1] += 1
            else:
                self.live[address] = [storage.nbytes(), 1]
                self.external.discard(address)
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            weakref.finalize(t, self._release, address)
        return out


def peak_memory_bytes(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[int, Any]:
    """Peak bytes of tensor memory allocated while ``fn(*args, **kwargs)`` runs.

    Method: a :class:`torch.utils._python_dispatch.TorchDispatchMode` sees every tensor
    operator the call executes. Each new storage an operator returns is added to a running
    total when it appears and subtracted when the last tensor using it is freed; the maximum of
    that total is the *extra* memory the call needed on top of what existed before (its
    inputs), its output included. The count is exact and the same on every run (it follows
    Python's reference counting, not the clock). What it cannot see is scratch memory a single
    operator allocates and frees inside its own kernel; the large intermediates between
    operators (score matrices, softmax weights) are all counted.

    Used by ``benchmarks/bench_flash.py`` and the chapter ``book/inference``.

    Returns:
        ``(peak_bytes, result)``.
    """
    tracker = _MemoryTracker()
    with tracker:
        result = fn(*args, **kwargs)
    return tracker.peak, result
