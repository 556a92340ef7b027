"""Tests for minitransformer.training: schedule, label smoothing, optimizer, loop, accuracy.

References: the paper's numbers (peak learning rate 6.99e-4 for d_model 512, warm-up 4000;
Adam 0.9 / 0.98 / 1e-9) and torch.nn.CrossEntropyLoss(label_smoothing=...).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.data import BOS_ID, EOS_ID, PAD_ID, make_batch
from minitransformer.decoding import greedy_decode
from minitransformer.model import Transformer
from minitransformer.training import (
    ADAM_BETAS,
    ADAM_EPS,
    LabelSmoothingLoss,
    TrainHistory,
    evaluate_loss,
    exact_match,
    make_optimizer,
    noam_lambda,
    noam_learning_rate,
    sequence_accuracy,
    smoothed_targets,
    teacher_forcing,
    train,
)

# ---------------------------------------------------------------------------- the schedule


def test_noam_peak_matches_paper():
    """The paper's base model: peak at step 4000, about 6.99e-4 (PAPER_FACTS)."""
    lrs = [noam_learning_rate(s, 512, 4000) for s in range(1, 20001)]
    peak_step = max(range(len(lrs)), key=lrs.__getitem__) + 1
    assert peak_step == 4000
    assert lrs[peak_step - 1] == pytest.approx(6.99e-4, abs=5e-7)
    assert lrs[peak_step - 1] == pytest.approx((512 * 4000) ** -0.5)


@settings(max_examples=40, deadline=None)
@given(
    d_model=st.integers(1, 2048),
    warmup=st.integers(1, 500),
    scale=st.floats(0.01, 10.0),
)
def test_noam_shape(d_model, warmup, scale):
    """Linear warm-up, peak at warmup_steps, then inverse square root decay."""
    lr = lambda s: noam_learning_rate(s, d_model, warmup, scale)  # noqa: E731
    peak = scale * (d_model * warmup) ** -0.5
    assert lr(warmup) == pytest.approx(peak)
    for s in range(1, warmup + 1):  # linear in the step during warm-up
        assert lr(s) == pytest.approx(peak * s / warmup)
    for s in (warmup + 1, 2 * warmup, 10 * warmup + 3):  # decays as step**-0.5 afterwards
        assert lr(s) == pytest.approx(peak * math.sqrt(warmup / s))
        assert lr(s) < peak
    assert lr(4 * warmup) == pytest.approx(lr(warmup) / 2)


def test_noam_step_zero_and_scale():
    assert noam_learning_rate(0, 512) == 0.0
    assert noam_learning_rate(100, 64, 50, scale=0.5) == pytest.approx(
        0.5 * noam_learning_rate(100, 64, 50)
    )


@pytest.mark.parametrize(
    "kwargs, word",
    [
        (dict(step=-1, d_model=512), "step"),
        (dict(step=1, d_model=0), "d_model"),
        (dict(step=1, d_model=512, warmup_steps=0), "warmup_steps"),
        (dict(step=1, d_model=512, scale=0.0), "scale"),
    ],
)
def test_noam_bad_arguments(kwargs, word):
    with pytest.raises(ValueError, match=word):
        noam_learning_rate(**kwargs)


def test_optimizer_has_paper_settings_and_schedule():
    model = torch.nn.Linear(3, 3)
    optimizer, scheduler = make_optimizer(model, d_model=512, warmup_steps=10, scale=2.0)
    assert isinstance(optimizer, torch.optim.Adam)
    group = optimizer.param_groups[0]
    assert group["betas"] == ADAM_BETAS == (0.9, 0.98)
    assert group["eps"] == ADAM_EPS == 1e-9
    seen = []
    for _ in range(25):  # update k runs with noam(k): the first update is step 1, not 0
        seen.append(optimizer.param_groups[0]["lr"])
        model(torch.ones(1, 3)).sum().backward()
        optimizer.step()
        scheduler.step()
    want = [noam_learning_rate(k, 512, 10, 2.0) for k in range(1, 26)]
    assert seen == pytest.approx(want)
    assert noam_lambda(512, 10, 2.0)(0) == pytest.approx(want[0])


def test_optimizer_reads_d_model_from_model():
    model = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match="d_model"):
        make_optimizer(model)
    model.d_model = 64
    optimizer, _ = make_optimizer(model, warmup_steps=4)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(noam_learning_rate(1, 64, 4))


# ---------------------------------------------------------------------------- label smoothing


