"""Scaled dot-product attention and multi-head attention (and additive attention, to compare).

Chapters "Scaled dot-product attention" (``book/attention``) and "Multi-head attention"
(``book/multihead``). Shape letters: B batch, T query length, S key/value length, h query heads,
h_kv key/value heads, d_k = d_v the size of one head.

Masks are boolean and ``True`` means "may attend", the convention of
:func:`torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from minitransformer._checks import positive_int, probability, tensor
from minitransformer._layout import step_weight, transposed_layout
from minitransformer.kv_cache import AttentionCache
from minitransformer.positional import rotary_embedding

__all__ = [
    "scaled_dot_product_attention",
    "additive_attention",
    "AdditiveAttention",
    "causal_mask",
    "padding_mask",
    "split_heads",
    "merge_heads",
    "Projection",
    "MultiHeadAttention",
    "AttentionFlops",
    "attention_parameter_count",
    "attention_flops",
    "check_qkv",
    "check_mask",
]


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """``softmax(Q K^T / sqrt(d_k)) V``: returns ``(output, weights)``.

    Chapter "Scaled dot-product attention" (``book/attention``).

    Args:
        query: ``(..., T, d_k)``; key: ``(..., S, d_k)``; value: ``(..., S, d_v)``. The leading
            (batch) dimensions broadcast with each other.
        mask: boolean, broadcastable to ``(..., T, S)`` without adding dimensions; True = may
            attend.
        dropout_p: dropout on the weights before they multiply the values (training); the
            returned weights are the dropped-out ones that were used.

    Returns:
        ``(..., T, d_v)`` and ``(..., T, S)``. A query row whose keys are all masked gets zero
        weights and a zero output (never NaN), as in PyTorch.
    """
    batch = check_qkv(query, key, value)
    if mask is not None:
        _check_broadcast_mask(mask, batch + (query.shape[-2], key.shape[-2]), query, key)
    dropout_p = probability("dropout_p", dropout_p)
    dtype = query.dtype

    # float16 and bfloat16 inputs are computed in float32 and the results rounded back, as
    # torch's CPU attention kernels accumulate: a half-precision q . k overflows past 65504,
    # and its sums and softmax lose the digits that the weights need.
    work = torch.float32 if query.dtype in _HALF else query.dtype
    query, key, value = query.to(work), key.to(work), value.to(work)
    # Scaling the query rather than the scores keeps the products small.
    scores = (query * (1.0 / math.sqrt(query.shape[-1]))) @ key.transpose(-2, -1)  # (..., T, S)
    grad = scores.requires_grad
    hidden = None if mask is None else ~mask
    if hidden is not None:
        # The most negative finite number rather than -inf: exp() makes it exactly 0 in every
        # row that sees a key, and a fully masked row stays finite (no 0/0 = NaN).
        scores = _masked_fill(scores, hidden, torch.finfo(scores.dtype).min, in_place=True)
    # softmax subtracts the row maximum first, so large scores do not overflow exp(). Without
    # a gradient it overwrites the scores instead of allocating a second (..., T, S) tensor.
    weights = torch.softmax(scores, dim=-1) if grad else torch.softmax(scores, -1, out=scores)
    if hidden is not None:
        empty = hidden.all(dim=-1, keepdim=True)  # (..., T, 1): rows that see no key
        if empty.any():  # such a row came out uniform: zero it
            weights = _masked_fill(weights, empty, 0.0, in_place=not grad)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    out = weights @ value  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)
    return out.to(dtype), weights.to(dtype)


_HALF = (torch.float16, torch.bfloat16)  # computed in float32 (scaled_dot_product_attention)


def _masked_fill(x: Tensor, where: Tensor, value: float, *, in_place: bool) -> Tensor:
    """``x.masked_fill(where, value)``, in place when allowed and ``where`` fits inside ``x``."""
    if in_place and _broadcast_shape(where.shape, x.shape) == tuple(x.shape):
        return x.masked_fill_(where, value)
    return x.masked_fill(where, value)


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """The ``(size, size)`` boolean mask, True on and below the diagonal.

    Position ``t`` may attend to ``0..t`` only (chapter "Scaled dot-product attention", masks).
    Combine it with :func:`padding_mask` by ``&``.
    """
    size = positive_int("size", size, allow_zero=True)
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def padding_mask(lengths: Tensor | list[int] | tuple[int, ...], max_len: int) -> Tensor:
    """``(B, 1, 1, max_len)`` boolean, True at the first ``lengths[b]`` positions of row ``b``.

    ``lengths``: ``(B,)`` integers (tensor or list). Hides padding keys (chapter "Scaled
    dot-product attention", masks); ``padding_mask(lengths, T) & causal_mask(T)`` is the
    ``(B, 1, T, T)`` decoder mask.
    """
    if isinstance(lengths, (list, tuple)):
        lengths = torch.tensor(lengths) if lengths else torch.zeros(0, dtype=torch.long)
    tensor("lengths", lengths, kind="int", ndim=1, what="(B,)")
    max_len = positive_int("max_len", max_len, allow_zero=True)
    if lengths.numel() and (int(lengths.max()) > max_len or int(lengths.min()) < 0):
        raise ValueError(f"lengths {lengths.tolist()} must lie in [0, max_len={max_len}]")
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, max_len)


def split_heads(x: Tensor, num_heads: int) -> Tensor:
    """``(B, T, h * d_k) -> (B, h, T, d_k)``, a view: head ``i`` gets features ``i*d_k ..``.

    The layout of :class:`torch.nn.MultiheadAttention`: one projection of width ``h * d_k``
    read as ``h`` projections of width ``d_k`` (section "One big projection, reshaped").
    """
    tensor("x", x)
    num_heads = positive_int("num_heads", num_heads)
    if x.dim() != 3:
        raise ValueError(
            f"split_heads expects x of shape (B, T, h * d_k), got shape {tuple(x.shape)}"
        )
    B, T, D = x.shape
    if D % num_heads != 0:
        raise ValueError(
            f"last dimension {D} of shape {tuple(x.shape)} is not divisible by "
            f"num_heads={num_heads}"
        )
    return x.view(B, T, num_heads, D // num_heads).transpose(1, 2)  # (B, h, T, d_k)


def merge_heads(x: Tensor) -> Tensor:
    """``(B, h, T, d_v) -> (B, T, h * d_v)``: Concat(head_1, ..., head_h), the inverse of
    :func:`split_heads`."""
    if tensor("x", x).dim() != 4:
        raise ValueError(
            f"merge_heads expects x of shape (B, h, T, d_v), got shape {tuple(x.shape)}"
        )
    B, h, T, d_v = x.shape
    return x.transpose(1, 2).reshape(B, T, h * d_v)  # (B, T, h, d_v) -> (B, T, h * d_v)


class Projection(NamedTuple):
    """One of ``W^Q``, ``W^K``, ``W^V``: views of rows of the packed input projection.

    ``weight`` is ``(heads * d_k, d_model)`` (``nn.Linear``'s layout, i.e. ``W^T``), ``bias``
    ``(heads * d_k,)`` or None. Calling it computes ``x @ weight.T + bias``; writing into
    ``weight`` or ``bias`` (under ``torch.no_grad()``) changes the module.
    """

    weight: Tensor
    bias: Tensor | None

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch-first (section "Multi-head attention").

    ``h`` heads of size ``d_k = d_v = d_model / h`` attend in parallel; ``W^O`` mixes their
    concatenation. The input projections of all heads are one matrix, as in
    :class:`torch.nn.MultiheadAttention`: ``in_proj_weight`` stacks ``[W^Q; W^K; W^V]`` row-wise,
    ``((h + 2 h_kv) d_k, d_model)``, so self-attention computes Q, K and V with one matmul and
    cross-attention K and V with one. ``w_q``, ``w_k`` and ``w_v`` are :class:`Projection` views
    of its three row blocks; ``w_o`` is an ``nn.Linear``.

    Args:
        d_model: model width.
        num_heads: query heads ``h``; must divide ``d_model`` unless ``head_dim`` is given.
        dropout: dropout on the attention weights (training only).
        bias: whether the projections have biases.
        num_kv_heads: key/value heads ``h_kv`` (grouped-query attention; 1 = multi-query);
            must divide ``num_heads``. Default ``num_heads``.
        head_dim: ``d_k``; default ``d_model // num_heads``.
        rotary: rotate queries and keys by their positions (RoPE,
            :func:`~minitransformer.positional.rotary_embedding`) before the scores; for
            self-attention, needs an even ``head_dim``.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        *,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        rotary: bool = False,
    ) -> None:
        super().__init__()
        d_k, h_kv = _head_sizes(d_model, num_heads, num_kv_heads, head_dim)
        probability("dropout", dropout)
        if rotary and d_k % 2 != 0:
            raise ValueError(f"rotary=True rotates pairs of features: head_dim={d_k} must be even")
        self.d_model, self.num_heads, self.num_kv_heads, self.d_k = d_model, num_heads, h_kv, d_k
        self.rotary = bool(rotary)
        rows = (num_heads + 2 * h_kv) * d_k
        self.in_proj_weight = nn.Parameter(torch.empty(rows, d_model))  # [W^Q; W^K; W^V]
        self.in_proj_bias = nn.Parameter(torch.empty(rows)) if bias else None
        self._reset_in_proj()
        self.w_o = nn.Linear(num_heads * d_k, d_model, bias=bias)  # W^O: h*d_v -> d_model
        self.dropout = nn.Dropout(dropout)

    def _reset_in_proj(self) -> None:
        """Initialise W^Q, W^K, W^V exactly as three ``nn.Linear(d_model, ...)`` would be."""
        bound = 1 / math.sqrt(self.d_model)
        for projection in (self.w_q, self.w_k, self.w_v):
            nn.init.kaiming_uniform_(projection.weight, a=math.sqrt(5))
            if projection.bias is not None:
                nn.init.uniform_(projection.bias, -bound, bound)

    def _projection(self, first_head: int, heads: int) -> Projection:
        rows = slice(first_head * self.d_k, (first_head + heads) * self.d_k)
        bias = None if self.in_proj_bias is None else self.in_proj_bias[rows]
        return Projection(self.in_proj_weight[rows], bias)

    @property
    def w_q(self) -> Projection:
        """``W^Q``: rows ``0 .. h d_k`` of ``in_proj_weight``, ``(h d_k, d_model)``."""
        return self._projection(0, self.num_heads)

    @property
    def w_k(self) -> Projection:
        """``W^K``: the next ``h_kv d_k`` rows."""
        return self._projection(self.num_heads, self.num_kv_heads)

    @property
    def w_v(self) -> Projection:
        """``W^V``: the last ``h_kv d_k`` rows."""
        return self._projection(self.num_heads + self.num_kv_heads, self.num_kv_heads)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = True,
        cache: AttentionCache | None = None,
        start: int | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` ``(B, T, d_model)`` to ``key``/``value`` ``(B, S, d_model)``.

        Args:
            mask: boolean ``(T, S)`` or ``(B, h, T, S)`` with any of B, h, T as 1; True = may
                attend.
            need_weights: return the ``(B, h, T, S)`` weights, computed explicitly with
                :func:`scaled_dot_product_attention`; False uses PyTorch's fused kernel and
                returns None for them.
            cache: an :class:`~minitransformer.kv_cache.AttentionCache` (chapter "Inference").
                Self-attention appends the new keys/values and attends over all cached
                positions (``S`` is then the cache length); a filled cross-attention (static)
                cache is reused for the same ``key`` without projecting it again.
            start: with ``rotary``, the position of the first query and new key row
                (default: the cache length, else 0).

        Returns:
            ``(B, T, d_model)`` and ``(B, h, T, S)`` (or None).
        """
        self._check_inputs(query, key, value, cache, start)
        if cache is not None and cache.holds(key):  # a filled cross-attention cache
            q = split_heads(self.w_q(query), self.num_heads)  # 1. project the queries only
            k, v = cache.get()  # 2. the stored K/V
        else:
            q, k, v = self._project(query, key, value)  # 1. project
            if self.rotary:
                q, k = self._rotate(q, k, cache, start)
            if cache is not None:  # 2. the cache: the new K/V appended
                k, v = cache.update(k, v, source=key)
        k, v = self._repeat_kv(k), self._repeat_kv(v)  # 3. (B, h, S, d_k): K/V per query head
        out, weights = self._attend(q, k, v, mask, need_weights)  # 4. (B, h, T, d_v)
        return self.w_o(merge_heads(out)), weights  # 5. Concat(heads) W^O: (B, T, d_model)

    def _step_weights(self, *, packed: bool, cross: bool) -> _AttentionStep:
        """What :func:`_attention_step` reads for this module, gathered once per decoding run
        (``minitransformer.model.Decoder._step_plan``): ``[W^Q; W^K; W^V]`` for self-attention,
        ``W^Q`` alone for cross-attention (the memory's keys and values are cached), ``W^O``;
        ``packed``: :func:`~minitransformer._layout.step_weight`'s copies of them."""
        w_in: Tensor = self.in_proj_weight
        b_in: Tensor | None = self.in_proj_bias
        w_o: Tensor = self.w_o.weight
        if cross:  # W^Q alone, the first h d_k rows: from the copy if W^Q is read that way
            rows = self.num_heads * self.d_k
            source = step_weight(w_in) if packed and transposed_layout(w_in[:rows]) else w_in
            w_in, b_in = source[:rows], None if b_in is None else b_in[:rows]
        elif packed:
            w_in = step_weight(w_in)
        w_o = step_weight(w_o) if packed else w_o
        return _AttentionStep(
            w_in, b_in, w_o, self.w_o.bias, self.num_heads, self.num_kv_heads, self.d_k
        )

    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q ``(B, h, T, d_k)``, K and V ``(B, h_kv, S, d_k)``; one matmul per input tensor."""
        h, h_kv = self.num_heads, self.num_kv_heads
        if query is key is value:  # self-attention: Q, K and V at once
            qkv = F.linear(query, self.in_proj_weight, self.in_proj_bias)  # (B, T, (h+2h_kv) d_k)
            q, k, v = split_heads(qkv, h + 2 * h_kv).split((h, h_kv, h_kv), dim=1)
            return q, k, v
        q = split_heads(self.w_q(query), h)  # (B, h, T, d_k)
        if key is value:  # cross-attention: K and V of the memory at once
            kv = self._projection(h, 2 * h_kv)(key)  # (B, S, 2 h_kv d_k)
            k, v = split_heads(kv, 2 * h_kv).split((h_kv, h_kv), dim=1)
            return q, k, v
        return q, split_heads(self.w_k(key), h_kv), split_heads(self.w_v(value), h_kv)

    def _rotate(
        self, q: Tensor, k: Tensor, cache: AttentionCache | None, start: int | None
    ) -> tuple[Tensor, Tensor]:
        """RoPE: query row ``t`` and new key row ``t`` sit at position ``start + t``. Keys are
        rotated once, before caching: a key's position never changes."""
        if start is None:
            start = 0 if cache is None else cache.length
        positions = torch.arange(start, start + max(q.shape[2], k.shape[2]), device=q.device)
        return (
            rotary_embedding(q, positions[: q.shape[2]]),
            rotary_embedding(k, positions[: k.shape[2]]),
        )

    def _repeat_kv(self, x: Tensor) -> Tensor:
        """Grouped-query attention: each K/V head serves ``h / h_kv`` query heads."""
        return _repeat_heads(x, self.num_heads // self.num_kv_heads)  # (B, h, S, d)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Scaled dot-product attention per head, dropout on the weights in training."""
        if mask is not None:
            B, h, T = q.shape[:3]
            check_mask("mask", mask, (B, h, T, k.shape[2]))  # (B, h, T, S)
        p = self.dropout.p if self.training else 0.0
        if need_weights:
            return scaled_dot_product_attention(q, k, v, mask, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), None

    def _check_inputs(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        cache: AttentionCache | None,
        start: int | None,
    ) -> None:
        """Raise, naming the shapes, unless the inputs are ``(B, T|S, d_model)`` tensors in the
        module's dtype and on its device (the common case costs no message)."""
        w = self.in_proj_weight
        if cache is not None and not isinstance(cache, AttentionCache):
            raise TypeError(f"cache must be an AttentionCache, got {type(cache).__name__}")
        if (
            start is None
            and (cache is None or not self.rotary)
            and isinstance(query, Tensor)
            and self._fits(query, w)
            and (key is query or self._fits(key, w))
            and (value is key or self._fits(value, w))
            and key.shape[:2] == value.shape[:2]
            and query.shape[0] == key.shape[0]
        ):
            return  # the common case, no message built
        for name, x in (("query", query), ("key", key), ("value", value)):
            tensor(name, x, kind="float", ndim=3, what="(B, length, d_model)")
            if x.dtype != w.dtype:
                raise TypeError(f"{name} has dtype {x.dtype}, the module {w.dtype}")
            if x.device != w.device:
                raise ValueError(f"{name} is on {x.device}, the module on {w.device}")
        shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        if any(x.shape[-1] != self.d_model for x in (query, key, value)):
            raise ValueError(f"expected last dimension d_model={self.d_model}, got {shapes}")
        if key.shape[:2] != value.shape[:2] or query.shape[0] != key.shape[0]:
            raise ValueError(
                f"key and value must be (B, S, d_model) with the query's B, got {shapes}"
            )
        if start is not None:
            if not self.rotary:
                raise ValueError(
                    "start (the position of the first row) only applies with rotary=True"
                )
            positive_int("start", start, allow_zero=True)
        if self.rotary and cache is not None and cache.static:
            raise ValueError(
                "rotary=True is for self-attention; got a static (cross-attention) cache"
            )

    def _fits(self, x: Tensor, w: Tensor) -> bool:
        """Whether ``x`` is a ``(B, L, d_model)`` tensor in ``w``'s dtype and on its device."""
        return (
            isinstance(x, Tensor)
            and x.dim() == 3
            and x.shape[2] == self.d_model
            and x.dtype == w.dtype
            and x.device == w.device
        )

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of a :class:`torch.nn.MultiheadAttention`, in its dtype and on its device.

        torch's ``in_proj_weight`` has our layout, so it is copied as is. Call the copy with
        batch-first inputs and *our* masks (True = may attend; torch's mean "blocked").
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(
                f"module must be a torch.nn.MultiheadAttention, got {type(module).__name__}"
            )
        if not module._qkv_same_embed_dim:
            raise ValueError(
                f"kdim={module.kdim} and vdim={module.vdim} must equal embed_dim={module.embed_dim}"
            )
        if module.bias_k is not None or module.add_zero_attn:
            raise ValueError("add_bias_kv and add_zero_attn have no counterpart here")
        new = cls(
            module.embed_dim,
            module.num_heads,
            dropout=module.dropout,
            bias=module.in_proj_bias is not None,
        )
        new.to(device=module.in_proj_weight.device, dtype=module.in_proj_weight.dtype)
        new._copy_torch_weights(module)
        return new.train(module.training)

    def _copy_torch_weights(self, module: nn.MultiheadAttention) -> None:
        """Copy the weights of a torch module of our sizes, dtype and device (exactly)."""
        with torch.no_grad():
            self.in_proj_weight.copy_(module.in_proj_weight)
            self.w_o.weight.copy_(module.out_proj.weight)
            if self.in_proj_bias is not None:
                self.in_proj_bias.copy_(module.in_proj_bias)
                self.w_o.bias.copy_(module.out_proj.bias)

    def extra_repr(self) -> str:
        kv = f", num_kv_heads={self.num_kv_heads}" if self.num_kv_heads != self.num_heads else ""
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}{kv}, head_dim={self.d_k}"
            f"{', rotary=True' if self.rotary else ''}"
        )


# -- additive (Bahdanau) attention ---------------------------------------------------------


def additive_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    w_query: Tensor,
    w_key: Tensor,
    w_score: Tensor,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Additive attention (Bahdanau et al., 2015): returns ``(output, weights)``.

    The score of query ``q`` and key ``k`` is ``w_score . tanh(q W_query + k W_key)``, a
    one-hidden-layer network of width ``d_a`` instead of a dot product; the softmax over the
    keys and the weighted sum of the values are those of :func:`scaled_dot_product_attention`.
    Chapter "Scaled dot-product attention", section "Additive attention against the dot
    product".

    Args:
        query: ``(..., T, d_q)``; key: ``(..., S, d_k)``; value: ``(..., S, d_v)``. ``d_q``
            and ``d_k`` may differ; the leading (batch) dimensions broadcast.
        w_query: ``(d_q, d_a)``; w_key: ``(d_k, d_a)``; w_score: ``(d_a,)``.
        mask: boolean, broadcastable to ``(..., T, S)`` without adding dimensions; True = may
            attend.

    Returns:
        ``(..., T, d_v)`` and ``(..., T, S)``. A query row whose keys are all masked gets zero
        weights and a zero output (never NaN). Memory: an ``(..., T, S, d_a)`` intermediate.
    """
    for name, x in (
        ("query", query),
        ("key", key),
        ("value", value),
        ("w_query", w_query),
        ("w_key", w_key),
        ("w_score", w_score),
    ):
        tensor(name, x, kind="float")
    if query.dim() < 2 or key.dim() < 2 or value.dim() < 2:
        raise ValueError(
            "query, key and value need at least 2 dimensions (..., length, features), got "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if key.shape[-2] != value.shape[-2]:
        raise ValueError(
            f"key (..., S, d_k) = {tuple(key.shape)} and value (..., S, d_v) = "
            f"{tuple(value.shape)} must have the same length S"
        )
    if w_score.dim() != 1:
        raise ValueError(f"w_score must have shape (d_a,), got {tuple(w_score.shape)}")
    d_a = w_score.shape[0]
    for name, w, x, letter in (
        ("w_query", w_query, query, "d_q"),
        ("w_key", w_key, key, "d_k"),
    ):
        if tuple(w.shape) != (x.shape[-1], d_a):
            raise ValueError(
                f"{name} must have shape ({letter}, d_a) = ({x.shape[-1]}, {d_a}) (d_a from "
                f"w_score), got {tuple(w.shape)}"
            )
    dtypes = {x.dtype for x in (query, key, value, w_query, w_key, w_score)}
    if len(dtypes) != 1:
        raise ValueError(
            "query, key, value, w_query, w_key and w_score must have the same dtype, got "
            f"{sorted(str(d) for d in dtypes)}"
        )
    batch = _broadcast_shape(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    if batch is None:
        raise ValueError(
            "the leading (batch) dimensions of query, key and value do not broadcast: "
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
        )
    if mask is not None:
        _check_broadcast_mask(mask, batch + (query.shape[-2], key.shape[-2]), query, key)

    hidden_q = (query @ w_query).unsqueeze(-2)  # (..., T, 1, d_a)
    hidden_k = (key @ w_key).unsqueeze(-3)  # (..., 1, S, d_a)
    scores = torch.tanh(hidden_q + hidden_k) @ w_score  # (..., T, S, d_a) -> (..., T, S)
    if mask is not None:
        # As in scaled_dot_product_attention: the most negative finite number, then fully
        # masked rows (which came out uniform) set to zero.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S)
    if mask is not None:
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    return weights @ value, weights  # (..., T, S) @ (..., S, d_v) -> (..., T, d_v)


class AdditiveAttention(nn.Module):
    """Additive (Bahdanau) attention with learned ``W_query``, ``W_key`` and ``w_score``.

    Chapter "Scaled dot-product attention", section "Additive attention against the dot
    product". ``forward(query, key, value, mask=None)`` is :func:`additive_attention` with this
    module's weights. ``w_query``, ``w_key`` and ``w_score`` are bias-free ``nn.Linear`` layers
    (``(d_a, d_q)``, ``(d_a, d_k)`` and ``(1, d_a)`` in ``nn.Linear``'s layout, ``W^T``) with
    PyTorch's default initialisation, whose variance is ``1 / (3 fan_in)``: the
    pre-activation ``q W_query + k W_key`` has the same scale for every ``d_q`` and ``d_k``.

    Args:
        query_dim: ``d_q``, the size of a query.
        key_dim: ``d_k``, the size of a key.
        hidden_dim: ``d_a``, the width of the score's hidden layer.
    """

    def __init__(self, query_dim: int, key_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.query_dim = positive_int("query_dim", query_dim)
        self.key_dim = positive_int("key_dim", key_dim)
        self.hidden_dim = positive_int("hidden_dim", hidden_dim)
        self.w_query = nn.Linear(query_dim, hidden_dim, bias=False)
        self.w_key = nn.Linear(key_dim, hidden_dim, bias=False)
        self.w_score = nn.Linear(hidden_dim, 1, bias=False)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(..., T, d_q)``, ``(..., S, d_k)``, ``(..., S, d_v)`` -> ``(output, weights)``."""
        return additive_attention(
            query,
            key,
            value,
            self.w_query.weight.T,  # (d_q, d_a)
            self.w_key.weight.T,  # (d_k, d_a)
            self.w_score.weight[0],  # (d_a,)
            mask,
        )

    def extra_repr(self) -> str:
        return f"query_dim={self.query_dim}, key_dim={self.key_dim}, hidden_dim={self.hidden_dim}"


# -- argument checks ----------------------------------------------------------------------


def check_qkv(query: Tensor, key: Tensor, value: Tensor) -> tuple[int, ...]:
    """Check attention inputs ``(..., T, d_k)``, ``(..., S, d_k)``, ``(..., S, d_v)``.

    Returns the broadcast batch shape. ``TypeError`` for non-float tensors, ``ValueError``
    naming the shapes otherwise. Shared with :func:`minitransformer.flash.tiled_attention`.
    """
    for name, x in (("query", query), ("key", key), ("value", value)):
        tensor(name, x, kind="float")
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
    if query.shape[-1] == 0:
        # 1 / sqrt(d_k) has no value, and a score would be an empty sum
        raise ValueError(
            f"query and key need d_k >= 1 features, got query {tuple(query.shape)} and key "
            f"{tuple(key.shape)}"
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


def check_mask(
    name: str, mask: Tensor | None, shape: tuple[int, int, int, int], *, allow_2d: bool = True
) -> None:
    """Raise unless ``mask`` is None or a boolean ``(b, g, t, S)`` tensor where each of
    ``b, g, t`` is 1 or the size in ``shape = (B, h, T, S)``; with ``allow_2d`` also ``(t, S)``.

    The documented shapes, not merely "it broadcasts": a ``(B, S)`` or ``(B, 1, S)`` padding
    mask would broadcast along the wrong axis when ``B`` equals ``T`` or ``h``.
    """
    if mask is None:
        return
    _check_boolean(name, mask)
    B, h, T, S = shape
    m = tuple(mask.shape)
    if len(m) == 4 and m[0] in (1, B) and m[1] in (1, h) and m[2] in (1, T) and m[3] == S:
        return
    if allow_2d and len(m) == 2 and m[0] in (1, T) and m[1] == S:
        return
    letters = ", ".join(
        "1" if size == 1 else letter for letter, size in zip("BhT", shape[:3], strict=True)
    )
    forms = f"({letters}, S) = {tuple(shape)}" + (f" or (T, S) = ({T}, {S})" if allow_2d else "")
    raise ValueError(f"{name} must have shape {forms} (a size other than S may be 1), got {m}")


def _check_broadcast_mask(
    mask: Tensor, scores_shape: tuple[int, ...], query: Tensor, key: Tensor
) -> None:
    """Raise unless ``mask`` is boolean and broadcasts to ``scores_shape`` without adding
    leading dimensions (a ``(B, 1, 1, S)`` mask on 3-D queries would make ``(B, B, T, S)``)."""
    _check_boolean("mask", mask)
    if _broadcast_shape(mask.shape, scores_shape) != tuple(scores_shape):
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the score shape "
            f"(..., T, S) = {tuple(scores_shape)} of query {tuple(query.shape)} and "
            f"key {tuple(key.shape)}"
        )


def _check_boolean(name: str, mask: Tensor) -> None:
    tensor(name, mask)
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must be a boolean tensor (True = may attend), got dtype {mask.dtype}; "
            "an additive float mask or a 0/1 integer mask is not accepted"
        )


def _broadcast_shape(*shapes: tuple[int, ...]) -> tuple[int, ...] | None:
    """:func:`torch.broadcast_shapes` in plain Python (torch's costs more than a small
    attention call), None where the shapes do not broadcast."""
    ndim = max((len(shape) for shape in shapes), default=0)
    out: list[int] = []
    for sizes in zip(*((1,) * (ndim - len(shape)) + tuple(shape) for shape in shapes), strict=True):
        size = 1
        for s in sizes:
            if s != 1:
                if size != 1 and s != size:
                    return None
                size = s
        out.append(size)
    return tuple(out)


# -- cost ----------------------------------------------------------------------------------


def _head_sizes(
    d_model: int, num_heads: int, num_kv_heads: int | None, head_dim: int | None
) -> tuple[int, int]:
    """Validate the sizes of a multi-head attention; return ``(d_k, h_kv)``."""
    d_model = positive_int("d_model", d_model)
    num_heads = positive_int("num_heads", num_heads)
    if head_dim is None:
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model={d_model} must be divisible by num_heads={num_heads} "
                f"(d_k = d_model / h); d_model % num_heads = {d_model % num_heads}"
            )
        head_dim = d_model // num_heads
    head_dim = positive_int("head_dim", head_dim)
    h_kv = num_heads if num_kv_heads is None else positive_int("num_kv_heads", num_kv_heads)
    if num_heads % h_kv != 0:
        raise ValueError(f"num_kv_heads={h_kv} must divide num_heads={num_heads}")
    return head_dim, h_kv


def attention_parameter_count(
    d_model: int,
    num_heads: int,
    bias: bool = True,
    num_kv_heads: int | None = None,
    head_dim: int | None = None,
) -> int:
    """Parameters of :class:`MultiHeadAttention` (section "Design question 2: why d_k = d_model
    / h?"): ``W^Q`` ``d_model x h d_k``, ``W^K``, ``W^V`` ``d_model x h_kv d_k``, ``W^O`` ``h d_v x
    d_model``. With ``d_k = d_model / h``: ``4 d_model^2 + 4 d_model`` for every ``h``."""
    d_k, h_kv = _head_sizes(d_model, num_heads, num_kv_heads, head_dim)
    q_out, kv_out = num_heads * d_k, h_kv * d_k
    weights = d_model * q_out + 2 * d_model * kv_out + q_out * d_model
    biases = q_out + 2 * kv_out + d_model if bias else 0
    return weights + biases


def _repeat_heads(x: Tensor, group: int) -> Tensor:
    """``(B, h_kv, S, d) -> (B, h_kv * group, S, d)``: each K/V head repeated for the ``group``
    query heads it serves (grouped-query attention); ``x`` itself when ``group`` is 1."""
    return x if group == 1 else x.repeat_interleave(group, dim=1)


class _AttentionStep(NamedTuple):
    """The tensors and sizes :func:`_attention_step` reads: one :class:`MultiHeadAttention`'s,
    gathered once per decoding run, so that a step looks up no module attributes."""

    w_in: Tensor  # [W^Q; W^K; W^V] ((h + 2 h_kv) d_k, d_model), or W^Q alone (h d_k, d_model)
    b_in: Tensor | None
    w_o: Tensor  # (d_model, h d_v)
    b_o: Tensor | None
    num_heads: int
    num_kv_heads: int
    d_k: int


def _attention_step(
    a: _AttentionStep,
    x: Tensor,
    cache: AttentionCache,
    memory: Tensor | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """:meth:`MultiHeadAttention.forward` for one new query row with a cache, in eval mode,
    without weights: ``x`` ``(B, 1, d_model)`` -> ``(B, 1, d_model)``. The decoder's fast
    cached step (``minitransformer.model.Decoder._step_plan`` says when and why).

    Self-attention (``memory`` None) appends the new key and value to ``cache``;
    cross-attention reads the keys and values of ``memory`` from its filled static cache. The
    same products and kernels as the module, so the same numbers (over
    :func:`~minitransformer._layout.step_weight`'s copies, the same up to rounding); what it
    skips: the input checks (the caller checks once), dropout, and with one query row, the
    transposes of :func:`split_heads` and :func:`merge_heads`, which become views.
    """
    B = x.shape[0]
    h, h_kv, d_k = a.num_heads, a.num_kv_heads, a.d_k
    if memory is None:  # self-attention: Q, K and V of the new row in one product
        qkv = F.linear(x, a.w_in, a.b_in)  # (B, 1, (h + 2 h_kv) d_k)
        q, k, v = qkv.view(B, h + 2 * h_kv, 1, d_k).split((h, h_kv, h_kv), dim=1)
        k, v = cache.append(k, v)  # (B, h_kv, length, d_k), all positions so far
    else:  # cross-attention: only Q is new; the memory's K and V are cached
        cache.holds(memory)  # raises if the cache holds another encoder output
        q = F.linear(x, a.w_in, a.b_in).view(B, h, 1, d_k)  # (B, h, 1, d_k)
        k, v = cache.get()  # (B, h_kv, S, d_k)
    k, v = _repeat_heads(k, h // h_kv), _repeat_heads(v, h // h_kv)  # (B, h, S, d_k)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, h, 1, d_v)
    # Concat(heads) W^O; with one row, (B, h, 1, d_v) is already laid out as (B, 1, h d_v)
    return F.linear(out.view(B, 1, h * d_k), a.w_o, a.b_o)


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
    """Multiply-adds of :class:`MultiHeadAttention` for one sequence (section "Design question
    2"): ``T d_model h d_k`` for Q, ``S d_model h_kv d_k`` each for K and V, ``T h d_v d_model``
    for ``W^O``, and ``h T S d_k`` each for the scores and the weighted sum. Softmax, scaling
    and biases are left out; multiply by 2 for FLOPs and by ``B`` for a batch."""
    T = positive_int("T", T, allow_zero=True)
    S = positive_int("S", S, allow_zero=True)
    d_k, h_kv = _head_sizes(d_model, num_heads, num_kv_heads, head_dim)
    projections = T * d_model * num_heads * d_k + 2 * S * d_model * h_kv * d_k
    projections += T * num_heads * d_k * d_model
    attention = 2 * num_heads * T * S * d_k
    return AttentionFlops(projections, attention)
