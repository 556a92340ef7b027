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

from minitransformer._checks import as_int, finite_float, positive_int, probability, tensor

__all__ = [
    "angular_frequencies",
    "wavelengths",
    "sinusoidal_encoding",
    "shift_matrix",
    "PositionalEncoding",
    "LearnedPositionalEmbedding",
    "rotary_embedding",
]


def _check_even(d: int, name: str = "d_model") -> int:
    d = as_int(name, d)
    if d <= 0 or d % 2 != 0:
        raise ValueError(
            f"{name}={d} must be a positive even number: the dimensions come in (sin, cos) "
            "pairs (2i, 2i + 1)"
        )
    return d


def _check_base(base: float) -> float:
    return finite_float("base", base, low=1.0, low_open=True)


def _work_device(device: torch.device | str | None) -> torch.device | None:
    """Where to compute in float64: ``device``, except MPS (no float64 there): the CPU."""
    device = None if device is None else torch.device(device)
    return torch.device("cpu") if device is not None and device.type == "mps" else device


def angular_frequencies(
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float64,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """The ``d_model / 2`` angular frequencies ``omega_i = base ** (-2i / d_model)``, from 1 down
    towards ``1 / base`` (section "The formula"): pair ``(2i, 2i + 1)`` turns by ``omega_i`` per
    position."""
    d_model, base = _check_even(d_model), _check_base(base)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=_work_device(device))
    return torch.pow(base, -two_i / d_model).to(device=device, dtype=dtype)  # (d_model/2,)


def wavelengths(d_model: int, base: float = 10000.0, dtype: torch.dtype = torch.float64) -> Tensor:
    """The wavelengths ``2 pi / omega_i``: a geometric progression from ``2 pi`` whose next term
    after the last would be ``base * 2 pi`` (the paper's "from 2 pi to 10000 * 2 pi")."""
    return (2 * math.pi / angular_frequencies(d_model, base, torch.float64)).to(dtype)


