"""Scaled dot-product attention and multi-head attention.

Explained in the chapters "Scaled dot-product attention" (``book/attention``) and
"Multi-head attention" (``book/multihead``).

Shape letters used throughout the package:

====== ===========================================
B      batch size
T      target (query) length
S      source (key/value) length
h      number of (query) heads
d_k    size of a query/key vector (per head)
d_v    size of a value vector (per head)
====== ===========================================

Masks are boolean and ``True`` means "may attend", the convention of
:func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math
import operator
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer.positional import rotary_embedding

if TYPE_CHECKING:  # only for the annotation of MultiHeadAttention.forward's cache
    from minitransformer.kv_cache import AttentionCache

__all__ = [
    "check_qkv",
    "scaled_dot_product_attention",
    "causal_mask",
    "padding_mask",
    "split_heads",
    "merge_heads",
    "MultiHeadAttention",
    "AttentionFlops",
    "attention_parameter_count",
    "attention_flops",
]


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast of ``shapes`` (NumPy rules), or None if they do not broadcast.

    The same answer as :func:`torch.broadcast_shapes`, in plain Python: torch's version goes
    through its symbolic-shape machinery and cost more than the attention itself for one
    decoding step of a small model (it ran several times per step, in every layer).
    """
    out: list[int] = []
    for sizes in zip(*(reversed(shape) for shape in _padded(shapes))):
        size = 1
        for s in sizes:
            if s != 1:
                if size != 1 and s != size:
                    return None
                size = s
        out.append(size)
    return tuple(reversed(out))


