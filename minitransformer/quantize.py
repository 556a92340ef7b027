"""Symmetric int8 quantisation, for the KV cache (chapter "Where next", section on quantisation).

A tensor is stored as int8 values and one float scale per *slice*: with ``dim=-1`` on a
``(B, h, S, d_k)`` key tensor, one scale per (sequence, head, position), i.e. per token and
head. Each slice is scaled so that its largest magnitude maps to 127:

    scale = max|x| / 127,    q = round(x / scale) in [-127, 127],    x ~ q * scale.

Rounding to the nearest integer makes the round-trip error of every element at most half a
step, ``|x - q * scale| <= scale / 2``; :func:`quantize_int8` is tested against that bound.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from minitransformer.kv_cache import AttentionCache
from minitransformer.kv_memory import kv_cache_bytes

__all__ = ["Int8Tensor", "quantize_int8", "Int8AttentionCache", "int8_kv_cache_bytes"]

QMAX = 127  # symmetric: -127..127, so that -x quantises to -q
SCALE_DTYPE = torch.float16  # 2 bytes per scale


@dataclass(frozen=True)
class Int8Tensor:
    """int8 ``values`` and float ``scale`` (``values``' shape with the quantised dim set to 1)."""

    values: Tensor
    scale: Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Back to floating point: ``values * scale``."""
        return self.values.to(dtype) * self.scale.to(dtype)

    @property
    def nbytes(self) -> int:
        """The bytes held, one per value plus the scales."""
        return self.values.numel() * self.values.element_size() + self.scale.numel() * self.scale.element_size()

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


def quantize_int8(x: Tensor, dim: int = -1, scale_dtype: torch.dtype = SCALE_DTYPE) -> Int8Tensor:
    """Quantise ``x`` to int8 with one scale per slice along ``dim`` (absmax, symmetric).

    Args:
        x: a floating-point tensor.
        dim: the dimension each scale covers (``-1``: one scale per row, e.g. per token and
            head for a ``(B, h, S, d_k)`` cache).
        scale_dtype: how the scales are stored (float16 by default: 2 bytes per slice).

    Returns:
        an :class:`Int8Tensor` whose ``dequantize()`` is within ``scale / 2`` of ``x``
        elementwise (the stored, rounded scale is the one used to quantise).
    """
    if not torch.is_floating_point(x):
        raise TypeError(f"quantize_int8 needs a floating-point tensor, got dtype {x.dtype}")
    if x.dim() == 0:
        raise ValueError("quantize_int8 needs at least one dimension to take scales over")
    absmax = x.detach().abs().amax(dim=dim, keepdim=True).float()
    # Round the scale to its storage dtype *before* quantising, so that the values are
    # consistent with the scale that is kept; a zero slice gets scale 1 (its values are 0).
    if not torch.isfinite(absmax).all() or float(absmax.max()) / QMAX > torch.finfo(scale_dtype).max:
        raise ValueError(
            f"cannot quantise: the largest magnitude {float(absmax.max()):.3g} is not finite or "
            f"its scale does not fit in {scale_dtype}"
        )
    scale = (absmax / QMAX).to(scale_dtype)
    # Rounding the scale down would push the largest entry past 127 (and clipping it would
    # break the error bound): step such scales up to the next representable number.
    too_small = scale.float() * QMAX < absmax
    scale = torch.where(too_small, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.round(x.float() / scale.float()).clamp_(-QMAX, QMAX).to(torch.int8)
    return Int8Tensor(values=values, scale=scale)


class Int8AttentionCache(AttentionCache):
    """An :class:`~minitransformer.kv_cache.AttentionCache` that stores keys and values as int8.

    Each new position's key and value are quantised on arrival with one float16 scale per
    (sequence, KV head, position), :func:`quantize_int8` over the head dimension, and
    dequantised when attention reads them. Memory per cached element is 1 byte plus
    ``2 / d_k`` for the scale, against 4 bytes in float32 or 2 in float16.

    This simulates the *storage* of an int8 cache: the arithmetic stays in floating point.
    Use it through ``greedy_decode(..., cache_cls=Int8AttentionCache)`` or
    ``KVCache(..., cache_cls=Int8AttentionCache)``.
    """

    _BUFFERS = ("keys", "values", "key_scales", "value_scales")

    def _allocate(self, like_k: Tensor, like_v: Tensor, capacity: int) -> None:
        B, h_kv, _, d_k = like_k.shape
        self.dtype = like_k.dtype  # what attention gets back
        self.keys = torch.empty(B, h_kv, capacity, d_k, dtype=torch.int8, device=like_k.device)
        self.values = torch.empty(B, h_kv, capacity, like_v.shape[-1], dtype=torch.int8,
                                  device=like_v.device)
        self.key_scales = torch.empty(B, h_kv, capacity, 1, dtype=SCALE_DTYPE, device=like_k.device)
        self.value_scales = torch.empty(B, h_kv, capacity, 1, dtype=SCALE_DTYPE, device=like_v.device)

    def _write(self, start: int, end: int, key: Tensor, value: Tensor) -> None:
        for q, values, scales in ((quantize_int8(key), self.keys, self.key_scales),
                                  (quantize_int8(value), self.values, self.value_scales)):
            values[:, :, start:end] = q.values  # (B, h_kv, n, d)
            scales[:, :, start:end] = q.scale  # (B, h_kv, n, 1)

    def _read(self, end: int) -> tuple[Tensor, Tensor]:
        k = Int8Tensor(self.keys[:, :, :end], self.key_scales[:, :, :end]).dequantize(self.dtype)
        v = Int8Tensor(self.values[:, :, :end], self.value_scales[:, :, :end]).dequantize(self.dtype)
        return k, v


def int8_kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch_size: int = 1
) -> int:
    """Bytes of an :class:`Int8AttentionCache` KV cache: one byte per element, as
    :func:`~minitransformer.kv_memory.kv_cache_bytes` with ``bytes_per_element=1``, plus one
    float16 scale per key and per value vector (per layer, KV head, position and sequence)."""
    values = kv_cache_bytes(num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element=1)
    scales = 2 * num_layers * num_kv_heads * seq_len * batch_size * torch.finfo(SCALE_DTYPE).bits // 8
    return values + scales