def sinusoidal_encoding(
    num_positions: int,
    d_model: int,
    base: float = 10000.0,
    dtype: torch.dtype | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """The ``(num_positions, d_model)`` table ``PE[pos, 2i] = sin(pos omega_i)``,
    ``PE[pos, 2i + 1] = cos(pos omega_i)`` (section "The formula"; paper, section 3.5).

    Computed in float64, returned in ``dtype`` (default ``torch.get_default_dtype()``).
    """
    num_positions = positive_int("num_positions", num_positions, allow_zero=True)
    d_model = _check_even(d_model)
    dtype = torch.get_default_dtype() if dtype is None else dtype
    work = _work_device(device)
    pos = torch.arange(num_positions, dtype=torch.float64, device=work)[:, None]  # (P, 1)
    angles = pos * angular_frequencies(d_model, base, device=work)[None, :]  # (P, d_model/2)
    pe = torch.empty(num_positions, d_model, dtype=torch.float64, device=work)
    pe[:, 0::2] = torch.sin(angles)  # even dimensions 2i
    pe[:, 1::2] = torch.cos(angles)  # odd dimensions 2i + 1
    return pe.to(device=device, dtype=dtype)


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

    Block diagonal, block ``i`` the 2x2 rotation by ``k omega_i``; it depends on the offset
    ``k`` only (any real number), is orthogonal, and ``M_j M_k = M_(j+k)``. Section "A shift is
    a rotation".
    """
    offset = finite_float("offset", offset)
    blocks = _rotation_blocks(offset * angular_frequencies(d_model, base))  # (d/2, 2, 2)
    return torch.block_diag(*blocks).to(dtype)


class PositionalEncoding(nn.Module):
    """``dropout(x + PE[start : start + T])`` with the sinusoidal table (paper, section 3.5).

    ``x`` ``(B, T, d_model)`` is expected already scaled, ``embedding(tokens) * sqrt(d_model)``.
    The table is a non-persistent buffer: it follows ``.to(device)`` but is not in the
    ``state_dict``. Same interface as :class:`LearnedPositionalEmbedding`.
    """

    pe: Tensor  # (max_len, d_model), the buffer registered in __init__

    def __init__(
        self, d_model: int, max_len: int = 5000, *, dropout: float = 0.1, base: float = 10000.0
    ) -> None:
        super().__init__()
        self.d_model = _check_even(d_model)
        self.max_len = positive_int("max_len", max_len)
        self.dropout = nn.Dropout(probability("dropout", dropout))
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model, base), persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """``(B, T, d_model) -> (B, T, d_model)``; ``start`` is the position of the first row
        (the cache length when decoding with a KV cache)."""
        start = _check_positions_input(x, self.d_model, self.max_len, start, type(self).__name__)
        x = x + self.pe[start : start + x.shape[1]].to(x.dtype)
        return self.dropout(x) if self.training else x

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"


class LearnedPositionalEmbedding(nn.Module):
    """``dropout(x + P[start : start + T])`` with a trained ``(max_len, d_model)`` table
    (Table 3, row E), initialised from ``N(0, init_std^2)``.

    Same interface as :class:`PositionalEncoding`. A row only changes if some training
    sequence reaches that position (section "Learned or sinusoidal?").
    """

    def __init__(
        self, d_model: int, max_len: int = 5000, *, dropout: float = 0.0, init_std: float = 1.0
    ) -> None:
        super().__init__()
        self.d_model = positive_int("d_model", d_model)
        self.max_len = positive_int("max_len", max_len)
        self.embedding = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.embedding.weight, std=finite_float("init_std", init_std, low=0.0))
        self.dropout = nn.Dropout(probability("dropout", dropout))

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """``(B, T, d_model) -> (B, T, d_model)``, positions from ``start``."""
        start = _check_positions_input(x, self.d_model, self.max_len, start, type(self).__name__)
        x = x + self.embedding.weight[start : start + x.shape[1]].to(x.dtype)
        return self.dropout(x) if self.training else x

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.max_len}"


def _check_positions_input(x: Tensor, d_model: int, max_len: int, start: int, who: str) -> int:
    tensor("x", x, kind="float")
    if x.dim() != 3 or x.shape[-1] != d_model:
        raise ValueError(
            f"{who} expects x of shape (B, T, d_model={d_model}), got {tuple(x.shape)}"
        )
    start = positive_int("start", start, allow_zero=True)
    T = x.shape[1]
    if start + T > max_len:
        raise ValueError(
            f"{who}: sequence length T={T} (starting at position {start}) exceeds "
            f"max_len={max_len}; input shape {tuple(x.shape)}. Build the module with a larger "
            "max_len or feed shorter sequences."
        )
    return start


def rotary_embedding(x: Tensor, positions: Tensor | None = None, base: float = 10000.0) -> Tensor:
    """Rotary position embedding (RoPE, Su et al.) of queries or keys ``x`` ``(..., T, d)``.

    Pair ``(2i, 2i + 1)`` of row ``m`` turns by ``m omega_i``:
    ``rotary_embedding(x)[..., m, :] == x[..., m, :] @ shift_matrix(m, d)``, so the score
    ``rope(q)_m . rope(k)_n`` depends on ``m - n`` only (section "A look forward: relative
    positions and RoPE"). The interleaved pairing of RoFormer; GPT-NeoX and Hugging Face's
    Llama pair ``i`` with ``i + d/2`` instead (a permutation of the features).

    Args:
        x: ``(..., T, d)``, ``d`` even, e.g. queries ``(B, h, T, d_k)``.
        positions: ``(T,)`` integer positions of the rows (default ``0 .. T-1``).
        base: the ``10000`` of the formula.

    Returns:
        A tensor of the shape, dtype and device of ``x``. The angles are computed in float64
        (on the CPU for MPS, which has no float64).
    """
    tensor("x", x, kind="float")
    if x.dim() < 2:
        raise ValueError(f"rotary_embedding expects x of shape (..., T, d), got {tuple(x.shape)}")
    T, d = x.shape[-2], x.shape[-1]
    _check_even(d, "the last dimension of x, d")
    work = _work_device(x.device)
    if positions is None:
        positions = torch.arange(T, device=work)
    positions = tensor("positions", positions, kind="int", what="(T,)")
    if positions.shape != (T,):
        raise ValueError(
            f"positions must have shape (T,) = ({T},) to match x of shape {tuple(x.shape)}, "
            f"got {tuple(positions.shape)}"
        )
    omega = angular_frequencies(d, base, device=work)  # (d/2,)
    angles = positions.to(device=work, dtype=torch.float64)[:, None] * omega[None, :]  # (T, d/2)
    cos = torch.cos(angles).to(device=x.device, dtype=x.dtype)
    sin = torch.sin(angles).to(device=x.device, dtype=x.dtype)
    x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., T, d/2) each
    # Row vector (a, b) times [[cos, -sin], [sin, cos]] = (a cos + b sin, -a sin + b cos).
    out = torch.empty_like(x)
    out[..., 0::2] = x_even * cos + x_odd * sin
    out[..., 1::2] = -x_even * sin + x_odd * cos
    return out
