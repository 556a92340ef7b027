r"""Positional information for attention: sinusoids, learned embeddings and rotary (RoPE).

Explained in the chapter "Positional encoding" (``book/positional``).

Self-attention treats its input as a *set*: permute the tokens and the output is permuted
the same way. Each module here gives the model a way to tell positions apart:

* :func:`sinusoidal_encoding` is the paper's fixed table (section 3.5),

  .. math::

      PE(pos, 2i) = \sin(pos\,\omega_i), \quad PE(pos, 2i+1) = \cos(pos\,\omega_i),
      \quad \omega_i = 10000^{-2i/d_{model}};

* :func:`shift_matrix` is the block-diagonal rotation ``M_k`` with
  ``PE[pos + k] == PE[pos] @ M_k`` for every ``pos`` (the linear relation of section 3.5);
* :class:`PositionalEncoding` adds the table to (already scaled) token embeddings;
* :class:`LearnedPositionalEmbedding` is the alternative of Table 3, row (E);
* :func:`rotary_embedding` (RoPE, Su et al.) rotates queries and keys instead, so that
  ``q_m . k_n`` depends on ``m - n`` only.

Shape letters: B batch, T sequence length, d_model model width (``d`` for any even feature
size). Position ``pos`` is a row index of the table, ``i`` indexes the ``d_model / 2`` pairs
of dimensions ``(2i, 2i + 1)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

__all__ = [
    "angular_frequencies",
    "wavelengths",
    "sinusoidal_encoding",
    "shift_matrix",
    "PositionalEncoding",
    "LearnedPositionalEmbedding",
    "rotary_embedding",
]


def _check_even(d: int, name: str = "d_model") -> None:
    if not isinstance(d, int) or isinstance(d, bool):
        raise TypeError(f"{name} must be an int, got {type(d).__name__}")
    if d <= 0 or d % 2 != 0:
        raise ValueError(
            f"{name}={d} must be a positive even number: the dimensions come in (sin, cos) "
            "pairs (2i, 2i + 1)"
        )


def angular_frequencies(d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float64) -> Tensor:
    """The ``d_model / 2`` angular frequencies ``omega_i = base ** (-2i / d_model)``.

    Pair ``i`` (dimensions ``2i`` and ``2i + 1``) turns by ``omega_i`` radians per position.
    They fall geometrically from 1 (``i = 0``) towards ``1 / base``. Section "The formula".
    """
    _check_even(d_model)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,): 0, 2, 4, ...
    return torch.pow(float(base), -two_i / d_model).to(dtype)


def wavelengths(d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float64) -> Tensor:
    """The wavelengths ``2 pi / omega_i`` of the ``d_model / 2`` sinusoid pairs.

    A geometric progression with ratio ``base ** (2 / d_model)``: it starts at ``2 pi`` and
    its next term after the last one would be ``base * 2 pi`` (the paper's "from 2 pi to
    10000 * 2 pi"); the last wavelength itself is ``2 pi * base ** (1 - 2 / d_model)``.
    """
    return (2 * math.pi / angular_frequencies(d_model, base, torch.float64)).to(dtype)


def sinusoidal_encoding(
    num_positions: int,
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The ``(num_positions, d_model)`` sinusoidal table of the paper (section 3.5).

    ``PE[pos, 2i] = sin(pos * omega_i)`` and ``PE[pos, 2i + 1] = cos(pos * omega_i)`` with
    ``omega_i = base ** (-2i / d_model)``. Computed in float64 and returned in ``dtype``
    (default: ``torch.get_default_dtype()``). Section "The formula" of the book.

    Raises:
        ValueError: if ``d_model`` is odd or not positive, or ``num_positions`` is negative.
    """
    _check_even(d_model)
    if num_positions < 0:
        raise ValueError(f"num_positions must be non-negative, got {num_positions}")
    dtype = torch.get_default_dtype() if dtype is None else dtype
    pos = torch.arange(num_positions, dtype=torch.float64)[:, None]  # (P, 1)
    angles = pos * angular_frequencies(d_model, base)[None, :]  # (P, d_model/2)
    pe = torch.empty(num_positions, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angles)  # even dimensions 2i
    pe[:, 1::2] = torch.cos(angles)  # odd dimensions 2i + 1
    return pe.to(dtype)


def _rotation_blocks(angles: Tensor) -> Tensor:
    """``(..., n) -> (..., n, 2, 2)``: the matrices [[cos a, -sin a], [sin a, cos a]]."""
    c, s = torch.cos(angles), torch.sin(angles)
    return torch.stack([torch.stack([c, -s], -1), torch.stack([s, c], -1)], -2)


def shift_matrix(
    offset: float,
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """The ``(d_model, d_model)`` matrix ``M_k`` with ``PE[pos + k] == PE[pos] @ M_k``.

    ``M_k`` is block diagonal; block ``i`` acts on the row vector
    ``(sin(pos w_i), cos(pos w_i))`` of dimensions ``(2i, 2i + 1)`` and is the rotation

    .. code-block:: text

        [[ cos(k w_i), -sin(k w_i)],
         [ sin(k w_i),  cos(k w_i)]]

    It depends on the offset ``k`` only, never on ``pos``; it is orthogonal, and
    ``M_j @ M_k == M_(j+k)``, ``M_k.T == M_(-k)``. Section "A shift is a rotation" of the book
    (the proposition and its proof).
    ``offset`` may be any real number (negative offsets shift backwards).
    """
    _check_even(d_model)
    blocks = _rotation_blocks(float(offset) * angular_frequencies(d_model, base))  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype)


class PositionalEncoding(nn.Module):
    """Add the sinusoidal table to token embeddings, then apply dropout (section 3.5).

    The input is expected to be already scaled, ``embedding(tokens) * sqrt(d_model)`` (section
    3.4 of the paper), so token and position signals have comparable size.

    Args:
        d_model: model width (even).
        max_len: the longest sequence the table covers.
        dropout: dropout probability applied to the sum (the paper uses 0.1).
        base: the ``10000`` of the formula.

    The table is a non-persistent buffer: it moves with ``.to(device)`` but is not saved in
    the ``state_dict`` (it is a fixed function of ``d_model`` and ``max_len``).
    """

    def __init__(self, d_model: int, max_len: int = 5000, dropout: float = 0.1, base: float = 10000.0) -> None:
        super().__init__()
        _check_even(d_model)
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.d_model = d_model
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """``x`` ``(B, T, d_model)`` -> ``dropout(x + PE[start : start + T])``, same shape.

        ``start`` is the position of the first token (non-zero when decoding one token at a
        time with a cache).

        Raises:
            ValueError: if ``x`` is not ``(B, T, d_model)`` or ``start + T > max_len``.
        """
        _check_positions_input(x, self.d_model, self.max_len, start, type(self).__name__)
        T = x.shape[1]
        pe = self.pe[start : start + T].to(x.dtype)  # (T, d_model), broadcast over B
        return self.dropout(x + pe)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEmbedding(nn.Module):
    """A trained vector per position, added like :class:`PositionalEncoding` (Table 3, row E).

    Same interface as :class:`PositionalEncoding`: ``forward(x)`` with ``x`` ``(B, T, d_model)``
    returns ``dropout(x + P[:T])`` where ``P`` is a ``(max_len, d_model)`` parameter. Rows are
    initialised from ``N(0, init_std**2)``; a row only changes if some training sequence
    reaches that position, so positions beyond the longest training sequence keep their
    random initial vectors (section "Learned or sinusoidal?" of the book).
    """

    def __init__(self, max_len: int, d_model: int, dropout: float = 0.0, init_std: float = 1.0) -> None:
        super().__init__()
        if not isinstance(d_model, int) or d_model <= 0:
            raise ValueError(f"d_model must be a positive int, got {d_model}")
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        self.d_model = d_model
        self.max_len = max_len
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=init_std)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """``x`` ``(B, T, d_model)`` -> ``dropout(x + P[start : start + T])``, same shape."""
        _check_positions_input(x, self.d_model, self.max_len, start, type(self).__name__)
        T = x.shape[1]
        return self.dropout(x + self.embedding.weight[start : start + T].to(x.dtype))

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}, d_model={self.d_model}"


