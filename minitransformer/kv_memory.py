"""How much memory a KV cache needs: the formula, published models' shapes, Hugging Face configs.

Chapter "Inference: the KV cache and the cost of attention" (``book/inference``), section
"Memory". The cache of a decoder keeps one key and one value vector per position, layer and
key/value head:

    bytes = 2 (K and V) x batch_size x seq_len x num_layers x num_kv_heads x head_dim
            x bytes per element.

It counts *key/value* heads, which grouped-query (GQA) and multi-query attention (MQA) make
fewer than the query heads, and it is summed layer by layer: a sliding window caps ``seq_len``
in the layers that use it (all of Mistral's, half of Gemma 2's, five in six of Gemma 3's), and
multi-head latent attention (MLA, DeepSeek-V2/V3) caches one latent vector and one rotary key
per position and layer instead of K and V per head. An encoder-decoder adds the
cross-attention's K/V over the source (``src_len`` positions). A Hugging Face ``config.json``
is read by the rules of its ``model_type``; one the calculator does not know is refused, never
counted as plain multi-head attention.

Plain Python: this module imports no torch, so the command line
(:mod:`minitransformer.kv_cli`) starts in a fraction of a second.
"""

from __future__ import annotations

import json
import math
import numbers
import operator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, SupportsIndex

