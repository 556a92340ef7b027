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

    cache = KVCache.for_model(model, max_len=L)  # batch size from step 1
    # logits: (B, 1, V)
    logits = model.decode(next_tokens, memory, src_mask=src_mask, cache=cache)

:func:`minitransformer.decoding.greedy_decode` and :func:`~minitransformer.decoding.beam_search`
do this for you (``use_cache=True``, the default). The memory calculator (the formula above,
published models' shapes) is :mod:`minitransformer.kv_memory`; its command line is
:mod:`minitransformer.kv_cli`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitransformer._checks import ids, positive_int, tensor

__all__ = [
    "AttentionCache",
    "LayerCache",
    "KVCache",
]


class AttentionCache:
    """The keys and values of one attention module during one decoding run.

    Section "How the cache works" of ``book/inference``. Keys and values are stored per
    key/value head, ``(B, h_kv, max_len, d_k)``, in buffers allocated by the first
    :meth:`update` (in the dtype and on the device of its keys). Each update writes the new
    positions into the next free slots and returns views of the filled part; a run longer than
    ``max_len`` doubles the buffers.

    * ``static=False``, decoder self-attention: every step appends its positions.
    * ``static=True``, cross-attention: filled once from the encoder output, then reused while
      the same encoder output comes back (:meth:`holds`); another one raises.

    A subclass stores K/V differently by overriding ``_allocate``, ``_write`` and ``_read``
    (e.g. :class:`minitransformer.quantize.Int8AttentionCache`); the bookkeeping works on the
    buffers named in ``_BUFFERS``.
    """

    _BUFFERS: tuple[str, ...] = ("keys", "values")

    def __init__(self, max_len: int | None = None, *, static: bool = False) -> None:
        self.max_len = None if max_len is None else positive_int("max_len", max_len)
        self.static = bool(static)
        self.keys: Tensor | None = None  # (B, h_kv, max_len, d_k)
        self.values: Tensor | None = None  # (B, h_kv, max_len, d_v)
        self.length = 0  # positions filled
        self.source: Tensor | None = None  # static: the encoder output the K/V came from

    def _allocate(self, like_k: Tensor, like_v: Tensor, max_len: int) -> None:
        B, h_kv, _, d_k = like_k.shape
        self.keys = like_k.new_empty(B, h_kv, max_len, d_k)
        self.values = like_v.new_empty(B, h_kv, max_len, like_v.shape[-1])

    def _buffers(self) -> tuple[Tensor, Tensor]:
        """The key and value buffers (allocated by the first :meth:`update`)."""
        keys, values = self.keys, self.values
        if keys is None or values is None:
            raise ValueError(
                "the cache is empty: nothing has been stored yet (call update() first)"
            )
        return keys, values

    def _write(self, start: int, end: int, key: Tensor, value: Tensor) -> None:
        keys, values = self._buffers()
        keys[:, :, start:end] = key  # in place: the old positions are not copied
        values[:, :, start:end] = value

    def _read(self, end: int) -> tuple[Tensor, Tensor]:
        keys, values = self._buffers()
        if end == keys.shape[2]:  # full (always, for a static cache): no slicing
            return keys, values
        return keys[:, :, :end], values[:, :, :end]

    def update(
        self, key: Tensor, value: Tensor, *, source: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Store ``key``/``value`` ``(B, h_kv, n, d)`` after the cached positions; return all
        positions so far, ``(B, h_kv, length, d)``. ``source``: for a static cache, the encoder
        output they were computed from (what :meth:`holds` compares with).

        Raises:
            ValueError: if B, h_kv, d, dtype or device differ from what is cached, or a static
                cache is filled twice.
        """
        tensor("key", key, kind="float")
        tensor("value", value, kind="float")
        if key.dim() != 4 or value.dim() != 4 or key.shape[:3] != value.shape[:3]:
            raise ValueError(
                f"key and value must be (B, h_kv, n, d) with the same B, h_kv and n, got key "
                f"{tuple(key.shape)} and value {tuple(value.shape)}"
            )
        n = key.shape[2]
        state = self.__dict__.copy()  # references only: put back if anything below raises
        try:
            return self._update(key, value, n, source)
        except BaseException:
            self.__dict__.clear()
            self.__dict__.update(state)  # the cache as it was (the buffers it had)
            raise

    def _update(
        self, key: Tensor, value: Tensor, n: int, source: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """:meth:`update` after the checks of its arguments' kinds and shapes."""
        if self.keys is None:
            self._allocate(key, value, n if self.static else max(self.max_len or 0, n, 1))
            self._like = (
                key.shape[0],
                key.shape[1],
                key.shape[3],
                value.shape[3],
                key.dtype,
                key.device,
            )
        elif self.static:
            raise ValueError(
                "key: a static (cross-attention) cache is filled once, and this one holds "
                f"{self.length} positions already; use a new KVCache for each source batch"
            )
        else:
            got = (key.shape[0], key.shape[1], key.shape[3], value.shape[3], key.dtype, key.device)
            if got != self._like:
                cached = ", ".join(
                    f"{name}={v}"
                    for name, v in zip(
                        ("B", "h_kv", "d_k", "d_v", "dtype", "device"), self._like, strict=True
                    )
                )
                raise ValueError(
                    f"new keys {tuple(key.shape)} / values {tuple(value.shape)} ({key.dtype}, "
                    f"{key.device}) do not match the cache ({cached})"
                )
            if self.length + n > self.keys.shape[2]:  # outgrown: double (amortised O(1))
                old = {name: getattr(self, name) for name in self._BUFFERS}
                self._allocate(key, value, max(2 * self.keys.shape[2], self.length + n))
                for name, buffer in old.items():
                    getattr(self, name)[:, :, : self.length] = buffer[:, :, : self.length]
        end = self.length + n
        self._write(self.length, end, key, value)
        self.length = end
        if self.static:
            self.source = source
        return self._read(end)

    def append(self, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        """:meth:`update` of a self-attention cache without its checks, for the model's fast
        cached step (``minitransformer.model.Decoder._step_plan``), whose keys and values
        come from the same weights as the earlier steps'. Falls back to :meth:`update` (checks
        included) for the first step, a new batch size, and when the buffers must grow."""
        end = self.length + key.shape[2]
        if (
            self.keys is None
            or self.static
            or end > self.keys.shape[2]
            or key.shape[0] != self.keys.shape[0]
        ):
            return self.update(key, value)
        self._write(self.length, end, key, value)
        self.length = end
        return self._read(end)

    def holds(self, source: Tensor) -> bool:
        """Whether this is a static cache filled from ``source`` (so its K/V can be reused).

        The same tensor, or an equal one (beam search re-indexes the encoder output every
        step), is accepted. An empty or self-attention cache gives False.

        Raises:
            ValueError: if the cache was filled from a different encoder output: its K/V
                would be stale (start a new cache for each source batch).
        """
        if self.source is None:
            return False
        if source is self.source:
            return True
        if (
            tensor("source", source).shape == self.source.shape
            and source.device == self.source.device
            and torch.equal(source, self.source)
        ):
            self.source = source
            return True
        raise ValueError(
            f"this cross-attention cache holds the keys and values of another encoder output "
            f"(shape {tuple(self.source.shape)}), got {tuple(source.shape)}: use a new KVCache "
            "for each source batch"
        )

    def get(self) -> tuple[Tensor, Tensor]:
        """The cached keys and values, ``(B, h_kv, length, d)``."""
        if self.keys is None:
            raise ValueError(
                "the cache is empty: nothing has been stored yet (call update() first)"
            )
        return self._read(self.length)

    def _check_index(self, index: object) -> Tensor:
        """``index`` ``(B',)`` as int64 (any integer dtype of ``_checks.ids``), in ``[0, B)``
        once the cache holds a batch of ``B`` rows."""
        index = ids("index", index, ndim=1, what="(B',)", low=None)
        if self.keys is not None:
            B = self.keys.shape[0]
            if index.numel() and (int(index.min()) < 0 or int(index.max()) >= B):
                raise ValueError(f"index {index.tolist()} must lie in [0, B={B})")
        return index

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` ``(B',)`` (beam search: the row each survivor came from):
        an integer tensor of any dtype of ``minitransformer._checks.ID_DTYPES``."""
        self._reorder(self._check_index(index))

    def _reorder(self, index: Tensor) -> None:
        """:meth:`reorder` of an ``index`` that ``_check_index`` returned."""
        if self.keys is None:
            return
        B = self.keys.shape[0]
        index = index.to(self.keys.device)
        for name in self._BUFFERS:
            buffer = getattr(self, name)  # (B, h_kv, max_len, d)
            if len(index) == B:  # same batch size: copy only the filled positions, in place
                buffer[:, :, : self.length] = buffer[index, :, : self.length]
            else:
                setattr(self, name, buffer.index_select(0, index))
        if self.source is not None:
            self.source = self.source.index_select(0, index)
        self._like = (len(index),) + self._like[1:]

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
    """The caches of one decoder layer: self-attention (grows) and cross-attention (static;
    None in a decoder-only model)."""

    self_attn: AttentionCache
    cross_attn: AttentionCache | None = None


class KVCache:
    """The KV cache of a whole decoder: one :class:`LayerCache` per decoder layer.

    Section "How the cache works" of ``book/inference``. Pass it to
    :meth:`minitransformer.model.Transformer.decode` as ``cache=``: ``tgt`` then holds only the
    new tokens, at positions from :attr:`length`. One cache serves one run over one source
    batch.

    Args:
        num_layers: decoder layers.
        max_len: positions to preallocate for self-attention (longer runs still work: the
            buffers double).
        cache_cls: :class:`AttentionCache` (the default) or a subclass, such as
            :class:`minitransformer.quantize.Int8AttentionCache`.
        cross_attention: whether the layers have cross-attention (False: decoder-only).
    """

    def __init__(
        self,
        num_layers: int,
        max_len: int | None = None,
        cache_cls: type[AttentionCache] | None = None,
        *,
        cross_attention: bool = True,
    ) -> None:
        positive_int("num_layers", num_layers)
        cache_cls = AttentionCache if cache_cls is None else cache_cls
        if not (isinstance(cache_cls, type) and issubclass(cache_cls, AttentionCache)):
            raise TypeError(f"cache_cls must be AttentionCache or a subclass, got {cache_cls!r}")
        self.layers = [
            LayerCache(cache_cls(max_len), cache_cls(static=True) if cross_attention else None)
            for _ in range(num_layers)
        ]
        # What the model checked on this run's first step (Transformer.decode keeps its
        # validated inputs here, so that later steps need not check them again).
        # (memory, src_mask, the cross-attention mask), or None before the first step.
        self.checked: tuple[Tensor, Tensor | None, Tensor | None] | None = None
        # The decoder's fast path for this run: the tensors its steps read, gathered on the
        # run's first fast step (minitransformer.model.Decoder._step_plan), or None before it.
        self.step_plan: object | None = None

    @classmethod
    def for_model(
        cls,
        model: nn.Module,
        max_len: int | None = None,
        cache_cls: type[AttentionCache] | None = None,
    ) -> KVCache:
        """An empty cache for ``model`` (anything with ``model.decoder.layers``)."""
        layers = getattr(getattr(model, "decoder", None), "layers", None)
        if layers is None:
            raise TypeError(f"model must have decoder.layers, got {type(model).__name__}")
        cross = any(getattr(layer, "cross_attn", None) is not None for layer in layers)
        return cls(len(layers), max_len, cache_cls, cross_attention=cross)

    @property
    def length(self) -> int:
        """Target positions cached so far (the position of the next token)."""
        return self.layers[0].self_attn.length

    def reorder(self, index: Tensor, *, cross_attention: bool = True) -> None:
        """Keep batch rows ``index`` in every layer (beam search reorders hypotheses).

        ``cross_attention=False`` leaves the cross-attention caches as they are. That is right,
        and saves copying them, when every row of ``index`` comes from a row of the same
        source, whose keys and values are the same: beam search's ``(B, k)`` layout, where a
        hypothesis always extends one of its own example's beams.

        ``index`` is checked against every layer before any changes, so that a bad one
        leaves the cache as it was.
        """
        caches = [layer.self_attn for layer in self.layers]
        if cross_attention:
            caches += [layer.cross_attn for layer in self.layers if layer.cross_attn is not None]
        for attention_cache in caches:
            index = attention_cache._check_index(index)
        for attention_cache in caches:
            attention_cache._reorder(index)

    @property
    def self_attn_nbytes(self) -> int:
        """Allocated bytes of the self-attention caches (what
        :func:`~minitransformer.kv_memory.kv_cache_bytes` counts)."""
        return sum(layer.self_attn.nbytes for layer in self.layers)

    @property
    def cross_attn_nbytes(self) -> int:
        """Allocated bytes of the cross-attention caches (the source's K/V, stored once)."""
        return sum(layer.cross_attn.nbytes for layer in self.layers if layer.cross_attn)

    @property
    def nbytes(self) -> int:
        """The allocated bytes of all layers, self-attention plus cross-attention."""
        return self.self_attn_nbytes + self.cross_attn_nbytes

    def __repr__(self) -> str:
        return f"KVCache(layers={len(self.layers)}, length={self.length}, nbytes={self.nbytes:,})"