def _check_positions_input(x: Tensor, d_model: int, max_len: int, start: int, who: str) -> None:
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{who} expects x of shape (B, T, d_model={d_model}), got {tuple(x.shape)}")
    if start < 0:
        raise ValueError(f"start must be non-negative, got {start}")
    T = x.shape[1]
    if start + T > max_len:
        raise ValueError(
            f"{who}: sequence length T={T} (starting at position {start}) exceeds "
            f"max_len={max_len}; input shape {tuple(x.shape)}. Build the module with a larger "
            "max_len or feed shorter sequences."
        )


def rotary_embedding(x: Tensor, positions: Tensor | None = None, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (RoPE, Su et al.), applied to queries or keys.

    Each pair of features ``(2i, 2i + 1)`` of the vector at position ``m`` is rotated by the
    angle ``m * omega_i`` with the frequencies of :func:`angular_frequencies`:
    ``rotary_embedding(x)[..., m, :] == x[..., m, :] @ shift_matrix(m, d)``. Because rotations
    compose, ``rope(q)_m . rope(k)_n = q_m @ M_(m - n) @ k_n``: the score depends on the
    positions only through ``m - n``. Section "A look forward: relative positions and RoPE".

    This is the interleaved pairing of the RoFormer paper; some libraries (e.g. GPT-NeoX,
    Llama in Hugging Face) pair feature ``i`` with ``i + d/2`` instead, a permutation of
    the features.

    Args:
        x: ``(..., T, d)`` with ``d`` even, e.g. queries ``(B, h, T, d_k)``.
        positions: ``(T,)`` positions of the rows (default ``0 .. T-1``); pass
            ``torch.arange(start, start + T)`` when decoding with a cache.
        base: the ``10000`` of the formula.

    Returns:
        A tensor of the shape and dtype of ``x``.
    """
    if x.dim() < 2:
        raise ValueError(f"rotary_embedding expects x of shape (..., T, d), got {tuple(x.shape)}")
    T, d = x.shape[-2], x.shape[-1]
    _check_even(d, "the feature size d")
    if positions is None:
        positions = torch.arange(T, device=x.device)
    positions = torch.as_tensor(positions, device=x.device)
    if positions.shape != (T,):
        raise ValueError(
            f"positions must have shape (T,) = ({T},) to match x of shape {tuple(x.shape)}, "
            f"got {tuple(positions.shape)}"
        )
    omega = angular_frequencies(d, base).to(x.device)  # (d/2,)
    angles = positions.to(torch.float64)[:, None] * omega[None, :]  # (T, d/2)
    cos = torch.cos(angles).to(x.dtype)
    sin = torch.sin(angles).to(x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    # Row vector (a, b) times [[cos, -sin], [sin, cos]] = (a cos + b sin, -a sin + b cos).
    out = torch.empty_like(x)
    out[..., 0::2] = x_even * cos + x_odd * sin
    out[..., 1::2] = -x_even * sin + x_odd * cos
    return out
