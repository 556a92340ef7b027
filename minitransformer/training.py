"""The paper's training recipe: Adam, the warm-up ("Noam") schedule, label smoothing, a loop.

Explained in the chapter "Training a Transformer" (``book/training``). Section 5.3 of
Vaswani et al. (2017) trains with

* Adam with ``beta1 = 0.9``, ``beta2 = 0.98``, ``eps = 1e-9`` (:func:`make_optimizer`);
* a learning rate that grows linearly for ``warmup_steps`` updates and then decays as the
  inverse square root of the step number (:func:`noam_learning_rate`);
* label smoothing with ``epsilon_ls = 0.1`` (:class:`LabelSmoothingLoss`).

:func:`train` runs teacher-forced training on batches of token ids and returns
the loss history; :func:`sequence_accuracy` measures exact-match accuracy of decoded outputs.

Shape letters: B batch, S source length, T target length, V vocabulary size.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

import torch
from torch import Tensor, nn
from tqdm import tqdm

from minitransformer.data import PAD_ID

__all__ = [
    "ADAM_BETAS",
    "ADAM_EPS",
    "noam_learning_rate",
    "noam_lambda",
    "make_optimizer",
    "smoothed_targets",
    "LabelSmoothingLoss",
    "teacher_forcing",
    "TrainHistory",
    "train",
    "evaluate_loss",
    "exact_match",
    "sequence_accuracy",
]

#: Adam's (beta1, beta2) in the paper (section 5.3); PyTorch's default beta2 is 0.999.
ADAM_BETAS: tuple[float, float] = (0.9, 0.98)
#: Adam's epsilon in the paper; PyTorch's default is 1e-8.
ADAM_EPS: float = 1e-9


# --------------------------------------------------------------------------------------------
# The learning-rate schedule
# --------------------------------------------------------------------------------------------


def noam_learning_rate(
    step: int, d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> float:
    """The paper's learning rate at update number ``step`` (section "The warm-up schedule").

    ``lrate = scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``

    (equation 3 of the paper, where ``scale = 1``). It rises linearly for ``warmup_steps``
    updates, peaks at ``step = warmup_steps`` with the value
    ``scale * (d_model * warmup_steps)**-0.5`` (about 6.99e-4 for ``d_model = 512`` and
    4000 warm-up steps), then decays as ``step**-0.5``.

    Steps are counted from 1: the first parameter update is ``step = 1``. At ``step = 0``
    (before any update) the formula's ``min(inf, 0)`` is 0, and that is what is returned.

    Args:
        step: update number, ``>= 0``.
        d_model: model width; larger models get smaller learning rates.
        warmup_steps: length of the linear warm-up, ``>= 1``.
        scale: a constant factor. The paper uses 1; toy models with a short warm-up often need
            a smaller one, because the peak ``(d_model * warmup_steps)**-0.5`` grows as the
            warm-up shrinks.

    Raises:
        ValueError: for a negative step, a non-positive ``d_model``, ``warmup_steps`` or
            ``scale``.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0 (updates are counted from 1), got {step}")
    if d_model <= 0:
        raise ValueError(f"d_model must be positive, got {d_model}")
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}")
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    if step == 0:
        return 0.0
    return scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


def noam_lambda(
    d_model: int, warmup_steps: int = 4000, scale: float = 1.0
) -> Callable[[int], float]:
    """The schedule as a ``lr_lambda`` for :class:`torch.optim.lr_scheduler.LambdaLR`.

    ``LambdaLR`` calls its lambda with the number of updates done so far (0 before the first
    update), and multiplies the optimizer's base learning rate by the result. With a base
    learning rate of 1 (as :func:`make_optimizer` sets it) update ``k = 1, 2, ...`` therefore
    runs with exactly ``noam_learning_rate(k, ...)``.
    """
    noam_learning_rate(1, d_model, warmup_steps, scale)  # validate the arguments now
    return lambda done: noam_learning_rate(done + 1, d_model, warmup_steps, scale)


