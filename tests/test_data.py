"""Tests for minitransformer.data: the toy tasks, their padding / BOS / EOS layout and seeding."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.attention import padding_mask
from minitransformer.data import (
    BOS_ID,
    EOS_ID,
    FIRST_TOKEN,
    PAD_ID,
    TASKS,
    Batch,
    apply_task,
    make_batch,
    src_padding_mask,
    strip_special,
)


def test_special_ids() -> None:
    assert (PAD_ID, BOS_ID, EOS_ID, FIRST_TOKEN) == (0, 1, 2, 3)
    assert TASKS == ("copy", "reverse", "sort")


@settings(max_examples=30, deadline=None)
@given(
    task=st.sampled_from(TASKS),
    batch_size=st.integers(1, 6),
    min_len=st.integers(1, 5),
    extra=st.integers(0, 5),
    vocab_size=st.integers(4, 20),
    seed=st.integers(0, 2**31 - 1),
)
def test_batch_layout(task, batch_size, min_len, extra, vocab_size, seed) -> None:
    max_len = min_len + extra
    src, tgt_in, tgt_out = make_batch(
        task, batch_size, min_len, max_len, vocab_size, torch.Generator().manual_seed(seed)
    )
    L = src.shape[1]
    assert src.dtype == tgt_in.dtype == tgt_out.dtype == torch.long
    assert src.shape == (batch_size, L) and tgt_in.shape == tgt_out.shape == (batch_size, L + 1)
    assert min_len <= L <= max_len
    for b in range(batch_size):
        n = int((src[b] != PAD_ID).sum())
        assert min_len <= n <= max_len
        x = src[b, :n]
        assert torch.all(src[b, n:] == PAD_ID)  # padding only at the end
        assert torch.all((x >= FIRST_TOKEN) & (x < vocab_size))  # content ids only
        y = apply_task(task, x)
        assert tgt_in[b, 0] == BOS_ID
        assert torch.equal(tgt_in[b, 1 : n + 1], y)
        assert torch.all(tgt_in[b, n + 1 :] == PAD_ID)
        assert torch.equal(tgt_out[b, :n], y)
        assert tgt_out[b, n] == EOS_ID
        assert torch.all(tgt_out[b, n + 1 :] == PAD_ID)
        # teacher forcing: the output is the input shifted left by one
        assert torch.equal(tgt_in[b, 1 : n + 1], tgt_out[b, :n])


def test_tasks_compute_the_right_targets() -> None:
    x = torch.tensor([5, 3, 9, 3])
    assert apply_task("copy", x).tolist() == [5, 3, 9, 3]
    assert apply_task("reverse", x).tolist() == [3, 9, 3, 5]
    assert apply_task("sort", x).tolist() == [3, 3, 5, 9]


def test_same_seed_same_batch_different_seed_different_batch() -> None:
    a = make_batch("reverse", 8, 2, 9, 30, torch.Generator().manual_seed(1))
    b = make_batch("reverse", 8, 2, 9, 30, torch.Generator().manual_seed(1))
    c = make_batch("reverse", 8, 2, 9, 30, torch.Generator().manual_seed(2))
    for u, v in zip(a, b, strict=True):
        assert torch.equal(u, v)
    assert not (a.src.shape == c.src.shape and torch.equal(a.src, c.src))


def test_lengths_cover_the_range() -> None:
    src, _, _ = make_batch("copy", 400, 2, 6, 10, torch.Generator().manual_seed(0))
    lengths = set((src != PAD_ID).sum(1).tolist())
    assert lengths == {2, 3, 4, 5, 6}


def test_batch_properties_tgt_and_src_mask() -> None:
    batch = make_batch("sort", 5, 1, 6, 12, torch.Generator().manual_seed(3))
    assert isinstance(batch, Batch)
    assert torch.equal(batch.tgt[:, 1:], batch.tgt_out)
    assert torch.equal(
        batch.tgt[:, :-1].masked_fill(batch.tgt[:, :-1] == EOS_ID, PAD_ID), batch.tgt_in
    )
    lengths = (batch.src != PAD_ID).sum(1)
    assert torch.equal(batch.src_mask, padding_mask(lengths, batch.src.shape[1]))
    assert batch.src_mask.shape == (5, 1, 1, batch.src.shape[1])


def test_src_padding_mask() -> None:
    src = torch.tensor([[4, 5, 0], [6, 0, 0]])
    mask = src_padding_mask(src)
    assert mask.dtype == torch.bool and mask.shape == (2, 1, 1, 3)
    assert mask[:, 0, 0].tolist() == [[True, True, False], [True, False, False]]
    with pytest.raises(ValueError, match=r"\(B, S\)"):
        src_padding_mask(torch.zeros(3, dtype=torch.long))


def test_strip_special() -> None:
    assert strip_special([BOS_ID, 5, 7, EOS_ID, PAD_ID]) == [5, 7]
    assert strip_special(torch.tensor([BOS_ID, 5, 7, EOS_ID, 8])) == [5, 7]  # cut at EOS
    assert strip_special([5, 7]) == [5, 7]
    assert strip_special([BOS_ID, 4, 6, PAD_ID, PAD_ID]) == [4, 6]


def test_bad_arguments_raise() -> None:
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="unknown task 'rotate'"):
        make_batch("rotate", 2, 1, 3, 10, gen)
    with pytest.raises(ValueError, match="min_len=4, max_len=3"):
        make_batch("copy", 2, 4, 3, 10, gen)
    with pytest.raises(ValueError, match="vocab_size=3"):
        make_batch("copy", 2, 1, 3, 3, gen)
    with pytest.raises(ValueError, match="batch_size"):
        make_batch("copy", 0, 1, 3, 10, gen)
    with pytest.raises(TypeError, match="torch.Generator"):
        make_batch("copy", 2, 1, 3, 10, 42)
    with pytest.raises(ValueError, match=r"\(n,\)"):
        apply_task("sort", torch.ones(2, 3, dtype=torch.long))


@pytest.mark.parametrize(
    "call, error, words",
    [
        (lambda g: make_batch(3, 2, 1, 3, 10, g), TypeError, "task must be a str"),
        (lambda g: make_batch("copy", 2.0, 1, 3, 10, g), TypeError, "batch_size must be an int"),
        (
            lambda g: make_batch("copy", 2, 0, 3, 10, g),
            ValueError,
            "min_len must be positive, got 0",
        ),
        (
            lambda g: make_batch("copy", 2, 1, True, 10, g),
            TypeError,
            "max_len must be an int, got bool",
        ),
        (
            lambda g: apply_task("copy", torch.ones(3)),
            TypeError,
            "tokens must be an integer tensor",
        ),
        (lambda g: src_padding_mask(torch.ones(2, 3)), TypeError, "src must be an integer tensor"),
        (
            lambda g: src_padding_mask(torch.ones(2, 3, dtype=torch.long), pad_id=0.5),
            TypeError,
            "pad_id must be an int",
        ),
        (
            lambda g: strip_special(torch.ones(2, 3, dtype=torch.long)),
            ValueError,
            r"row must have 1 dimensions \(length,\), got shape \(2, 3\)",
        ),
        (lambda g: strip_special([1, 2.5]), TypeError, r"row\[i\] must be an int"),
    ],
)
def test_bad_kinds_and_values_name_the_argument(call, error, words) -> None:
    with pytest.raises(error, match=words):
        call(torch.Generator().manual_seed(0))


def test_empty_inputs_work() -> None:
    """Empty sequences and batches of zero rows are valid input where they make sense."""
    assert apply_task("reverse", torch.zeros(0, dtype=torch.long)).shape == (0,)
    assert strip_special([]) == [] and strip_special([BOS_ID, EOS_ID]) == []
    assert src_padding_mask(torch.zeros(0, 4, dtype=torch.long)).shape == (0, 1, 1, 4)


def test_make_batch_on_device(device) -> None:
    batch = make_batch("sort", 4, 2, 5, 11, torch.Generator().manual_seed(0), device=device)
    cpu = make_batch("sort", 4, 2, 5, 11, torch.Generator().manual_seed(0))
    for on_device, reference in zip(batch, cpu, strict=True):
        assert on_device.device.type == device.type
        assert torch.equal(on_device.cpu(), reference)  # the same draw, whatever the device
    assert batch.src_mask.device.type == device.type