def _padded(shapes: tuple[tuple[int, ...], ...]) -> list[tuple[int, ...]]:
    """``shapes`` left-padded with 1s to a common number of dimensions."""
    ndim = max((len(shape) for shape in shapes), default=0)
    return [(1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes]


def _check_mask(mask: Tensor, scores_shape: tuple[int, ...], query: Tensor, key: Tensor) -> None:
    """Raise unless ``mask`` is a boolean tensor that broadcasts to ``scores_shape`` exactly.

    "Exactly" means the mask may not add leading dimensions of its own: a ``(B, 1, 1, S)``
    padding mask with 3-D ``(B, T, d_k)`` queries would silently broadcast to ``(B, B, T, S)``.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"mask must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise ValueError(
            f"mask must be a boolean tensor (True = may attend), got dtype {mask.dtype}; "
            "an additive float mask or a 0/1 integer mask is not accepted"
        )
    if _broadcast_shape(mask.shape, scores_shape) != tuple(scores_shape):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the score shape "
            f"(..., T, S) = {tuple(scores_shape)} of query {tuple(query.shape)} and "
            f"key {tuple(key.shape)}"
        )


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> tuple[int, ...]:
    """Check attention inputs ``(..., T, d_k)``, ``(..., S, d_k)``, ``(..., S, d_v)``.

    Returns the broadcast leading (batch) shape. Raises ``TypeError`` for non-float tensors and
    ``ValueError``, naming the shapes, for a mismatched ``d_k``, ``S``, dtype or batch shape.
    Shared by :func:`scaled_dot_product_attention` and
    :func:`minitransformer.flash.tiled_attention`.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            "query, key and value need at least 2 dimensions (..., length, features), got "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if not query.dtype == key.dtype == value.dtype:
        raise ValueError(
            f"query, key and value must have the same dtype, got {query.dtype}, {key.dtype} "
            f"and {value.dtype}"
        )
    if query.shape[-1] != key.shape[-1]:
        raise ValueError(
            f"query (..., T, d_k) = {tuple(query.shape)} and key (..., S, d_k) = "
            f"{tuple(key.shape)} must have the same d_k"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key (..., S, d_k) = {tuple(key.shape)} and value (..., S, d_v) = "
            f"{tuple(value.shape)} must have the same length S"
        )
    batch = _broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if batch is None:
        raise ValueError(
            "the leading (batch) dimensions of query, key and value do not broadcast: "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    return batch


def scaled_dot_product_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(Q K^T / sqrt(d_k)) V, returning the output and the attention weights.

    Chapter "Scaled dot-product attention" (``book/attention``) derives every step: the
    scores, the ``1/sqrt(d_k)`` scaling, the masking and the weighted sum.

    Args:
        query: ``(..., T, d_k)``, one row per position that asks.
        key: ``(..., S, d_k)``, one row per position that can be looked at.
        value: ``(..., S, d_v)``, what each of those ``S`` positions passes on.
        mask: optional boolean tensor broadcastable to ``(..., T, S)``; ``True`` = may attend
            (the convention of :func:`torch.nn.functional.scaled_dot_product_attention`).
            The leading (batch) dimensions of query, key and value broadcast with each other;
            the mask broadcasts to theirs but may not add dimensions of its own.

    Returns:
        ``(output, weights)`` with shapes ``(..., T, d_v)`` and ``(..., T, S)``. Each row of
        ``weights`` sums to one, except a query row whose keys are *all* masked: its weights
        and its output are zero (never NaN), as in
        :func:`torch.nn.functional.scaled_dot_product_attention`.

    Raises:
        TypeError: if an argument is not a tensor, or query/key/value are not floating point.
        ValueError: if query, key and value have fewer than 2 dimensions or different dtypes,
            if the query and key sizes ``d_k`` differ, if key and value have different lengths
            ``S``, if the batch dimensions do not broadcast, or if the mask is not boolean or
            does not broadcast to ``(..., T, S)``. The message names the shapes.
    """
    batch = check_qkv(query, key, value)
    if mask is not None:
        _check_mask(mask, batch + (query.shape[-2], key.shape[-2]), query, key)

    d_k = query.shape[-1]
    # Scaling the query before the product is the same as scaling the scores, but keeps the
    # intermediate sums small: in float16, q . k itself can overflow (max 65504).
    scaled_query = query * (1.0 / math.sqrt(d_k))  # (..., T, d_k)
    # (..., T, d_k) @ (..., d_k, S) -> (..., T, S): one row per query, one column per key.
    scores = torch.matmul(scaled_query, key.transpose(-2, -1))
    if mask is not None:
        # Masked scores get the most negative finite number, so that exp() makes them exactly
        # 0 in every row that has at least one visible key. (-inf would do the same there, but
        # turn a fully masked row into 0/0 = NaN, in the forward and in the backward pass.)
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # softmax subtracts the row maximum first, so scores of 1e4 do not overflow exp().
    if scores.requires_grad:
        weights = torch.softmax(scores, dim=-1)  # (..., T, S), each row sums to one
    else:
        # No gradient will flow through here (inference): overwrite the fresh scores instead
        # of allocating a second (..., T, S) tensor, as torch.nn.MultiheadAttention does.
        weights = torch.softmax(scores, dim=-1, out=scores)
    if mask is not None:
        # A fully masked row came out uniform (all its scores were equal): zero it. In the
        # other rows the masked entries are exactly 0 already, so nothing changes there.
        weights = weights.masked_fill(~mask, 0.0)
    output = torch.matmul(weights, value)  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)
    return output, weights


def _as_int(value: object, name: str) -> int:
    """``value`` as a Python int (ints, numpy ints and 0-d integer tensors); else TypeError."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """The ``(size, size)`` boolean mask that is True on and below the diagonal.

    Position ``t`` may attend to positions ``0..t`` only (chapter "Scaled dot-product
    attention", section on masks). It broadcasts against ``(T, T)``, ``(B, T, T)`` and
    ``(B, h, T, T)`` scores and combines with :func:`padding_mask` by ``&``.
    """
    size = _as_int(size, "size")
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: Tensor, max_len: int) -> Tensor:
    """A ``(B, 1, 1, max_len)`` boolean mask, True at the first ``lengths[b]`` positions.

    It hides the padding keys of each sequence (chapter "Scaled dot-product attention",
    section on masks) and broadcasts against ``(B, h, T, S)`` scores with ``S = max_len``;
    ``padding_mask(lengths, T) & causal_mask(T)`` is the ``(B, 1, T, T)`` decoder mask.
    ``lengths`` is a 1-D integer tensor (or list) of shape ``(B,)``.
    """
    lengths = torch.as_tensor(lengths)
    if lengths.dim() != 1:
        raise ValueError(f"lengths must be 1-D (B,), got shape {tuple(lengths.shape)}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    max_len = _as_int(max_len, "max_len")
    if max_len < 0:
        raise ValueError(f"max_len must be non-negative, got {max_len}")
    if lengths.numel() and (int(lengths.max()) > max_len or int(lengths.min()) < 0):
        raise ValueError(f"lengths {lengths.tolist()} must lie in [0, max_len={max_len}]")
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, max_len)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(B, T, h * d_k) -> (B, h, T, d_k)``: cut the last dimension into ``h`` heads.

    Head ``i`` gets features ``i*d_k .. (i+1)*d_k - 1``, the same layout as
    :class:`torch.nn.MultiheadAttention`. The result is a view (no copy): one big projection
    ``x @ W^Q`` of width ``h * d_k``, read as ``h`` projections of width ``d_k``.
    Section "Multi-head attention", "One big projection, reshaped".
    """
    if x.dim() != 3:
        raise ValueError(f"split_heads expects (B, T, h * d_k), got shape {tuple(x.shape)}")
    B, T, D = x.shape
    if num_heads <= 0 or D % num_heads != 0:
        raise ValueError(
            f"last dimension {D} of shape {tuple(x.shape)} is not divisible by "
            f"num_heads={num_heads}"
        )
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)  # (B, h, T, d_k)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, h, T, d_v) -> (B, T, h * d_v)``: concatenate the heads side by side.

    The inverse of :func:`split_heads`: ``merge_heads(split_heads(x, h)) == x``. This is the
    "Concat(head_1, ..., head_h)" of the paper, ready for ``W^O``.
    """
    if x.dim() != 4:
        raise ValueError(f"merge_heads expects (B, h, T, d_v), got shape {tuple(x.shape)}")
    B, h, T, d_v = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_v)  # (B, T, h, d_v) -> (B, T, h * d_v)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch-first (section "Multi-head attention").

    ``h`` heads of size ``d_k = d_v = d_model / h`` each attend with
    :func:`scaled_dot_product_attention`; their outputs are concatenated and mixed by ``W^O``.
    The per-head projections ``W_i^Q`` (``d_model x d_k``) are the column blocks of one
    ``d_model x h*d_k`` matrix, so one ``nn.Linear`` computes all heads at once.

    Args:
        d_model: model width.
        num_heads: number of query heads ``h``; must divide ``d_model`` (unless ``head_dim``
            is given).
        dropout: dropout on the attention weights (training only).
        bias: whether the four projections have biases.
        num_kv_heads: number of key/value heads (grouped-query attention); defaults to
            ``num_heads`` (plain multi-head attention); 1 gives multi-query attention.
            Must divide ``num_heads``.
        head_dim: size ``d_k = d_v`` of each head; defaults to ``d_model // num_heads`` (the
            paper's choice). Any other value changes the cost, as the chapter's design
            question 2 measures.
        rotary: rotate queries and keys by their positions with
            :func:`~minitransformer.positional.rotary_embedding` (RoPE, chapter "Positional
            encoding") before the scores, so that they depend on relative positions only.
            For self-attention: query row ``t`` and key row ``t`` are both at position
            ``start + t`` (see :meth:`forward`). Needs an even ``head_dim``.

    Shapes: ``query`` ``(B, T, d_model)``, ``key``/``value`` ``(B, S, d_model)``; the output is
    ``(B, T, d_model)`` and the per-head weights ``(B, h, T, S)``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        rotary: bool = False,
    ) -> None:
        super().__init__()
        if num_heads <= 0:
            raise ValueError(f"num_heads must be positive, got {num_heads}")
        if head_dim is None:
            if d_model % num_heads != 0:
                raise ValueError(
                    f"d_model={d_model} must be divisible by num_heads={num_heads} "
                    f"(d_k = d_model / h); d_model % num_heads = {d_model % num_heads}"
                )
            head_dim = d_model // num_heads
        if head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {head_dim}")
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if num_kv_heads <= 0 or num_heads % num_kv_heads != 0:
            raise ValueError(f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must lie in [0, 1), got {dropout}")
        if rotary and head_dim % 2 != 0:
            raise ValueError(f"rotary=True rotates pairs of features: head_dim={head_dim} must be even")
        self.rotary = rotary
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.d_k = head_dim
        self.w_q = nn.Linear(d_model, num_heads * head_dim, bias=bias)  # all W_i^Q side by side
        self.w_k = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.w_v = nn.Linear(d_model, num_kv_heads * head_dim, bias=bias)
        self.w_o = nn.Linear(num_heads * head_dim, d_model, bias=bias)  # W^O: h*d_v x d_model
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = True,
        cache: AttentionCache | None = None,
        start: int | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` ``(B, T, d_model)`` to ``key``/``value`` ``(B, S, d_model)``.

        Args:
            mask: boolean, broadcastable to ``(B, h, T, S)``, True = may attend.
            need_weights: ``True`` (default) computes the attention explicitly with
                :func:`scaled_dot_product_attention` and returns the per-head weights (in
                training with dropout, the dropped-out weights that were used, as PyTorch
                does). ``False`` calls PyTorch's fused kernel
                :func:`torch.nn.functional.scaled_dot_product_attention`, which never
                materialises the ``(B, h, T, S)`` weights, and returns ``None`` for them.
            cache: a :class:`~minitransformer.kv_cache.AttentionCache` for incremental
                decoding (chapter ``book/inference``). The new keys/values (only the
                ``num_kv_heads`` KV heads) are appended to it and attention runs over all
                cached positions, so ``S`` is then the cache length; a filled static
                (cross-attention) cache is reused without projecting ``key``/``value`` again.
            start: with ``rotary=True``, the position of the first query row and of the first
                new key row: queries are at ``start .. start + T - 1``, keys at
                ``start .. start + S - 1``. Default: the number of positions already in the
                cache, else 0. Keys enter the cache already rotated.

        Returns:
            ``(output, weights)``: ``(B, T, d_model)`` and ``(B, h, T, S)`` (or ``None``).
        """
        self._check_inputs(query, key, value)
        if start is not None and not self.rotary:
            raise ValueError("start (the position of the first row) only applies with rotary=True")
        if self.rotary:
            if cache is not None and cache.static:
                raise ValueError("rotary=True is for self-attention; got a static (cross-attention) cache")
            if start is None:
                start = 0 if cache is None else cache.length
            if start < 0:
                raise ValueError(f"start must be non-negative, got {start}")
        q = split_heads(self.w_q(query), self.num_heads)  # (B, h, T, d_k)
        if self.rotary:  # query row t sits at position start + t
            q = rotary_embedding(q, torch.arange(start, start + q.shape[2], device=q.device))
        if cache is not None and cache.reuse:
            k, v = cache.get()  # cross-attention: the source's K/V, projected once, reused
        else:
            k = split_heads(self.w_k(key), self.num_kv_heads)  # (B, h_kv, S, d_k)
            v = split_heads(self.w_v(value), self.num_kv_heads)  # (B, h_kv, S, d_v)
            if self.rotary:  # rotated once, before caching: a key's position never changes
                k = rotary_embedding(k, torch.arange(start, start + k.shape[2], device=k.device))
            if cache is not None:
                k, v = cache.update(k, v)  # (B, h_kv, S, d_k): cached positions + the new ones
        if self.num_kv_heads != self.num_heads:
            # Grouped-query attention: each KV head serves num_heads / num_kv_heads query heads.
            group = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(group, dim=1)  # (B, h, S, d_k)
            v = v.repeat_interleave(group, dim=1)  # (B, h, S, d_v)
        p = self.dropout.p if self.training else 0.0
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask)  # (B, h, T, d_v)
            if p > 0.0:
                weights = self.dropout(weights)  # drop whole query-key links, training only
                out = torch.matmul(weights, v)  # (B, h, T, d_v)
        else:
            if mask is not None:
                _check_mask(mask, q.shape[:-1] + k.shape[-2:-1], q, k)  # (B, h, T, S)
            # Same convention as ours: a boolean attn_mask is True where attention is allowed.
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)
            weights = None
        return self.w_o(merge_heads(out)), weights  # (B, T, h * d_v) -> (B, T, d_model)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        """Raise ``ValueError`` naming the shapes unless they fit ``(B, T|S, d_model)``."""
        q, k, v = query.shape, key.shape, value.shape
        if len(q) == len(k) == len(v) == 3 and q[2] == k[2] == v[2] == self.d_model \
                and k[:2] == v[:2] and q[0] == k[0]:
            return  # the common case, checked without building any message (hot path)
        shapes = f"query {tuple(q)}, key {tuple(k)}, value {tuple(v)}"
        if len(q) != 3 or len(k) != 3 or len(v) != 3:
            raise ValueError(f"query, key and value must be 3-D (B, length, d_model), got {shapes}")
        if any(x[-1] != self.d_model for x in (q, k, v)):
            raise ValueError(f"expected last dimension d_model={self.d_model}, got {shapes}")
        raise ValueError(f"key and value must be (B, S, d_model) with the query's B, got {shapes}")

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> "MultiHeadAttention":
        """A copy of ``torch.nn.MultiheadAttention(d_model, h, batch_first=True)``'s weights.

        PyTorch stacks ``[W_q; W_k; W_v]`` into one ``(3 d_model, d_model)``
        ``in_proj_weight``; we cut it into our three projections. Call the result with batch-
        first inputs and *our* mask convention (True = may attend); PyTorch's boolean
        ``attn_mask`` and ``key_padding_mask`` mean the opposite (True = blocked).

        Raises:
            TypeError: if ``module`` is not a ``torch.nn.MultiheadAttention``.
            ValueError: for ``kdim``/``vdim`` different from ``embed_dim``, ``add_bias_kv`` or
                ``add_zero_attn``, which this module does not have.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(module).__name__}")
        if not module._qkv_same_embed_dim:
            raise ValueError(
                f"kdim={module.kdim} and vdim={module.vdim} must equal embed_dim={module.embed_dim}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart here")
        bias = module.in_proj_bias is not None
        new = cls(module.embed_dim, module.num_heads, dropout=module.dropout, bias=bias)
        new = new.to(device=module.in_proj_weight.device, dtype=module.in_proj_weight.dtype)
        w_q, w_k, w_v = module.in_proj_weight.detach().chunk(3, dim=0)  # 3 x (d_model, d_model)
        with torch.no_grad():
            for ours, w in ((new.w_q, w_q), (new.w_k, w_k), (new.w_v, w_v)):
                ours.weight.copy_(w)
            new.w_o.weight.copy_(module.out_proj.weight)
            if bias:
                for ours, b in zip((new.w_q, new.w_k, new.w_v), module.in_proj_bias.chunk(3)):
                    ours.bias.copy_(b)
                new.w_o.bias.copy_(module.out_proj.bias)
        return new.train(module.training)


def _head_sizes(
    d_model: int, num_heads: int, num_kv_heads: int | None, head_dim: int | None
) -> tuple[int, int]:
    """Validate the cost functions' arguments; return ``(d_k, h_kv)``."""
    if d_model <= 0 or num_heads <= 0:
        raise ValueError(f"d_model={d_model} and num_heads={num_heads} must be positive")
    if head_dim is None:
        if d_model % num_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by num_heads={num_heads}")
        head_dim = d_model // num_heads
    h_kv = num_heads if num_kv_heads is None else num_kv_heads
    if head_dim <= 0 or h_kv <= 0 or num_heads % h_kv != 0:
        raise ValueError(
            f"head_dim={head_dim} must be positive and num_kv_heads={h_kv} must divide "
            f"num_heads={num_heads}"
        )
    return head_dim, h_kv


