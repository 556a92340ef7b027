"""The encoder–decoder Transformer of "Attention Is All You Need", batch-first.

Explained in the chapter "The encoder–decoder picture" (``book/encoder_decoder``); trained in
"Training a Transformer" (``book/training``).

Read top to bottom: :class:`FeedForward` (the position-wise FFN), :class:`EncoderLayer`,
:class:`DecoderLayer`, the :class:`Encoder` and :class:`Decoder` stacks, and the
:class:`Transformer` that adds embeddings, positional encodings and the output projection.
:func:`parameter_breakdown` counts parameters the way the paper's Table 3 does.

Shapes (the letters of the whole package): ``B`` batch, ``S`` source length, ``T`` target
length, ``h`` heads, ``d_model`` model width, ``d_ff`` FFN width, ``N`` layers, ``V`` vocabulary.

Masks are boolean, ``True`` = "may attend" (``torch.nn.Transformer*`` uses the opposite).

* ``src_mask``: ``(B, 1, 1, S)``, hides source padding (from
  :func:`minitransformer.attention.padding_mask` or :func:`minitransformer.data.src_padding_mask`).
  It is used by encoder self-attention and by the decoder's cross-attention.
* ``tgt_mask``: anything broadcastable to ``(B, h, T, T)``, e.g. target padding ``(B, 1, 1, T)``.
  :meth:`Transformer.decode` always combines it with the causal mask by ``&``.

Sub-layer recipe (section "The sub-layer recipe"): with ``norm_first=False`` (post-LN, the
paper) each sub-layer computes ``LayerNorm(x + Dropout(Sublayer(x)))``; with ``norm_first=True``
(pre-LN, most modern models) it computes ``x + Dropout(Sublayer(LayerNorm(x)))`` and the stack
ends with one more LayerNorm, because nothing else normalises the residual stream.

After every forward pass each layer keeps the attention weights it computed, detached, for
plotting: ``EncoderLayer.self_attn_weights`` ``(B, h, S, S)``,
``DecoderLayer.self_attn_weights`` ``(B, h, T, T)`` and ``DecoderLayer.cross_attn_weights``
``(B, h, T, S)``. :meth:`Transformer.attention_weights` collects them for all layers.
Incremental decoding with a KV cache is the exception: a cached step sees one query row, so
the decoder layers use the fused attention kernel and keep ``None`` (see
:meth:`DecoderLayer.forward`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer.attention import MultiHeadAttention, causal_mask
from minitransformer.positional import PositionalEncoding

if TYPE_CHECKING:  # annotations of the cache arguments (chapter "Inference")
    from minitransformer.kv_cache import KVCache, LayerCache

__all__ = [
    "FeedForward",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "Transformer",
    "parameter_breakdown",
]


def _dropout(module: nn.Dropout, x: Tensor) -> Tensor:
    """``module(x)``, skipping the call when it is the identity (eval mode, or ``p = 0``).

    Each module call costs a few microseconds of Python; a cached decoding step makes
    dozens of them for one token, so the no-ops are worth skipping.
    """
    return F.dropout(x, module.p, True, module.inplace) if module.training and module.p else x


class FeedForward(nn.Module):
    """The position-wise feed-forward network ``FFN(x) = max(0, x W_1 + b_1) W_2 + b_2``.

    The same two linear maps are applied at every position: ``(B, L, d_model) -> (B, L,
    d_model)`` through a hidden width ``d_ff`` (2048 in the paper's base model). Dropout acts
    on the hidden activations, as in :class:`torch.nn.TransformerEncoderLayer`.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)  # W_1, b_1
        self.linear2 = nn.Linear(d_ff, d_model)  # W_2, b_2
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        # (B, L, d_model) -> (B, L, d_ff) -> (B, L, d_model)
        return self.linear2(_dropout(self.dropout, torch.relu(self.linear1(x))))


def _check_torch_layer(layer: nn.Module, kind: str) -> None:
    """Reject torch layers whose computation our layers do not reproduce."""
    mha = layer.self_attn
    if not mha.batch_first:
        raise ValueError(f"{kind}.from_torch needs a layer built with batch_first=True")
    act = getattr(layer, "activation", None)
    if act is not torch.nn.functional.relu and not isinstance(act, nn.ReLU):
        raise ValueError(f"{kind}.from_torch needs activation='relu', got {act!r}")
    if mha.in_proj_weight is None:
        raise ValueError(f"{kind}.from_torch needs packed q/k/v projections (kdim = vdim = d_model)")
    if mha.in_proj_bias is None or layer.linear1.bias is None or layer.norm1.bias is None:
        raise ValueError(f"{kind}.from_torch needs a torch layer with biases (bias=True)")


