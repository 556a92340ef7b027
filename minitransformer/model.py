"""The encoder–decoder Transformer of "Attention Is All You Need", batch-first.

Chapter "The encoder–decoder picture" (``book/encoder_decoder``); trained in "Training a
Transformer" (``book/training``). Read top to bottom: :class:`FeedForward`,
:class:`EncoderLayer`, :class:`DecoderLayer`, the :class:`Encoder` and :class:`Decoder`
stacks, and the :class:`Transformer`; :func:`parameter_breakdown` counts parameters as the
paper's Table 3 does, and :func:`table3_configs` lists that table's model sizes.

Shapes: ``B`` batch, ``S`` source length, ``T`` target length, ``h`` heads, ``V`` vocabulary.
Masks are boolean, True = may attend (``torch.nn.Transformer*`` uses the opposite):

* ``src_mask`` ``(B, 1, 1, S)`` or ``(1, 1, 1, S)`` hides source padding, in the encoder's
  self-attention and the decoder's cross-attention;
* ``tgt_mask``, the decoder's self-attention mask: ``(T, T)``, ``(B, 1, T, T)``,
  ``(B, 1, 1, T)`` or ``(B, h, T, T)`` (with a KV cache the last size is cache length + T).

Sub-layers (section "The sub-layer recipe"): post-LN (``norm_first=False``, the paper)
computes ``LayerNorm(x + Dropout(Sublayer(x)))``; pre-LN ``x + Dropout(Sublayer(LayerNorm(x)))``,
and the stack then ends with one more LayerNorm.

Attention weights are kept only when asked: :meth:`Transformer.attention_weights` runs a
pass that records them, or set a layer's ``store_weights``. Otherwise attention runs PyTorch's
fused kernel, which never materialises them.

Cached decoding of one token at a time (chapter "Inference") takes a fast path from the second
step on: ``Decoder._step_plan`` says when and why, ``_layer_step`` is the same layer written
with ``torch.nn.functional`` calls; over the parameters it gives the same logits, bit for bit,
and without autograd it reads the wider weights from copies laid out for one-row products
(``Decoder.pack_weights``; the same logits up to rounding).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer._checks import ids, positive_int, probability, tensor
from minitransformer._layout import step_weight
from minitransformer.attention import (
    MultiHeadAttention,
    _attention_step,
    _AttentionStep,
    causal_mask,
    check_mask,
)
from minitransformer.kv_cache import AttentionCache, KVCache, LayerCache
from minitransformer.positional import PositionalEncoding

__all__ = [
    "ACTIVATIONS",
    "FeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "Transformer",
    "parameter_breakdown",
    "table3_configs",
]


def _keep(layer: nn.Module, name: str, weights: Tensor | None) -> None:
    """Store the detached attention ``weights`` on ``layer`` (only set when there is
    something to change: an nn.Module attribute write costs microseconds)."""
    if weights is not None or getattr(layer, name) is not None:
        setattr(layer, name, None if weights is None else weights.detach())


def _check_stream(name: str, x: Tensor, d_model: int, what: str) -> None:
    """``x`` must be a float ``(B, L, d_model)`` tensor (``what`` names the shape)."""
    tensor(name, x, kind="float")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"{name} must have shape {what} with d_model={d_model}, got {tuple(x.shape)}"
        )


ACTIVATIONS = ("relu", "gelu", "gelu_tanh")
"""The names of the feed-forward activations. ``"relu"`` is the paper's, ``"gelu"`` the exact
GELU (with the normal CDF), ``"gelu_tanh"`` GELU's tanh approximation, which GPT-2 uses
(``transformers`` calls it ``gelu_new``)."""


def _activation(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(ACTIVATIONS)}; got {value!r}")
    if value not in ACTIVATIONS:
        raise ValueError(f"{name} must be one of {', '.join(ACTIVATIONS)}, got {value!r}")
    return value


def _activate(activation: str, hidden: Tensor) -> Tensor:
    """The activation on ``hidden``; ReLU in place (no second ``d_ff`` tensor)."""
    if activation == "relu":
        return torch.relu_(hidden)
    return F.gelu(hidden, approximate="tanh" if activation == "gelu_tanh" else "none")


class FeedForward(nn.Module):
    """``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2`` at every position: ``(B, L, d_model) ->
    (B, L, d_model)`` through width ``d_ff``; dropout on the hidden activations, as in
    :class:`torch.nn.TransformerEncoderLayer`. ``activation``: one of :data:`ACTIVATIONS` in
    place of the paper's ``max(0, .)``."""

    def __init__(
        self, d_model: int, d_ff: int, *, dropout: float = 0.1, activation: str = "relu"
    ) -> None:
        super().__init__()
        self.activation = _activation("activation", activation)
        self.linear1 = nn.Linear(positive_int("d_model", d_model), positive_int("d_ff", d_ff))
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(probability("dropout", dropout))

    def forward(self, x: Tensor) -> Tensor:
        _check_stream("x", x, self.linear1.in_features, "(B, L, d_model)")
        hidden = _activate(self.activation, self.linear1(x))  # (B, L, d_ff)
        if self.training:  # dropout acts in training only: no call otherwise
            hidden = self.dropout(hidden)
        return self.linear2(hidden)  # (B, L, d_model)


