"""Checkers for the chapter "The encoder–decoder picture" (``book/encoder_decoder``)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minitransformer.attention import causal_mask, padding_mask
from minitransformer.exercises._core import (
    Case,
    checker,
    close,
    hard_wired,
    like,
    raises,
    seeded,
    when,
)
from minitransformer.model import DecoderLayer, EncoderLayer, Transformer

__all__ = [
    "check_decoder_mask",
    "check_encoder_layer",
    "check_layer_parameters",
    "check_next_token",
]


_DECODER_MASK_MISTAKES = [
    when(
        lambda got: got.dtype != torch.bool,
        "the mask has dtype {got.dtype}; it must be boolean (True = may attend). Compare with `<` "
        "/ `<=` or use `.tril()` on a boolean tensor",
    ),
    when(
        lambda got: got.dim() == 2,
        "the mask has shape {got.shape}: one (T, T) matrix cannot hide the padding of each "
        "sequence. Combine the causal (T, T) mask with a per-sequence (B, 1, 1, T) padding mask "
        "by `&`, which broadcasts to (B, 1, T, T)",
    ),
    when(
        lambda got, want: (
            got.shape != want.shape
            and (
                got.numel() == want.numel()
                and torch.equal(got.reshape(want.shape), want)
                or got.dim() == 4
                and torch.equal(torch.broadcast_to(got, want.shape), want)
            )
        ),
        "the values are right but the shape is {got.shape}; return shape (B, 1, T, T) = "
        "{want.shape}, the 1 for the heads (the mask is the same for every head)",
    ),
    when(
        lambda got, want: torch.equal(got, ~want),
        "your mask is inverted: True must mean *may attend* (PyTorch's nn.Transformer uses True = "
        "blocked; this course does not)",
    ),
    like(
        lambda lengths, T: causal_mask(T).expand(len(lengths), 1, T, T),
        "your mask is only causal: sequence 1 has 3 real tokens, so keys 3 and 4 are padding and "
        "must be hidden too. AND it with the padding mask",
    ),
    like(
        lambda lengths, T: padding_mask(lengths, T).expand(-1, 1, T, T),
        "your mask only hides padding: position t can still see later tokens t+1, t+2, ... AND it "
        "with the lower-triangular causal mask",
    ),
    like(
        [
            lambda lengths, T: causal_mask(T).T & padding_mask(lengths, T),
            lambda lengths, T: causal_mask(T).T.expand(len(lengths), 1, T, T),
        ],
        "your causal part is upper-triangular (the transpose): row t is the query, column s the "
        "key, and t may see s only when s <= t. Use .tril(), not .triu()",
    ),
    like(
        lambda lengths, T: causal_mask(T) | padding_mask(lengths, T),
        "you combined the masks with OR; a key must pass both tests: use &",
    ),
]


@checker(
    "decoder self-attention mask (causal and padding)",
    mistakes=_DECODER_MASK_MISTAKES,
    reference=lambda lengths, T: causal_mask(T) & padding_mask(lengths, T),  # (B, 1, T, T)
    returns="decoder_mask(lengths, T)",
    otherwise="It should be causal_mask(T) & padding_mask(lengths, T); check row 2 of "
    "sequence 1: it should be [True, True, True, False, False]",
)
def check_decoder_mask() -> list[Case]:
    """Check ``fn(lengths, T)`` -> boolean ``(B, 1, T, T)``, True = may attend, for ``lengths``
    ``(B,)`` real target tokens per sequence."""
    return [
        Case("for lengths [5, 3, 1] and T = 5", lengths=torch.tensor([5, 3, 1]), T=5),
        Case(
            "for lengths [2, 4] and T = 6",
            lengths=torch.tensor([2, 4]),
            T=6,
            hint=hard_wired("the sizes (B = 3, T = 5)"),
        ),
    ]


# -- an encoder layer from its parts (section "The sub-layer recipe"); wrong ones use them too


def _post_ln(
    layer: EncoderLayer,
    x: Tensor,
    src_mask: Tensor | None,
    *,
    norms: tuple[int, int] = (1, 2),
    residual: tuple[bool, bool] = (True, True),
    ffn_reads_x: bool = False,
) -> Tensor:
    """Post-LN, or a variant: ``norms`` the LayerNorms used (0 = none), ``residual`` which
    sub-layers keep their residual addition, ``ffn_reads_x`` the FFN fed the layer's input."""
    norm: dict[int, Callable[[Tensor], Tensor]] = {0: lambda z: z, 1: layer.norm1, 2: layer.norm2}
    attended = layer.self_attn(x, x, x, src_mask)[0]  # (B, S, d_model); [1] is the weights
    h = norm[norms[0]](x + attended if residual[0] else attended)
    transformed = layer.feed_forward(x if ffn_reads_x else h)
    return norm[norms[1]](h + transformed if residual[1] else transformed)


def _pre_ln(layer: EncoderLayer, x: Tensor, src_mask: Tensor | None) -> Tensor:
    normed = layer.norm1(x)
    h = x + layer.self_attn(normed, normed, normed, src_mask)[0]
    return h + layer.feed_forward(layer.norm2(h))


