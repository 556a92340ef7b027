"""GPT-2's weights in the course's own layers: :func:`from_hf_gpt2`.

Section "Your model is GPT-2" of the chapter "From the paper to a language model"
(``book/lm``). GPT-2 (Radford et al., 2019) is the decoder-only model of that chapter with four
changes, each an option of :class:`~minitransformer.lm.DecoderOnlyTransformer`: learned
positions, the token embedding unscaled, GELU (its tanh approximation) in the feed-forward
layers, and pre-LN with a LayerNorm after the last block. :func:`from_hf_gpt2` builds that
model and copies a Hugging Face ``transformers`` GPT-2 into it, weight by weight
(:func:`gpt2_weight_map` lists the mapping). The package does not import ``transformers``: it
reads what ``save_pretrained`` writes (``config.json`` and ``model.safetensors``) or a
``state_dict`` with its config.

Two layout differences are undone on the way in:

* GPT-2 stores its projections as ``Conv1D`` modules, ``y = x W + b`` with ``W`` of shape
  ``(in, out)``; ``nn.Linear`` (and so this package) stores ``W^T``, ``(out, in)``;
* ``c_attn`` is one fused ``(d_model, 3 d_model)`` projection whose output columns are
  ``[Q | K | V]``; transposed, that is exactly the row blocks ``[W^Q; W^K; W^V]`` of
  :class:`~minitransformer.attention.MultiHeadAttention`'s ``in_proj_weight``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from minitransformer._checks import positive_int
from minitransformer.lm import DecoderOnlyTransformer

__all__ = ["from_hf_gpt2", "gpt2_weight_map", "load_safetensors"]

# transformers' names for GPT-2's activations -> this package's (model.ACTIVATIONS)
_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}

# safetensors' dtype names (https://github.com/huggingface/safetensors, the format's README)
_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


def load_safetensors(path: str | os.PathLike[str]) -> dict[str, Tensor]:
    """The tensors of a ``.safetensors`` file, by name, without the ``safetensors`` package.

    The format: 8 bytes giving the header's length ``n`` (little-endian), ``n`` bytes of JSON
    mapping each name to its ``dtype``, ``shape`` and ``data_offsets`` (``[begin, end)`` in the
    bytes after the header), then the data, little-endian, row-major.
    """
    path = Path(path)
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path} is not a safetensors file: {len(data)} bytes")
    n = int.from_bytes(data[:8], "little")
    try:
        header = json.loads(data[8 : 8 + n])
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a safetensors file: its header is not JSON") from error
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info.get('dtype')!r}, unknown")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if not 0 <= begin <= end <= len(data) - base:
            raise ValueError(f"{path}: tensor {name!r} lies outside the file")
        count = math.prod(shape)
        size = count * torch.empty((), dtype=dtype).element_size()
        if end - begin != size:
            raise ValueError(
                f"{path}: tensor {name!r} has {end - begin} bytes, its shape {shape} needs {size}"
            )
        if count == 0:
            tensors[name] = torch.empty(shape, dtype=dtype)
        else:
            chunk = bytearray(data[base + begin : base + end])  # writable: torch may change it
            tensors[name] = torch.frombuffer(chunk, dtype=dtype).reshape(shape)
    return tensors


def _config_dict(config: object) -> dict[str, Any]:
    """A transformers config (``to_dict()``) or a mapping, as a plain dict."""
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    as_dict = to_dict() if callable(to_dict) else None
    if isinstance(as_dict, Mapping):
        return dict(as_dict)
    raise TypeError(
        f"config must be a mapping or a transformers config, got {type(config).__name__}"
    )


def _model_options(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The :class:`DecoderOnlyTransformer` arguments for a GPT-2 ``config`` (refuses what
    the model cannot express)."""
    model_type = config.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ValueError(f"{where}: model_type must be 'gpt2', got {model_type!r}")
    sizes = {
        "vocab_size": config.get("vocab_size"),
        "n_embd": config.get("n_embd"),
        "n_head": config.get("n_head"),
        "n_layer": config.get("n_layer"),
        "n_positions": config.get("n_positions", config.get("max_position_embeddings", 1024)),
        "n_inner": config.get("n_inner"),  # None: 4 n_embd
    }
    if sizes["n_inner"] is None and isinstance(sizes["n_embd"], int):
        sizes["n_inner"] = 4 * sizes["n_embd"]
    for key, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{where}: {key} must be a positive integer, got {value!r}")
    if sizes["n_embd"] % sizes["n_head"]:
        raise ValueError(f"{where}: n_head={sizes['n_head']} must divide n_embd={sizes['n_embd']}")
    eps = config.get("layer_norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ValueError(f"{where}: layer_norm_epsilon must be in (0, 1), got {eps!r}")
    unsupported = {
        "scale_attn_weights": (True, "scores not divided by sqrt(d_k)"),
        "scale_attn_by_inverse_layer_idx": (False, "scores divided by the layer's index"),
        "add_cross_attention": (False, "cross-attention blocks"),
    }
    for key, (needed, what) in unsupported.items():
        if config.get(key, needed) != needed:
            raise ValueError(f"{where}: {key}={config[key]!r} ({what}) has no counterpart here")
    activation = config.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise ValueError(
            f"{where}: activation_function {activation!r} has no counterpart here "
            f"(known: {', '.join(_ACTIVATIONS)})"
        )
    return {
        "vocab_size": sizes["vocab_size"],
        "d_model": sizes["n_embd"],
        "num_heads": sizes["n_head"],
        "num_layers": sizes["n_layer"],
        "d_ff": sizes["n_inner"],
        "max_len": sizes["n_positions"],
        "dropout": config.get("resid_pdrop", 0.1),
        "tie_embeddings": config.get("tie_word_embeddings", True),
        "norm_first": True,
        "positions": "learned",
        "scale_embedding": False,
        "activation": _ACTIVATIONS[activation],
    }


def gpt2_weight_map(num_layers: int, *, tie_embeddings: bool = True) -> dict[str, str]:
    """GPT-2's ``state_dict`` names (without the ``transformer.`` prefix) -> the names in
    :class:`~minitransformer.lm.DecoderOnlyTransformer`. The ``Conv1D`` weights (``c_attn``,
    ``c_proj``, ``c_fc``) are stored transposed; ``lm_head.weight`` appears only untied."""
    num_layers = positive_int("num_layers", num_layers)
    if not isinstance(tie_embeddings, bool):
        raise TypeError(f"tie_embeddings must be a bool, got {tie_embeddings!r}")
    names = {
        "wte.weight": "embed.weight",
        "wpe.weight": "positional.embedding.weight",
        "ln_f.weight": "decoder.norm.weight",
        "ln_f.bias": "decoder.norm.bias",
    }
    if not tie_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(num_layers):
        theirs, ours = f"h.{i}.", f"decoder.layers.{i}."
        for a, b in [
            ("ln_1", "norm1"),  # before attention
            ("attn.c_attn", "self_attn.in_proj"),  # [W^Q | W^K | W^V], fused
            ("attn.c_proj", "self_attn.w_o"),  # W^O
            ("ln_2", "norm3"),  # before the feed-forward
            ("mlp.c_fc", "feed_forward.linear1"),  # W_1
            ("mlp.c_proj", "feed_forward.linear2"),  # W_2
        ]:
            sep = "_" if b.endswith("in_proj") else "."
            names[theirs + a + ".weight"] = ours + b + sep + "weight"
            names[theirs + a + ".bias"] = ours + b + sep + "bias"
    return names


def _read_source(
    source: object, config: object | None
) -> tuple[dict[str, Tensor], dict[str, Any], str, str]:
    """The ``state_dict``, the config, and names for messages about each, from what
    :func:`from_hf_gpt2` accepts."""
    if isinstance(source, (str, os.PathLike)):
        folder = Path(source)
        config_file, weights = folder / "config.json", folder / "model.safetensors"
        for needed in (config_file, weights):
            if not needed.is_file():
                raise FileNotFoundError(
                    f"{needed} not found: from_hf_gpt2 reads a folder written by "
                    "save_pretrained (config.json and model.safetensors)"
                )
        if config is not None:
            raise ValueError(f"config comes from {config_file}; do not pass one with a folder")
        try:
            config_dict = json.loads(config_file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{config_file} is not valid JSON: {error}") from error
        return load_safetensors(weights), config_dict, str(config_file), str(weights)
    if isinstance(source, nn.Module):  # a transformers model: its weights and its config
        if config is None:
            config = getattr(source, "config", None)
            if config is None:
                raise TypeError(f"source {type(source).__name__} has no config; pass config=")
        name = type(source).__name__
        return dict(source.state_dict()), _config_dict(config), f"{name}.config", name
    if isinstance(source, Mapping):
        if config is None:
            raise TypeError("config is required with a state_dict (the heads are not in it)")
        return dict(source), _config_dict(config), "config", "the state_dict"
    raise TypeError(
        "source must be a folder, a state_dict or a transformers GPT-2 model, "
        f"got {type(source).__name__}"
    )


def from_hf_gpt2(
    source: str | os.PathLike[str] | Mapping[str, Tensor] | nn.Module,
    *,
    config: Mapping[str, Any] | object | None = None,
) -> DecoderOnlyTransformer:
    """A :class:`~minitransformer.lm.DecoderOnlyTransformer` holding a Hugging Face GPT-2.

    ``source``: a folder written by ``save_pretrained`` (``config.json`` and
    ``model.safetensors``), a ``GPT2LMHeadModel`` / ``GPT2Model`` (its ``state_dict`` and
    ``config``), or a ``state_dict`` with ``config`` (a dict or a ``GPT2Config``). Names may
    carry the ``transformer.`` prefix of ``GPT2LMHeadModel``; the causal-mask buffers of old
    checkpoints (``attn.bias``, ``attn.masked_bias``) are skipped. The model comes back in eval
    mode, in the weights' dtype, on the CPU unless the tensors were elsewhere: its logits equal
    GPT-2's (``tests/test_gpt2.py``). Refuses, naming the key, a missing or unexpected weight, a
    wrong shape, and config options the model cannot express.
    """
    state, config_dict, config_where, where = _read_source(source, config)
    options = _model_options(config_dict, config_where)
    state = {k.removeprefix("transformer."): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    if options["tie_embeddings"]:
        state.pop("lm_head.weight", None)  # the same matrix as wte, if saved at all
    names = gpt2_weight_map(options["num_layers"], tie_embeddings=options["tie_embeddings"])
    missing = [k for k in names if k not in state]
    unexpected = [k for k in state if k not in names]
    if missing or unexpected:
        raise ValueError(
            f"{where} is not a GPT-2 with n_layer={options['num_layers']}: "
            f"missing {missing[:4]}{' ...' if len(missing) > 4 else ''}, "
            f"unexpected {unexpected[:4]}{' ...' if len(unexpected) > 4 else ''}"
        )
    for key in names:
        value = state[key]
        if not isinstance(value, Tensor) or not value.is_floating_point():
            kind = value.dtype if isinstance(value, Tensor) else type(value).__name__
            raise TypeError(f"{where}: {key} must be a floating-point tensor, got {kind}")
    wte = state["wte.weight"]
    model = DecoderOnlyTransformer(**options)
    model.to(device=wte.device, dtype=wte.dtype)
    eps = config_dict.get("layer_norm_epsilon", 1e-5)
    for layer in model.modules():
        if isinstance(layer, nn.LayerNorm):
            layer.eps = eps
    ours = model.state_dict()
    with torch.no_grad():
        for theirs, name in names.items():
            weight = state[theirs]
            transposed = name.endswith("in_proj_weight") or (
                name.endswith(".weight") and ("w_o" in name or "linear" in name)
            )
            if transposed:
                weight = weight.t()  # Conv1D (in, out) -> nn.Linear (out, in)
            if weight.shape != ours[name].shape:
                raise ValueError(
                    f"{where}: {theirs} has shape {tuple(state[theirs].shape)}, the config "
                    f"needs {tuple(ours[name].t().shape if transposed else ours[name].shape)}"
                )
            ours[name].copy_(weight)
    return model.eval()