def make_optimizer(
    model: nn.Module,
    d_model: int | None = None,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    betas: tuple[float, float] = ADAM_BETAS,
    eps: float = ADAM_EPS,
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam with the paper's settings and the warm-up schedule (section "The paper's recipe").

    Returns ``(optimizer, scheduler)``. Call ``optimizer.step()`` then ``scheduler.step()``
    once per batch (:func:`train` does). The optimizer's base learning rate is 1 and the
    scheduler multiplies it by :func:`noam_learning_rate`, so
    ``optimizer.param_groups[0]["lr"]`` is always the learning rate of the next update.

    Args:
        model: the module whose parameters are trained.
        d_model: model width for the schedule; defaults to ``model.d_model``.
        warmup_steps: warm-up length (the paper: 4000 updates of 25000 + 25000 tokens).
        scale: factor on the whole schedule (the paper: 1). For toy runs of a few hundred
            steps we shorten the warm-up and pass a scale below 1 so that the peak stays sane.
        betas, eps: Adam's constants; the paper's by default.
    """
    if d_model is None:
        d_model = getattr(model, "d_model", None)
        if not isinstance(d_model, int):
            raise ValueError(
                f"pass d_model explicitly: {type(model).__name__} has no integer d_model attribute"
            )
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=betas, eps=eps)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, noam_lambda(d_model, warmup_steps, scale)
    )
    return optimizer, scheduler


# --------------------------------------------------------------------------------------------
# Label smoothing
# --------------------------------------------------------------------------------------------


def _check_epsilon(epsilon: float) -> None:
    if not 0.0 <= epsilon < 1.0:
        raise ValueError(f"epsilon must lie in [0, 1), got {epsilon}")


def smoothed_targets(target: Tensor, num_classes: int, epsilon: float) -> Tensor:
    """The label-smoothed target distribution ``q`` (section "Label smoothing").

    ``q = (1 - epsilon) * one_hot(target) + epsilon / V``: the true class gets
    ``1 - epsilon + epsilon / V`` and every other class ``epsilon / V``. This is the
    distribution of :class:`torch.nn.CrossEntropyLoss` with ``label_smoothing=epsilon``
    (Szegedy et al., 2016): the smoothing mass is spread over *all* ``V`` classes, including
    the true one.

    Args:
        target: integer class ids of any shape ``(...)``, each in ``[0, num_classes)``.
        num_classes: ``V``.
        epsilon: smoothing mass in ``[0, 1)``; 0 gives the one-hot targets.

    Returns:
        a float tensor ``(..., V)`` whose rows sum to one.
    """
    _check_epsilon(epsilon)
    _check_target(target, num_classes, ignore_index=None)
    one_hot = torch.nn.functional.one_hot(target, num_classes).float()  # (..., V)
    return (1.0 - epsilon) * one_hot + epsilon / num_classes


def _check_target(target: Tensor, num_classes: int, ignore_index: int | None) -> None:
    if target.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise TypeError(f"target must hold integer class ids, got dtype {target.dtype}")
    kept = target if ignore_index is None else target[target != ignore_index]
    if kept.numel() and (int(kept.min()) < 0 or int(kept.max()) >= num_classes):
        raise ValueError(
            f"target ids must lie in [0, {num_classes}) (V = {num_classes}), got values in "
            f"[{int(kept.min())}, {int(kept.max())}]"
        )


class LabelSmoothingLoss(nn.Module):
    """Cross-entropy against label-smoothed targets (section "Label smoothing").

    For logits ``z`` (..., V) and a target class ``y`` the per-token loss is

    ``-sum_v q_v log softmax(z)_v = (1 - epsilon) * (-log p_y) + epsilon * mean_v(-log p_v)``

    with ``q`` from :func:`smoothed_targets`. It equals
    ``torch.nn.CrossEntropyLoss(label_smoothing=epsilon, ignore_index=ignore_index)``
    **exactly** (not up to a constant), and with ``reduction="mean"`` it averages over the
    tokens whose target is not ``ignore_index`` (padding), like PyTorch.

    Some implementations (The Annotated Transformer) minimise ``KL(q || p)`` instead. That is
    this loss minus the entropy ``H(q)``, a constant (:meth:`loss_floor`): the gradients are
    identical, only the reported number differs. Ours never goes below ``H(q) > 0``, even for
    a perfect model, which the chapter shows on the training curve.

    Args:
        epsilon: smoothing mass in ``[0, 1)`` (the paper: 0.1). 0 gives plain cross-entropy.
        ignore_index: a target id whose tokens do not count (the padding id), or ``None``.
        reduction: ``"mean"`` (over counted tokens), ``"sum"`` or ``"none"`` (per token, 0 at
            ignored tokens).
    """

    def __init__(
        self, epsilon: float = 0.1, ignore_index: int | None = None, reduction: str = "mean"
    ) -> None:
        super().__init__()
        _check_epsilon(epsilon)
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.epsilon = epsilon
        self.ignore_index = ignore_index
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits`` ``(..., V)`` (e.g. ``(B, T, V)``), ``target`` ``(...)`` (e.g. ``(B, T)``)."""
        if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(target.shape):
            raise ValueError(
                f"logits (..., V) = {tuple(logits.shape)} and target (...) = "
                f"{tuple(target.shape)} must agree on the leading dimensions"
            )
        V = logits.shape[-1]
        _check_target(target, V, self.ignore_index)
        log_p = torch.log_softmax(logits, dim=-1)  # (..., V)
        keep = (
            torch.ones_like(target, dtype=torch.bool)
            if self.ignore_index is None
            else target != self.ignore_index
        )  # (...)
        safe_target = torch.where(keep, target, torch.zeros_like(target)).long()
        nll = -log_p.gather(-1, safe_target.unsqueeze(-1)).squeeze(-1)  # (...) -log p_y
        uniform = -log_p.mean(dim=-1)  # (...) mean_v -log p_v
        per_token = ((1.0 - self.epsilon) * nll + self.epsilon * uniform) * keep
        if self.reduction == "none":
            return per_token
        if self.reduction == "sum":
            return per_token.sum()
        return per_token.sum() / keep.sum()  # NaN when every token is ignored, like PyTorch

    def loss_floor(self, num_classes: int) -> float:
        """The smallest value the loss can take: the entropy ``H(q)`` of the smoothed targets.

        It is reached when the model predicts ``q`` itself; for ``epsilon = 0`` it is 0.
        """
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        eps, V = self.epsilon, num_classes
        on, off = 1.0 - eps + eps / V, eps / V

        def h(p: float) -> float:
            return -p * math.log(p) if p > 0 else 0.0

        return h(on) + (V - 1) * h(off)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, ignore_index={self.ignore_index}"


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------


def teacher_forcing(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Split ``(B, T + 1)`` target ids ``[BOS, y_1, ..., y_n, EOS, PAD...]`` for training.

    Returns ``(decoder_input, labels)``, both ``(B, T)``: the decoder reads
    ``[BOS, y_1, ..., y_n, ...]`` and must predict the same sequence shifted left by one,
    ``[y_1, ..., y_n, EOS, ...]``. Position ``t`` sees the *true* tokens before it, never its
    own prediction: that is teacher forcing.
    """
    if tgt.dim() != 2 or tgt.shape[1] < 2:
        raise ValueError(f"tgt must be (B, T + 1) with T + 1 >= 2 (BOS + one token), got {tuple(tgt.shape)}")
    return tgt[:, :-1], tgt[:, 1:]


def _split_batch(batch) -> tuple[Tensor, Tensor, Tensor]:
    """``(src, tgt)`` or ``(src, tgt_in, tgt_out)`` (a :class:`minitransformer.data.Batch`)."""
    if len(batch) == 3:
        src, tgt_in, tgt_out = batch
    elif len(batch) == 2:
        src, tgt = batch
        tgt_in, tgt_out = teacher_forcing(tgt)
    else:
        raise ValueError(
            f"a batch must be (src, tgt) or (src, tgt_in, tgt_out), got {len(batch)} items"
        )
    if src.dim() != 2 or tgt_in.shape != tgt_out.shape or tgt_in.dim() != 2 \
            or src.shape[0] != tgt_in.shape[0]:
        raise ValueError(
            f"src (B, S) = {tuple(src.shape)}, tgt_in (B, T) = {tuple(tgt_in.shape)} and "
            f"tgt_out (B, T) = {tuple(tgt_out.shape)} must be 2-D with one batch size"
        )
    return src, tgt_in, tgt_out


def _forward_loss(
    model: nn.Module, src: Tensor, tgt_in: Tensor, tgt_out: Tensor, loss_fn: nn.Module,
    pad_id: int,
) -> Tensor:
    """Teacher-forced logits for one batch and their loss."""
    src_mask = (src != pad_id)[:, None, None, :]  # (B, 1, 1, S): hide padded source keys
    logits = model(src, tgt_in, src_mask=src_mask)  # (B, T, V); decode adds the causal mask
    return loss_fn(logits, tgt_out)


@dataclass
class TrainHistory:
    """What :func:`train` records, one entry per update.

    ``loss`` is the training loss of each batch, ``lr`` the learning rate it was taken with;
    ``eval_steps`` / ``eval_loss`` hold the optional held-out loss every ``eval_every`` steps.
    """

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def smoothed(self, window: int = 20) -> list[float]:
        """The training loss averaged over a trailing window (for plots of noisy curves)."""
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        out, total = [], 0.0
        for i, x in enumerate(self.loss):
            total += x
            if i >= window:
                total -= self.loss[i - window]
            out.append(total / min(i + 1, window))
        return out


def train(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, ...]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    loss_fn: nn.Module | None = None,
    num_steps: int | None = None,
    pad_id: int = PAD_ID,
    clip_grad_norm: float | None = None,
    eval_batch: tuple[Tensor, ...] | None = None,
    eval_every: int = 50,
    progress: bool = True,
    desc: str = "training",
) -> TrainHistory:
    """Teacher-forced training, one update per batch (section "Training on the reverse task").

    Each batch is a :class:`minitransformer.data.Batch` ``(src, tgt_in, tgt_out)`` or a pair
    ``(src, tgt)`` with ``tgt`` ``(B, T + 1)`` = ``[BOS, y..., EOS, PAD...]``, split by
    :func:`teacher_forcing`. For each batch it computes ``model(src, tgt_in, src_mask=...)``
    (logits ``(B, T, V)``), the loss against ``tgt_out``, and takes one optimizer and one
    scheduler step. Padding (``pad_id``) is hidden from attention by the source mask and from
    the loss by the loss's ``ignore_index``; the decoder's causal mask hides the future.

    Args:
        model: a :class:`minitransformer.model.Transformer` (or anything with the same call).
        batches: an iterable of batches; an endless generator is fine when ``num_steps`` is
            given.
        optimizer, scheduler: e.g. from :func:`make_optimizer`.
        loss_fn: defaults to ``LabelSmoothingLoss(0.1, ignore_index=pad_id)``, the paper's.
        num_steps: stop after this many updates (default: when ``batches`` runs out).
        pad_id: the padding id.
        clip_grad_norm: clip the global gradient norm to this value (the paper does not clip;
            ``None`` = no clipping).
        eval_batch: an optional held-out batch (same layout) whose loss (same ``loss_fn``, in
            eval mode, without gradients) is recorded every ``eval_every`` updates and at the end.
        progress: show a tqdm progress bar with the running loss (``False`` hides it).
        desc: the progress bar's label.

    Returns:
        a :class:`TrainHistory`. The model is left in the mode (train/eval) it was in.
    """
    if num_steps is not None and num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    if eval_every < 1:
        raise ValueError(f"eval_every must be >= 1, got {eval_every}")
    if loss_fn is None:
        loss_fn = LabelSmoothingLoss(0.1, ignore_index=pad_id)
    was_training = model.training
    history = TrainHistory()
    start = time.perf_counter()

    def record_eval(step: int) -> None:
        if eval_batch is None:
            return
        history.eval_steps.append(step)
        history.eval_loss.append(evaluate_loss(model, [eval_batch], loss_fn, pad_id))

    total = num_steps
    if hasattr(batches, "__len__"):
        total = len(batches) if num_steps is None else min(num_steps, len(batches))
    bar = tqdm(total=total, desc=desc, disable=not progress, mininterval=1.0, ncols=80)
    try:
        step = 0
        for batch in batches:
            if num_steps is not None and step >= num_steps:
                break
            model.train()
            lr = optimizer.param_groups[0]["lr"]
            loss = _forward_loss(model, *_split_batch(batch), loss_fn, pad_id)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if clip_grad_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            step += 1
            history.loss.append(float(loss.detach()))
            history.lr.append(float(lr))
            if step % eval_every == 0:
                record_eval(step)
            bar.update(1)
            bar.set_postfix(loss=f"{history.loss[-1]:.3f}", lr=f"{lr:.2e}", refresh=False)
        if eval_batch is not None and (not history.eval_steps or history.eval_steps[-1] != step):
            record_eval(step)
    finally:
        bar.close()
        model.train(was_training)
    history.seconds = time.perf_counter() - start
    return history


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    batches: Iterable[tuple[Tensor, ...]],
    loss_fn: nn.Module | None = None,
    pad_id: int = PAD_ID,
) -> float:
    """The mean teacher-forced loss over ``batches``, in eval mode (no dropout), no gradients.

    ``loss_fn`` defaults to plain cross-entropy ignoring padding. Batches are weighted by their
    number of non-padding target tokens.
    """
    if loss_fn is None:
        loss_fn = LabelSmoothingLoss(0.0, ignore_index=pad_id)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in batches:
            src, tgt_in, tgt_out = _split_batch(batch)
            n = int((tgt_out != pad_id).sum())
            total += float(_forward_loss(model, src, tgt_in, tgt_out, loss_fn, pad_id)) * n
            count += n
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError("evaluate_loss got no non-padding target tokens")
    return total / count


# --------------------------------------------------------------------------------------------
# Exact-match accuracy
# --------------------------------------------------------------------------------------------


def _until_eos(row: list[int], eos_id: int, pad_id: int) -> list[int]:
    """The tokens up to and including the first EOS; without an EOS, the row minus trailing pads."""
    if eos_id in row:
        return row[: row.index(eos_id) + 1]
    while row and row[-1] == pad_id:
        row = row[:-1]
    return row


def exact_match(predictions: Tensor, targets: Tensor, eos_id: int, pad_id: int = 0) -> Tensor:
    """Which rows of ``predictions`` equal ``targets`` exactly, as sequences (``(B,)`` bool).

    Both are ``(B, length)`` token ids in the same layout (e.g. both starting with BOS); their
    lengths may differ. Each row is cut after its first ``eos_id`` (a row without EOS keeps all
    tokens except trailing ``pad_id``), and the two token lists must be identical: one wrong,
    missing or extra token makes the whole sequence wrong.
    """
    if predictions.dim() != 2 or targets.dim() != 2 or predictions.shape[0] != targets.shape[0]:
        raise ValueError(
            f"predictions (B, T') = {tuple(predictions.shape)} and targets (B, T) = "
            f"{tuple(targets.shape)} must be 2-D with the same batch size"
        )
    return torch.tensor(
        [
            _until_eos(p, eos_id, pad_id) == _until_eos(t, eos_id, pad_id)
            for p, t in zip(predictions.tolist(), targets.tolist())
        ],
        dtype=torch.bool,
    )


@torch.no_grad()
def sequence_accuracy(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    bos_id: int,
    eos_id: int,
    pad_id: int = PAD_ID,
    max_len: int | None = None,
    beam_size: int | None = None,
    batch_size: int = 512,
) -> float:
    """Exact-match sequence accuracy of decoded outputs (section "Decoding the trained model").

    Decodes ``src`` ``(B, S)`` with :func:`minitransformer.decoding.greedy_decode` (or
    :func:`~minitransformer.decoding.beam_search` with ``beam_size``), in eval mode, and returns
    the fraction of rows whose output equals ``tgt`` ``(B, T + 1)`` = ``[BOS, y..., EOS, PAD...]``
    exactly (:func:`exact_match`).

    Args:
        max_len: longest output including BOS; defaults to ``tgt.shape[1]`` (enough for every
            reference).
        batch_size: rows decoded at once (bounds memory).
    """
    from minitransformer.decoding import beam_search, greedy_decode

    if src.dim() != 2 or tgt.dim() != 2 or src.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"src (B, S) = {tuple(src.shape)} and tgt (B, T + 1) = {tuple(tgt.shape)} must be "
            "2-D with the same batch size"
        )
    if src.shape[0] == 0:
        raise ValueError("sequence_accuracy needs at least one sequence, got B = 0")
    max_len = tgt.shape[1] if max_len is None else max_len
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for i in range(0, src.shape[0], batch_size):
            s, t = src[i : i + batch_size], tgt[i : i + batch_size]
            if beam_size is None:
                out = greedy_decode(model, s, max_len, bos_id, eos_id)
            else:
                out = beam_search(model, s, max_len, bos_id, eos_id, beam_size=beam_size)
            correct += int(exact_match(out, t, eos_id, pad_id).sum())
    finally:
        model.train(was_training)
    return correct / src.shape[0]