@settings(max_examples=40, deadline=None)
@given(
    epsilon=st.sampled_from([0.0, 0.1, 0.3, 0.9]),
    B=st.integers(1, 4),
    T=st.integers(1, 6),
    V=st.integers(2, 12),
    seed=st.integers(0, 2**16),
)
def test_label_smoothing_equals_torch(epsilon, B, T, V, seed):
    """Exactly torch's CrossEntropyLoss(label_smoothing=eps, ignore_index=pad): value and grad."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=gen, dtype=torch.float64) * 3
    target = torch.randint(0, V, (B, T), generator=gen)
    target[0, 0] = 1 % V if V > 1 else 0  # at least one counted token
    pad = 0
    ours_in = logits.clone().requires_grad_()
    ref_in = logits.clone().requires_grad_()
    ours = LabelSmoothingLoss(epsilon, ignore_index=pad)(ours_in, target)
    ref = torch.nn.CrossEntropyLoss(label_smoothing=epsilon, ignore_index=pad)(
        ref_in.reshape(-1, V), target.reshape(-1)
    )
    if target.ne(pad).any():
        torch.testing.assert_close(ours, ref)
        ours.backward()
        ref.backward()
        torch.testing.assert_close(ours_in.grad, ref_in.grad)
    else:
        assert torch.isnan(ours) and torch.isnan(ref)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_label_smoothing_reductions_equal_torch(reduction):
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 9, generator=gen)
    target = torch.randint(0, 9, (3, 5), generator=gen)
    target[:, -2:] = 0
    ours = LabelSmoothingLoss(0.1, ignore_index=0, reduction=reduction)(logits, target)
    ref = torch.nn.CrossEntropyLoss(label_smoothing=0.1, ignore_index=0, reduction=reduction)(
        logits.reshape(-1, 9), target.reshape(-1)
    )
    torch.testing.assert_close(ours.reshape(ref.shape), ref)


def test_label_smoothing_without_ignore_index_counts_every_token():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(10, 6, generator=gen)
    target = torch.randint(0, 6, (10,), generator=gen)
    torch.testing.assert_close(
        LabelSmoothingLoss(0.2)(logits, target),
        torch.nn.functional.cross_entropy(logits, target, label_smoothing=0.2),
    )


def test_smoothed_targets():
    q = smoothed_targets(torch.tensor([[2, 0]]), num_classes=5, epsilon=0.1)
    assert q.shape == (1, 2, 5)
    torch.testing.assert_close(q.sum(-1), torch.ones(1, 2))
    assert q[0, 0, 2] == pytest.approx(0.9 + 0.02)
    assert q[0, 0, 0] == pytest.approx(0.02)
    torch.testing.assert_close(
        smoothed_targets(torch.tensor([1]), 3, 0.0), torch.tensor([[0.0, 1.0, 0.0]])
    )


def test_loss_is_cross_entropy_with_smoothed_targets_and_kl_plus_floor():
    """loss = -sum q log p, and = KL(q || p) + H(q), the floor reached at p = q."""
    gen = torch.Generator().manual_seed(3)
    V, eps = 7, 0.1
    logits = torch.randn(4, V, generator=gen, dtype=torch.float64)
    target = torch.tensor([0, 3, 6, 3])
    loss_fn = LabelSmoothingLoss(eps)
    q = smoothed_targets(target, V, eps).double()
    log_p = torch.log_softmax(logits, -1)
    assert float(loss_fn(logits, target)) == pytest.approx(float(-(q * log_p).sum(-1).mean()))
    kl = torch.nn.functional.kl_div(log_p, q, reduction="batchmean")
    floor = loss_fn.loss_floor(V)
    assert float(loss_fn(logits, target)) == pytest.approx(float(kl) + floor)
    assert float(loss_fn(q.log(), target)) == pytest.approx(floor)  # predicting q is optimal
    assert LabelSmoothingLoss(0.0).loss_floor(V) == 0.0


@pytest.mark.parametrize(
    "logits, target, error, word",
    [
        (torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long), ValueError, r"\(2, 3, 5\)"),
        (torch.zeros(2, 5), torch.zeros(2), TypeError, "integer"),
        (torch.zeros(2, 5), torch.tensor([0, 5]), ValueError, r"\[0, 5\)"),
    ],
)
def test_label_smoothing_bad_input(logits, target, error, word):
    with pytest.raises(error, match=word):
        LabelSmoothingLoss(0.1)(logits, target)


@pytest.mark.parametrize("epsilon", [-0.1, 1.0])
def test_label_smoothing_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="epsilon"):
        LabelSmoothingLoss(epsilon)


# ---------------------------------------------------------------------------- helpers


def test_teacher_forcing_shifts_by_one():
    tgt = torch.tensor([[1, 5, 6, 2, 0], [1, 7, 2, 0, 0]])
    decoder_input, labels = teacher_forcing(tgt)
    assert decoder_input.tolist() == [[1, 5, 6, 2], [1, 7, 2, 0]]
    assert labels.tolist() == [[5, 6, 2, 0], [7, 2, 0, 0]]
    with pytest.raises(ValueError, match=r"\(2, 1\)"):
        teacher_forcing(tgt[:, :1])


def test_exact_match():
    eos, pad = 2, 0
    targets = torch.tensor([[1, 5, 6, 2, 0], [1, 5, 6, 2, 0], [1, 7, 2, 0, 0], [1, 7, 2, 0, 0]])
    predictions = torch.tensor(
        [
            [1, 5, 6, 2, 9, 9],  # right; anything after EOS does not count
            [1, 5, 6, 6, 2, 0],  # one extra token
            [1, 7, 2, 0, 0, 0],  # right, padded differently
            [1, 7, 7, 7, 7, 7],  # never stops
        ]
    )
    assert exact_match(predictions, targets, eos, pad).tolist() == [True, False, True, False]
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        exact_match(predictions[:3], targets, eos, pad)


def test_history_smoothed():
    h = TrainHistory(loss=[4.0, 2.0, 0.0, 2.0])
    assert h.smoothed(2) == pytest.approx([4.0, 3.0, 1.0, 1.0])
    assert h.smoothed(1) == h.loss


# ---------------------------------------------------------------------------- with the model

VOCAB = 13  # PAD, BOS, EOS and 10 content tokens


@pytest.fixture
def one_thread():
    """Tiny models train fastest on one thread, and a loaded machine makes more threads far
    slower; restore the previous setting afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _tiny_model(seed: int = 0, dropout: float = 0.0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(VOCAB, VOCAB, d_model=64, num_heads=4, num_layers=1, d_ff=128,
                       dropout=dropout, max_len=16)


def _batches(seed: int, batch_size: int, min_len: int, max_len: int):
    gen = torch.Generator().manual_seed(seed)
    while True:
        yield make_batch("reverse", batch_size, min_len, max_len, VOCAB, gen)


def test_train_loop_records_history_and_restores_mode(one_thread):
    model = _tiny_model(dropout=0.1).eval()
    optimizer, scheduler = make_optimizer(model, warmup_steps=5, scale=0.5)
    held_out = make_batch("reverse", 32, 1, 5, VOCAB, torch.Generator().manual_seed(99))
    before = evaluate_loss(model, [held_out])
    history = train(model, _batches(0, 32, 1, 5), optimizer, scheduler, num_steps=30,
                    eval_batch=held_out, eval_every=10, progress=False)
    assert len(history.loss) == len(history.lr) == 30
    assert history.lr == pytest.approx([noam_learning_rate(k, 64, 5, 0.5) for k in range(1, 31)])
    assert history.eval_steps == [10, 20, 30] and len(history.eval_loss) == 3
    assert not model.training  # left in the mode it was in
    assert evaluate_loss(model, [held_out]) < before  # it learnt something
    # A (src, tgt) pair and a Batch give the same loss.
    assert evaluate_loss(model, [(held_out.src, held_out.tgt)]) == pytest.approx(
        evaluate_loss(model, [held_out])
    )


def test_train_rejects_bad_batches():
    model = _tiny_model()
    optimizer, _ = make_optimizer(model, warmup_steps=5)
    src = torch.full((2, 4), 5)
    with pytest.raises(ValueError, match=r"\(2, 4\).*\(3, 5\)"):
        train(model, [(src, torch.full((3, 6), 5))], optimizer, progress=False)
    with pytest.raises(ValueError, match="4 items"):
        train(model, [(src, src, src, src)], optimizer, progress=False)


def test_sequence_accuracy_is_exact_match_of_greedy_decoding(one_thread):
    """Batched, in eval mode, mode restored; equals exact_match on greedy_decode's output."""
    model = _tiny_model(dropout=0.1)
    held_out = make_batch("reverse", 20, 1, 6, VOCAB, torch.Generator().manual_seed(5))
    acc = sequence_accuracy(model, held_out.src, held_out.tgt, BOS_ID, EOS_ID, batch_size=7)
    assert model.training
    model.eval()
    out = greedy_decode(model, held_out.src, held_out.tgt.shape[1], BOS_ID, EOS_ID)
    assert acc == pytest.approx(exact_match(out, held_out.tgt, EOS_ID).float().mean().item())
    assert acc < 0.5  # untrained
    with pytest.raises(ValueError, match=r"\(20, 6\).*\(3, 8\)|\(20, \d+\).*\(3, \d+\)"):
        sequence_accuracy(model, held_out.src, held_out.tgt[:3], BOS_ID, EOS_ID)


def test_reverse_task_reaches_99_percent_exact_match(one_thread):
    """The paper's recipe (Adam 0.9/0.98/1e-9, warm-up schedule, label smoothing 0.1) trains a
    one-layer model to reverse sequences of 6 to 8 tokens; exact-match accuracy of greedy
    decoding on 500 held-out sequences (a different seed) must reach 99%. Seeded, CPU."""
    model = _tiny_model(seed=0)
    optimizer, scheduler = make_optimizer(model, warmup_steps=30, scale=0.5)
    train(model, _batches(0, 128, 6, 8), optimizer, scheduler,
          LabelSmoothingLoss(0.1, ignore_index=PAD_ID), num_steps=250, clip_grad_norm=1.0,
          progress=False)
    held_out = make_batch("reverse", 500, 6, 8, VOCAB, torch.Generator().manual_seed(12345))
    accuracy = sequence_accuracy(model, held_out.src, held_out.tgt, BOS_ID, EOS_ID)
    assert accuracy >= 0.99, f"exact-match accuracy {accuracy:.3f} < 0.99"