def attention_parameter_count(
    d_model: int,
    num_heads: int,
    bias: bool = True,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
) -> int:
    """Parameters of :class:`MultiHeadAttention`.

    Section "Design question 2: why d_k = d_model / h?" of the chapter "Multi-head attention".

    ``W^Q`` is ``d_model x h*d_k``, ``W^K`` and ``W^V`` are ``d_model x h_kv*d_k``, ``W^O`` is
    ``h*d_v x d_model``. With ``d_k = d_model / h`` this is ``4 d_model^2 + 4 d_model`` for
    every ``h``: the number of heads does not change the size of the layer.
    """
    d_k, h_kv = _head_sizes(d_model, num_heads, num_kv_heads, head_dim)
    q_out, kv_out = num_heads * d_k, h_kv * d_k
    weights = d_model * q_out + 2 * d_model * kv_out + q_out * d_model
    biases = q_out + 2 * kv_out + d_model if bias else 0
    return weights + biases


class AttentionFlops(NamedTuple):
    """Multiply-adds of one multi-head attention call, per batch element."""

    projections: int
    """The four projections ``Q = X W^Q``, ``K``, ``V`` and ``Concat(heads) W^O``."""
    attention: int
    """The two attention matmuls ``Q K^T`` and ``weights V``, summed over heads."""

    @property
    def total(self) -> int:
        return self.projections + self.attention


def attention_flops(
    T: int,
    S: int,
    d_model: int,
    num_heads: int,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
) -> AttentionFlops:
    """Multiply-adds of :class:`MultiHeadAttention` for one sequence.

    Section "Design question 2: why d_k = d_model / h?" of the chapter "Multi-head attention".

    Counts the projections (``T d_model h d_k`` for queries, ``S d_model h_kv d_k`` each for
    keys and values, ``T h d_v d_model`` for ``W^O``) and the two attention matmuls
    (``h T S d_k`` for the scores, ``h T S d_v`` for the weighted sum). Softmax, scaling and
    biases are lower order and left out. Multiply by 2 for floating-point operations and by
    ``B`` for a batch.
    """
    if T < 0 or S < 0:
        raise ValueError(f"lengths must be non-negative, got T={T}, S={S}")
    d_k, h_kv = _head_sizes(d_model, num_heads, num_kv_heads, head_dim)
    projections = T * d_model * num_heads * d_k + 2 * S * d_model * h_kv * d_k
    projections += T * num_heads * d_k * d_model
    attention = 2 * num_heads * T * S * d_k
    return AttentionFlops(projections, attention)
