"""Checkers for the exercises of the chapter "The encoder–decoder picture" (``book/encoder_decoder``).

* :func:`check_decoder_mask`: build the decoder self-attention mask, causal AND target padding;
* :func:`check_layer_parameters`: count the parameters of an encoder or decoder layer by hand;
* :func:`check_next_token`: one step of greedy autoregressive decoding.
"""

from __future__ import annotations

from typing import Callable

import torch

from minitransformer.attention import causal_mask, padding_mask
from minitransformer.exercises._core import ExerciseError, attempt, checker, expect_shape
from minitransformer.model import DecoderLayer, EncoderLayer, Transformer

__all__ = ["check_decoder_mask", "check_layer_parameters", "check_next_token"]


def reference_decoder_mask(lengths: torch.Tensor, T: int) -> torch.Tensor:
    """``(B, 1, T, T)``: query t may attend to key s iff ``s <= t`` and ``s < lengths[b]``."""
    return causal_mask(T) & padding_mask(lengths, T)  # (T, T) & (B, 1, 1, T) -> (B, 1, T, T)


@checker("decoder self-attention mask (causal and padding)")
def check_decoder_mask(decoder_mask: Callable[[torch.Tensor, int], torch.Tensor]) -> None:
    """Check ``decoder_mask(lengths, T)`` -> boolean ``(B, 1, T, T)``, True = may attend.

    ``lengths`` ``(B,)`` holds the number of real target tokens of each sequence."""
    lengths, T = torch.tensor([5, 3, 1]), 5
    got = attempt(decoder_mask, lengths.clone(), T)
    want = reference_decoder_mask(lengths, T)
    if isinstance(got, torch.Tensor) and got.dtype != torch.bool:
        raise ExerciseError(
            f"the mask has dtype {got.dtype}; it must be boolean (True = may attend). Compare "
            "with `<` / `<=` or use `.tril()` on a boolean tensor"
        )
    if isinstance(got, torch.Tensor) and tuple(got.shape) != tuple(want.shape):
        if got.dim() == 2:
            raise ExerciseError(
                f"the mask has shape {tuple(got.shape)}: one (T, T) matrix cannot hide the "
                "padding of each sequence. Combine the causal (T, T) mask with a per-sequence "
                "(B, 1, 1, T) padding mask by `&`, which broadcasts to (B, 1, T, T)"
            )
        same_values = got.numel() == want.numel() and torch.equal(got.reshape(want.shape), want)
        if same_values or (got.dim() == 4 and got.shape[-2:] == want.shape[-2:]
                           and torch.equal(torch.broadcast_to(got, want.shape), want)):
            raise ExerciseError(
                f"the values are right but the shape is {tuple(got.shape)}; return shape "
                f"(B, 1, T, T) = {tuple(want.shape)}, the 1 for the heads (the mask is the "
                "same for every head)"
            )
    expect_shape(got, tuple(want.shape), "decoder_mask(lengths=[5, 3, 1], T=5)")
    if torch.equal(got, want):
        return
    if torch.equal(got, ~want):
        raise ExerciseError(
            "your mask is inverted: True must mean *may attend* (PyTorch's nn.Transformer uses "
            "True = blocked; this course does not)"
        )
    causal = causal_mask(T).expand_as(want)
    pad = padding_mask(lengths, T).expand_as(want)
    if torch.equal(got, causal):
        raise ExerciseError(
            "your mask is only causal: sequence 1 has 3 real tokens, so keys 3 and 4 are "
            "padding and must be hidden too. AND it with the padding mask"
        )
    if torch.equal(got, pad):
        raise ExerciseError(
            "your mask only hides padding: position t can still see later tokens t+1, t+2, ... "
            "AND it with the lower-triangular causal mask"
        )
    if torch.equal(got, causal_mask(T).T & pad) or torch.equal(got, causal_mask(T).T.expand_as(want)):
        raise ExerciseError(
            "your causal part is upper-triangular (the transpose): row t is the query, column s "
            "the key, and t may see s only when s <= t. Use .tril(), not .triu()"
        )
    if torch.equal(got, causal | pad):
        raise ExerciseError("you combined the masks with OR; a key must pass both tests: use &")
    raise ExerciseError(
        "your mask differs from causal_mask(T) & padding_mask(lengths, T); check row 2 of "
        "sequence 1: it should be [True, True, True, False, False]"
    )


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@checker("parameters of an encoder or decoder layer")
def check_layer_parameters(count: Callable[[int, int, bool], int]) -> None:
    """Check ``count(d_model, d_ff, decoder)`` against the package's layers, for several sizes."""
    for d_model, d_ff in ((512, 2048), (64, 256), (24, 40)):
        for decoder in (False, True):
            layer = (DecoderLayer if decoder else EncoderLayer)(d_model, 4, d_ff)
            want = _count(layer)
            got = attempt(count, d_model, d_ff, decoder)
            if isinstance(got, torch.Tensor):
                got = got.item()
            if not isinstance(got, (int, float)) or got != want:
                _diagnose_count(got, want, d_model, d_ff, decoder)


