"""Tiled attention with an online softmax: FlashAttention's idea in plain PyTorch.

Chapter "Inference: the KV cache and the cost of attention", section "FlashAttention's idea".
:func:`tiled_attention` walks over the keys in blocks and keeps, per query row, the running
maximum ``m``, normaliser ``ell = sum exp(s - m)`` (the text's l) and unnormalised output
``acc = sum exp(s - m) v`` (:func:`online_softmax_step`), so its largest intermediate is a
``(T, block_size)`` score tile instead of ``(T, S)``. FlashAttention (Dao et al., 2022) fuses
this into one GPU kernel to save memory traffic; in plain PyTorch we show the memory saving
(:func:`peak_memory_bytes`).

Shape letters: leading (batch, head) dimensions ``...``, T queries, S keys/values, d_k, d_v.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from minitransformer._checks import positive_int, tensor
from minitransformer.attention import check_qkv

__all__ = ["online_softmax_step", "tiled_attention", "peak_memory_bytes"]


def _check_step(m: Tensor, ell: Tensor, acc: Tensor, scores: Tensor, values: Tensor) -> None:
    for name, x in (("m", m), ("ell", ell), ("acc", acc), ("scores", scores), ("values", values)):
        tensor(name, x, kind="float")
        if x.dim() < 2:
            raise ValueError(f"{name} must have at least 2 dimensions, got shape {tuple(x.shape)}")
    lead, T = scores.shape[:-2], scores.shape[-2]
    shapes = {
        "m": (*lead, T, 1),
        "ell": (*lead, T, 1),
        "acc": (*lead, T, values.shape[-1]),
        "values": (*lead, scores.shape[-1], values.shape[-1]),
    }
    for name, x in (("m", m), ("ell", ell), ("acc", acc), ("values", values)):
        if tuple(x.shape) != shapes[name]:
            raise ValueError(
                f"{name} must have shape {shapes[name]} for scores (..., T, S_blk) = "
                f"{tuple(scores.shape)} and values (..., S_blk, d_v) = {tuple(values.shape)}, "
                f"got {tuple(x.shape)}"
            )


def _online_softmax_step(
    m: Tensor, ell: Tensor, acc: Tensor, scores: Tensor, values: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    m_new = torch.maximum(m, scores.amax(dim=-1, keepdim=True))  # (..., T, 1)
    # A row that has seen only masked keys keeps m_new = -inf; use 0 there so that
    # exp(-inf - 0) = 0 instead of exp(-inf + inf) = NaN.
    m_safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
    # exp_ works in place on the fresh difference: one (T, S_blk) tile less, inputs untouched.
    p = (scores - m_safe).exp_()  # (..., T, S_blk) unnormalised block weights
    correction = torch.exp(m - m_safe)  # (..., T, 1) rescales what was summed under the old max
    ell_new = correction * ell + p.sum(dim=-1, keepdim=True)
    # correction * acc + p @ values, accumulated into the fresh product (one (T, d_v) less)
    acc_new = torch.matmul(p, values).addcmul_(correction, acc)  # (..., T, d_v)
    return m_new, ell_new, acc_new


def online_softmax_step(
    m: Tensor, ell: Tensor, acc: Tensor, scores: Tensor, values: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Fold one block of keys into the running softmax statistics (section "Deriving the
    online softmax").

    ``m``, ``ell`` ``(..., T, 1)``: running maximum (``-inf`` before the first block) and
    normaliser ``sum exp(s - m)``; ``acc`` ``(..., T, d_v)``: running ``sum exp(s - m) v``;
    ``scores`` ``(..., T, S_blk)`` (masked entries ``-inf``) and ``values`` ``(..., S_blk, d_v)``
    of the new block. Returns the new ``(m, ell, acc)``; after the last block ``acc / ell`` is the
    attention output.
    """
    _check_step(m, ell, acc, scores, values)
    return _online_softmax_step(m, ell, acc, scores, values)


def tiled_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    block_size: int = 64,
    causal: bool = False,
) -> Tensor:
    """softmax(Q K^T / sqrt(d_k)) V block by block, never forming the ``(T, S)`` score matrix.

    Section "FlashAttention's idea". ``query`` ``(..., T, d_k)``, ``key`` ``(..., S, d_k)``,
    ``value`` ``(..., S, d_v)`` with equal leading dimensions -> ``(..., T, d_v)``, equal to
    ``scaled_dot_product_attention`` up to rounding (zeros where a row sees no key, e.g.
    ``S == 0``). ``block_size``: key positions per block, any positive int. ``causal``: query
    ``t`` sees keys ``0..t``, the top-left mask of SDPA's ``is_causal=True``.
    """
    block_size = positive_int("block_size", block_size)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    check_qkv(query, key, value)  # the same checks and messages as the naive version
    if not (query.shape[:-2] == key.shape[:-2] == value.shape[:-2]):
        raise ValueError(
            "query, key and value must have the same leading (batch, head) dimensions, got "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )

    T, d_k = query.shape[-2], query.shape[-1]
    S, d_v = key.shape[-2], value.shape[-1]
    lead = query.shape[:-2]
    # float16 and bfloat16: the scores and the running statistics are kept in float32, as in
    # FlashAttention and torch's CPU kernel (in half precision the sums over blocks lose
    # digits: 5-14x torch's error); each block is converted as it is read.
    work = torch.float32 if query.dtype in (torch.float16, torch.bfloat16) else query.dtype
    # Scale the queries once (T x d_k) rather than every score block.
    q = query.to(work) * (1.0 / math.sqrt(d_k))
    m = torch.full((*lead, T, 1), float("-inf"), dtype=work, device=query.device)
    ell = torch.zeros((*lead, T, 1), dtype=work, device=query.device)
    acc = torch.zeros((*lead, T, d_v), dtype=work, device=query.device)
    rows = torch.arange(T, device=query.device)[:, None]  # (T, 1) query positions (causal)

    # With the top-left causal mask, key j is visible to some query only if j <= T - 1.
    stop = min(S, T) if causal else S
    for start in range(0, stop, block_size):
        end = min(start + block_size, stop)
        k_blk = key[..., start:end, :].to(work)  # (..., S_blk, d_k)
        v_blk = value[..., start:end, :].to(work)  # (..., S_blk, d_v)
        scores = torch.matmul(q, k_blk.transpose(-2, -1))  # (..., T, S_blk): the only score tile
        if causal:
            cols = torch.arange(start, end, device=query.device)[None, :]  # (1, S_blk)
            scores = scores.masked_fill(cols > rows, float("-inf"))  # key after query: hidden
        m, ell, acc = _online_softmax_step(m, ell, acc, scores, v_blk)

    # A row that saw no key at all has ell = 0 and acc = 0: clamping ell gives 0, not 0/0 = NaN.
    return (acc / ell.clamp_min(torch.finfo(ell.dtype).tiny)).to(query.dtype)


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

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],  # an ATen operator (torch._ops.OpOverload)
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
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
    """``(peak_bytes, result)``: the peak extra tensor memory while ``fn(*args, **kwargs)`` runs.

    A ``TorchDispatchMode`` sees every operator: each new storage counts from when an operator
    returns it until its last tensor is freed, so the peak is exact and the same on every run
    (inputs excluded, output included; scratch memory inside one kernel is not seen). Used by
    ``benchmarks/bench_flash.py`` and the chapter's section "FlashAttention's idea".
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    tracker = _MemoryTracker()
    with tracker:
        result = fn(*args, **kwargs)
    return tracker.peak, result
