"""Symmetric int8 quantisation for the KV cache (chapter "Where next", section "Quantisation").

A tensor is stored as int8 values and one float scale per slice along ``dim`` (``dim=-1`` on
a ``(B, h, S, d_k)`` key tensor: one scale per token and head), the slice's largest magnitude
mapping to 127::

    scale = max|x| / 127
    q     = round(x / scale), in [-127, 127]
    x     ~ q * scale

so every element's round-trip error is at most half a step, ``scale / 2``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from minitransformer._checks import as_int, tensor
from minitransformer.kv_cache import AttentionCache
from minitransformer.kv_memory import kv_cache_bytes

__all__ = ["Int8Tensor", "quantize_int8", "Int8AttentionCache", "int8_kv_cache_bytes"]

QMAX = 127  # symmetric: -127..127, so that -x quantises to -q
# 2 bytes per scale, and float32's exponent range: a float16 scale underflows below 6e-8, so a
# row of magnitude 1e-6 would map its largest entry to 17 instead of 127. bfloat16's 8-bit
# mantissa costs nothing here, since the values are quantised with the rounded scale.
SCALE_DTYPE = torch.bfloat16


def _float_dtype(name: str, dtype: object) -> torch.dtype:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


@dataclass(frozen=True)
class Int8Tensor:
    """int8 ``values`` and float ``scale`` (``values``' shape with the quantised dim set to 1)."""

    values: Tensor
    scale: Tensor

    def __post_init__(self) -> None:
        tensor("values", self.values)
        if self.values.dtype != torch.int8:
            raise TypeError(f"values must be an int8 tensor, got dtype {self.values.dtype}")
        tensor("scale", self.scale, kind="float", ndim=self.values.dim())
        if any(s not in (1, v) for s, v in zip(self.scale.shape, self.values.shape, strict=True)):
            raise ValueError(
                f"scale {tuple(self.scale.shape)} must have values' shape "
                f"{tuple(self.values.shape)} with some dimensions set to 1"
            )

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """Back to floating point: ``values * scale``, in ``dtype``."""
        dtype = _float_dtype("dtype", dtype)
        return self.values.to(dtype) * self.scale.to(dtype)

    @property
    def nbytes(self) -> int:
        """The bytes held, one per value plus the scales."""
        return (
            self.values.numel() * self.values.element_size()
            + self.scale.numel() * self.scale.element_size()
        )

    @property
    def shape(self) -> torch.Size:
        return self.values.shape


def quantize_int8(x: Tensor, dim: int = -1, scale_dtype: torch.dtype = SCALE_DTYPE) -> Int8Tensor:
    """Quantise floating-point ``x`` to int8 with one absmax scale per slice along ``dim``.

    The scales are stored in ``scale_dtype`` (bfloat16: 2 bytes per slice), and rounded before
    quantising, so that ``dequantize()`` is within ``scale / 2`` of ``x`` elementwise.
    """
    tensor("x", x, kind="float")
    if x.dim() == 0:
        raise ValueError("x must have at least one dimension to take scales over, got a 0-d tensor")
    dim = as_int("dim", dim)
    if not -x.dim() <= dim < x.dim():
        raise ValueError(
            f"dim must be in [{-x.dim()}, {x.dim()}) for x of shape {tuple(x.shape)}, got {dim}"
        )
    scale_dtype = _float_dtype("scale_dtype", scale_dtype)
    if x.shape[dim] == 0:  # empty slices: nothing to scale (they get scale 1 below)
        shape = list(x.shape)
        shape[dim] = 1
        absmax = x.new_zeros(shape, dtype=torch.float32)
    else:
        absmax = x.detach().abs().amax(dim=dim, keepdim=True).float()
    largest = float(absmax.max()) if absmax.numel() else 0.0
    if not math.isfinite(largest):
        raise ValueError(
            f"x must be finite to be quantised; its largest magnitude is {largest} (not finite)"
        )
    if largest / QMAX > torch.finfo(scale_dtype).max:
        raise ValueError(
            f"x's largest magnitude {largest:.3g} gives a scale that does not fit "
            f"in scale_dtype {scale_dtype}"
        )
    # Round the scale to its storage dtype *before* quantising, so that the values are
    # consistent with the scale that is kept; a zero slice gets scale 1 (its values are 0).
    scale = (absmax / QMAX).to(scale_dtype)
    # Rounding the scale down would push the largest entry past 127 (and clipping it would
    # break the error bound): step such scales up to the next representable number.
    too_small = scale.float() * QMAX < absmax
    scale_up = torch.nextafter(scale, torch.full_like(scale, float("inf")))
    scale = torch.where(too_small, scale_up, scale)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.round(x.float() / scale.float()).clamp_(-QMAX, QMAX).to(torch.int8)
    return Int8Tensor(values=values, scale=scale)


class Int8AttentionCache(AttentionCache):
    """An :class:`~minitransformer.kv_cache.AttentionCache` that stores keys and values as int8
    (section "An int8 KV cache for the trained model").

    Each position's key and value are quantised on arrival (:func:`quantize_int8` over the head
    dimension: one bfloat16 scale per sequence, KV head and position) and dequantised when read,
    so an element takes ``1 + 2 / d_k`` bytes instead of 4 (float32). Only the storage is
    simulated; the arithmetic stays in floating point. Use it as ``cache_cls=`` of the decoders
    or of :class:`~minitransformer.kv_cache.KVCache`.
    """

    _BUFFERS = ("keys", "values", "key_scales", "value_scales")

    def _allocate(self, like_k: Tensor, like_v: Tensor, max_len: int) -> None:
        B, h_kv, _, d_k = like_k.shape
        self.dtype = like_k.dtype  # what attention gets back
        self.keys = torch.empty(B, h_kv, max_len, d_k, dtype=torch.int8, device=like_k.device)
        self.values = torch.empty(
            B, h_kv, max_len, like_v.shape[-1], dtype=torch.int8, device=like_v.device
        )
        self.key_scales = torch.empty(B, h_kv, max_len, 1, dtype=SCALE_DTYPE, device=like_k.device)
        self.value_scales = torch.empty(
            B, h_kv, max_len, 1, dtype=SCALE_DTYPE, device=like_v.device
        )

    def _write(self, start: int, end: int, key: Tensor, value: Tensor) -> None:
        assert self.keys is not None and self.values is not None  # update() allocated them
        for q, values, scales in (
            (quantize_int8(key), self.keys, self.key_scales),
            (quantize_int8(value), self.values, self.value_scales),
        ):
            values[:, :, start:end] = q.values  # (B, h_kv, n, d)
            scales[:, :, start:end] = q.scale  # (B, h_kv, n, 1)

    def _read(self, end: int) -> tuple[Tensor, Tensor]:
        assert self.keys is not None and self.values is not None  # update() allocated them
        k = Int8Tensor(self.keys[:, :, :end], self.key_scales[:, :, :end])
        v = Int8Tensor(self.values[:, :, :end], self.value_scales[:, :, :end])
        return k.dequantize(self.dtype), v.dequantize(self.dtype)


def int8_kv_cache_bytes(
    num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch_size: int = 1
) -> int:
    """Bytes of an :class:`Int8AttentionCache` KV cache: one byte per element, as
    :func:`~minitransformer.kv_memory.kv_cache_bytes` with ``bytes_per_element=1``, plus one
    bfloat16 scale per key and per value vector (per layer, KV head, position and sequence)."""
    values = kv_cache_bytes(
        num_layers, num_kv_heads, head_dim, seq_len, batch_size, bytes_per_element=1
    )
    scale_bytes = torch.finfo(SCALE_DTYPE).bits // 8
    scales = 2 * num_layers * num_kv_heads * seq_len * batch_size * scale_bytes
    return values + scales