class EncoderLayer(nn.Module):
    """Self-attention, then the FFN, each with residual and LayerNorm (section "The sub-layer
    recipe"): ``(B, S, d_model) -> (B, S, d_model)``.

    With ``store_weights = True`` a forward pass keeps the detached attention weights in
    ``self_attn_weights`` ``(B, h, S, S)``; otherwise that is None.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        norm_first: bool = False,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.d_model, self.norm_first = d_model, norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, head_dim=head_dim)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)  # on each sub-layer's output, before the residual add
        self.dropout2 = nn.Dropout(dropout)
        self.store_weights = False
        self.self_attn_weights: Tensor | None = None

    def forward(self, x: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``x`` ``(B, S, d_model)``; ``src_mask`` ``(B, 1, 1, S)`` or ``(1, 1, 1, S)``."""
        self._check_inputs(x, src_mask)
        return self._forward(x, src_mask)

    def _check_inputs(self, x: Tensor, src_mask: Tensor | None) -> None:
        _check_stream("x", x, self.d_model, "(B, S, d_model)")
        check_mask("src_mask", src_mask, (x.shape[0], 1, 1, x.shape[1]), allow_2d=False)

    def _forward(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        """:meth:`forward` on checked inputs (the :class:`Encoder` checks once for all layers)."""
        if self.norm_first:  # pre-LN: x + Sublayer(LayerNorm(x))
            x = x + self._self_attention(self.norm1(x), src_mask)
            x = x + self._feed_forward(self.norm2(x))
        else:  # post-LN (the paper): LayerNorm(x + Sublayer(x))
            x = self.norm1(x + self._self_attention(x, src_mask))
            x = self.norm2(x + self._feed_forward(x))
        return x

    def _self_attention(self, x: Tensor, src_mask: Tensor | None) -> Tensor:
        out, weights = self.self_attn(x, x, x, src_mask, need_weights=self.store_weights)
        _keep(self, "self_attn_weights", weights)  # (B, h, S, S)
        return self.dropout1(out) if self.training else out

    def _feed_forward(self, x: Tensor) -> Tensor:
        out = self.feed_forward(x)
        return self.dropout2(out) if self.training else out

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """A copy of a :class:`torch.nn.TransformerEncoderLayer` (``batch_first=True``, ReLU):
        sizes, dropout, LayerNorm epsilon, ``norm_first``, dtype and device."""
        _check_torch_layer(layer, nn.TransformerEncoderLayer, "EncoderLayer")
        ours = cls(
            layer.linear1.in_features,
            layer.self_attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
        )
        ours.to(layer.linear1.weight.device, layer.linear1.weight.dtype)  # then copy: exact
        ours.self_attn._copy_torch_weights(layer.self_attn)
        _copy_modules(
            [
                (ours.feed_forward.linear1, layer.linear1),
                (ours.feed_forward.linear2, layer.linear2),
                (ours.norm1, layer.norm1),
                (ours.norm2, layer.norm2),
            ]
        )
        return ours.train(layer.training)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention to the encoder output, FFN (section "The
    sub-layer recipe"): ``x`` ``(B, T, d_model)`` and ``memory`` ``(B, S, d_model)`` to
    ``(B, T, d_model)``.

    ``cross_attention=False`` drops the cross-attention sub-layer (and ``norm2``,
    ``dropout2``): the layer of a decoder-only model, called with ``memory=None``.
    ``activation``: the feed-forward's, as in :class:`FeedForward`. With
    ``store_weights = True`` a forward pass keeps the detached ``self_attn_weights``
    ``(B, h, T, T)`` and ``cross_attn_weights`` ``(B, h, T, S)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        norm_first: bool = False,
        cross_attention: bool = True,
        head_dim: int | None = None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.d_model, self.norm_first = d_model, norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, head_dim=head_dim)
        self.cross_attn = (
            MultiHeadAttention(d_model, num_heads, dropout=dropout, head_dim=head_dim)
            if cross_attention
            else None
        )
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, activation=activation)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model) if cross_attention else None
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout) if cross_attention else None
        self.dropout3 = nn.Dropout(dropout)
        self.store_weights = False
        self.self_attn_weights: Tensor | None = None
        self.cross_attn_weights: Tensor | None = None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``tgt_mask`` must contain the causal mask (the layer adds none). With a
        :class:`~minitransformer.kv_cache.LayerCache` (chapter "Inference"), ``x`` holds only
        the new positions; ``tgt_mask``'s last size is then cache length + T."""
        self._check_inputs(x, memory, src_mask, tgt_mask, cache)
        return self._forward(x, memory, src_mask, tgt_mask, cache)

    def _forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: LayerCache | None,
    ) -> Tensor:
        """:meth:`forward` on checked inputs (the :class:`Decoder` checks once for all layers)."""
        norm2 = self.norm2  # None in a decoder-only layer (then memory is None too)
        if self.norm_first:  # pre-LN
            x = x + self._self_attention(self.norm1(x), tgt_mask, cache)
            if norm2 is not None and memory is not None:
                x = x + self._cross_attention(norm2(x), memory, src_mask, cache)
            x = x + self._feed_forward(self.norm3(x))
        else:  # post-LN (the paper)
            x = self.norm1(x + self._self_attention(x, tgt_mask, cache))
            if norm2 is not None and memory is not None:
                x = norm2(x + self._cross_attention(x, memory, src_mask, cache))
            x = self.norm3(x + self._feed_forward(x))
        return x

    def _self_attention(
        self, x: Tensor, tgt_mask: Tensor | None, cache: LayerCache | None
    ) -> Tensor:
        out, weights = self.self_attn(
            x,
            x,
            x,
            tgt_mask,
            need_weights=self.store_weights,
            cache=None if cache is None else cache.self_attn,
        )
        _keep(self, "self_attn_weights", weights)  # (B, h, T, T)
        return self.dropout1(out) if self.training else out

    def _cross_attention(
        self, x: Tensor, memory: Tensor, src_mask: Tensor | None, cache: LayerCache | None
    ) -> Tensor:
        # Queries come from the decoder, keys and values from the encoder output.
        assert self.cross_attn is not None and self.dropout2 is not None  # _forward checked
        out, weights = self.cross_attn(
            x,
            memory,
            memory,
            src_mask,
            need_weights=self.store_weights,
            cache=None if cache is None else cache.cross_attn,
        )
        _keep(self, "cross_attn_weights", weights)  # (B, h, T, S)
        return self.dropout2(out) if self.training else out

    def _feed_forward(self, x: Tensor) -> Tensor:
        out = self.feed_forward(x)
        return self.dropout3(out) if self.training else out

    def _step_weights(self, packed: bool) -> _LayerStep:
        """What :func:`_layer_step` reads for this layer, gathered once per decoding run
        (``Decoder._step_plan``); ``packed``: the products read
        :func:`~minitransformer._layout.step_weight`'s copies of the weights."""
        ffn, norm2, cross = self.feed_forward, self.norm2, self.cross_attn
        w1, w2 = ffn.linear1.weight, ffn.linear2.weight
        if packed:
            w1, w2 = step_weight(w1), step_weight(w2)
        return _LayerStep(
            self.norm_first,
            _norm_step(self.norm1),
            self.self_attn._step_weights(packed=packed, cross=False),
            None
            if cross is None or norm2 is None
            else (cross._step_weights(packed=packed, cross=True), _norm_step(norm2)),
            _norm_step(self.norm3),
            (w1, ffn.linear1.bias, w2, ffn.linear2.bias, ffn.activation),
        )

    def _check_inputs(
        self,
        x: Tensor,
        memory: Tensor | None,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: LayerCache | None,
    ) -> None:
        _check_stream("x", x, self.d_model, "(B, T, d_model)")
        B, T = x.shape[:2]
        if cache is not None and not isinstance(cache, LayerCache):
            raise TypeError(f"cache must be a LayerCache, got {type(cache).__name__}")
        length = T if cache is None else cache.self_attn.length + T
        check_mask("tgt_mask", tgt_mask, (B, self.self_attn.num_heads, T, length))
        if (memory is None) != (self.cross_attn is None):
            raise ValueError(
                "memory must be given exactly when the layer has cross-attention "
                f"(cross_attention={self.cross_attn is not None}), got "
                f"{'None' if memory is None else tuple(memory.shape)}"
            )
        if memory is not None:
            _check_stream("memory", memory, self.d_model, "(B, S, d_model)")
            if memory.shape[0] != B:
                raise ValueError(
                    f"batch sizes differ: x {tuple(x.shape)} vs memory {tuple(memory.shape)}"
                )
            check_mask("src_mask", src_mask, (B, 1, 1, memory.shape[1]), allow_2d=False)
            if cache is not None and cache.cross_attn is None:
                raise ValueError("the cache has no cross-attention entry (decoder-only cache)")

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """A copy of a :class:`torch.nn.TransformerDecoderLayer` (``batch_first=True``, ReLU):
        sizes, dropout, LayerNorm epsilon, ``norm_first``, dtype and device."""
        _check_torch_layer(layer, nn.TransformerDecoderLayer, "DecoderLayer")
        ours = cls(
            layer.linear1.in_features,
            layer.self_attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
        )
        ours.to(layer.linear1.weight.device, layer.linear1.weight.dtype)  # then copy: exact
        assert ours.cross_attn is not None and ours.norm2 is not None  # built with cross-attention
        ours.self_attn._copy_torch_weights(layer.self_attn)
        ours.cross_attn._copy_torch_weights(layer.multihead_attn)
        _copy_modules(
            [
                (ours.feed_forward.linear1, layer.linear1),
                (ours.feed_forward.linear2, layer.linear2),
                (ours.norm1, layer.norm1),
                (ours.norm2, layer.norm2),
                (ours.norm3, layer.norm3),
            ]
        )
        return ours.train(layer.training)


