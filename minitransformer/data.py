"""Toy sequence-to-sequence tasks that generate their own data: copy, reverse and sort.

Used in the chapters "The encoder–decoder picture" (``book/encoder_decoder``) and "Training a
Transformer" (``book/training``). Nothing is downloaded: every batch is drawn from a
``torch.Generator`` the caller seeds, so the same seed gives the same batches.

Vocabulary layout (``vocab_size`` ids in all):

====== ====================================================
id     meaning
====== ====================================================
0      ``PAD_ID``: padding after the end of a sequence
1      ``BOS_ID``: "beginning of sequence", the decoder's first input
2      ``EOS_ID``: "end of sequence", the decoder's last output
3 ...  content tokens ``FIRST_TOKEN .. vocab_size - 1``
====== ====================================================

A batch of ``B`` examples with content lengths ``n_b`` (between ``min_len`` and ``max_len``)
is three ``long`` tensors, padded to the longest example of the batch (``L = max n_b``):

* ``src``     ``(B, L)``:     ``x_1 .. x_n, PAD ...``             (the encoder's input)
* ``tgt_in``  ``(B, L + 1)``: ``BOS, y_1 .. y_n, PAD ...``         (the decoder's input)
* ``tgt_out`` ``(B, L + 1)``: ``y_1 .. y_n, EOS, PAD ...``         (what it must predict)

``tgt_out`` is ``tgt_in`` shifted left by one with ``EOS`` appended: teacher forcing. The
target ``y`` is ``x`` (copy), ``x`` reversed (reverse) or ``x`` sorted ascending (sort).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = [
    "PAD_ID",
    "BOS_ID",
    "EOS_ID",
    "FIRST_TOKEN",
    "TASKS",
    "Batch",
    "apply_task",
    "make_batch",
    "src_padding_mask",
    "strip_special",
]

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
FIRST_TOKEN = 3  # the smallest content id
TASKS = ("copy", "reverse", "sort")


class Batch(NamedTuple):
    """One batch of a toy task; unpacks as ``src, tgt_in, tgt_out`` (shapes in the module doc)."""

    src: Tensor  # (B, L)
    tgt_in: Tensor  # (B, L + 1): BOS, y, PAD...
    tgt_out: Tensor  # (B, L + 1): y, EOS, PAD...

    @property
    def tgt(self) -> Tensor:
        """The whole target ``(B, L + 2)``: ``BOS, y_1 .. y_n, EOS, PAD ...``.

        ``tgt[:, 1:] == tgt_out``; ``tgt[:, :-1]`` is ``tgt_in`` except that a row shorter
        than the batch shows its EOS where ``tgt_in`` has PAD (a position whose label is PAD,
        so teacher forcing from either gives the same loss).
        """
        return torch.cat([self.tgt_in[:, :1], self.tgt_out], dim=1)

    @property
    def src_mask(self) -> Tensor:
        """``(B, 1, 1, L)`` boolean, True at real source tokens (see :func:`src_padding_mask`)."""
        return src_padding_mask(self.src)


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")


def apply_task(task: str, tokens: Tensor) -> Tensor:
    """The target of one unpadded content sequence ``(n,)``: copied, reversed or sorted."""
    _check_task(task)
    if tokens.dim() != 1:
        raise ValueError(f"apply_task expects one sequence of shape (n,), got {tuple(tokens.shape)}")
    if task == "copy":
        return tokens.clone()
    if task == "reverse":
        return tokens.flip(0)
    return tokens.sort().values


def make_batch(
    task: str,
    batch_size: int,
    min_len: int,
    max_len: int,
    vocab_size: int,
    generator: torch.Generator,
    device: torch.device | str | None = None,
) -> Batch:
    """Draw ``batch_size`` examples of ``task`` (``"copy"``, ``"reverse"`` or ``"sort"``).

    Each content length is uniform in ``[min_len, max_len]`` and each content token uniform in
    ``[FIRST_TOKEN, vocab_size)``. All randomness comes from ``generator``, so a seeded
    generator reproduces the batch. Returns a :class:`Batch` ``(src, tgt_in, tgt_out)`` of
    ``long`` tensors padded with ``PAD_ID`` to the longest example (module docstring).
    A model for these tasks needs ``max_len >= L + 1`` positions on the target side.
    """
    _check_task(task)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (seed it for reproducible data), "
            f"got {type(generator).__name__}"
        )
    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive, got {batch_size}")
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if vocab_size <= FIRST_TOKEN:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no content tokens: ids 0..{FIRST_TOKEN - 1} are "
            "PAD, BOS, EOS"
        )
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (B,)
    L = int(lengths.max())
    content = torch.randint(FIRST_TOKEN, vocab_size, (batch_size, L), generator=generator)
    src = torch.full((batch_size, L), PAD_ID, dtype=torch.long)
    tgt_in = torch.full((batch_size, L + 1), PAD_ID, dtype=torch.long)
    tgt_out = torch.full((batch_size, L + 1), PAD_ID, dtype=torch.long)
    tgt_in[:, 0] = BOS_ID
    for b, n in enumerate(lengths.tolist()):
        x = content[b, :n]
        y = apply_task(task, x)
        src[b, :n] = x
        tgt_in[b, 1 : n + 1] = y
        tgt_out[b, :n] = y
        tgt_out[b, n] = EOS_ID
    return Batch(src.to(device), tgt_in.to(device), tgt_out.to(device))


def src_padding_mask(src: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """``(B, S)`` token ids -> ``(B, 1, 1, S)`` boolean mask, True where ``src != pad_id``.

    Padding keys are hidden from every query; the mask broadcasts over heads and queries
    (``(B, h, T, S)`` scores), the same layout as :func:`minitransformer.attention.padding_mask`.
    """
    if src.dim() != 2:
        raise ValueError(f"src must have shape (B, S), got {tuple(src.shape)}")
    return (src != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def strip_special(row: Tensor | list[int], eos_id: int = EOS_ID, bos_id: int = BOS_ID,
                  pad_id: int = PAD_ID) -> list[int]:
    """The content tokens of one decoded row: drop a leading BOS, cut at the first EOS, drop PAD.

    ``strip_special([BOS, 5, 7, EOS, PAD]) == [5, 7]``.
    """
    ids = row.tolist() if isinstance(row, Tensor) else list(row)
    if ids and ids[0] == bos_id:
        ids = ids[1:]
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return [i for i in ids if i != pad_id]