def _twice(
    fn: Callable[..., Tensor], layer: EncoderLayer, x: Tensor, src_mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Two calls, the second on its own copy of the inputs: in eval mode both give one output."""
    again = copy.deepcopy((layer, x, src_mask))
    return fn(layer, x, src_mask), fn(*again)


_ENCODER_LAYER_MISTAKES = [
    when(
        lambda got: not close(got[0], got[1]),
        "two calls on the same input gave different outputs: dropout is still on. The layer is in "
        "eval mode, where its dropout1 and dropout2 do nothing, so leave dropout out (F.dropout "
        "drops even in eval mode unless you pass training=False; do not call layer.train())",
    ),
    like(
        _pre_ln,
        "you normalised *before* each sub-layer, x + Sublayer(LayerNorm(x)): that is pre-LN "
        "(norm_first=True). The paper's layer is post-LN: LayerNorm(x + Sublayer(x)), the "
        "LayerNorm after the residual addition",
    ),
    like(
        [
            lambda layer, x, m: _post_ln(layer, x, m, residual=(False, True)),
            lambda layer, x, m: _post_ln(layer, x, m, residual=(True, False)),
            lambda layer, x, m: _post_ln(layer, x, m, residual=(False, False)),
        ],
        "a residual connection is missing: each sub-layer's output is *added* to its input "
        "before the LayerNorm, norm1(x + attention) and norm2(h + FFN(h))",
    ),
    like(
        lambda layer, x, m: _post_ln(layer, x, m, norms=(2, 1)),
        "your LayerNorms are swapped: norm1 follows the self-attention, norm2 the feed-forward "
        "network (each has its own gain and bias)",
    ),
    like(
        [
            lambda layer, x, m: _post_ln(layer, x, m, norms=(0, 2)),
            lambda layer, x, m: _post_ln(layer, x, m, norms=(1, 0)),
        ],
        "a LayerNorm is missing: post-LN normalises after each of the two residual additions",
    ),
    like(
        lambda layer, x, m: _post_ln(layer, x, m, ffn_reads_x=True),
        "your feed-forward network reads the layer's input x; it reads the first sub-layer's "
        "result, h = norm1(x + attention), and its output is added to h",
    ),
    like(
        lambda layer, x, m: _post_ln(layer, x, None),
        "you ignore src_mask {where}: pass it to layer.self_attn(x, x, x, src_mask), or every "
        "token also attends to the padding",
    ),
    raises(
        TypeError,
        "layer.self_attn(query, key, value, mask) returns a pair (output, weights): keep the "
        "output, layer.self_attn(x, x, x, src_mask)[0]",
    ),
]


@checker(
    "an encoder layer from its parts",
    reference=lambda layer, x, src_mask: layer(x, src_mask),
    mistakes=_ENCODER_LAYER_MISTAKES,
    observe=_twice,
    returns=("the output", "the output of a second call"),
    otherwise="It differs from layer(x, src_mask): h = norm1(x + self_attn(x, x, x, "
    "src_mask)[0]), then norm2(h + feed_forward(h))",
)
def check_encoder_layer(gen: torch.Generator) -> list[Case]:
    """Check ``fn(layer, x, src_mask) -> (B, S, d_model)``, the post-LN
    :class:`~minitransformer.model.EncoderLayer` from its parts, against the layer itself."""

    def layer(d_model: int, num_heads: int, d_ff: int) -> EncoderLayer:
        built = seeded(0, lambda: EncoderLayer(d_model, num_heads, d_ff, dropout=0.1).eval())
        with torch.no_grad():  # gains and biases of their own, so that swapped norms show
            for norm in (built.norm1, built.norm2):
                norm.weight.copy_(0.5 + torch.rand(d_model, generator=gen))
                norm.bias.copy_(0.3 * torch.randn(d_model, generator=gen))
        return built

    small, other = layer(16, 4, 32), layer(12, 3, 24)
    return [
        Case(
            "for x (2, 5, 16) without a mask",
            layer=small,
            x=torch.randn(2, 5, 16, generator=gen),
            src_mask=None,
        ),
        Case(
            "for x (3, 6, 16) with padding (lengths 6, 4, 2)",
            layer=small,
            x=torch.randn(3, 6, 16, generator=gen),
            src_mask=padding_mask(torch.tensor([6, 4, 2]), 6),
        ),
        Case(
            "for x (1, 4, 12) with padding (length 3)",
            layer=other,
            x=torch.randn(1, 4, 12, generator=gen),
            src_mask=padding_mask(torch.tensor([3]), 4),
        ),
    ]


def _layer_parameters(d_model: int, d_ff: int, decoder: bool) -> int:
    with torch.device("meta"):  # no memory, no random numbers: only the shapes are counted
        layer = (DecoderLayer if decoder else EncoderLayer)(d_model, 4, d_ff)
    return sum(p.numel() for p in layer.parameters())


def _short_by(*missing: Callable[[int, int, bool], int]) -> Callable[..., bool]:
    """The count is the right one minus ``missing(d_model, d_ff, decoder)`` (any of them)."""
    return lambda got, want, d_model, d_ff, decoder: any(
        got == want - n(d_model, d_ff, decoder) for n in missing
    )


_LAYER_MISTAKES = [
    when(
        lambda got: not isinstance(got, (int, float)),
        "{where} should return a number, got {got_type}",
    ),
    when(
        _short_by(lambda d, f, dec: (2 if dec else 1) * 4 * d + f + d),
        "{where} = {got:,} misses the biases: each of the 4 attention projections has a bias of "
        "d_model entries, and the FFN's two linear maps have biases of d_ff and d_model",
    ),
    when(
        _short_by(lambda d, f, dec: (3 if dec else 2) * 2 * d),
        lambda where, got, decoder: (
            f"{where} = {got:,} misses the LayerNorms: each has a gain "
            f"and a bias of d_model entries, and this layer has {3 if decoder else 2} of them"
        ),
    ),
    when(
        _short_by(lambda d, f, dec: dec * (4 * d * d + 6 * d)),
        "{where} = {got:,} looks like an encoder layer: a decoder layer also has cross-attention "
        "(4 more projections) and a third LayerNorm",
    ),
    when(
        _short_by(lambda d, f, dec: dec * (4 * d * d + 4 * d)),
        "{where} = {got:,} misses the cross-attention's 4 projections",
    ),
    when(
        _short_by(lambda d, f, dec: dec * 2 * d),
        "{where} = {got:,} misses the third LayerNorm (after cross-attention)",
    ),
    when(
        _short_by(lambda d, f, dec: d * d + d),
        "{where} = {got:,} misses one projection per attention: there are four, W^Q, W^K, W^V and "
        "the output projection W^O",
    ),
    when(
        _short_by(lambda d, f, dec: d * f + f, lambda d, f, dec: f * d + d),
        "{where} = {got:,} counts only one of the FFN's two linear maps (d_model -> d_ff and d_ff "
        "-> d_model)",
    ),
]


@checker(
    "parameters of an encoder or decoder layer",
    reference=_layer_parameters,
    mistakes=_LAYER_MISTAKES,
    returns="",
    otherwise="Count per attention 4 * (d_model^2 + d_model), for the FFN "
    "2 * d_model * d_ff + d_ff + d_model, per LayerNorm 2 * d_model",
)
def check_layer_parameters() -> list[Case]:
    """Check ``fn(d_model, d_ff, decoder)``, the parameters of an
    :class:`~minitransformer.model.EncoderLayer` or :class:`~minitransformer.model.DecoderLayer`."""
    return [
        Case(f"count(d_model={d}, d_ff={f}, decoder={dec})", d_model=d, d_ff=f, decoder=dec)
        for d, f in ((512, 2048), (64, 256), (24, 40))
        for dec in (False, True)
    ]


_NEXT_TOKEN_MISTAKES = [
    when(
        lambda got, model, src, prefix: got.shape == model(src, prefix)[:, -1].shape,
        "you return a tensor of shape {got.shape} = (B, V): the logits themselves. Return the id "
        "of the best token, argmax over the vocabulary",
    ),
    when(
        lambda got, prefix: got.shape == prefix.shape,
        "you return {got.shape} = (B, T): one prediction per position. Only the last position "
        "predicts the next token: take logits[:, -1]",
    ),
    like(
        lambda model, src, prefix: model(src, prefix)[:, 0].argmax(-1),  # (B, T, V) logits
        "you used the logits of the first position (they predict the token after BOS). The next "
        "token comes from the *last* position: logits[:, -1]",
    ),
    like(
        lambda model, src, prefix: model(src, prefix)[:, -1].argmin(-1),
        "you took argmin; the most likely token is the argmax",
    ),
]


@checker(
    "one step of greedy decoding",
    mistakes=_NEXT_TOKEN_MISTAKES,
    reference=lambda model, src, prefix: model(src, prefix)[:, -1].argmax(-1),
    returns="next_token(model, src, prefix)",
    otherwise="Your ids differ from model(src, prefix)[:, -1].argmax(-1): run the whole "
    "prefix through the model (teacher forcing the known tokens) and read the last "
    "position",
)
def check_next_token(gen: torch.Generator) -> list[Case]:
    """Check ``fn(model, src, prefix)`` -> ``(B,)`` ids of the most likely next token."""
    model = seeded(
        0,
        lambda: Transformer(
            13, 13, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0, max_len=16
        ).eval(),
    )

    def case(B: int, S: int, T: int, **kwargs: Any) -> Case:
        src = torch.randint(3, 13, (B, S), generator=gen)
        prefix = torch.cat(  # BOS, then T - 1 tokens
            [torch.ones(B, 1, dtype=torch.long), torch.randint(3, 13, (B, T - 1), generator=gen)],
            dim=1,
        )
        return Case(f"for B = {B}, a prefix of {T}", model=model, src=src, prefix=prefix, **kwargs)

    # 64 sequences: an answer that drops part of the input (the source, BOS, all but the last
    # token) changes the argmax of several of them, though a random model leans on each little.
    return [case(64, 5, 4), case(64, 7, 2, hint=hard_wired("the sizes"))]
