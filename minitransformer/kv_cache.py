"""The KV cache: how much memory it needs, and (KVCache) a real one for incremental decoding.

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
    logits = model.decode(next_tokens, memory, src_mask=src_mask, cache=cache)  # (B, 1, V)

:func:`minitransformer.decoding.greedy_decode` and :func:`~minitransformer.decoding.beam_search`
do this for you (``use_cache=True``, the default).

Command line::

    python -m minitransformer.kv_cache llama-2-7b --context 4096 --batch 8 --dtype bf16
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from minitransformer._checks import positive_int, tensor

__all__ = [
    "AttentionCache",
    "LayerCache",
    "KVCache",
    "DTYPE_BYTES",
    "ModelConfig",
    "MODEL_CONFIGS",
    "kv_cache_bytes",
    "format_bytes",
    "main",
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

    def _write(self, start: int, end: int, key: Tensor, value: Tensor) -> None:
        self.keys[:, :, start:end] = key  # in place: the old positions are not copied
        self.values[:, :, start:end] = value

    def _read(self, end: int) -> tuple[Tensor, Tensor]:
        if end == self.keys.shape[2]:  # full (always, for a static cache): no slicing
            return self.keys, self.values
        return self.keys[:, :, :end], self.values[:, :, :end]

    def update(self, key: Tensor, value: Tensor, *, source: Tensor | None = None
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
        if self.keys is None:
            self._allocate(key, value, n if self.static else max(self.max_len or 0, n, 1))
            self._like = (key.shape[0], key.shape[1], key.shape[3], value.shape[3], key.dtype,
                          key.device)
        elif self.static:
            raise ValueError("a static (cross-attention) cache is filled once")
        else:
            got = (key.shape[0], key.shape[1], key.shape[3], value.shape[3], key.dtype, key.device)
            if got != self._like:
                cached = ", ".join(f"{name}={v}" for name, v in
                                   zip(("B", "h_kv", "d_k", "d_v", "dtype", "device"), self._like))
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
        if (tensor("source", source).shape == self.source.shape and source.device == self.source.device
                and torch.equal(source, self.source)):
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
            raise ValueError("the cache is empty: nothing has been stored yet")
        return self._read(self.length)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` ``(B',)`` (beam search: the row each survivor came from)."""
        tensor("index", index, kind="int", ndim=1, what="(B',)")
        if self.keys is None:
            return
        B = self.keys.shape[0]
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= B):
            raise ValueError(f"index {index.tolist()} must lie in [0, B={B})")
        index = index.to(self.keys.device)
        for name in self._BUFFERS:
            setattr(self, name, getattr(self, name).index_select(0, index))
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
        self, num_layers: int, max_len: int | None = None,
        cache_cls: type[AttentionCache] | None = None, *, cross_attention: bool = True,
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
        self.checked: object = None

    @classmethod
    def for_model(
        cls, model: nn.Module, max_len: int | None = None,
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

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows ``index`` in every layer (beam search reorders hypotheses)."""
        for layer in self.layers:
            layer.self_attn.reorder(index)
            if layer.cross_attn is not None:
                layer.cross_attn.reorder(index)

    @property
    def self_attn_nbytes(self) -> int:
        """Allocated bytes of the self-attention caches (what :func:`kv_cache_bytes` counts)."""
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
        return (f"KVCache(layers={len(self.layers)}, length={self.length}, "
                f"nbytes={self.nbytes:,})")


#: Bytes per element of the usual cache dtypes.
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "int8": 1,
}


def _positive_int(name: str, value: object, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} integer, got {value!r}")
    return value


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    batch_size: int = 1,
    bytes_per_element: int = 2,
) -> int:
    """Bytes of the keys and values a decoder keeps for ``seq_len`` positions (section "Memory").

    ``2 x batch_size x seq_len x num_layers x num_kv_heads x head_dim x bytes_per_element``:
    one key and one value vector of ``head_dim`` elements per KV head, per layer, per position,
    per sequence. ``num_kv_heads`` is the number of *key/value* heads (8 for Llama-2-70B, whose
    64 query heads share them), not the number of query heads.

    For an encoder-decoder the decoder's cross-attention adds the same formula with
    ``seq_len`` = the source length (computed once from the encoder output).

    Raises:
        ValueError: for a non-integer or non-positive size (``seq_len`` may be 0).
    """
    _positive_int("num_layers", num_layers)
    _positive_int("num_kv_heads", num_kv_heads)
    _positive_int("head_dim", head_dim)
    _positive_int("seq_len", seq_len, allow_zero=True)
    _positive_int("batch_size", batch_size)
    _positive_int("bytes_per_element", bytes_per_element)
    return 2 * batch_size * seq_len * num_layers * num_kv_heads * head_dim * bytes_per_element


@dataclass(frozen=True)
class ModelConfig:
    """The attention shape of a published model: all the KV-cache calculator needs.

    ``num_layers`` counts the layers that keep a KV cache (the decoder layers).
    ``sliding_window`` (Mistral) caps the positions each layer attends to, and so the cache
    per sequence. ``max_context`` is ``None`` for the paper's models: sinusoidal positions set
    no fixed limit.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_model: int
    max_context: int | None
    source: str
    sliding_window: int | None = None

    @property
    def attention(self) -> str:
        """"MHA", "GQA" or "MQA", from the number of KV heads."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    def bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV-cache bytes one position adds (all layers, K and V)."""
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, 1, 1,
                              bytes_per_element)

    def cache_bytes(self, context: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
        """KV-cache bytes for ``batch_size`` sequences of ``context`` positions.

        With a sliding window only the last ``sliding_window`` positions are kept.
        """
        positions = context if self.sliding_window is None else min(context, self.sliding_window)
        return kv_cache_bytes(self.num_layers, self.num_kv_heads, self.head_dim, positions,
                              batch_size, bytes_per_element)

    def mha_cache_bytes(self, context: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
        """The same cache if every query head had its own K and V (no GQA/MQA)."""
        positions = context if self.sliding_window is None else min(context, self.sliding_window)
        return kv_cache_bytes(self.num_layers, self.num_heads, self.head_dim, positions,
                              batch_size, bytes_per_element)


#: Known configurations, by name. Each one is taken from the configuration published with the
#: model (``config.json`` of the released weights) or from its paper; the source is in the
#: comment above it and in ``ModelConfig.source``.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in [
        # Vaswani et al. (2017), Table 3, base model: N = 6, d_model = 512, h = 8,
        # d_k = d_v = 64. Only the 6 decoder layers cache self-attention K/V; the cross-attention
        # K/V over the source (same formula, seq_len = source length) come on top.
        ModelConfig("transformer-base", 6, 8, 8, 64, 512, None,
                    "Vaswani et al. 2017, Table 3 (base)"),
        # Vaswani et al. (2017), Table 3, big model: N = 6, d_model = 1024, h = 16, d_k = 64.
        ModelConfig("transformer-big", 6, 16, 16, 64, 1024, None,
                    "Vaswani et al. 2017, Table 3 (big)"),
        # GPT-2 small, openai-community/gpt2 config.json: n_layer 12, n_head 12, n_embd 768,
        # n_positions 1024 (Radford et al. 2019).
        ModelConfig("gpt2-small", 12, 12, 12, 64, 768, 1024,
                    "openai-community/gpt2 config.json"),
        # Llama 2 7B, meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32,
        # num_attention_heads 32, num_key_value_heads 32, hidden_size 4096,
        # max_position_embeddings 4096 (Touvron et al. 2023).
        ModelConfig("llama-2-7b", 32, 32, 32, 128, 4096, 4096,
                    "meta-llama/Llama-2-7b-hf config.json"),
        # Llama 2 70B, meta-llama/Llama-2-70b-hf config.json: num_hidden_layers 80,
        # num_attention_heads 64, num_key_value_heads 8 (GQA), hidden_size 8192,
        # max_position_embeddings 4096.
        ModelConfig("llama-2-70b", 80, 64, 8, 128, 8192, 4096,
                    "meta-llama/Llama-2-70b-hf config.json"),
        # Llama 3 8B, meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32,
        # num_attention_heads 32, num_key_value_heads 8, hidden_size 4096,
        # max_position_embeddings 8192.
        ModelConfig("llama-3-8b", 32, 32, 8, 128, 4096, 8192,
                    "meta-llama/Meta-Llama-3-8B config.json"),
        # Mistral 7B v0.1, mistralai/Mistral-7B-v0.1 config.json: num_hidden_layers 32,
        # num_attention_heads 32, num_key_value_heads 8, hidden_size 4096,
        # max_position_embeddings 32768, sliding_window 4096 (Jiang et al. 2023).
        ModelConfig("mistral-7b", 32, 32, 8, 128, 4096, 32768,
                    "mistralai/Mistral-7B-v0.1 config.json", sliding_window=4096),
    ]
}


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``: binary units (KiB = 1024 bytes), three significant figures."""
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
    value, unit = float(n), 0
    while abs(value) >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value):,} bytes"
    # 100 and up: whole units ("1010 MiB"; .3g would print "1.01e+03"), else two decimals
    return f"{value:.0f} {units[unit]}" if value >= 100 else f"{value:.2f} {units[unit]}"


def _lookup(name: str) -> ModelConfig:
    key = name.lower()
    if key not in MODEL_CONFIGS:
        raise ValueError(
            f"unknown model {name!r}; known models: {', '.join(sorted(MODEL_CONFIGS))}"
        )
    return MODEL_CONFIGS[key]


def report(cfg: ModelConfig, context: int, batch_size: int, dtype: str) -> str:
    """The calculator's table for one model, as text (what the command line prints)."""
    bpe = DTYPE_BYTES[dtype]
    per_token = cfg.bytes_per_token(bpe)
    positions = context if cfg.sliding_window is None else min(context, cfg.sliding_window)
    per_seq = cfg.cache_bytes(context, 1, bpe)
    per_batch = cfg.cache_bytes(context, batch_size, bpe)
    rows = [
        ("model", f"{cfg.name} ({cfg.source})"),
        ("layers x KV heads x head_dim",
         f"{cfg.num_layers} x {cfg.num_kv_heads} x {cfg.head_dim} "
         f"({cfg.attention}, {cfg.num_heads} query heads)"),
        ("dtype", f"{dtype} ({bpe} byte{'s' if bpe > 1 else ''} per element)"),
        ("per token", f"{per_token:,} bytes ({format_bytes(per_token)})"),
        (f"per sequence ({context:,} tokens)", f"{per_seq:,} bytes ({format_bytes(per_seq)})"),
        (f"per batch ({batch_size} sequence{'s' if batch_size > 1 else ''})",
         f"{per_batch:,} bytes ({format_bytes(per_batch)})"),
    ]
    if positions != context:
        rows.append(("sliding window",
                     f"only the last {cfg.sliding_window:,} positions are cached"))
    if cfg.num_kv_heads != cfg.num_heads:
        mha = cfg.mha_cache_bytes(context, batch_size, bpe)
        rows.append((f"{cfg.attention} saving",
                     f"{cfg.num_heads // cfg.num_kv_heads}x: with one KV head per query head "
                     f"the batch would need {format_bytes(mha)}"))
    else:
        rows.append(("GQA saving", "none: every query head has its own K and V (MHA)"))
    if cfg.max_context is not None and context > cfg.max_context:
        rows.append(("note", f"{context:,} tokens exceeds the model's context of "
                             f"{cfg.max_context:,}"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; see ``python -m minitransformer.kv_cache --help``."""
    parser = argparse.ArgumentParser(
        prog="python -m minitransformer.kv_cache",
        description=(
            "KV-cache memory of a decoder: 2 (K and V) x batch x context x layers x "
            "KV heads x head_dim x bytes per element. Prints the bytes per token, per "
            "sequence and per batch, and what grouped-query attention saves."
        ),
        epilog="Known models: " + ", ".join(sorted(MODEL_CONFIGS)) + ". Example: "
               "python -m minitransformer.kv_cache llama-2-7b --context 4096 --batch 8 "
               "--dtype bf16",
    )
    parser.add_argument("model", nargs="?", help="model name (see the list below); "
                        "omit it and give --layers/--kv-heads/--head-dim for your own model")
    parser.add_argument("--context", type=int, default=None,
                        help="tokens per sequence (default: the model's context length; "
                        "1024 for the paper's models, which have no fixed limit)")
    parser.add_argument("--batch", type=int, default=1, help="sequences (default: 1)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPE_BYTES),
                        help="element type of the cache (default: bf16)")
    parser.add_argument("--layers", type=int, help="custom model: decoder layers")
    parser.add_argument("--heads", type=int, help="custom model: query heads "
                        "(default: --kv-heads)")
    parser.add_argument("--kv-heads", type=int, help="custom model: key/value heads")
    parser.add_argument("--head-dim", type=int, help="custom model: size of one head")
    parser.add_argument("--list", action="store_true", help="list the known models and exit")
    args = parser.parse_args(argv)

    if args.list:
        for name in sorted(MODEL_CONFIGS):
            cfg = MODEL_CONFIGS[name]
            print(f"{name:<18} {cfg.num_layers:>3} layers, {cfg.num_heads:>2} heads, "
                  f"{cfg.num_kv_heads:>2} KV heads, head_dim {cfg.head_dim}  ({cfg.source})")
        return 0
    custom = (args.layers, args.kv_heads, args.head_dim)
    try:
        if args.model is not None:
            cfg = _lookup(args.model)
        elif all(v is not None for v in custom):
            heads = args.heads if args.heads is not None else args.kv_heads
            cfg = ModelConfig("custom", args.layers, heads, args.kv_heads, args.head_dim,
                              heads * args.head_dim, None, "command line")
            if heads % args.kv_heads:
                raise ValueError(f"--kv-heads {args.kv_heads} must divide --heads {heads}")
        else:
            parser.error("give a model name, or all of --layers, --kv-heads and --head-dim")
        context = args.context if args.context is not None else (cfg.max_context or 1024)
        _positive_int("--context", context)
        _positive_int("--batch", args.batch)
        print(report(cfg, context, args.batch, args.dtype))
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
