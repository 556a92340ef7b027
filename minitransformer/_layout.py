"""Weights laid out for the products of a cached decoding step.

Chapter "Inference: the KV cache and the cost of attention", section "The measured speed-up".
A cached step multiplies one row per sequence by every weight matrix. ``F.linear(x, W)`` reads
``W`` as ``nn.Linear`` stores it, ``(out, in)``, and computes ``x W^T``: one dot product of
length ``in`` per output. The same product over ``W^T`` stored row by row, ``(in, out)``, adds
up ``in`` rows of length ``out`` instead. The numbers are the same up to rounding, but the BLAS
library runs the two with different kernels: on the machines where the package was developed
(AMD EPYC, PyTorch's MKL), a matrix with more outputs than inputs went 1.3 to 2.2 times faster
the second way once it had left the L2 cache, and one with fewer outputs slower
(``benchmarks/bench_kv_cache.py`` has the measurements).

:func:`step_weight` gives a weight in the layout its one-row product reads faster: a copy,
made on first use and made again when the parameter changes (an optimiser step, ``copy_``,
``load_state_dict``, ``.to()``). The copies cost memory (for GPT-2 small, 352 MB beside its
498 MB of parameters) and go with their parameters."""

from __future__ import annotations

import weakref

import torch
from torch import Tensor

__all__ = ["step_weight", "transposed_layout"]

# id(parameter) -> (a weak reference to it, its version and address when copied, the copy)
_COPIES: dict[int, tuple[weakref.ref[Tensor], int, int, Tensor]] = {}


def transposed_layout(weight: Tensor) -> bool:
    """Whether a one-row product reads ``weight`` ``(out, in)`` from a copy stored ``(in, out)``:
    when it has more outputs than inputs (the measured rule above)."""
    return weight.dim() == 2 and weight.shape[0] > weight.shape[1]


def step_weight(weight: Tensor) -> Tensor:
    """``weight`` ``(out, in)`` with the same values, stored ``(in, out)`` where
    :func:`transposed_layout` says so: pass it to ``F.linear`` as the weight. Use it only without
    autograd: the copy is detached. Returns ``weight`` itself when it keeps its layout, is
    stored ``(in, out)`` already, or is an inference tensor (it has no version to check)."""
    if not transposed_layout(weight) or weight.stride(0) == 1 or weight.is_inference():
        return weight
    key, version, address = id(weight), weight._version, weight.data_ptr()
    entry = _COPIES.get(key)
    if entry is not None and entry[0]() is weight and entry[1:3] == (version, address):
        return entry[3]
    with torch.no_grad():
        copy = weight.detach().t().contiguous().t()  # (out, in) values, (in, out) in memory

    def forget(_: object) -> None:  # the parameter is gone: so is its copy
        _COPIES.pop(key, None)

    _COPIES[key] = (weakref.ref(weight, forget), version, address, copy)
    return copy