__all__ = [
    "DTYPE_BYTES",
    "ModelConfig",
    "MODEL_CONFIGS",
    "HF_CONFIGS",
    "HF_MODEL_TYPES",
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
    caps the positions cached by ``num_sliding_layers`` of them (``None``: all; Mistral caps
    every layer, Gemma 2 every other one, Gemma 3 five layers in six). ``max_len`` is the
    model's context length, ``None`` where the model sets none (the paper's sinusoids).
    ``encoder_decoder`` models also cache the cross-attention K/V over the source. ``dtype`` is
    the published dtype, if known.

    ``v_head_dim`` is the size of a value head where it differs from ``head_dim`` (the key
    head). Multi-head latent attention (MLA, DeepSeek-V2/V3) sets ``kv_lora_rank`` and
    ``qk_rope_head_dim``: each layer then caches one latent vector of ``kv_lora_rank`` numbers
    and one shared rotary key of ``qk_rope_head_dim`` per position, for all heads together (no
    factor 2: keys and values are both decompressed from the latent).
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
    v_head_dim: int | None = None
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_heads", "num_kv_heads", "head_dim", "d_model"):
            _size(name, getattr(self, name))
        for name in ("max_len", "sliding_window", "v_head_dim", "kv_lora_rank"):
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
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(
                "kv_lora_rank and qk_rope_head_dim go together (multi-head latent attention), "
                f"got kv_lora_rank={self.kv_lora_rank}, qk_rope_head_dim={self.qk_rope_head_dim}"
            )
        if self.qk_rope_head_dim is not None:
            _size("qk_rope_head_dim", self.qk_rope_head_dim, allow_zero=True)
        if self.kv_lora_rank is not None and self.encoder_decoder:
            raise ValueError("multi-head latent attention is for decoder-only models here")
        if self.dtype is not None and self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {self.dtype!r}")

    def to_dict(self) -> dict[str, Any]:
        """The fields and :attr:`attention`, for JSON."""
        return asdict(self) | {"attention": self.attention}

    @property
    def attention(self) -> str:
        """ "MHA", "GQA", "MQA" (from the number of KV heads) or "MLA" (a latent cache)."""
        if self.kv_lora_rank is not None:
            return "MLA"
        if self.num_kv_heads == self.num_heads:
            return "MHA"
        return "MQA" if self.num_kv_heads == 1 else "GQA"

    @property
    def window_layers(self) -> int:
        """How many layers cache at most ``sliding_window`` positions (0 without a window)."""
        if self.sliding_window is None:
            return 0
        return self.num_layers if self.num_sliding_layers is None else self.num_sliding_layers

    @property
    def elements_per_position(self) -> int:
        """The numbers one layer caches per position, ``num_kv_heads x (head_dim + v_head_dim)``
        (K and V), or for MLA ``kv_lora_rank + qk_rope_head_dim`` (the latent and the rotary
        key, shared by all heads)."""
        if self.kv_lora_rank is not None and self.qk_rope_head_dim is not None:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return self._per_head_elements(self.num_kv_heads)

    def _per_head_elements(self, kv_heads: int) -> int:
        return kv_heads * (self.head_dim + (self.v_head_dim or self.head_dim))

    def bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """KV-cache bytes one position adds (all layers, K and V), before any window caps it."""
        return self._self_attention_bytes(self.elements_per_position, 1, 1, bytes_per_element)

    def cache_bytes(self, seq_len: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
        """Self-attention KV-cache bytes for ``batch_size`` sequences of ``seq_len`` positions.

        The layers with a sliding window keep only its last ``sliding_window`` positions.
        """
        return self._self_attention_bytes(
            self.elements_per_position, seq_len, batch_size, bytes_per_element
        )

    def mha_cache_bytes(self, seq_len: int, batch_size: int = 1, bytes_per_element: int = 2) -> int:
        """The same cache if every query head had its own K and V (no GQA/MQA; for MLA the
        decompressed per-head keys and values)."""
        return self._self_attention_bytes(
            self._per_head_elements(self.num_heads), seq_len, batch_size, bytes_per_element
        )

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
        self, per_position: int, seq_len: int, batch_size: int, bytes_per_element: int
    ) -> int:
        """Sum over the layers of positions kept x ``per_position`` numbers x bytes."""
        _size("seq_len", seq_len, allow_zero=True)
        _size("batch_size", batch_size)
        _size("bytes_per_element", bytes_per_element)
        windowed = self.window_layers
        kept = seq_len if self.sliding_window is None else min(seq_len, self.sliding_window)
        layer_positions = (self.num_layers - windowed) * seq_len + windowed * kept
        return layer_positions * per_position * batch_size * bytes_per_element

    @classmethod
    def from_hf_config(
        cls, config: str | Path | dict[str, Any], *, name: str | None = None
    ) -> ModelConfig:
        """The attention shape in a Hugging Face ``config.json`` (a path, its folder, or the
        parsed dict), read by the rules of its ``model_type`` (:data:`HF_MODEL_TYPES`).

        Per-layer shapes are read as the model uses them: an explicit ``head_dim``; sliding
        windows in every layer (Mistral, Phi-3), in the layers ``layer_types`` names (or, without
        it, every other layer for Gemma 2, five in six for Gemma 3's ``sliding_window_pattern``,
        the layers from ``max_window_layers`` on for Qwen2 with ``use_sliding_window``); the
        latent cache of multi-head latent attention (DeepSeek-V2/V3); the language model in
        ``text_config`` (Gemma 3); fields a config leaves out take the defaults of the
        ``transformers`` class of that type. ``torch_dtype`` ``"auto"`` counts as no dtype.
        T5 counts the *decoder* layers (``num_decoder_layers``, else ``num_layers``) and adds the
        cross-attention K/V over the source (:meth:`cross_cache_bytes`).

        Raises:
            ValueError: for a file that is not a JSON object, a missing or invalid field, or a
                ``model_type`` or attention variant the calculator does not know (it never
                counts plain multi-head attention for a model that is not one); the message
                names the field and the file, and says what the calculator would need.
        """
        if isinstance(config, dict):
            named = config.get("_name_or_path")
            fields, where = (
                config,
                f"{named} config.json" if isinstance(named, str) else "the config",
            )
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
        top = fields
        model_type = fields.get("model_type")
        if model_type in _MULTIMODAL:  # the language model's fields are in text_config
            text = fields.get("text_config")
            if not isinstance(text, dict):
                raise ValueError(
                    f"{where}: model_type {model_type!r} keeps its language model in "
                    f"text_config, got {text!r}"
                )
            fields = {"model_type": _MULTIMODAL[model_type]} | text
            model_type = fields["model_type"]
        family = _family(model_type, where)
        hf = _HFFields(
            fields | {k: v for k, v in family.defaults.items() if k not in fields}, where
        )

        layers = hf.size("number of layers", _LAYER_FIELDS)
        heads = hf.size("number of attention heads", _HEAD_FIELDS)
        kv_heads = family.kv_heads(hf, heads)
        d_model = hf.optional_size(_HIDDEN_FIELDS)
        head_dim = hf.optional_size(_HEAD_DIM_FIELDS)
        v_head_dim = kv_lora_rank = qk_rope = None
        if family.latent:  # MLA: per-head keys of qk_nope + qk_rope, values of v_head_dim
            kv_lora_rank = hf.size("latent size", ("kv_lora_rank",))
            qk_rope = hf.size("rotary key size", ("qk_rope_head_dim",))
            head_dim = hf.size("key head size", ("qk_nope_head_dim",)) + qk_rope
            v_head_dim = hf.size("value head size", ("v_head_dim",))
        if head_dim is None:  # Llama, Mistral and GPT-2 define it as d_model / heads
            if d_model is None:
                raise hf.missing("head dimension or hidden size", _HEAD_DIM_FIELDS + _HIDDEN_FIELDS)
            if d_model % heads:
                raise ValueError(
                    f"{where}: the hidden size {d_model} is not divisible by the "
                    f"{heads} attention heads; give head_dim"
                )
            head_dim = d_model // heads

        window, windowed = family.window(hf, layers)
        if windowed == 0:
            window = windowed = None
        elif windowed == layers:
            windowed = None  # None: all of them

        max_len = hf.optional_size(_CONTEXT_FIELDS)
        dtype = hf.dtype() or _HFFields(top, where).dtype()
        try:  # the shape checks of ModelConfig itself (KV heads that do not divide the heads)
            return cls(
                name=name or str(top.get("_name_or_path") or top.get("model_type") or "unnamed"),
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=kv_heads,
                head_dim=head_dim,
                d_model=d_model if d_model is not None else heads * head_dim,
                max_len=max_len,
                source=where,
                sliding_window=window,
                num_sliding_layers=windowed,
                encoder_decoder=family.encoder_decoder,
                dtype=dtype,
                v_head_dim=v_head_dim,
                kv_lora_rank=kv_lora_rank,
                qk_rope_head_dim=qk_rope,
            )
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None


