"""How much memory a KV cache needs: the formula, published models' shapes, Hugging Face configs.

Chapter "Inference: the KV cache and the cost of attention" (``book/inference``), section
"Memory". The cache of a decoder keeps one key and one value vector per position, layer and
key/value head:

    bytes = 2 (K and V) x batch_size x seq_len x num_layers x num_kv_heads x head_dim
            x bytes per element.

It counts *key/value* heads, which grouped-query (GQA) and multi-query attention (MQA) make
fewer than the query heads, and a sliding window caps ``seq_len`` in the layers that use it.
An encoder-decoder adds the cross-attention's K/V over the source (``src_len`` positions).

Plain Python: this module imports no torch, so the command line
(:mod:`minitransformer.kv_cli`) starts in a fraction of a second.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, SupportsIndex

__all__ = [
    "DTYPE_BYTES",
    "ModelConfig",
    "MODEL_CONFIGS",
    "kv_cache_bytes",
    "format_bytes",
    "estimate",
    "report",
]

#: Bytes per element of the usual cache dtypes (``torch_dtype`` names of config.json included).
DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "float32": 4,
    "fp16": 2,
    "float16": 2,
    "bf16": 2,
    "bfloat16": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}


def _size(name: str, value: object, *, allow_zero: bool = False) -> int:
    """``value`` as an int >= 1 (>= 0 with ``allow_zero``), else TypeError/ValueError.

    The rule and messages of ``minitransformer._checks.positive_int``, which this module
    cannot import: ``_checks`` imports torch.
    """
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):  # ints, NumPy ints
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    n = operator.index(value)
    if n < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else 'positive'}, got {n}")
    return n


def kv_cache_bytes(
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    seq_len: int,
    batch_size: int = 1,
    bytes_per_element: int = 2,
) -> int:
    """Bytes of the keys and values a decoder keeps for ``seq_len`` positions (section "Memory").

    ``2 x batch_size x seq_len x num_layers x num_kv_heads x head_dim x bytes_per_element``.
    ``num_kv_heads`` counts *key/value* heads (8 for Llama-2-70B, whose 64 query heads share
    them). An encoder-decoder's cross-attention adds the same formula with ``seq_len`` = the
    source length.

    Raises:
        TypeError: for a size that is not an int.
        ValueError: for a size that is not positive (``seq_len`` may be 0).
    """
    _size("num_layers", num_layers)
    _size("num_kv_heads", num_kv_heads)
    _size("head_dim", head_dim)
    _size("seq_len", seq_len, allow_zero=True)
    _size("batch_size", batch_size)
    _size("bytes_per_element", bytes_per_element)
    return 2 * batch_size * seq_len * num_layers * num_kv_heads * head_dim * bytes_per_element


@dataclass(frozen=True)
class ModelConfig:
    """The attention shape of a model: all the KV-memory calculator needs.

    ``num_layers`` counts the layers that keep a KV cache (the decoder's). ``sliding_window``
    (Mistral) caps the positions cached by ``num_sliding_layers`` of them (``None``: all).
    ``max_len`` is the model's context length, ``None`` where the model sets none (the paper's
    sinusoids). ``encoder_decoder`` models also cache the
    cross-attention K/V over the source. ``dtype`` is the published dtype, if known.
    """

    name: str
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    d_model: int
    max_len: int | None
    source: str
    sliding_window: int | None = None
    num_sliding_layers: int | None = None
    encoder_decoder: bool = False
    dtype: str | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "d_model"):
            _size(name, getattr(self, name))
        for name in ("max_len", "sliding_window"):
            if getattr(self, name) is not None:
                _size(name, getattr(self, name))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        if self.num_sliding_layers is not None:
            if self.sliding_window is None:
                raise ValueError("num_sliding_layers needs a sliding_window")
            if not 1 <= _size("num_sliding_layers", self.num_sliding_layers) <= self.num_layers:
                raise ValueError(
                    f"num_sliding_layers must be at most num_layers="
                    f"{self.num_layers}, got {self.num_sliding_layers}"
                )
        if self.dtype is not None and self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        """The fields and :attr:`attention`, for JSON."""
        return asdict(self) | {"attention": self.attention}

    @property
    def attention(self) -> str:
        """ "MHA", "GQA" or "MQA", from the number of KV heads."""
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def window_layers(self) -> int:
        """How many layers cache at most ``sliding_window`` positions (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return self.num_layers if self.num_sliding_layers is None else self.num_sliding_layers

    def bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV-cache bytes one position adds (all layers, K and V)."""
        return kv_cache_bytes(
            self.num_layers, self.num_kv_heads, self.head_dim, 1, 1, bytes_per_element
        )

    def cache_bytes(self, seq_len: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
        """Self-attention KV-cache bytes for ``batch_size`` sequences of ``seq_len`` positions.

        The layers with a sliding window keep only its last ``sliding_window`` positions.
        """
        return self._self_attention_bytes(self.num_kv_heads, seq_len, batch_size, bytes_per_element)

    def mha_cache_bytes(self, seq_len: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
        """The same cache if every query head had its own K and V (no GQA/MQA)."""
        return self._self_attention_bytes(self.num_heads, seq_len, batch_size, bytes_per_element)

    def cross_cache_bytes(
        self, src_len: int, batch_size: int = 1, bytes_per_element: int = 2
    ) -> int:
        """Cross-attention bytes: every decoder layer keeps the K/V of the ``src_len`` source
        positions (computed once from the encoder output). 0 for a decoder-only model."""
        size = kv_cache_bytes(
            self.num_layers,
            self.num_kv_heads,
            self.head_dim,
            src_len,
            batch_size,
            bytes_per_element,
        )
        return size if self.encoder_decoder else 0

    def _self_attention_bytes(
        self, kv_heads: int, seq_len: int, batch_size: int, bytes_per_element: int
    ) -> int:
        def layers(n: int, positions: int) -> int:
            return (
                kv_cache_bytes(n, kv_heads, self.head_dim, positions, batch_size, bytes_per_element)
                if n
                else 0
            )

        windowed = self.window_layers
        kept = seq_len if self.sliding_window is None else min(seq_len, self.sliding_window)
        return layers(self.num_layers - windowed, seq_len) + layers(windowed, kept)

    @classmethod
    def from_hf_config(
        cls, config: str | Path | dict[str, Any], *, name: str | None = None
    ) -> ModelConfig:
        """The attention shape in a Hugging Face ``config.json`` (a path, its folder, or the
        parsed dict), for the field names of Llama, Mistral, Qwen2, GPT-2 and T5.

        T5 and other encoder-decoders (``is_encoder_decoder``) count the *decoder* layers
        (``num_decoder_layers``, else ``num_layers``): their self-attention cache, plus the
        cross-attention K/V over the source (:meth:`cross_cache_bytes`).

        Raises:
            ValueError: for a file that is not a JSON object, or a missing or invalid field;
                the message names the field and the file.
        """
        if isinstance(config, dict):
            fields, where = config, "the config"
        else:
            path = Path(config)
            path = path / "config.json" if path.is_dir() else path
            where = str(path)
            try:
                fields = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where} is not valid JSON: {exc}") from None
            if not isinstance(fields, dict):
                raise ValueError(f"{where} must hold a JSON object, got {type(fields).__name__}")
        hf = _HFFields(fields, where)

        layers = hf.size("number of layers", _LAYER_FIELDS)
        heads = hf.size("number of attention heads", _HEAD_FIELDS)
        kv_heads = hf.optional_size(_KV_HEAD_FIELDS)
        if kv_heads is None:  # MQA where the config says so (GPT-BigCode, Falcon), else MHA
            kv_heads = 1 if fields.get("multi_query") is True else heads
        d_model = hf.optional_size(_HIDDEN_FIELDS)
        head_dim = hf.optional_size(_HEAD_DIM_FIELDS)
        if head_dim is None:  # Llama, Mistral and GPT-2 define it as d_model / heads
            if d_model is None:
                raise hf.missing("head dimension or hidden size", _HEAD_DIM_FIELDS + _HIDDEN_FIELDS)
            if d_model % heads:
                raise ValueError(
                    f"{where}: the hidden size {d_model} is not divisible by the "
                    f"{heads} attention heads; give head_dim"
                )
            head_dim = d_model // heads

        window = hf.optional_size(("sliding_window",))
        if fields.get("use_sliding_window") is False:  # Qwen2 ships a window it does not use
            window = None
        windowed = None if window is None else hf.sliding_layers(layers)
        if windowed == 0:
            window = windowed = None
        elif windowed == layers:
            windowed = None  # None: all of them

        return cls(
            name=name or str(fields.get("_name_or_path") or fields.get("model_type") or "unnamed"),
            num_layers=layers,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            d_model=d_model if d_model is not None else heads * head_dim,
            max_len=hf.optional_size(_CONTEXT_FIELDS),
            source=where,
            sliding_window=window,
            num_sliding_layers=windowed,
            encoder_decoder=bool(fields.get("is_encoder_decoder", False)),
            dtype=hf.dtype(),
        )


# config.json field names, in the order they are tried. Decoder layers first: they keep the
# cache (T5: num_decoder_layers, which defaults to num_layers).
_LAYER_FIELDS = ("num_decoder_layers", "num_hidden_layers", "n_layer", "num_layers")
_HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads")
_HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
_HEAD_DIM_FIELDS = ("head_dim", "d_kv")
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions")


class _HFFields:
    """Reads the fields of a config.json; every error names the field and the file."""

    def __init__(self, fields: dict[str, Any], where: str) -> None:
        self.fields, self.where = fields, where

    def optional_size(self, names: tuple[str, ...]) -> int | None:
        """The first of ``names`` that is present and not null, as a positive int, or None."""
        for key in names:
            value = self.fields.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(
                        f"{self.where}: {key} must be a positive integer, got {value!r}"
                    )
                return value
        return None

    def size(self, what: str, names: tuple[str, ...]) -> int:
        """Like :meth:`optional_size`, but one of ``names`` must be there."""
        value = self.optional_size(names)
        if value is None:
            raise self.missing(what, names)
        return value

    def missing(self, what: str, names: tuple[str, ...]) -> ValueError:
        return ValueError(f"{self.where}: no {what}: expected one of the fields {', '.join(names)}")

    def sliding_layers(self, num_layers: int) -> int:
        """How many layers use the sliding window: those ``layer_types`` names
        "sliding_attention", or (Qwen2) the layers from ``max_window_layers`` on, else all."""
        layer_types = self.fields.get("layer_types")
        if layer_types is not None:
            if not isinstance(layer_types, list) or len(layer_types) != num_layers:
                raise ValueError(
                    f"{self.where}: layer_types must list the {num_layers} "
                    f"layers, got {layer_types!r}"
                )
            return layer_types.count("sliding_attention")
        if self.fields.get("use_sliding_window") is True:
            first = self.size("first sliding-window layer", ("max_window_layers",))
            return max(num_layers - first, 0)
        return num_layers

    def dtype(self) -> str | None:
        for key in ("torch_dtype", "dtype"):
            value = self.fields.get(key)
            if value is not None:
                if value not in DTYPE_BYTES:
                    raise ValueError(
                        f"{self.where}: {key} must be one of "
                        f"{', '.join(DTYPE_BYTES)}, got {value!r}"
                    )
                return str(value)
        return None


#: Known configurations, by name. Each one is taken from the configuration published with the
#: model (``config.json`` of the released weights) or from its paper; the source is in the
#: comment above it and in ``ModelConfig.source``.
MODEL_CONFIGS: dict[str, ModelConfig] = {
    cfg.name: cfg
    for cfg in [
        # Vaswani et al. (2017), Table 3, base model: N = 6, d_model = 512, h = 8,
        # d_k = d_v = 64. The 6 decoder layers cache self-attention K/V; the cross-attention
        # K/V over the source (same formula, seq_len = source length) come on top.
        ModelConfig(
            "transformer-base",
            6,
            8,
            8,
            64,
            512,
            None,
            "Vaswani et al. 2017, Table 3 (base)",
            encoder_decoder=True,
        ),
        # Vaswani et al. (2017), Table 3, big model: N = 6, d_model = 1024, h = 16, d_k = 64.
        ModelConfig(
            "transformer-big",
            6,
            16,
            16,
            64,
            1024,
            None,
            "Vaswani et al. 2017, Table 3 (big)",
            encoder_decoder=True,
        ),
        # GPT-2 small, openai-community/gpt2 config.json: n_layer 12, n_head 12, n_embd 768,
        # n_positions 1024 (Radford et al. 2019).
        ModelConfig("gpt2-small", 12, 12, 12, 64, 768, 1024, "openai-community/gpt2 config.json"),
        # Llama 2 7B, meta-llama/Llama-2-7b-hf config.json: num_hidden_layers 32,
        # num_attention_heads 32, num_key_value_heads 32, hidden_size 4096,
        # max_position_embeddings 4096 (Touvron et al. 2023).
        ModelConfig(
            "llama-2-7b", 32, 32, 32, 128, 4096, 4096, "meta-llama/Llama-2-7b-hf config.json"
        ),
        # Llama 2 70B, meta-llama/Llama-2-70b-hf config.json: num_hidden_layers 80,
        # num_attention_heads 64, num_key_value_heads 8 (GQA), hidden_size 8192,
        # max_position_embeddings 4096.
        ModelConfig(
            "llama-2-70b", 80, 64, 8, 128, 8192, 4096, "meta-llama/Llama-2-70b-hf config.json"
        ),
        # Llama 3 8B, meta-llama/Meta-Llama-3-8B config.json: num_hidden_layers 32,
        # num_attention_heads 32, num_key_value_heads 8, hidden_size 4096,
        # max_position_embeddings 8192.
        ModelConfig(
            "llama-3-8b", 32, 32, 8, 128, 4096, 8192, "meta-llama/Meta-Llama-3-8B config.json"
        ),
        # Mistral 7B v0.1, mistralai/Mistral-7B-v0.1 config.json: num_hidden_layers 32,
        # num_attention_heads 32, num_key_value_heads 8, hidden_size 4096,
        # max_position_embeddings 32768, sliding_window 4096 (Jiang et al. 2023).
        ModelConfig(
            "mistral-7b",
            32,
            32,
            8,
            128,
            4096,
            32768,
            "mistralai/Mistral-7B-v0.1 config.json",
            sliding_window=4096,
        ),
    ]
}


def format_bytes(n: float) -> str:
    """``1536 -> '1.50 KiB'``: binary units (KiB = 1024 bytes), three significant figures."""
    given: object = n  # checked as any object: mypy counts no numbers.Real as a float
    if isinstance(given, bool) or not isinstance(given, numbers.Real):
        raise TypeError(f"n must be a number of bytes, got {type(n).__name__} {n!r}")
    value, unit = float(given), 0
    if not math.isfinite(value):
        raise ValueError(f"n must be a finite number of bytes, got {n}")
    units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB"]
    while abs(value) >= 1024 and unit < len(units) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{int(value):,} bytes"
    # 100 and up: whole units ("1010 MiB"; .3g would print "1.01e+03"), else two decimals
    return f"{value:.0f} {units[unit]}" if value >= 100 else f"{value:.2f} {units[unit]}"


def estimate(
    cfg: ModelConfig,
    seq_len: int,
    batch_size: int = 1,
    dtype: str = "bf16",
    *,
    src_len: int | None = None,
) -> dict[str, Any]:
    """The calculator's numbers for one model, as a JSON-ready dict (``--json`` prints it).

    Bytes of the self-attention cache per token, per sequence of ``seq_len`` positions and per
    batch; what it would be without GQA/MQA; for an encoder-decoder the cross-attention over
    ``src_len`` source positions (default: ``seq_len``) and the total.
    """
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    bpe = DTYPE_BYTES[dtype]
    _size("seq_len", seq_len)
    _size("batch_size", batch_size)
    if cfg.encoder_decoder:
        src_len = seq_len if src_len is None else _size("src_len", src_len)
    elif src_len is not None:
        raise ValueError(f"src_len is for encoder-decoder models; {cfg.name} is decoder-only")
    per_batch = cfg.cache_bytes(seq_len, batch_size, bpe)
    cross = cfg.cross_cache_bytes(src_len, batch_size, bpe) if src_len is not None else 0
    return {
        "model": cfg.to_dict(),
        "dtype": dtype,
        "bytes_per_element": bpe,
        "seq_len": seq_len,
        "batch_size": batch_size,
        "src_len": src_len,
        "bytes_per_token": cfg.bytes_per_token(bpe),
        "bytes_per_sequence": cfg.cache_bytes(seq_len, 1, bpe),
        "bytes_per_batch": per_batch,
        "mha_bytes_per_batch": cfg.mha_cache_bytes(seq_len, batch_size, bpe),
        "cross_attention_bytes_per_batch": cross,
        "total_bytes_per_batch": per_batch + cross,
        "exceeds_max_len": cfg.max_len is not None and seq_len > cfg.max_len,
    }


def report(
    cfg: ModelConfig,
    seq_len: int,
    batch_size: int = 1,
    dtype: str = "bf16",
    *,
    src_len: int | None = None,
) -> str:
    """The numbers of :func:`estimate` as a table with units (what the command line prints)."""
    est = estimate(cfg, seq_len, batch_size, dtype, src_len=src_len)
    bpe = est["bytes_per_element"]

    def size(n: int) -> str:
        return f"{n:,} bytes ({format_bytes(n)})"

    rows = [
        ("model", f"{cfg.name} ({cfg.source})"),
        (
            "layers x KV heads x head_dim",
            f"{cfg.num_layers} x {cfg.num_kv_heads} x {cfg.head_dim} "
            f"({cfg.attention}, {cfg.num_heads} query heads)",
        ),
        ("dtype", f"{dtype} ({bpe} byte{'s' if bpe > 1 else ''} per element)"),
        ("per token", size(est["bytes_per_token"])),
        (f"per sequence ({seq_len:,} tokens)", size(est["bytes_per_sequence"])),
        (
            f"per batch ({batch_size} sequence{'s' if batch_size > 1 else ''})",
            size(est["bytes_per_batch"]),
        ),
    ]
    if cfg.sliding_window is not None and seq_len > cfg.sliding_window:
        where = (
            ""
            if cfg.window_layers == cfg.num_layers
            else f" in {cfg.window_layers} of the {cfg.num_layers} layers"
        )
        rows.append(
            ("sliding window", f"only the last {cfg.sliding_window:,} positions are cached{where}")
        )
    if cfg.encoder_decoder:
        rows.append(
            (
                f"cross-attention ({est['src_len']:,} source tokens)",
                f"{size(est['cross_attention_bytes_per_batch'])} per batch "
                "(the source's K/V, every decoder layer)",
            )
        )
        rows.append(
            (
                "total per batch",
                f"{size(est['total_bytes_per_batch'])} (self- plus cross-attention)",
            )
        )
    if cfg.num_kv_heads != cfg.num_heads:
        rows.append(
            (
                f"{cfg.attention} saving",
                f"{cfg.num_heads // cfg.num_kv_heads}x: with one KV head per query head "
                f"the batch would need {format_bytes(est['mha_bytes_per_batch'])}",
            )
        )
    else:
        rows.append(("GQA saving", "none: every query head has its own K and V (MHA)"))
    if est["exceeds_max_len"]:
        rows.append(("note", f"{seq_len:,} tokens exceeds the model's context of {cfg.max_len:,}"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label:<{width}}  {value}" for label, value in rows)
