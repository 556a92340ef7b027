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

from minitransformer import _checks

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
        """The whole target ``(B, L + 2)``, ``BOS, y_1 .. y_n, EOS, PAD ...``; ``tgt[:, 1:]`` is
        ``tgt_out``, and ``tgt[:, :-1]`` is ``tgt_in`` except that shorter rows show their EOS
        where ``tgt_in`` has PAD (a position whose label is PAD, so the loss is the same)."""
        return torch.cat([self.tgt_in[:, :1], self.tgt_out], dim=1)

    @property
    def src_mask(self) -> Tensor:
        """``(B, 1, 1, L)`` boolean, True at real source tokens (:func:`src_padding_mask`)."""
        return src_padding_mask(self.src)


def _check_task(task: str) -> str:
    if not isinstance(task, str):
        raise TypeError(f"task must be a str, one of {TASKS}, got {type(task).__name__}")
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
    return task


def apply_task(task: str, tokens: Tensor) -> Tensor:
    """The target of one unpadded content sequence ``(n,)``: copied, reversed or sorted."""
    _check_task(task)
    _checks.tensor("tokens", tokens, kind="int")
    if tokens.dim() != 1:
        raise ValueError(
            f"apply_task expects one sequence of shape (n,), got {tuple(tokens.shape)}"
        )
    if task == "copy":
        return tokens.clone()
    if task == "reverse":
        return tokens.flip(0)
    return tokens.sort().values


def _apply_task_padded(task: str, content: Tensor, lengths: Tensor) -> Tensor:
    """:func:`apply_task` on every row of ``content`` ``(B, L)`` at once, each row cut to its
    length ``(B,)``; positions past a row's length hold ``PAD_ID``."""
    L = content.shape[1]
    real = torch.arange(L, device=content.device) < lengths[:, None]  # (B, L)
    if task == "copy":
        y = content
    elif task == "reverse":
        index = (lengths[:, None] - 1 - torch.arange(L, device=content.device)).clamp(min=0)
        y = content.gather(1, index)  # (B, L): row b reads x_(n_b - 1 - i) at position i
    else:  # sort: padding positions get a key above every token, so they sort last
        y = content.masked_fill(~real, torch.iinfo(content.dtype).max).sort(dim=1).values
    return y.masked_fill(~real, PAD_ID)


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

    Lengths are uniform in ``[min_len, max_len]``, content tokens uniform in
    ``[FIRST_TOKEN, vocab_size)``, all drawn from ``generator`` (a seeded generator reproduces
    the batch). Returns a :class:`Batch` of ``long`` tensors padded with ``PAD_ID`` to the
    longest example, ``L`` (module docstring), on ``device``; a model needs ``max_len >= L + 1``
    target positions.
    """
    _check_task(task)
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator (seed it for reproducible data), "
            f"got {type(generator).__name__}"
        )
    batch_size = _checks.positive_int("batch_size", batch_size)
    min_len = _checks.positive_int("min_len", min_len)
    max_len = _checks.positive_int("max_len", max_len)
    if min_len > max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    vocab_size = _checks.as_int("vocab_size", vocab_size)
    if vocab_size <= FIRST_TOKEN:
        raise ValueError(
            f"vocab_size={vocab_size} leaves no content tokens: ids 0..{FIRST_TOKEN - 1} are "
            "PAD, BOS, EOS"
        )
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)  # (B,)
    L = int(lengths.max())
    content = torch.randint(FIRST_TOKEN, vocab_size, (batch_size, L), generator=generator)
    real = torch.arange(L) < lengths[:, None]  # (B, L): True at the n_b content positions
    src = content.masked_fill(~real, PAD_ID)  # (B, L)
    y = _apply_task_padded(task, content, lengths)  # (B, L)
    bos = torch.full((batch_size, 1), BOS_ID, dtype=torch.long)
    pad = torch.full((batch_size, 1), PAD_ID, dtype=torch.long)
    tgt_in = torch.cat([bos, y], dim=1)  # (B, L + 1): BOS, y, PAD...
    tgt_out = torch.cat([y, pad], dim=1).scatter(1, lengths[:, None], EOS_ID)  # y, EOS, PAD...
    return Batch(src.to(device), tgt_in.to(device), tgt_out.to(device))


def src_padding_mask(src: Tensor, pad_id: int = PAD_ID) -> Tensor:
    """``(B, S)`` token ids -> ``(B, 1, 1, S)`` boolean mask, True where ``src != pad_id``
    (the layout of :func:`minitransformer.attention.padding_mask`)."""
    _checks.tensor("src", src, kind="int", ndim=2, what="(B, S)")
    pad_id = _checks.as_int("pad_id", pad_id)
    return (src != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def strip_special(
    row: Tensor | list[int], eos_id: int = EOS_ID, bos_id: int = BOS_ID, pad_id: int = PAD_ID
) -> list[int]:
    """The content tokens of one decoded row ``(length,)``: drop a leading BOS, cut at the
    first EOS, drop PAD. ``strip_special([BOS, 5, 7, EOS, PAD]) == [5, 7]``."""
    if isinstance(row, Tensor):
        _checks.tensor("row", row, kind="int", ndim=1, what="(length,)")
        ids = row.tolist()
    else:
        ids = [_checks.as_int("row[i]", i) for i in row]
    eos_id, bos_id = _checks.as_int("eos_id", eos_id), _checks.as_int("bos_id", bos_id)
    pad_id = _checks.as_int("pad_id", pad_id)
    if ids and ids[0] == bos_id:
        ids = ids[1:]
    if eos_id in ids:
        ids = ids[: ids.index(eos_id)]
    return [i for i in ids if i != pad_id]