# config.json field names, in the order they are tried. Decoder layers first: they keep the
# cache (T5: num_decoder_layers, which defaults to num_layers).
_LAYER_FIELDS = ("num_decoder_layers", "num_hidden_layers", "n_layer", "num_layers")
_HEAD_FIELDS = ("num_attention_heads", "n_head", "num_heads")
_KV_HEAD_FIELDS = ("num_key_value_heads", "num_kv_heads")
_HIDDEN_FIELDS = ("hidden_size", "n_embd", "d_model")
_HEAD_DIM_FIELDS = ("head_dim", "d_kv")
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions")
_LAYER_KINDS = ("full_attention", "sliding_attention")


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

    def layer_types(self, num_layers: int) -> int | None:
        """How many layers ``layer_types`` marks "sliding_attention" (None without the field);
        a layer kind other than full or sliding attention is refused."""
        layer_types = self.fields.get("layer_types")
        if layer_types is None:
            return None
        if not isinstance(layer_types, list) or len(layer_types) != num_layers:
            raise ValueError(
                f"{self.where}: layer_types must list the {num_layers} layers, got {layer_types!r}"
            )
        unknown = sorted({str(kind) for kind in layer_types} - set(_LAYER_KINDS))
        if unknown:
            raise ValueError(
                f"{self.where}: layer_types holds {', '.join(map(repr, unknown))}; the "
                f"calculator knows only {' and '.join(_LAYER_KINDS)} layers and would need "
                "the cache shape of the others"
            )
        return layer_types.count("sliding_attention")

    def dtype(self) -> str | None:
        for key in ("torch_dtype", "dtype"):
            value = self.fields.get(key)
            if value == "auto":  # "whatever the weights are stored in": not a dtype
                return None
            if value is not None:
                if value not in DTYPE_BYTES:
                    raise ValueError(
                        f"{self.where}: {key} must be one of "
                        f"{', '.join(DTYPE_BYTES)}, got {value!r}"
                    )
                return str(value)
        return None