_Norm = tuple[list[int], Tensor | None, Tensor | None, float]  # F.layer_norm's arguments


def _norm_step(norm: nn.LayerNorm) -> _Norm:
    """What ``norm(x)`` passes to ``F.layer_norm``, for the fast step."""
    return list(norm.normalized_shape), norm.weight, norm.bias, norm.eps


class _LayerStep(NamedTuple):
    """The tensors a :class:`DecoderLayer` 's fast step reads, gathered once per decoding run
    (``Decoder._step_plan``), so that a step looks up no module attributes."""

    norm_first: bool
    norm1: _Norm
    self_attn: _AttentionStep
    cross: tuple[_AttentionStep, _Norm] | None  # cross-attention and norm2; None: decoder-only
    norm3: _Norm
    ffn: tuple[Tensor, Tensor | None, Tensor, Tensor | None, str]  # W_1, b_1, W_2, b_2, act.


class _StepPlan(NamedTuple):
    """A decoding run's fast path: what each layer's step reads, and the final LayerNorm's
    arguments (``Decoder._step_plan`` builds it on the run's first fast step and keeps it in
    the run's :class:`~minitransformer.kv_cache.KVCache`)."""

    layers: list[_LayerStep]  # empty when the fast path does not apply (rotary)
    norm: _Norm | None
    packed: bool  # the products read step_weight's copies
    dtype: torch.dtype  # the weights'
    rotary: bool  # some layer rotates queries and keys: the module path, every step