def _diagnose_count(got, want: int, d: int, d_ff: int, decoder: bool) -> None:
    what = f"count(d_model={d}, d_ff={d_ff}, decoder={decoder})"
    if not isinstance(got, (int, float)):
        raise ExerciseError(f"{what} should return a number, got {type(got).__name__}")
    n_attn, n_norm = (2, 3) if decoder else (1, 2)
    biases = n_attn * 4 * d + d_ff + d
    if got == want - biases:
        raise ExerciseError(
            f"{what} = {got:,} misses the biases: each of the 4 attention projections has a bias "
            "of d_model entries, and the FFN's two linear maps have biases of d_ff and d_model"
        )
    if got == want - n_norm * 2 * d:
        raise ExerciseError(
            f"{what} = {got:,} misses the LayerNorms: each has a gain and a bias of d_model "
            f"entries, and this layer has {n_norm} of them"
        )
    if decoder and got == want - 4 * d * d - 4 * d - 2 * d:
        raise ExerciseError(
            f"{what} = {got:,} looks like an encoder layer: a decoder layer also has "
            "cross-attention (4 more projections) and a third LayerNorm"
        )
    if decoder and got == want - 4 * d * d - 4 * d:
        raise ExerciseError(f"{what} = {got:,} misses the cross-attention's 4 projections")
    if decoder and got == want - 2 * d:
        raise ExerciseError(f"{what} = {got:,} misses the third LayerNorm (after cross-attention)")
    if got == want - d * d - d:
        raise ExerciseError(
            f"{what} = {got:,} misses one projection per attention: there are four, W^Q, W^K, "
            "W^V and the output projection W^O"
        )
    if got == want - d * d_ff - d_ff or got == want - d_ff * d - d:
        raise ExerciseError(
            f"{what} = {got:,} counts only one of the FFN's two linear maps (d_model -> d_ff "
            "and d_ff -> d_model)"
        )
    raise ExerciseError(
        f"{what} = {got:,}, expected {want:,}. Count per attention 4 * (d_model^2 + d_model), "
        "for the FFN 2 * d_model * d_ff + d_ff + d_model, per LayerNorm 2 * d_model"
    )


def _next_token_setup() -> tuple[Transformer, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = Transformer(13, 13, d_model=16, num_heads=2, num_layers=1, d_ff=32, dropout=0.0,
                        max_len=16).eval()
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(3, 13, (3, 5), generator=gen)
    prefix = torch.cat([torch.ones(3, 1, dtype=torch.long),
                        torch.randint(3, 13, (3, 3), generator=gen)], dim=1)  # BOS + 3 tokens
    return model, src, prefix


@checker("one step of greedy decoding")
def check_next_token(next_token: Callable[[Transformer, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Check ``next_token(model, src, prefix)`` -> ``(B,)`` ids of the most likely next token."""
    model, src, prefix = _next_token_setup()
    with torch.no_grad():
        logits = model(src, prefix)  # (B, T, V)
    want = logits[:, -1].argmax(-1)  # (B,)
    got = attempt(next_token, model, src, prefix.clone())
    if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(logits[:, -1].shape):
        raise ExerciseError(
            f"you return a tensor of shape {tuple(got.shape)} = (B, V): the logits themselves. "
            "Return the id of the best token, argmax over the vocabulary"
        )
    if isinstance(got, torch.Tensor) and tuple(got.shape) == tuple(prefix.shape):
        raise ExerciseError(
            f"you return {tuple(got.shape)} = (B, T): one prediction per position. Only the "
            "last position predicts the next token: take logits[:, -1]"
        )
    expect_shape(got, tuple(want.shape), "next_token(model, src, prefix) for B = 3")
    if torch.equal(got.long(), want):
        return
    if torch.equal(got.long(), logits[:, 0].argmax(-1)):
        raise ExerciseError(
            "you used the logits of the first position (they predict the token after BOS). "
            "The next token comes from the *last* position: logits[:, -1]"
        )
    if torch.equal(got.long(), logits[:, -1].argmin(-1)):
        raise ExerciseError("you took argmin; the most likely token is the argmax")
    raise ExerciseError(
        "your ids differ from model(src, prefix)[:, -1].argmax(-1): run the whole prefix through "
        "the model (teacher forcing the known tokens) and read the last position"
    )
