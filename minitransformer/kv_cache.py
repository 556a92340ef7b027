"""The KV cache: keeping the keys and values of earlier positions for incremental decoding.

Explained in the chapter "Inference: the KV cache and the cost of attention"
(``book/inference``), sections "The KV cache" and "Memory".

When a decoder generates token ``t``, its self-attention needs the keys and values of all
earlier positions ``0..t``. They do not change from step to step (a position's key depends only
on the tokens up to it), so instead of recomputing them we keep them: that store is the
*KV cache* (:class:`KVCache`, one :class:`AttentionCache` per attention module). Its size is

    bytes = 2 (K and V) x batch x positions x layers x KV heads x head_dim x bytes per element.

Two details the usual formula forgets: the bytes per element (2 for fp16/bf16, 4 for fp32),
and that it counts *key/value* heads, which grouped-query attention (GQA) and multi-query
attention (MQA) make fewer than the query heads.

Usage with the package's :class:`~minitransformer.model.Transformer`::

    cache = KVCache.for_model(model, max_len=L)  # batch size: taken from the first step
    logits = model.decode(next_tokens, memory, src_mask, cache=cache)  # (B, 1, V), one step

:func:`minitransformer.decoding.greedy_decode` and :func:`~minitransformer.decoding.beam_search`
do this for you (``use_cache=True``, the default). The memory calculator (the formula above,
published models' shapes) is :mod:`minitransformer.kv_memory`; its command line is
:mod:`minitransformer.kv_cli`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = [
    "AttentionCache",
    "LayerCache",
    "KVCache",
]

class AttentionCache:
    """The keys and values of one attention module during one decoding run.

    Keys and values are stored per *key/value* head, ``(B, h_kv, capacity, d_k)``, in tensors
    allocated once: :meth:`update` writes the new positions into the next free slots (no
    ``torch.cat`` of a growing tensor per step) and returns views of the filled part. If a run
    outgrows ``capacity`` the buffers double, so appends stay amortised O(1).

    Two kinds (section "How the cache works"):

    * ``static=False``, decoder self-attention: every step appends the new position's K/V.
    * ``static=True``, cross-attention: the K/V of the encoder output are stored by the first
      call and then reused unchanged; :attr:`reuse` tells
      :class:`~minitransformer.attention.MultiHeadAttention` to skip the key/value projections.

    Buffers are allocated lazily, on the first :meth:`update`, with the dtype and device of the
    keys it receives (a static cache takes its capacity from them).
    """

    def __init__(self, capacity: int | None = None, static: bool = False) -> None:
        if capacity is not None:
            _positive_int("capacity", capacity)
        self.capacity = capacity
        self.static = static
        self.keys: Tensor | None = None  # (B, h_kv, capacity, d_k)
        self.values: Tensor | None = None  # (B, h_kv, capacity, d_v)
        self.length = 0  # positions filled

    @property
    def reuse(self) -> bool:
        """Whether this is a filled static (cross-attention) cache, whose K/V are reused."""
        return self.static and self.length > 0

    # Storage hooks. The bookkeeping above and below (capacity, growth, reorder, bytes) works
    # on the buffers named in _BUFFERS, so a subclass can store K/V differently by overriding
    # _allocate, _write and _read: minitransformer.quantize.Int8AttentionCache keeps int8.
    _BUFFERS: tuple[str, ...] = ("keys", "values")

    def _allocate(self, like_k: Tensor, like_v: Tensor, capacity: int) -> None:
        B, h_kv, _, d_k = like_k.shape
        self.keys = like_k.new_empty(B, h_kv, capacity, d_k)  # preallocated, filled by update
        self.values = like_v.new_empty(B, h_kv, capacity, like_v.shape[-1])

    def _write(self, start: int, end: int, key: Tensor, value: Tensor) -> None:
        self.keys[:, :, start:end] = key  # write in place: no copy of the old positions
        self.values[:, :, start:end] = value

    def _read(self, end: int) -> tuple[Tensor, Tensor]:
        return self.keys[:, :, :end], self.values[:, :, :end]

    def update(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """Store ``key``/``value`` ``(B, h_kv, n, d)`` after the cached positions.

        Returns the keys and values of all positions so far, ``(B, h_kv, length, d)`` views of
        the buffers.

        Raises:
            ValueError: if the batch, heads or head size differ from what is cached, or if a
                static cache is updated twice.
        """
        if key.dim() != 4 or value.dim() != 4 or key.shape[:3] != value.shape[:3]:
            raise ValueError(
                f"key and value must be (B, h_kv, n, d) with the same B, h_kv and n, got key "
                f"{tuple(key.shape)} and value {tuple(value.shape)}"
            )
        n = key.shape[2]
        if self.keys is None:
            capacity = n if self.static else max(self.capacity or 0, n, 1)
            self._allocate(key, value, capacity)
        elif self.static:
            raise ValueError("a static (cross-attention) cache is filled once; use reuse")
        else:
            B, h_kv, _, d_k = self.keys.shape
            if (key.shape[0], key.shape[1], key.shape[3], value.shape[3]) != (
                    B, h_kv, d_k, self.values.shape[3]):
                raise ValueError(
                    f"new keys {tuple(key.shape)} / values {tuple(value.shape)} do not match the "
                    f"cache (B={B}, h_kv={h_kv}, d_k={d_k}, d_v={self.values.shape[3]})"
                )
            if self.length + n > self.keys.shape[2]:  # outgrown: double (amortised O(1))
                old = {name: getattr(self, name) for name in self._BUFFERS}
                self._allocate(key, value, max(2 * self.keys.shape[2], self.length + n))
                for name, buffer in old.items():
                    getattr(self, name)[:, :, : self.length] = buffer[:, :, : self.length]
        end = self.length + n
        self._write(self.length, end, key, value)
        self.length = end
        return self._read(end)

    def get(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values, ``(B, h_kv, length, d)`` views."""
        if self.keys is None:
            raise ValueError("the cache is empty: nothing has been stored yet")
        return self._read(self.length)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` (beam search: the beam each survivor came from).

        ``index`` is a ``(B',)`` long tensor; the batch size becomes ``B'``.
        """
        if self.keys is not None:
            for name in self._BUFFERS:
                setattr(self, name, getattr(self, name).index_select(0, index))

    @property
    def nbytes(self) -> int:
        """The bytes of the allocated buffers (keys and values, and whatever a subclass adds)."""
        if self.keys is None:
            return 0
        return sum(getattr(self, name).nbytes for name in self._BUFFERS)

    @property
    def used_nbytes(self) -> int:
        """The bytes of the filled positions only."""
        if self.keys is None:
            return 0
        return sum(getattr(self, name)[:, :, : self.length].nbytes for name in self._BUFFERS)


@dataclass
class LayerCache:
    """The two caches of one decoder layer: self-attention (grows) and cross-attention (static)."""

    self_attn: AttentionCache
    cross_attn: AttentionCache


class KVCache:
    """The KV cache of a whole decoder: one :class:`LayerCache` per decoder layer.

    Section "How the cache works" of the chapter ``book/inference``. Pass it to
    :meth:`minitransformer.model.Transformer.decode` as ``cache=``; then ``tgt`` holds only the
    *new* tokens, whose positions start at :attr:`length`.

    Args:
        num_layers: decoder layers.
        capacity: positions to preallocate for self-attention (the longest output you expect;
            longer runs still work, the buffers double).
        cache_cls: the per-attention cache, :class:`AttentionCache` (keys and values in the
            model's dtype) or a subclass that stores them differently, such as
            :class:`minitransformer.quantize.Int8AttentionCache`.
    """

    def __init__(
        self, num_layers: int, capacity: int | None = None,
        cache_cls: type[AttentionCache] | None = None,
    ) -> None:
        _positive_int("num_layers", num_layers)
        cache_cls = AttentionCache if cache_cls is None else cache_cls
        self.layers = [
            LayerCache(cache_cls(capacity), cache_cls(static=True))
            for _ in range(num_layers)
        ]

    @classmethod
    def for_model(
        cls, model: nn.Module, max_len: int | None = None,
        cache_cls: type[AttentionCache] | None = None,
    ) -> "KVCache":
        """An empty cache for ``model`` (anything with ``model.decoder.layers``)."""
        return cls(len(model.decoder.layers), max_len, cache_cls)

    @property
    def length(self) -> int:
        """Target positions cached so far (the position of the next token)."""
        return self.layers[0].self_attn.length

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer (beam search reorders hypotheses)."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            layer.cross_attn.reorder(index)

    @property
    def self_attn_nbytes(self) -> int:
        """Allocated bytes of the self-attention caches (what
        :func:`~minitransformer.kv_memory.kv_cache_bytes` counts)."""
        return sum(layer.self_attn.nbytes for layer in self.layers)

    @property
    def cross_attn_nbytes(self) -> int:
        """Allocated bytes of the cross-attention caches (the source's K/V, stored once)."""
        return sum(layer.cross_attn.nbytes for layer in self.layers)

    @property
    def nbytes(self) -> int:
        """The allocated bytes of all layers, self-attention plus cross-attention."""
        return self.self_attn_nbytes + self.cross_attn_nbytes

    def __repr__(self) -> str:
        return (f"KVCache(layers={len(self.layers)}, length={self.length}, "
                f"nbytes={self.nbytes:,})")


def _positive_int(name: str, value: object, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} integer, got {value!r}")
    return value