def _layer_step(
    p: _LayerStep, x: Tensor, memory: Tensor | None, src_mask: Tensor | None, cache: LayerCache
) -> Tensor:
    """:meth:`DecoderLayer.forward` for one new position ``x`` ``(B, 1, d_model)`` with a cache,
    in eval mode: the same sub-layers in the same order, written with ``torch.nn.functional``
    over the tensors of ``p`` (``Decoder._step_plan`` says when and why)."""
    ln = F.layer_norm
    cross = None if memory is None else p.cross  # None in a decoder-only layer
    cross_cache = cast(AttentionCache, cache.cross_attn)  # the decoder checked it is there
    if p.norm_first:  # pre-LN: x + Sublayer(LayerNorm(x))
        x = x + _attention_step(p.self_attn, ln(x, *p.norm1), cache.self_attn)
        if cross is not None:
            x = x + _attention_step(cross[0], ln(x, *cross[1]), cross_cache, memory, src_mask)
        x = x + _ffn_step(p.ffn, ln(x, *p.norm3))
    else:  # post-LN (the paper): LayerNorm(x + Sublayer(x))
        x = ln(x + _attention_step(p.self_attn, x, cache.self_attn), *p.norm1)
        if cross is not None:
            x = ln(x + _attention_step(cross[0], x, cross_cache, memory, src_mask), *cross[1])
        x = ln(x + _ffn_step(p.ffn, x), *p.norm3)
    return x  # (B, 1, d_model)


def _ffn_step(ffn: tuple[Tensor, Tensor | None, Tensor, Tensor | None, str], x: Tensor) -> Tensor:
    """``FeedForward(x)`` in eval mode over the tensors of ``_LayerStep.ffn``:
    ``max(0, x W_1 + b_1) W_2 + b_2`` (or another activation)."""
    w1, b1, w2, b2, activation = ffn
    return F.linear(_activate(activation, F.linear(x, w1, b1)), w2, b2)  # via (B, 1, d_ff)


def _output_projection(
    output: nn.Linear, x: Tensor, decoder: Decoder, cache: KVCache | None
) -> Tensor:
    """``output(x)``: the pre-softmax projection, ``(B, T, d_model) -> (B, T, V)``. A cached
    step of one token reads the weight as the decoder's layers do (``Decoder._packs_weights``)."""
    if cache is not None and x.shape[1] == 1 and decoder._packs_weights():
        return F.linear(x, step_weight(output.weight), output.bias)
    return output(x)


