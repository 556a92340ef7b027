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

__all__ = ["Int8Tensor", "quantize_int8"]

QMAX = 127  # symmetric: -127..127, so that -x quantises to -q


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


def quantize_int8(x: Tensor, dim: int = -1, scale_dtype: torch.dtype = torch.float16) -> Int8Tensor:
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