def _heads_or_default(hf: _HFFields, heads: int) -> int:
    """``num_key_value_heads`` (or ``num_kv_heads``), else one per query head (MHA)."""
    kv_heads = hf.optional_size(_KV_HEAD_FIELDS)
    return heads if kv_heads is None else kv_heads


def _multi_query(hf: _HFFields, heads: int) -> int:
    """GPT-BigCode: one KV head when ``multi_query`` (its default), else one per query head."""
    return 1 if hf.fields.get("multi_query", True) is True else heads


def _falcon_heads(hf: _HFFields, heads: int) -> int:
    """Falcon: ``num_kv_heads`` with ``new_decoder_architecture`` (40B), else one KV head when
    ``multi_query`` (its default, 7B), else one per query head."""
    if hf.fields.get("new_decoder_architecture") is True:
        return _heads_or_default(hf, heads)
    return _multi_query(hf, heads)


def _no_window(hf: _HFFields, num_layers: int) -> tuple[int | None, int | None]:
    return None, None


def _window_everywhere(hf: _HFFields, num_layers: int) -> tuple[int | None, int | None]:
    """Mistral, Mixtral, Phi-3: ``sliding_window`` (if not null) caps every layer."""
    window = hf.optional_size(("sliding_window",))
    return window, (None if window is None else num_layers)


def _qwen2_window(hf: _HFFields, num_layers: int) -> tuple[int | None, int | None]:
    """Qwen2: only with ``use_sliding_window``, in the layers ``layer_types`` names, else in
    those from ``max_window_layers`` on (Qwen2.5 ships a window it switches off)."""
    if hf.fields.get("use_sliding_window") is not True:
        return None, None
    window = hf.optional_size(("sliding_window",))
    if window is None:
        return None, None
    typed = hf.layer_types(num_layers)
    if typed is not None:
        return window, typed
    first = hf.size("first sliding-window layer", ("max_window_layers",))
    return window, max(num_layers - first, 0)


def _pattern_window(period: int | None) -> Any:
    """Gemma 2 (``period`` 2) and Gemma 3 (``sliding_window_pattern``, default 6): layer ``i``
    is global when ``(i + 1) % period == 0`` and local (windowed) otherwise, unless
    ``layer_types`` says which."""

    def window(hf: _HFFields, num_layers: int) -> tuple[int | None, int | None]:
        size = hf.optional_size(("sliding_window",))
        if size is None:
            return None, None
        typed = hf.layer_types(num_layers)
        if typed is not None:
            return size, typed
        every = period or hf.size("sliding-window pattern", ("sliding_window_pattern",))
        return size, num_layers - num_layers // every

    return window


@dataclass(frozen=True)
class _Family:
    """How one ``model_type`` lays out its cache: where its KV heads and windows come from,
    and the defaults of its ``transformers`` config class for fields a file leaves out."""

    kv_heads: Any = _heads_or_default
    window: Any = _no_window
    defaults: dict[str, Any] = field(default_factory=dict)
    latent: bool = False
    encoder_decoder: bool = False


_MLA_DEFAULTS = {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128}

# The rules of each model_type that ModelConfig.from_hf_config reads; any other is refused.
# Defaults are those of the transformers config classes.
_FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "gpt2": _Family(),
    "gpt_bigcode": _Family(kv_heads=_multi_query),
    "falcon": _Family(kv_heads=_falcon_heads),
    "mistral": _Family(
        window=_window_everywhere, defaults={"num_key_value_heads": 8, "sliding_window": 4096}
    ),
    "mixtral": _Family(
        window=_window_everywhere, defaults={"num_key_value_heads": 8, "sliding_window": None}
    ),
    "phi3": _Family(window=_window_everywhere),
    "qwen2": _Family(
        window=_qwen2_window,
        defaults={"num_key_value_heads": 32, "sliding_window": 4096, "max_window_layers": 28},
    ),
    "gemma": _Family(defaults={"head_dim": 256, "num_key_value_heads": 16}),
    "gemma2": _Family(
        window=_pattern_window(2),
        defaults={"head_dim": 256, "num_key_value_heads": 4, "sliding_window": 4096},
    ),
    "gemma3_text": _Family(
        window=_pattern_window(None),
        defaults={
            "head_dim": 256,
            "num_key_value_heads": 4,
            "sliding_window": 4096,
            "sliding_window_pattern": 6,
            "max_position_embeddings": 131_072,
        },
    ),
    "deepseek_v2": _Family(latent=True, defaults=_MLA_DEFAULTS | {"v_head_dim": 128}),
    "deepseek_v3": _Family(latent=True, defaults=_MLA_DEFAULTS | {"v_head_dim": 128}),
    "t5": _Family(encoder_decoder=True, defaults={"d_kv": 64}),
    "mt5": _Family(encoder_decoder=True, defaults={"d_kv": 64}),
}
#: The ``model_type`` values :meth:`ModelConfig.from_hf_config` reads, each by its own rules
#: (and the defaults of its ``transformers`` config class); any other is refused.
HF_MODEL_TYPES: tuple[str, ...] = tuple(sorted(_FAMILIES))
# Multimodal configs whose language model sits in text_config, and that model's type.
_MULTIMODAL = {"gemma3": "gemma3_text"}