class Encoder(nn.Module):
    """``num_layers`` :class:`EncoderLayer` s: ``(B, S, d_model) -> (B, S, d_model)``.

    ``final_norm`` (default: ``norm_first``) adds a LayerNorm after the last layer, which a
    pre-LN stack needs; as :class:`torch.nn.TransformerEncoder` with ``norm=LayerNorm``.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        norm_first: bool = False,
        final_norm: bool | None = None,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(
                d_model, num_heads, d_ff, dropout=dropout, norm_first=norm_first, head_dim=head_dim
            )
            for _ in range(positive_int("num_layers", num_layers))
        )
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(d_model) if final_norm else None

    def forward(self, x: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """``src_mask``: ``(B, 1, 1, S)`` or ``(1, 1, 1, S)``."""
        layers = cast(Sequence[EncoderLayer], self.layers)  # (a ModuleList, typed for mypy)
        layers[0]._check_inputs(x, src_mask)  # the same shapes for every layer
        for layer in layers:
            x = layer._forward(x, src_mask)  # (B, S, d_model)
        return self.norm(x) if self.norm is not None else x

    @classmethod
    def from_torch(cls, stack: nn.TransformerEncoder) -> Encoder:
        """A copy of a :class:`torch.nn.TransformerEncoder`, its final ``norm`` included."""
        return _stack_from_torch(cls, stack, nn.TransformerEncoder, EncoderLayer)


class Decoder(nn.Module):
    """``num_layers`` :class:`DecoderLayer` s reading the encoder output ``memory``:
    ``(B, T, d_model)`` and ``(B, S, d_model)`` to ``(B, T, d_model)``.

    ``tgt_mask`` goes to every layer as is (include the causal mask; :meth:`Transformer.decode`
    does). ``final_norm`` as in :class:`Encoder`; ``cross_attention=False`` builds a
    decoder-only stack (``memory=None``); ``activation`` as in :class:`FeedForward`.
    ``fast_step`` (default True) lets a cached step of
    one token take the fast path (``_step_plan``); False runs the modules, to compare.
    ``pack_weights`` (default True): without autograd, the fast path's products read the
    weights with more outputs than inputs from copies stored transposed, ``(in, out)``, which
    a one-row product reads faster on the CPUs measured (``minitransformer._layout``; the same
    numbers up to rounding, and memory for the copies); False reads the parameters, and then
    the fast path's logits are the module path's bit for bit.
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        *,
        dropout: float = 0.1,
        norm_first: bool = False,
        final_norm: bool | None = None,
        cross_attention: bool = True,
        head_dim: int | None = None,
        activation: str = "relu",
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(
                d_model,
                num_heads,
                d_ff,
                dropout=dropout,
                norm_first=norm_first,
                cross_attention=cross_attention,
                head_dim=head_dim,
                activation=activation,
            )
            for _ in range(positive_int("num_layers", num_layers))
        )
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(d_model) if final_norm else None
        self.fast_step = True  # False: cached steps take the module path too (see _step_plan)
        self.pack_weights = True  # False: the fast path reads the parameters (_packs_weights)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``cache``: a :class:`~minitransformer.kv_cache.KVCache` with one entry per layer.
        A cached step of one token takes the fast path of ``_step_plan``."""
        layers = cast(Sequence[DecoderLayer], self.layers)  # (a ModuleList, typed for mypy)
        layer_caches: Sequence[LayerCache | None]
        if cache is None:
            layer_caches = [None] * len(layers)
        elif not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        elif len(cache.layers) != len(layers):
            raise ValueError(f"the cache has {len(cache.layers)} layers, the decoder {len(layers)}")
        else:
            layer_caches = cache.layers
        # The same shapes for every layer (their caches fill in step): check once.
        layers[0]._check_inputs(x, memory, src_mask, tgt_mask, layer_caches[0])
        if cache is not None and tgt_mask is None:
            plan = self._step_plan(x, memory, cache)
            if plan is not None:  # the fast path: the same computation without the modules
                for step, entry in zip(plan.layers, cache.layers, strict=True):
                    x = _layer_step(step, x, memory, src_mask, entry)  # (B, 1, d_model)
                return x if plan.norm is None else F.layer_norm(x, *plan.norm)
        for layer, layer_cache in zip(layers, layer_caches, strict=True):
            x = layer._forward(x, memory, src_mask, tgt_mask, layer_cache)  # (B, T, d_model)
        return self.norm(x) if self.norm is not None else x

    def _step_plan(self, x: Tensor, memory: Tensor | None, cache: KVCache) -> _StepPlan | None:
        """The fast path's plan if this call is one cached decoding step that it computes,
        else None (the module path).

        Why a second path: a cached step of one token does little arithmetic (matrix-vector
        products), so the Python around it counts. Through the modules a step makes ~45
        module calls and ~140 ``nn.Module`` attribute look-ups, plus the helpers' checks,
        which cost about as much as reading the weights (the benchmark
        ``benchmarks/bench_kv_cache.py`` measures it). :func:`_layer_step` makes the same
        products and kernels (the same numbers) with ``torch.nn.functional`` calls over the
        tensors that the run's first fast step gathered (the plan, kept in ``cache``); what it
        skips: module calls and attribute look-ups, per-layer checks (the first layer's were
        run), dropout, attention-weight bookkeeping, and, with one query row, the head
        transposes. Without autograd it reads the wider weights from copies laid out for
        one-row products (``pack_weights``; ``minitransformer._layout``).

        It applies to one new position (T = 1) with a KV cache and no ``tgt_mask``, in eval
        mode, when no layer stores its attention weights or uses rotary embeddings, ``x`` has
        the weights' dtype, and the cross-attention caches are filled (from the first step
        on, which takes the module path), and ``fast_step`` is True (set it to False to compare
        the two paths). Everything else takes the module path. The plan holds the parameters
        (or their copies) of the run's first fast step: like the cached keys and values, which
        were computed from them, it assumes the weights do not change during a run.
        """
        if not self.fast_step or x.shape[1] != 1 or self.training or cache.length == 0:
            return None
        cross = cache.layers[0].cross_attn
        if memory is not None and (cross is None or cross.source is None):
            return None
        layers = cast(Sequence[DecoderLayer], self.layers)
        if any(layer.store_weights for layer in layers):
            return None
        packed = self._packs_weights()
        plan = cast("_StepPlan | None", cache.step_plan)
        if plan is None or plan.packed != packed:  # the run's first fast step
            first = layers[0].self_attn.in_proj_weight
            rotary = any(layer.self_attn.rotary for layer in layers)
            plan = cache.step_plan = _StepPlan(
                [] if rotary else [layer._step_weights(packed) for layer in layers],
                None if self.norm is None else _norm_step(self.norm),
                packed,
                first.dtype,
                rotary,
            )
        return plan if x.dtype == plan.dtype and not plan.rotary else None

    def _packs_weights(self) -> bool:
        """Whether the fast path reads ``minitransformer._layout.step_weight``'s copies:
        ``fast_step`` and ``pack_weights`` are True, in eval mode, and autograd is off (under
        ``torch.no_grad()`` or ``torch.inference_mode()``, as the package's decoding runs): a
        step that gradients must reach reads the parameters themselves."""
        return (
            self.fast_step
            and self.pack_weights
            and not self.training
            and not torch.is_grad_enabled()
        )

    @classmethod
    def from_torch(cls, stack: nn.TransformerDecoder) -> Decoder:
        """A copy of a :class:`torch.nn.TransformerDecoder`, its final ``norm`` included."""
        return _stack_from_torch(cls, stack, nn.TransformerDecoder, DecoderLayer)


class Transformer(nn.Module):
    """The encoder–decoder Transformer (chapter "The encoder–decoder picture").

    :meth:`encode`: source ids ``(B, S)`` -> memory ``(B, S, d_model)``; :meth:`decode`: target
    ids ``(B, T)`` and memory -> logits ``(B, T, tgt_vocab_size)``; :meth:`forward` does both
    (teacher forcing). Embeddings are scaled by ``sqrt(d_model)`` and summed with the
    sinusoidal :class:`~minitransformer.positional.PositionalEncoding`.

    ``tie_embeddings`` (paper, section 3.4): the target embedding and the output projection
    (no bias) share one ``(V, d_model)`` matrix, and so does the source embedding if the
    vocabularies have the same size. Initialisation: Xavier-uniform for every weight matrix of
    the layers (each of W^Q, W^K, W^V on its own), ``N(0, 1/d_model)`` for the embeddings.
    ``head_dim`` sets ``d_k = d_v`` apart from ``d_model / num_heads`` (the paper's Table 3,
    rows (B)); by default ``d_k = d_model / h``.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        *,
        d_model: int = 512,
        num_heads: int = 8,
        num_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        tie_embeddings: bool = True,
        norm_first: bool = False,
        max_len: int = 5000,
        head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.src_vocab_size = positive_int("src_vocab_size", src_vocab_size)
        self.tgt_vocab_size = positive_int("tgt_vocab_size", tgt_vocab_size)
        self.d_model = positive_int("d_model", d_model)
        self.num_heads = positive_int("num_heads", num_heads)
        self.max_len = positive_int("max_len", max_len)
        self.norm_first, self.tie_embeddings = norm_first, tie_embeddings

        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout=dropout)
        self.encoder = Encoder(
            num_layers,
            d_model,
            num_heads,
            d_ff,
            dropout=dropout,
            norm_first=norm_first,
            head_dim=head_dim,
        )
        self.decoder = Decoder(
            num_layers,
            d_model,
            num_heads,
            d_ff,
            dropout=dropout,
            norm_first=norm_first,
            head_dim=head_dim,
        )
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)  # pre-softmax projection

        self._reset_parameters()
        if tie_embeddings:
            # One Parameter object, several modules: gradients from all uses add up.
            self.output.weight = self.tgt_embed.weight  # both (V_tgt, d_model)
            if src_vocab_size == tgt_vocab_size:
                self.src_embed.weight = self.tgt_embed.weight

    def _reset_parameters(self) -> None:
        for module in (self.encoder, self.decoder):
            for matrix in _weight_matrices(module):
                nn.init.xavier_uniform_(matrix)
        for weight in (self.src_embed.weight, self.tgt_embed.weight, self.output.weight):
            nn.init.normal_(weight, mean=0.0, std=self.d_model**-0.5)

    # -- the model ------------------------------------------------------------------------
    def embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        """``(B, L)`` ids -> ``(B, L, d_model)``: ``sqrt(d_model) E[ids]`` plus the positions
        ``start ..`` (``start`` = the cache length when decoding with a KV cache)."""
        if not isinstance(embedding, nn.Embedding):
            raise TypeError(f"embedding must be an nn.Embedding, got {type(embedding).__name__}")
        start = positive_int("start", start, allow_zero=True)
        tokens = self._check_tokens("tokens", tokens, embedding, start)
        return self._embed(tokens, embedding, start)

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        return self.positional(embedding(tokens) * math.sqrt(self.d_model), start)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, d_model)``; ``src_mask`` ``(B, 1, 1, S)``,
        True at real tokens."""
        src = self._check_tokens("src", src, self.src_embed)
        check_mask("src_mask", src_mask, (src.shape[0], 1, 1, src.shape[1]), allow_2d=False)
        return self.encoder(self._embed(src, self.src_embed), _unless_all_true(src_mask))

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Target ids ``(B, T)`` and memory ``(B, S, d_model)`` -> logits ``(B, T, V_tgt)``.

        The causal mask is always applied, combined with ``tgt_mask`` by ``&``. With a
        :class:`~minitransformer.kv_cache.KVCache` (chapter "Inference"), ``tgt`` holds only
        the new tokens, at positions ``cache.length ..``; feeding a sequence in pieces gives
        the logits of feeding it whole. The memory and ``src_mask`` are checked on the first
        cached step; the cache remembers them.
        """
        start = 0 if cache is None else cache.length
        tgt = self._check_tokens("tgt", tgt, self.tgt_embed, start)
        B, T = tgt.shape
        cross_mask = self._check_memory(memory, src_mask, B, cache)
        check_mask("tgt_mask", tgt_mask, (B, self.num_heads, T, start + T))
        if cache is None:
            mask = causal_mask(T, device=tgt.device)  # (T, T)
        elif T == 1:
            mask = None  # one new position may attend to every cached position and itself
        else:
            mask = causal_mask(start + T, device=tgt.device)[start:]  # (T, start + T)
        if tgt_mask is not None:
            mask = tgt_mask if mask is None else mask & tgt_mask
        x = self._embed(tgt, self.tgt_embed, start)  # (B, T, d_model)
        x = self.decoder(x, memory, src_mask=cross_mask, tgt_mask=mask, cache=cache)
        return _output_projection(self.output, x, self.decoder, cache)  # (B, T, V_tgt)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher forcing: source ``(B, S)`` and shifted target ``(B, T)`` -> logits
        ``(B, T, V_tgt)``."""
        if (
            isinstance(src, Tensor)
            and isinstance(tgt, Tensor)
            and src.dim() == tgt.dim() == 2
            and src.shape[0] != tgt.shape[0]
        ):
            raise ValueError(
                f"batch sizes differ: src {tuple(src.shape)} vs tgt {tuple(tgt.shape)}"
            )
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)

    @torch.no_grad()
    def attention_weights(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> dict[str, list[Tensor]]:
        """The attention weights of a forward pass on ``(src, tgt)``, per layer, for plotting:
        ``{"encoder": [(B, h, S, S)] * N, "decoder_self": [(B, h, T, T)] * N,
        "cross": [(B, h, T, S)] * N}``."""
        encoder = cast(Sequence[EncoderLayer], self.encoder.layers)
        decoder = cast(Sequence[DecoderLayer], self.decoder.layers)
        layers: list[EncoderLayer | DecoderLayer] = [*encoder, *decoder]
        try:
            for layer in layers:
                layer.store_weights = True
            self(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
            return {  # (set by that pass: not None)
                "encoder": [cast(Tensor, layer.self_attn_weights) for layer in encoder],
                "decoder_self": [cast(Tensor, layer.self_attn_weights) for layer in decoder],
                "cross": [cast(Tensor, layer.cross_attn_weights) for layer in decoder],
            }
        finally:
            for layer in layers:
                layer.store_weights = False
                layer.self_attn_weights = None
                if isinstance(layer, DecoderLayer):
                    layer.cross_attn_weights = None

    # -- input checks -------------------------------------------------------------------
    def _check_tokens(
        self, name: str, tokens: Tensor, embedding: nn.Embedding, start: int = 0
    ) -> Tensor:
        """``tokens`` ``(B, length)`` as int64 (``_checks.ids``: any integer dtype torch
        indexes with), on the model's device, fitting ``max_len`` from ``start`` and the
        vocabulary of ``embedding``."""
        tokens = ids(name, tokens, ndim=2, what="(B, length)", low=None)  # range: below
        if tokens.device != embedding.weight.device:
            raise ValueError(
                f"{name} is on {tokens.device}, the model on {embedding.weight.device}"
            )
        if start + tokens.shape[1] > self.max_len:
            at = f" from position {start}" if start else ""
            raise ValueError(
                f"{name} has length {tokens.shape[1]}{at} > max_len={self.max_len} (shape "
                f"{tuple(tokens.shape)}); build the model with a larger max_len"
            )
        return ids(name, tokens, high=embedding.num_embeddings)  # one pass over the ids

    def _check_memory(
        self, memory: Tensor, src_mask: Tensor | None, B: int, cache: KVCache | None
    ) -> Tensor | None:
        """Check ``memory`` and ``src_mask``, unless this cache's run already did; return the
        mask cross-attention needs (None when nothing is padded)."""
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache, got {type(cache).__name__}")
        checked = None if cache is None else cache.checked
        if checked is not None and checked[0] is memory and checked[1] is src_mask:
            return checked[2]  # later steps of a run: nothing new to check
        _check_stream("memory", memory, self.d_model, "(B, S, d_model)")
        if memory.shape[0] != B:
            raise ValueError(f"batch sizes differ: tgt has {B} rows, memory {tuple(memory.shape)}")
        check_mask("src_mask", src_mask, (B, 1, 1, memory.shape[1]), allow_2d=False)
        cross_mask = _unless_all_true(src_mask)
        if cache is not None:
            cache.checked = (memory, src_mask, cross_mask)
        return cross_mask


def _unless_all_true(mask: Tensor | None) -> Tensor | None:
    """``mask``, or None when it hides nothing (attention then skips the masking)."""
    return None if mask is None or (mask.device.type != "meta" and bool(mask.all())) else mask


def _weight_matrices(module: nn.Module) -> Iterator[Tensor]:
    """Every weight matrix of ``module`` in parameter order, each attention's packed
    ``[W^Q; W^K; W^V]`` as its three blocks (so that each gets its own Xavier bound)."""
    packed = {
        id(m.in_proj_weight): m for m in module.modules() if isinstance(m, MultiHeadAttention)
    }
    for p in module.parameters():
        if id(p) in packed:
            attention = packed[id(p)]
            yield from (attention.w_q.weight, attention.w_k.weight, attention.w_v.weight)
        elif p.dim() > 1:
            yield p


# -- copies of torch layers ---------------------------------------------------------------


def _check_torch_layer(
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
    expected: type[nn.Module],
    kind: str,
) -> None:
    """Reject torch layers whose computation our layers do not reproduce."""
    if not isinstance(layer, expected):
        raise TypeError(
            f"{kind}.from_torch needs a torch.nn.{expected.__name__}, got {type(layer).__name__}"
        )
    if not layer.self_attn.batch_first:
        raise ValueError(f"{kind}.from_torch needs a layer built with batch_first=True")
    act = getattr(layer, "activation", None)
    if act is not F.relu and not isinstance(act, nn.ReLU):
        raise ValueError(f"{kind}.from_torch needs activation='relu', got {act!r}")
    if layer.self_attn.in_proj_weight is None:
        raise ValueError(
            f"{kind}.from_torch needs packed q/k/v projections (kdim = vdim = d_model)"
        )
    if (
        layer.self_attn.in_proj_bias is None
        or layer.linear1.bias is None
        or layer.norm1.bias is None
    ):
        raise ValueError(f"{kind}.from_torch needs a torch layer with biases (bias=True)")
    kinds = {(p.dtype, p.device) for p in layer.parameters()}
    if len(kinds) != 1:
        raise ValueError(
            f"{kind}.from_torch needs parameters of one dtype and device, "
            f"got {sorted(map(str, kinds))}"
        )


def _copy_modules(pairs: list[tuple[nn.Linear | nn.LayerNorm, nn.Linear | nn.LayerNorm]]) -> None:
    """Copy weight, bias (and a LayerNorm's epsilon) from each torch module into ours."""
    with torch.no_grad():
        for ours, theirs in pairs:
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
            if isinstance(ours, nn.LayerNorm) and isinstance(theirs, nn.LayerNorm):
                ours.eps = theirs.eps


_Stack = TypeVar("_Stack", "Encoder", "Decoder")


def _stack_from_torch(
    cls: type[_Stack], stack: nn.Module, expected: type[nn.Module], layer_cls: Any
) -> _Stack:
    """A copy of a torch ``TransformerEncoder``/``TransformerDecoder`` (``expected``), layer
    by layer with ``layer_cls.from_torch``, its final ``norm`` included."""
    if not isinstance(stack, expected):
        raise TypeError(
            f"{cls.__name__}.from_torch needs a torch.nn.{expected.__name__}, "
            f"got {type(stack).__name__}"
        )
    layers = [layer_cls.from_torch(layer) for layer in cast(nn.ModuleList, stack.layers)]
    first = layers[0]
    ours = cls(
        len(layers),
        first.d_model,
        first.self_attn.num_heads,
        first.feed_forward.linear1.out_features,
        dropout=first.dropout1.p,
        norm_first=first.norm_first,
        final_norm=stack.norm is not None,
    )
    ours.to(first.norm1.weight.device, first.norm1.weight.dtype)
    ours.layers = nn.ModuleList(layers)
    if ours.norm is not None:
        _copy_modules([(ours.norm, cast(nn.LayerNorm, stack.norm))])
    return ours.train(stack.training)


# -- parameter counts ---------------------------------------------------------------------


def _count(params: Iterable[Tensor]) -> int:
    return sum(p.numel() for p in params)


def parameter_breakdown(model: Transformer) -> dict[str, int]:
    """Parameter counts of ``model``: ``embeddings``, ``encoder``, ``decoder`` and ``total``.

    A matrix shared by tying is counted once (in ``embeddings``: source and target embeddings
    and the output projection); the sinusoidal table is a buffer, not a parameter. ``total``
    equals ``sum(p.numel() for p in model.parameters())``. Works on the ``meta`` device.
    """
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a Transformer, got {type(model).__name__}")
    seen: set[int] = set()

    def unique(module: nn.Module) -> list[Tensor]:
        out: list[Tensor] = []
        for p in module.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    embeddings = _count(unique(model.src_embed) + unique(model.tgt_embed) + unique(model.output))
    encoder = _count(unique(model.encoder))
    decoder = _count(unique(model.decoder))
    other = _count(unique(model))  # anything else (none today), so that total stays honest
    return {
        "embeddings": embeddings,
        "encoder": encoder,
        "decoder": decoder,
        "total": embeddings + encoder + decoder + other,
    }


def table3_configs() -> dict[str, dict[str, int]]:
    """The model sizes of the paper's Table 3 as :class:`Transformer` keyword arguments, by row
    name: ``"base"``, rows (A) ``"(A) h=1"`` ..., (B) ``"(B) d_k=16"`` ..., (C) ``"(C) N=2"``
    ..., and ``"big"`` (chapter "The paper's Table 3 at toy scale", section "The parameter
    column"). Rows (A) and (C) keep ``d_k = d_model / h``; rows (B) set ``head_dim``, which here
    is ``d_k = d_v``, while the paper changed ``d_k`` alone (``d_v`` stays 64). A new dict each
    call; build the models on the ``meta`` device to count them without allocating."""
    base = {"num_layers": 6, "d_model": 512, "d_ff": 2048, "num_heads": 8}
    rows: dict[str, dict[str, int]] = {"base": base}
    rows.update({f"(A) h={h}": {**base, "num_heads": h} for h in (1, 4, 16, 32)})
    rows.update({f"(B) d_k={d_k}": {**base, "head_dim": d_k} for d_k in (16, 32)})
    rows.update({f"(C) N={n}": {**base, "num_layers": n} for n in (2, 4, 8)})
    rows.update({f"(C) d_model={d}": {**base, "d_model": d} for d in (256, 1024)})
    rows.update({f"(C) d_ff={d}": {**base, "d_ff": d} for d in (1024, 4096)})
    rows["big"] = {**base, "d_model": 1024, "d_ff": 4096, "num_heads": 16}
    return rows