def _copy_attention(ours: MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Copy :class:`torch.nn.MultiheadAttention` weights into our :class:`MultiHeadAttention`.

    torch packs ``W^Q, W^K, W^V`` row-wise into one ``(3 d_model, d_model)`` ``in_proj_weight``.
    """
    w_q, w_k, w_v = theirs.in_proj_weight.detach().chunk(3, dim=0)  # 3 x (d_model, d_model)
    b_q, b_k, b_v = theirs.in_proj_bias.detach().chunk(3, dim=0)
    with torch.no_grad():
        for lin, w, b in ((ours.w_q, w_q, b_q), (ours.w_k, w_k, b_k), (ours.w_v, w_v, b_v)):
            lin.weight.copy_(w)
            lin.bias.copy_(b)
        ours.w_o.weight.copy_(theirs.out_proj.weight)
        ours.w_o.bias.copy_(theirs.out_proj.bias)


def _copy_norm(ours: nn.LayerNorm, theirs: nn.LayerNorm) -> None:
    with torch.no_grad():
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)
    ours.eps = theirs.eps


def _copy_linear(ours: nn.Linear, theirs: nn.Linear) -> None:
    with torch.no_grad():
        ours.weight.copy_(theirs.weight)
        ours.bias.copy_(theirs.bias)


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention, then the FFN, each wrapped in residual + LayerNorm.

    ``forward(x, mask)`` maps ``(B, S, d_model) -> (B, S, d_model)``. ``mask`` (boolean, True =
    may attend) broadcasts to ``(B, h, S, S)``; usually the source padding mask ``(B, 1, 1, S)``.
    After a call, ``self_attn_weights`` holds the detached weights ``(B, h, S, S)``.

    Section "The sub-layer recipe" of the chapter "The encoder–decoder picture".
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)  # on each sub-layer's output, before the residual add
        self.dropout2 = nn.Dropout(dropout)
        self.self_attn_weights: Tensor | None = None

    def _self_attention(self, x: Tensor, mask: Tensor | None) -> Tensor:
        out, weights = self.self_attn(x, x, x, mask)  # (B, S, d_model), (B, h, S, S)
        self.self_attn_weights = weights.detach()
        return _dropout(self.dropout1, out)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        if self.norm_first:  # pre-LN: x + Sublayer(LayerNorm(x))
            x = x + self._self_attention(self.norm1(x), mask)
            x = x + _dropout(self.dropout2, self.feed_forward(self.norm2(x)))
        else:  # post-LN (the paper): LayerNorm(x + Sublayer(x))
            x = self.norm1(x + self._self_attention(x, mask))
            x = self.norm2(x + _dropout(self.dropout2, self.feed_forward(x)))
        return x

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> "EncoderLayer":
        """A copy of a :class:`torch.nn.TransformerEncoderLayer` (``batch_first=True``, ReLU).

        Sizes, dropout, LayerNorm epsilon and ``norm_first`` are read from ``layer``. In eval
        mode the copy computes the same function (up to floating-point rounding).
        """
        _check_torch_layer(layer, "EncoderLayer")
        ours = cls(
            d_model=layer.linear1.in_features,
            num_heads=layer.self_attn.num_heads,
            d_ff=layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
        )
        _copy_attention(ours.self_attn, layer.self_attn)
        _copy_linear(ours.feed_forward.linear1, layer.linear1)
        _copy_linear(ours.feed_forward.linear2, layer.linear2)
        _copy_norm(ours.norm1, layer.norm1)
        _copy_norm(ours.norm2, layer.norm2)
        return ours.to(layer.linear1.weight.device, layer.linear1.weight.dtype)


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, cross-attention to the encoder output, FFN.

    With ``cross_attention=False`` the layer has no cross-attention sub-layer (and no ``norm2``,
    ``dropout2``): masked self-attention and the FFN only, the layer of a decoder-only language
    model. ``memory`` is then ``None``.

    ``forward(x, memory, tgt_mask, memory_mask)`` maps ``x`` ``(B, T, d_model)`` and the encoder
    output ``memory`` ``(B, S, d_model)`` to ``(B, T, d_model)``. ``tgt_mask`` broadcasts to
    ``(B, h, T, T)`` and must already contain the causal mask (the layer adds nothing: the
    :class:`Decoder`'s caller decides); ``memory_mask`` broadcasts to ``(B, h, T, S)``, usually the
    source padding mask ``(B, 1, 1, S)``. After a call, ``self_attn_weights`` ``(B, h, T, T)``
    and ``cross_attn_weights`` ``(B, h, T, S)`` hold the detached attention weights.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        cross_attention: bool = True,
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout) if cross_attention else None
        self.feed_forward = FeedForward(d_model, d_ff, dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model) if cross_attention else None
        self.norm3 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout) if cross_attention else None
        self.dropout3 = nn.Dropout(dropout)
        self.self_attn_weights: Tensor | None = None
        self.cross_attn_weights: Tensor | None = None

    # With a cache (incremental decoding) the weights are not computed: a step sees only its
    # own query row, not the (T, T) map a plot wants, and the fused kernel
    # (need_weights=False) is one operation instead of the half-dozen of the explicit path.
    def _self_attention(self, x: Tensor, mask: Tensor | None, cache=None) -> Tensor:
        out, weights = self.self_attn(x, x, x, mask, need_weights=cache is None, cache=cache)
        # out (B, T, d_model); weights (B, h, T, T), or None with a cache
        self.self_attn_weights = None if weights is None else weights.detach()
        return _dropout(self.dropout1, out)

    def _cross_attention(self, x: Tensor, memory: Tensor, mask: Tensor | None, cache=None) -> Tensor:
        # Queries come from the decoder, keys and values from the encoder output.
        out, weights = self.cross_attn(x, memory, memory, mask, need_weights=cache is None,
                                       cache=cache)  # (B, T, d_model), (B, h, T, S) or None
        self.cross_attn_weights = None if weights is None else weights.detach()
        return _dropout(self.dropout2, out)

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """``cache`` (incremental decoding, chapter "Inference"): ``x`` holds only the new
        positions; self-attention appends their K/V to ``cache.self_attn`` and attends over all
        cached positions (``tgt_mask`` then broadcasts to ``(B, h, T, cache length)``), and
        cross-attention reuses the encoder K/V stored in ``cache.cross_attn``. The attention
        weights are then not computed: ``self_attn_weights`` and ``cross_attn_weights`` become
        None (run the model without a cache to plot them)."""
        self_cache = cache.self_attn if cache is not None else None
        cross_cache = cache.cross_attn if cache is not None else None
        if (memory is None) != (self.cross_attn is None):
            raise ValueError(
                "memory must be given exactly when the layer has cross-attention "
                f"(cross_attention={self.cross_attn is not None}), got "
                f"{'None' if memory is None else tuple(memory.shape)}"
            )
        if self.norm_first:  # pre-LN
            x = x + self._self_attention(self.norm1(x), tgt_mask, self_cache)
            if self.cross_attn is not None:
                x = x + self._cross_attention(self.norm2(x), memory, memory_mask, cross_cache)
            x = x + _dropout(self.dropout3, self.feed_forward(self.norm3(x)))
        else:  # post-LN (the paper)
            x = self.norm1(x + self._self_attention(x, tgt_mask, self_cache))
            if self.cross_attn is not None:
                x = self.norm2(x + self._cross_attention(x, memory, memory_mask, cross_cache))
            x = self.norm3(x + _dropout(self.dropout3, self.feed_forward(x)))
        return x

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> "DecoderLayer":
        """A copy of a :class:`torch.nn.TransformerDecoderLayer` (``batch_first=True``, ReLU).

        Sizes, dropout, LayerNorm epsilon and ``norm_first`` are read from ``layer``.
        """
        _check_torch_layer(layer, "DecoderLayer")
        ours = cls(
            d_model=layer.linear1.in_features,
            num_heads=layer.self_attn.num_heads,
            d_ff=layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
        )
        _copy_attention(ours.self_attn, layer.self_attn)
        _copy_attention(ours.cross_attn, layer.multihead_attn)
        _copy_linear(ours.feed_forward.linear1, layer.linear1)
        _copy_linear(ours.feed_forward.linear2, layer.linear2)
        _copy_norm(ours.norm1, layer.norm1)
        _copy_norm(ours.norm2, layer.norm2)
        _copy_norm(ours.norm3, layer.norm3)
        return ours.to(layer.linear1.weight.device, layer.linear1.weight.dtype)


def _stack_from_torch(cls, stack: nn.Module, layer_cls, kind: str):
    layers = [layer_cls.from_torch(layer) for layer in stack.layers]
    first = layers[0]
    norm_first = first.norm_first
    ours = cls(
        num_layers=len(layers),
        d_model=first.norm1.normalized_shape[0],
        num_heads=first.self_attn.num_heads,
        d_ff=first.feed_forward.linear1.out_features,
        dropout=first.dropout1.p,
        norm_first=norm_first,
        final_norm=stack.norm is not None,
    )
    ours.layers = nn.ModuleList(layers)
    if stack.norm is not None:
        _copy_norm(ours.norm, stack.norm)
    return ours.to(first.norm1.weight.device)


class Encoder(nn.Module):
    """A stack of ``num_layers`` :class:`EncoderLayer` s: ``(B, S, d_model) -> (B, S, d_model)``.

    ``final_norm`` (default: ``norm_first``) adds a LayerNorm after the last layer. A pre-LN
    stack needs it: its residual stream is never normalised otherwise. A post-LN stack already
    ends on a LayerNorm. This matches :class:`torch.nn.TransformerEncoder` with ``norm=None``
    (post-LN) or ``norm=LayerNorm(d_model)`` (pre-LN).
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        final_norm: bool | None = None,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, num_heads, d_ff, dropout, norm_first) for _ in range(num_layers)
        )
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(d_model) if final_norm else None

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)  # (B, S, d_model)
        return self.norm(x) if self.norm is not None else x

    @classmethod
    def from_torch(cls, stack: nn.TransformerEncoder) -> "Encoder":
        """A copy of a :class:`torch.nn.TransformerEncoder` (its final ``norm`` included)."""
        return _stack_from_torch(cls, stack, EncoderLayer, "Encoder")