def _family(model_type: object, where: str) -> _Family:
    """The rules for ``model_type``, or a ValueError saying what the calculator would need."""
    if isinstance(model_type, str) and model_type in _FAMILIES:
        return _FAMILIES[model_type]
    known = ", ".join(sorted([*_FAMILIES, *_MULTIMODAL]))
    got = "no model_type" if model_type is None else f"model_type {model_type!r}"
    raise ValueError(
        f"{where}: {got}, which the calculator does not know, so it cannot say what the "
        "model caches (sliding windows, latent attention, shared or missing KV layers change "
        f"it); it reads the model types {known}. For another model, give its cache shape "
        "(--layers, --kv-heads, --head-dim) if every layer caches plain K and V of all "
        "positions"
    )


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


#: The attention fields of the ``config.json`` published with the weights of current models, by
#: Hub name, as :meth:`ModelConfig.from_hf_config` reads them: the command line takes these
#: names too. They cover the per-layer shapes: an explicit ``head_dim`` (Gemma), sliding windows
#: in every layer (Mistral, Phi-3) or in a pattern of layers (Gemma 2 and 3), a window switched
#: off (Qwen2.5), a nested ``text_config`` (Gemma 3), multi-head latent attention (DeepSeek-V3)
#: and an encoder-decoder (T5). Fields that do not shape the cache are left out.
HF_CONFIGS: dict[str, dict[str, Any]] = {
    "meta-llama/Meta-Llama-3-8B": {
        "_name_or_path": "meta-llama/Meta-Llama-3-8B",
        "hidden_size": 4096,
        "max_position_embeddings": 8192,
        "model_type": "llama",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "torch_dtype": "bfloat16",
    },
    "mistralai/Mistral-7B-v0.1": {
        "_name_or_path": "mistralai/Mistral-7B-v0.1",
        "hidden_size": 4096,
        "max_position_embeddings": 32768,
        "model_type": "mistral",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "torch_dtype": "bfloat16",
    },
    "Qwen/Qwen2.5-7B": {
        "_name_or_path": "Qwen/Qwen2.5-7B",
        "hidden_size": 3584,
        "max_position_embeddings": 131072,
        "max_window_layers": 28,
        "model_type": "qwen2",
        "num_attention_heads": 28,
        "num_hidden_layers": 28,
        "num_key_value_heads": 4,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "torch_dtype": "bfloat16",
    },
    "google/gemma-2-9b": {
        "_name_or_path": "google/gemma-2-9b",
        "head_dim": 256,
        "hidden_size": 3584,
        "max_position_embeddings": 8192,
        "model_type": "gemma2",
        "num_attention_heads": 16,
        "num_hidden_layers": 42,
        "num_key_value_heads": 8,
        "sliding_window": 4096,
        "torch_dtype": "float32",
    },
    "google/gemma-3-27b-it": {
        "_name_or_path": "google/gemma-3-27b-it",
        "model_type": "gemma3",
        "text_config": {
            "head_dim": 128,
            "hidden_size": 5376,
            "model_type": "gemma3_text",
            "num_attention_heads": 32,
            "num_hidden_layers": 62,
            "num_key_value_heads": 16,
            "sliding_window": 1024,
        },
        "torch_dtype": "bfloat16",
    },
    "deepseek-ai/DeepSeek-V3": {
        "_name_or_path": "deepseek-ai/DeepSeek-V3",
        "hidden_size": 7168,
        "kv_lora_rank": 512,
        "max_position_embeddings": 163840,
        "model_type": "deepseek_v3",
        "num_attention_heads": 128,
        "num_hidden_layers": 61,
        "num_key_value_heads": 128,
        "num_nextn_predict_layers": 1,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "torch_dtype": "bfloat16",
        "v_head_dim": 128,
    },
    "microsoft/Phi-3-mini-4k-instruct": {
        "_name_or_path": "microsoft/Phi-3-mini-4k-instruct",
        "hidden_size": 3072,
        "max_position_embeddings": 4096,
        "model_type": "phi3",
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 32,
        "sliding_window": 2047,
        "torch_dtype": "bfloat16",
    },
    "google-t5/t5-small": {
        "_name_or_path": "google-t5/t5-small",
        "d_kv": 64,
        "d_model": 512,
        "is_encoder_decoder": True,
        "model_type": "t5",
        "n_positions": 512,
        "num_heads": 8,
        "num_layers": 6,
    },
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
    dtype: str | None = None,
    *,
    src_len: int | None = None,
) -> dict[str, Any]:
    """The calculator's numbers for one model, as a JSON-ready dict (``--json`` prints it).

    Bytes of the self-attention cache per token, per sequence of ``seq_len`` positions and per
    batch; what it would be without GQA/MQA (for MLA: with per-head K and V); for an
    encoder-decoder the cross-attention over ``src_len`` source positions (default:
    ``seq_len``) and the total. ``dtype`` defaults to the config's, else bf16;
    ``dtype_source`` says which ("argument", "config" or "default").
    """
    source = "argument" if dtype is not None else "config" if cfg.dtype else "default"
    dtype = dtype or cfg.dtype or "bf16"
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
        "dtype_source": source,
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
    dtype: str | None = None,
    *,
    src_len: int | None = None,
) -> str:
    """The numbers of :func:`estimate` as a table with units (what the command line prints)."""
    est = estimate(cfg, seq_len, batch_size, dtype, src_len=src_len)
    bpe, dtype = est["bytes_per_element"], est["dtype"]
    dtype_note = {
        "argument": "",
        "config": ", the config's",
        "default": "; the default: the model names no dtype, pass --dtype",
    }[est["dtype_source"]]
    if cfg.kv_lora_rank is not None:
        shape = (
            f"{cfg.num_layers} x ({cfg.kv_lora_rank} latent + {cfg.qk_rope_head_dim} rotary "
            f"key) (MLA: shared by the {cfg.num_heads} query heads, no separate K and V)"
        )
    else:
        value = "" if cfg.v_head_dim in (None, cfg.head_dim) else f" (values {cfg.v_head_dim})"
        shape = (
            f"{cfg.num_layers} x {cfg.num_kv_heads} x {cfg.head_dim}{value} "
            f"({cfg.attention}, {cfg.num_heads} query heads)"
        )

    def size(n: int) -> str:
        return f"{n:,} bytes ({format_bytes(n)})"

    rows = [
        ("model", f"{cfg.name} ({cfg.source})"),
        (
            "layers x (latent + rotary key)"
            if cfg.kv_lora_rank is not None
            else "layers x KV heads x head_dim",
            shape,
        ),
        ("dtype", f"{dtype} ({bpe} byte{'s' if bpe > 1 else ''} per element{dtype_note})"),
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
    if cfg.kv_lora_rank is not None:
        mha = est["mha_bytes_per_batch"]
        rows.append(
            (
                "MLA saving",
                f"{mha / est['bytes_per_batch']:.1f}x: per-head K ({cfg.head_dim}) and V "
                f"({cfg.v_head_dim}) for all {cfg.num_heads} heads would need "
                f"{format_bytes(mha)}",
            )
        )
    elif cfg.num_kv_heads != cfg.num_heads:
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