class Decoder(nn.Module):
    """A stack of ``num_layers`` :class:`DecoderLayer` s reading the encoder output ``memory``.

    ``forward(x, memory, tgt_mask, memory_mask)``: ``(B, T, d_model)`` and ``(B, S, d_model)``
    to ``(B, T, d_model)``. ``tgt_mask`` is passed to every layer as is (include the causal
    mask; :meth:`Transformer.decode` does). ``final_norm`` as in :class:`Encoder`.
    ``cross_attention=False`` builds a decoder-only stack (no encoder, ``memory=None``).
    """

    def __init__(
        self,
        num_layers: int,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        norm_first: bool = False,
        final_norm: bool | None = None,
        cross_attention: bool = True,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, num_heads, d_ff, dropout, norm_first, cross_attention)
            for _ in range(num_layers)
        )
        final_norm = norm_first if final_norm is None else final_norm
        self.norm = nn.LayerNorm(d_model) if final_norm else None

    def forward(
        self,
        x: Tensor,
        memory: Tensor | None,
        tgt_mask: Tensor | None = None,
        memory_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """``cache``: a :class:`~minitransformer.kv_cache.KVCache` with one entry per layer."""
        if cache is None:
            for layer in self.layers:
                x = layer(x, memory, tgt_mask, memory_mask)  # (B, T, d_model)
        else:
            if len(cache.layers) != len(self.layers):
                raise ValueError(
                    f"the cache has {len(cache.layers)} layers, the decoder {len(self.layers)}"
                )
            for layer, layer_cache in zip(self.layers, cache.layers):
                x = layer(x, memory, tgt_mask, memory_mask, layer_cache)  # (B, T_new, d_model)
        return self.norm(x) if self.norm is not None else x

    @classmethod
    def from_torch(cls, stack: nn.TransformerDecoder) -> "Decoder":
        """A copy of a :class:`torch.nn.TransformerDecoder` (its final ``norm`` included)."""
        return _stack_from_torch(cls, stack, DecoderLayer, "Decoder")


class Transformer(nn.Module):
    """The encoder–decoder Transformer (chapter "The encoder–decoder picture").

    ``encode`` maps source ids ``(B, S)`` to the memory ``(B, S, d_model)``; ``decode`` maps
    target ids ``(B, T)`` and the memory to logits ``(B, T, tgt_vocab_size)``; ``forward`` does
    both (teacher forcing: the whole shifted target is fed at once).

    Embeddings are multiplied by ``sqrt(d_model)`` and summed with the sinusoidal
    :class:`~minitransformer.positional.PositionalEncoding` (followed by dropout).

    With ``tie_embeddings=True`` (the paper, section 3.4): if the two vocabularies have the same
    size, the source embedding, the target embedding and the output projection share one
    ``(V, d_model)`` matrix; otherwise only the target embedding and the output projection
    share one. The output projection has no bias.

    Initialisation: Xavier-uniform for every weight matrix of the layers (as
    :class:`torch.nn.Transformer` and The Annotated Transformer do) and ``N(0, 1/d_model)`` for
    the embedding, so that ``sqrt(d_model)`` times an embedding has entries of variance 1 and
    the tied output projection starts with small logits.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 512,
        num_heads: int = 8,
        num_layers: int = 6,
        d_ff: int = 2048,
        dropout: float = 0.1,
        tie_embeddings: bool = True,
        norm_first: bool = False,
        max_len: int = 5000,
    ) -> None:
        super().__init__()
        for name, value in (("src_vocab_size", src_vocab_size), ("tgt_vocab_size", tgt_vocab_size),
                            ("d_model", d_model), ("num_layers", num_layers), ("d_ff", d_ff),
                            ("max_len", max_len)):
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        self.src_vocab_size = src_vocab_size
        self.tgt_vocab_size = tgt_vocab_size
        self.d_model = d_model
        self.num_heads = num_heads
        self.max_len = max_len
        self.norm_first = norm_first
        self.tie_embeddings = tie_embeddings

        self.src_embed = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embed = nn.Embedding(tgt_vocab_size, d_model)
        self.positional = PositionalEncoding(d_model, max_len, dropout=dropout)
        self.encoder = Encoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.decoder = Decoder(num_layers, d_model, num_heads, d_ff, dropout, norm_first)
        self.output = nn.Linear(d_model, tgt_vocab_size, bias=False)  # pre-softmax projection

        self._reset_parameters()
        if tie_embeddings:
            # One Parameter object, several modules: gradients from all uses add up.
            self.output.weight = self.tgt_embed.weight  # both (V_tgt, d_model)
            if src_vocab_size == tgt_vocab_size:
                self.src_embed.weight = self.tgt_embed.weight

    def _reset_parameters(self) -> None:
        for module in (self.encoder, self.decoder):
            for p in module.parameters():
                if p.dim() > 1:
                    nn.init.xavier_uniform_(p)
        for emb in (self.src_embed, self.tgt_embed):
            nn.init.normal_(emb.weight, mean=0.0, std=self.d_model ** -0.5)
        nn.init.normal_(self.output.weight, mean=0.0, std=self.d_model ** -0.5)

    # -- input checks -------------------------------------------------------------------
    def _check_tokens(self, tokens: Tensor, name: str, vocab_size: int) -> None:
        if not isinstance(tokens, Tensor):
            raise TypeError(f"{name} must be a tensor of token ids, got {type(tokens).__name__}")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(
                f"{name} must hold integer token ids (torch.long), got dtype {tokens.dtype}"
            )
        if tokens.dim() != 2:
            raise ValueError(f"{name} must have shape (B, length), got {tuple(tokens.shape)}")
        if tokens.shape[1] > self.max_len:
            raise ValueError(
                f"{name} has length {tokens.shape[1]} > max_len={self.max_len} "
                f"(shape {tuple(tokens.shape)}); build the model with a larger max_len"
            )
        if tokens.numel() and tokens.device.type != "meta":
            lo, hi = (int(x) for x in torch.aminmax(tokens))  # one pass over the ids
            if lo < 0 or hi >= vocab_size:
                raise ValueError(
                    f"{name} holds ids in [{lo}, {hi}], outside the vocabulary [0, {vocab_size})"
                )

    @staticmethod
    def _check_mask(mask: Tensor | None, name: str) -> None:
        if mask is not None and mask.dtype != torch.bool:
            raise ValueError(
                f"{name} must be a boolean tensor (True = may attend), got dtype {mask.dtype}"
            )

    # -- the model ------------------------------------------------------------------------
    def embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        """``(B, L)`` ids -> ``(B, L, d_model)``: ``sqrt(d_model) * E[ids]`` plus positions.

        ``start`` is the position of the first token (the cache length when decoding with a
        KV cache)."""
        return self.positional(embedding(tokens) * math.sqrt(self.d_model), start)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, d_model)``.

        ``src_mask``: boolean ``(B, 1, 1, S)``, True at real (non-padding) tokens, or None.
        """
        self._check_tokens(src, "src", self.src_vocab_size)
        self._check_mask(src_mask, "src_mask")
        return self.encoder(self.embed(src, self.src_embed), src_mask)  # (B, S, d_model)

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Target ids ``(B, T)`` and memory ``(B, S, d_model)`` -> logits ``(B, T, V_tgt)``.

        The causal mask is always applied; a given ``tgt_mask`` (boolean, broadcastable to
        ``(B, h, T, T)``, e.g. target padding ``(B, 1, 1, T)``) is combined with it by ``&``.
        The logits at position ``t`` predict token ``t + 1`` from tokens ``0..t``.

        With a :class:`~minitransformer.kv_cache.KVCache` (incremental decoding, chapter
        "Inference: the KV cache"), ``tgt`` holds only the ``T`` *new* tokens, at positions
        ``cache.length .. cache.length + T - 1``; their keys and values are appended to the
        cache and the logits of the new positions are returned. Feeding a sequence in pieces
        gives the same logits as feeding it whole. A ``tgt_mask`` must then broadcast to
        ``(B, h, T, cache.length + T)``.
        """
        self._check_tokens(tgt, "tgt", self.tgt_vocab_size)
        self._check_mask(src_mask, "src_mask")
        self._check_mask(tgt_mask, "tgt_mask")
        if memory.dim() != 3 or memory.shape[-1] != self.d_model:
            raise ValueError(
                f"memory must have shape (B, S, d_model={self.d_model}), got {tuple(memory.shape)}"
            )
        if memory.shape[0] != tgt.shape[0]:
            raise ValueError(
                f"batch sizes differ: tgt {tuple(tgt.shape)} vs memory {tuple(memory.shape)}"
            )
        T = tgt.shape[1]
        start = 0 if cache is None else cache.length  # positions already cached
        if cache is None:
            mask = causal_mask(T, device=tgt.device)  # (T, T)
        elif T == 1:
            mask = None  # one new position may attend to every cached position and itself
        else:
            mask = causal_mask(start + T, device=tgt.device)[start:]  # (T, start + T)
        if tgt_mask is not None:
            # broadcasts to (B, 1, T, T) or (B, h, T, T); with a cache, (..., T, start + T)
            mask = tgt_mask if mask is None else mask & tgt_mask
        x = self.embed(tgt, self.tgt_embed, start)  # (B, T, d_model)
        x = self.decoder(x, memory, mask, src_mask, cache)  # (B, T, d_model)
        return self.output(x)  # (B, T, V_tgt)

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        src_mask: Tensor | None = None,
        tgt_mask: Tensor | None = None,
    ) -> Tensor:
        """Teacher forcing: source ``(B, S)`` and shifted target ``(B, T)`` -> logits
        ``(B, T, V_tgt)``."""
        if isinstance(src, Tensor) and isinstance(tgt, Tensor) and src.dim() == tgt.dim() == 2:
            if src.shape[0] != tgt.shape[0]:
                raise ValueError(
                    f"batch sizes differ: src {tuple(src.shape)} vs tgt {tuple(tgt.shape)}"
                )
        memory = self.encode(src, src_mask)
        return self.decode(tgt, memory, src_mask, tgt_mask)

    def attention_weights(self) -> dict[str, list[Tensor]]:
        """The attention weights of the last forward pass, per layer, for plotting.

        Returns ``{"encoder": [(B, h, S, S)] * N, "decoder_self": [(B, h, T, T)] * N,
        "cross": [(B, h, T, S)] * N}`` (entries are None for layers not run yet, and the
        decoder's are None after a step with a KV cache, which does not compute them).
        """
        return {
            "encoder": [layer.self_attn_weights for layer in self.encoder.layers],
            "decoder_self": [layer.self_attn_weights for layer in self.decoder.layers],
            "cross": [layer.cross_attn_weights for layer in self.decoder.layers],
        }


def _count(params) -> int:
    return sum(p.numel() for p in params)


def parameter_breakdown(model: Transformer) -> dict[str, int]:
    """Parameter counts of ``model``: ``embeddings``, ``encoder``, ``decoder`` and ``total``.

    A matrix shared by tying is counted once (in ``embeddings``, which holds the source and
    target embeddings and the output projection). The sinusoidal positional encoding is a
    buffer, not a parameter. ``total`` equals ``sum(p.numel() for p in model.parameters())``.
    Works on a model built on the ``meta`` device (no memory is allocated).
    """
    seen: set[int] = set()

    def unique(module: nn.Module) -> list[Tensor]:
        out = []
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
