"""The paper's training recipe and the one training loop of the course.

Chapter "Training a Transformer" (``book/training``), after section 5.3 of Vaswani et al.
(2017): Adam with ``betas = (0.9, 0.98)``, ``eps = 1e-9`` (:func:`make_optimizer`), the
warm-up schedule (:func:`noam_learning_rate`, optionally ending in a linear decay), label
smoothing (:class:`LabelSmoothingLoss`). :func:`train` runs any experiment of the book (a
``loss`` callback, an ``eval_fn`` every ``eval_every`` updates) and trains data-parallel when
started with ``torchrun`` (:func:`shard_batch`, section "Scaling out").

Shape letters: B batch, S source length, T target length, V vocabulary size.
"""

from __future__ import annotations

import itertools
import math
import numbers
import time
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch import distributed as dist
from tqdm.auto import tqdm

from minitransformer import _checks
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
    "seq2seq_loss",
    "shard_batch",
    "TrainHistory",
    "train",
    "evaluate_loss",
    "average_checkpoints",
    "exact_match",
    "sequence_accuracy",
    "Calibration",
    "calibration",
]

#: Adam's (beta1, beta2) in the paper (section 5.3); PyTorch's default beta2 is 0.999.
ADAM_BETAS: tuple[float, float] = (0.9, 0.98)
#: Adam's epsilon in the paper; PyTorch's default is 1e-8.
ADAM_EPS: float = 1e-9


# --------------------------------------------------------------------------------------------
# The learning-rate schedule
# --------------------------------------------------------------------------------------------


def _check_decay(total_steps: int | None, decay_steps: int) -> tuple[int | None, int]:
    decay_steps = _checks.positive_int("decay_steps", decay_steps, allow_zero=True)
    if total_steps is None:
        if decay_steps:
            raise ValueError(f"decay_steps={decay_steps} needs total_steps (the last update)")
        return None, 0
    total_steps = _checks.positive_int("total_steps", total_steps)
    if decay_steps > total_steps:
        raise ValueError(f"decay_steps={decay_steps} must be <= total_steps={total_steps}")
    return total_steps, decay_steps


def noam_learning_rate(
    step: int,
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    *,
    total_steps: int | None = None,
    decay_steps: int = 0,
) -> float:
    """The learning rate of update ``step`` (section "The warm-up schedule"), equation 3:

    ``scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)``

    a linear rise to ``scale * (d_model * warmup_steps)**-0.5`` at ``step = warmup_steps``,
    then ``step**-0.5``. Updates count from 1 (``step = 0`` gives 0). With ``decay_steps``,
    the last ``decay_steps`` updates up to ``total_steps`` are multiplied by a factor falling
    linearly from 1 to ``1 / decay_steps`` (0 after ``total_steps``), so that a short toy run
    ends at a small rate (section "Training on the reverse task").
    """
    step = _checks.positive_int("step", step, allow_zero=True)
    d_model = _checks.positive_int("d_model", d_model)
    warmup_steps = _checks.positive_int("warmup_steps", warmup_steps)
    scale = _checks.finite_float("scale", scale, low=0.0, low_open=True)
    total_steps, decay_steps = _check_decay(total_steps, decay_steps)
    if step == 0:
        return 0.0
    lr = scale * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)
    if total_steps is not None and decay_steps:  # _check_decay: decay_steps needs total_steps
        lr *= min(1.0, max(0, total_steps - step + 1) / decay_steps)
    return lr


def noam_lambda(
    d_model: int,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    *,
    total_steps: int | None = None,
    decay_steps: int = 0,
) -> Callable[[int], float]:
    """The schedule as an ``lr_lambda`` of :class:`torch.optim.lr_scheduler.LambdaLR`.

    ``LambdaLR`` passes the number of updates done (0 before the first); with a base learning
    rate of 1, update ``k`` runs with ``noam_learning_rate(k, ...)``.
    """

    def lr_lambda(done: int) -> float:
        return noam_learning_rate(
            done + 1, d_model, warmup_steps, scale, total_steps=total_steps, decay_steps=decay_steps
        )

    lr_lambda(0)  # check the arguments now
    return lr_lambda


def make_optimizer(
    model: nn.Module,
    d_model: int | None = None,
    *,
    warmup_steps: int = 4000,
    scale: float = 1.0,
    total_steps: int | None = None,
    decay_steps: int = 0,
    betas: tuple[float, float] = ADAM_BETAS,
    eps: float = ADAM_EPS,
) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
    """Adam with the paper's constants and the warm-up schedule (section "The paper's recipe").

    Returns ``(optimizer, scheduler)``; step both once per batch (:func:`train` does). The base
    learning rate is 1 and the scheduler multiplies it by :func:`noam_learning_rate` (same
    arguments), so ``optimizer.param_groups[0]["lr"]`` is the rate of the next update.
    ``d_model`` defaults to ``model.d_model``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if d_model is None:
        d_model = getattr(model, "d_model", None)
        if not isinstance(d_model, int):
            raise ValueError(
                f"pass d_model explicitly: {type(model).__name__} has no integer d_model attribute"
            )
    lr_lambda = noam_lambda(
        d_model, warmup_steps, scale, total_steps=total_steps, decay_steps=decay_steps
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=betas, eps=eps)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


# --------------------------------------------------------------------------------------------
# Label smoothing
# --------------------------------------------------------------------------------------------


def _check_target(target: Tensor, num_classes: int, ignore_index: int | None) -> None:
    _checks.tensor("target", target, kind="int")
    kept = target if ignore_index is None else target[target != ignore_index]
    if kept.numel():
        lo, hi = (int(x) for x in torch.aminmax(kept))
        if lo < 0 or hi >= num_classes:
            raise ValueError(
                f"target ids must lie in [0, {num_classes}) (V = {num_classes}), got values in "
                f"[{lo}, {hi}]"
            )


def smoothed_targets(target: Tensor, num_classes: int, epsilon: float) -> Tensor:
    """Integer ids ``(...)`` -> label-smoothed targets ``q`` ``(..., V)`` (section "Label
    smoothing"): ``(1 - epsilon) * one_hot + epsilon / V``, PyTorch's convention (the smoothing
    mass is spread over all ``V`` classes, the true one included). Rows sum to one."""
    epsilon = _checks.probability("epsilon", epsilon)
    num_classes = _checks.positive_int("num_classes", num_classes)
    _check_target(target, num_classes, ignore_index=None)
    one_hot = torch.nn.functional.one_hot(target.long(), num_classes).float()  # (..., V)
    return (1.0 - epsilon) * one_hot + epsilon / num_classes


class LabelSmoothingLoss(nn.Module):
    """Cross-entropy against label-smoothed targets (section "Label smoothing").

    Per token ``(1 - epsilon) * (-log p_y) + epsilon * mean_v(-log p_v)``; exactly
    ``torch.nn.CrossEntropyLoss(label_smoothing=epsilon, ignore_index=ignore_index)``.
    ``"mean"`` averages over the tokens whose target is not ``ignore_index`` (NaN if there are
    none, like PyTorch), ``"none"`` gives 0 at ignored tokens. ``KL(q || p)`` (The Annotated
    Transformer) is this loss minus the constant :meth:`loss_floor`.
    """

    def __init__(
        self, epsilon: float = 0.1, ignore_index: int | None = None, reduction: str = "mean"
    ) -> None:
        super().__init__()
        self.epsilon = _checks.probability("epsilon", epsilon)
        if ignore_index is not None:
            ignore_index = _checks.as_int("ignore_index", ignore_index)
        self.ignore_index = ignore_index
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        self.reduction = reduction

    def forward(self, logits: Tensor, target: Tensor) -> Tensor:
        """``logits`` ``(..., V)`` float, ``target`` ``(...)`` integer ids (e.g. ``(B, T, V)``
        and ``(B, T)``)."""
        _checks.tensor("logits", logits, kind="float", what="(..., V)")
        _checks.tensor("target", target, kind="int", what="(...)")
        if logits.dim() < 1 or tuple(logits.shape[:-1]) != tuple(target.shape):
            raise ValueError(
                f"logits (..., V) = {tuple(logits.shape)} and target (...) = "
                f"{tuple(target.shape)} must agree on the leading dimensions"
            )
        _check_target(target, logits.shape[-1], self.ignore_index)
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
        return per_token.sum() / keep.sum()

    def loss_floor(self, num_classes: int) -> float:
        """The smallest value of the loss, the entropy ``H(q)`` of the smoothed targets
        (reached when the model predicts ``q``); 0 for ``epsilon = 0``."""
        V = _checks.positive_int("num_classes", num_classes)
        on, off = 1.0 - self.epsilon + self.epsilon / V, self.epsilon / V

        def h(p: float) -> float:
            return -p * math.log(p) if p > 0 else 0.0

        return h(on) + (V - 1) * h(off)

    def extra_repr(self) -> str:
        return f"epsilon={self.epsilon}, ignore_index={self.ignore_index}"


# --------------------------------------------------------------------------------------------
# Batches and the default loss
# --------------------------------------------------------------------------------------------


def teacher_forcing(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """``(B, T + 1)`` ids ``[BOS, y_1, ..., EOS, PAD...]`` -> ``(decoder_input, labels)``, both
    ``(B, T)``: the row without its last and without its first token (section "Training on the
    reverse task")."""
    _checks.tensor("tgt", tgt, kind="int", ndim=2, what="(B, T + 1)")
    if tgt.shape[1] < 2:
        raise ValueError(
            f"tgt must be (B, T + 1) with T + 1 >= 2 (BOS + one token), got {tuple(tgt.shape)}"
        )
    return tgt[:, :-1], tgt[:, 1:]


def _split_batch(batch: Any) -> tuple[Tensor, Tensor, Tensor]:
    """``(src, tgt)`` or ``(src, tgt_in, tgt_out)`` (a :class:`~minitransformer.data.Batch`)."""
    if not isinstance(batch, (tuple, list)) or len(batch) not in (2, 3):
        what = f"{len(batch)} items" if isinstance(batch, (tuple, list)) else type(batch).__name__
        raise ValueError(f"a batch must be (src, tgt) or (src, tgt_in, tgt_out), got {what}")
    if len(batch) == 3:
        src, tgt_in, tgt_out = batch
        _checks.tensor("tgt_in", tgt_in, kind="int", ndim=2, what="(B, T)")
        _checks.tensor("tgt_out", tgt_out, kind="int", ndim=2, what="(B, T)")
    else:
        src, tgt = batch
        tgt_in, tgt_out = teacher_forcing(tgt)
    _checks.tensor("src", src, kind="int", ndim=2, what="(B, S)")
    if tgt_in.shape != tgt_out.shape or src.shape[0] != tgt_in.shape[0]:
        raise ValueError(
            f"src (B, S) = {tuple(src.shape)}, tgt_in (B, T) = {tuple(tgt_in.shape)} and "
            f"tgt_out (B, T) = {tuple(tgt_out.shape)} must have one batch size"
        )
    if src.shape[0] == 0 or src.shape[1] == 0:
        raise ValueError(
            f"a batch needs B >= 1 rows and S >= 1 source tokens, got src {tuple(src.shape)}"
        )
    return src, tgt_in, tgt_out


def seq2seq_loss(
    model: nn.Module, batch: Any, loss_fn: nn.Module | None = None, *, pad_id: int = PAD_ID
) -> Tensor:
    """The teacher-forced loss of one batch, :func:`train`'s default ``loss``.

    ``batch`` is ``(src, tgt_in, tgt_out)`` (a :class:`~minitransformer.data.Batch`) or
    ``(src, tgt)`` split by :func:`teacher_forcing`. Computes
    ``loss_fn(model(src, tgt_in, src_mask=src != pad_id), tgt_out)``; ``loss_fn`` defaults to
    ``LabelSmoothingLoss(0.1, ignore_index=pad_id)``, the paper's.
    """
    _checks.module("model", model)
    src, tgt_in, tgt_out = _split_batch(batch)
    if loss_fn is None:
        loss_fn = LabelSmoothingLoss(0.1, ignore_index=pad_id)
    src_mask = (src != pad_id)[:, None, None, :]  # (B, 1, 1, S): hide padded source keys
    logits = model(src, tgt_in, src_mask=src_mask)  # (B, T, V); the model adds the causal mask
    return loss_fn(logits, tgt_out)


def _map_tensors(fn: Callable[[Tensor], object], batch: Any) -> Any:
    """Apply ``fn`` to every tensor in a (nested) tuple, NamedTuple, list or dict."""
    if isinstance(batch, Tensor):
        return fn(batch)
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a NamedTuple such as Batch
        return type(batch)(*(_map_tensors(fn, x) for x in batch))
    if isinstance(batch, (tuple, list)):
        return type(batch)(_map_tensors(fn, x) for x in batch)
    if isinstance(batch, dict):
        return {k: _map_tensors(fn, v) for k, v in batch.items()}
    return batch


def shard_batch(batch: Any, rank: int, world_size: int) -> Any:
    """Process ``rank``'s share of a global batch: rows ``rank * B / W`` to
    ``(rank + 1) * B / W - 1`` of every tensor in it (``W = world_size``; tuples, lists, dicts
    and :class:`~minitransformer.data.Batch` keep their type). ``B`` must split into ``W``
    equal shards (section "Scaling out": equal shards make the averaged gradient exact)."""
    world_size = _checks.positive_int("world_size", world_size)
    rank = _checks.as_int("rank", rank)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size={world_size}), got {rank}")
    sizes: set[str] = set()  # the dim-0 size of every tensor in the batch
    _map_tensors(lambda x: sizes.add(str(x.shape[0]) if x.dim() else "0-d"), batch)
    if len(sizes) != 1 or "0-d" in sizes:
        raise ValueError(
            f"every tensor of a batch needs the same batch size B on dim 0, got "
            f"{', '.join(sorted(sizes)) or 'no tensor'}"
        )
    B = int(sizes.pop())
    if B % world_size:
        raise ValueError(
            f"batch size B={B} does not split into world_size={world_size} equal shards"
        )
    n = B // world_size
    return _map_tensors(lambda x: x[rank * n : (rank + 1) * n], batch)


# --------------------------------------------------------------------------------------------
# The training loop
# --------------------------------------------------------------------------------------------


@dataclass
class TrainHistory:
    """What :func:`train` records: per update the training ``loss`` and the learning rate
    ``lr`` it used; per evaluation its step (``eval_steps``), the held-out loss
    (``eval_loss``, with ``eval_batch``) and the value of ``eval_fn`` (``eval_metric``)."""

    loss: list[float] = field(default_factory=list)
    lr: list[float] = field(default_factory=list)
    eval_steps: list[int] = field(default_factory=list)
    eval_loss: list[float] = field(default_factory=list)
    eval_metric: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def smoothed(self, window: int = 20) -> list[float]:
        """The training loss averaged over a trailing window of ``window`` updates."""
        window = _checks.positive_int("window", window)
        out, total = [], 0.0
        for i, x in enumerate(self.loss):
            total += x
            if i >= window:
                total -= self.loss[i - window]
            out.append(total / min(i + 1, window))
        return out


def _process_group() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised ``torch.distributed`` group, else ``(0, 1)``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _device_of(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (the CPU for a model without any)."""
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _batch_stream(
    batches: Iterable[Any] | Callable[[], Any], num_steps: int | None
) -> tuple[Iterable[Any], int | None]:
    """``(iterable of at most num_steps batches, their number if known)``."""
    if callable(batches):
        if num_steps is None:
            raise ValueError("batches is a function: pass num_steps (how many batches to draw)")
        return (batches() for _ in range(num_steps)), num_steps
    total = len(batches) if isinstance(batches, Sized) else None
    if num_steps is None:
        return batches, total
    total = num_steps if total is None else min(total, num_steps)
    return itertools.islice(batches, num_steps), total


def _mean_over_ranks(value: Tensor, world_size: int) -> float:
    """The mean of a scalar over all processes (the value itself on one process)."""
    value = value.detach()
    if world_size > 1:
        value = value.clone()
        dist.all_reduce(value)  # sum over ranks
        value /= world_size
    return float(value)


def train(
    model: nn.Module,
    batches: Iterable[Any] | Callable[[], Any],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    loss_fn: nn.Module | None = None,
    *,
    loss: Callable[[nn.Module, Any], Tensor] | None = None,
    num_steps: int | None = None,
    pad_id: int = PAD_ID,
    clip_grad_norm: float | None = None,
    eval_batch: Any = None,
    eval_fn: Callable[[nn.Module], float] | None = None,
    eval_every: int = 50,
    progress: bool = True,
    desc: str = "training",
) -> TrainHistory:
    """One update per batch: ``loss(model, batch)``, backward, clip, optimizer and scheduler
    step (sections "Training on the reverse task" and "Scaling out").

    Args:
        batches: an iterable of batches, or a function of no arguments that returns the next
            batch (then ``num_steps`` is required). Tensors in a batch are moved to the device
            of the model's first parameter.
        loss: ``loss(model, batch) -> scalar tensor``; default :func:`seq2seq_loss` with
            ``loss_fn`` (default ``LabelSmoothingLoss(0.1, ignore_index=pad_id)``) and
            ``pad_id``, for batches ``(src, tgt_in, tgt_out)`` or ``(src, tgt)``.
        num_steps: stop after this many updates (default: when ``batches`` runs out).
        clip_grad_norm: clip the global gradient norm (the paper does not clip).
        eval_batch, eval_fn: every ``eval_every`` updates and after the last, in eval mode and
            without gradients, record ``loss(model, eval_batch)`` and ``eval_fn(model)``.
        progress: a tqdm bar (a widget in JupyterLab, text elsewhere) labelled ``desc``.

    Under ``torchrun`` (an initialised ``torch.distributed`` process group of ``W > 1``
    processes) every process must see the same global batches; each trains on its
    :func:`shard_batch`, the model is wrapped in ``DistributedDataParallel`` (``loss``
    receives the wrapper, ``eval_fn`` the bare model), the history holds the mean loss over
    processes and only rank 0 shows progress. Returns a :class:`TrainHistory`; the model is
    left in the mode (train/eval) it was in.
    """
    _check_train_args(model, optimizer, scheduler, loss, loss_fn, eval_fn)
    if num_steps is not None:
        num_steps = _checks.positive_int("num_steps", num_steps, allow_zero=True)
    eval_every = _checks.positive_int("eval_every", eval_every)
    pad_id = _checks.as_int("pad_id", pad_id)
    if clip_grad_norm is not None:
        clip_grad_norm = _checks.finite_float(
            "clip_grad_norm", clip_grad_norm, low=0.0, low_open=True
        )
    batches, total = _batch_stream(batches, num_steps)
    if loss is None:
        if loss_fn is None:
            loss_fn = LabelSmoothingLoss(0.1, ignore_index=pad_id)

        def default_loss(net: nn.Module, batch: Any) -> Tensor:
            return seq2seq_loss(net, batch, loss_fn, pad_id=pad_id)

        loss = default_loss

    rank, world_size = _process_group()
    net = model  # what the loss calls: the model, or its DistributedDataParallel wrapper
    if isinstance(model, nn.parallel.DistributedDataParallel):
        model = model.module
    elif world_size > 1:
        net = nn.parallel.DistributedDataParallel(model)  # broadcasts rank 0's parameters
    device = _device_of(model)

    def to_device(x: Tensor) -> Tensor:
        return x.to(device)

    if eval_batch is not None:
        eval_batch = _map_tensors(to_device, eval_batch)
    was_training = model.training
    history = TrainHistory()

    def record_eval(step: int) -> None:
        if eval_batch is None and eval_fn is None:
            return
        history.eval_steps.append(step)
        model.eval()
        with torch.no_grad():
            if eval_batch is not None:
                history.eval_loss.append(float(loss(model, eval_batch)))
            if eval_fn is not None:
                history.eval_metric.append(_metric(eval_fn(model)))

    bar = tqdm(total=total, desc=desc, disable=not progress or rank != 0, mininterval=1.0)
    start = time.perf_counter()
    step = 0
    try:
        for batch in batches:
            batch = _map_tensors(to_device, batch)
            if world_size > 1:
                batch = shard_batch(batch, rank, world_size)
            model.train()
            lr = optimizer.param_groups[0]["lr"]
            mean_value = _update(
                net, model, batch, loss, optimizer, scheduler, clip_grad_norm, world_size, step + 1
            )
            step += 1
            history.loss.append(mean_value)
            history.lr.append(float(lr))
            if step % eval_every == 0:
                record_eval(step)
            bar.update(1)
            bar.set_postfix(loss=f"{mean_value:.3f}", lr=f"{lr:.2e}", refresh=False)
        if not history.eval_steps or history.eval_steps[-1] != step:
            record_eval(step)
    finally:
        bar.close()
        model.train(was_training)
    history.seconds = time.perf_counter() - start
    return history


def _check_train_args(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    loss: Callable[[nn.Module, Any], Tensor] | None,
    loss_fn: nn.Module | None,
    eval_fn: Callable[[nn.Module], float] | None,
) -> None:
    """:func:`train`'s type checks: a clear error before the first update, not in it."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(
            f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}"
        )
    if scheduler is not None and not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"scheduler must have a step() method, got {type(scheduler).__name__}")
    for name, fn in (("loss", loss), ("eval_fn", eval_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable, got {type(fn).__name__}")
    if loss is not None and loss_fn is not None:
        raise ValueError(
            "pass either loss (a function of model and batch) or loss_fn (the "
            "criterion of the default seq2seq loss), not both"
        )


def _metric(value: object) -> float:
    """``eval_fn(model)`` as a float: a number, or a tensor of one element."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real | Tensor):
        raise TypeError(f"eval_fn(model) must return a number, got {type(value).__name__}")
    if isinstance(value, Tensor) and value.numel() != 1:
        raise TypeError(
            f"eval_fn(model) must return a number, got a tensor of shape {tuple(value.shape)}"
        )
    return float(value)


def _update(
    net: nn.Module,
    model: nn.Module,
    batch: Any,
    loss: Callable[[nn.Module, Any], Tensor],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    clip_grad_norm: float | None,
    world_size: int,
    step: int,
) -> float:
    """One update of :func:`train` (its number is ``step``): loss, backward, clip, optimizer and
    scheduler step. ``net`` is what the loss calls (``model`` or its DDP wrapper). Returns the
    loss, averaged over the processes."""
    value = loss(net, batch)
    if not isinstance(value, Tensor) or value.dim() != 0:
        raise ValueError(
            f"loss(model, batch) must return a scalar tensor, got {_checks.shape_of(value)}"
        )
    mean_value = _mean_over_ranks(value, world_size)  # the same on every process
    if not math.isfinite(mean_value):
        raise ValueError(
            f"the loss of update {step} is {mean_value} (a batch whose targets are "
            "all padding, or a learning rate that diverges)"
        )
    if not value.requires_grad:
        raise ValueError(
            "loss(model, batch) returned a tensor without a gradient (requires_grad=False): "
            "compute it from the model's output, outside torch.no_grad() and without .detach()"
        )
    optimizer.zero_grad(set_to_none=True)
    value.backward()  # DDP averages the gradients over the processes here
    if clip_grad_norm is not None:
        nn.utils.clip_grad_norm_(model.parameters(), clip_grad_norm)
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return mean_value


@torch.no_grad()
def evaluate_loss(
    model: nn.Module,
    batches: Iterable[Any],
    loss_fn: nn.Module | None = None,
    pad_id: int = PAD_ID,
) -> float:
    """The mean teacher-forced loss over ``batches`` (weighted by their non-padding target
    tokens), in eval mode, without gradients, on the model's device. ``loss_fn`` defaults to
    plain cross-entropy ignoring ``pad_id``."""
    pad_id = _checks.as_int("pad_id", pad_id)
    if loss_fn is None:
        loss_fn = LabelSmoothingLoss(0.0, ignore_index=pad_id)
    _checks.module("model", model)
    device = _device_of(model)
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        for batch in batches:
            batch = _map_tensors(lambda x: x.to(device), batch)
            n = int((_split_batch(batch)[2] != pad_id).sum())
            total += float(seq2seq_loss(model, batch, loss_fn, pad_id=pad_id)) * n
            count += n
    finally:
        model.train(was_training)
    if count == 0:
        raise ValueError(
            "evaluate_loss got no non-padding target tokens (no batch, or only padding)"
        )
    return total / count


# --------------------------------------------------------------------------------------------
# Exact-match accuracy
# --------------------------------------------------------------------------------------------


def average_checkpoints(states: Iterable[dict[str, Tensor]]) -> dict[str, Tensor]:
    """The parameter-by-parameter mean of ``states`` (``model.state_dict()`` copies), as the
    paper decodes with the average of its last 5 checkpoints (section 6.1): load it with
    ``model.load_state_dict``. Sums in float64, returned in each entry's dtype; the inputs are
    not changed.

    Raises:
        ValueError: for no states, or states whose names or shapes differ (naming them).
        TypeError: for an entry that is not a floating-point tensor (an integer buffer has no
            mean).
    """
    states = list(states)
    if not states:
        raise ValueError("states must hold at least one state_dict")
    for k, state in enumerate(states):
        if not isinstance(state, dict):
            raise TypeError(
                f"states[{k}] must be a state_dict (a dict), got {type(state).__name__}"
            )
    names = list(states[0])
    for k, state in enumerate(states):
        if list(state) != names:
            missing, extra = sorted(set(names) - set(state)), sorted(set(state) - set(names))
            raise ValueError(
                f"states[{k}] has other entries than states[0]: missing {missing}, extra {extra}"
            )
    average = {}
    for name in names:
        first = states[0][name]
        for k, state in enumerate(states):
            x = state[name]
            if not (isinstance(x, Tensor) and x.is_floating_point()):
                raise TypeError(
                    f"states[{k}][{name!r}] must be a floating-point tensor, got "
                    f"{getattr(x, 'dtype', type(x).__name__)}"
                )
            if x.shape != first.shape:
                raise ValueError(
                    f"states[{k}][{name!r}] has shape {tuple(x.shape)}, states[0]'s "
                    f"{tuple(first.shape)}"
                )
        total = torch.stack([state[name].double() for state in states]).mean(0)
        average[name] = total.to(first.dtype)
    return average


def _until_eos(row: list[int], eos_id: int, pad_id: int) -> list[int]:
    """The tokens up to and including the first EOS; without an EOS, the row minus trailing pads."""
    if eos_id in row:
        return row[: row.index(eos_id) + 1]
    while row and row[-1] == pad_id:
        row = row[:-1]
    return row


def exact_match(predictions: Tensor, targets: Tensor, eos_id: int, pad_id: int = PAD_ID) -> Tensor:
    """Which rows of ``predictions`` ``(B, T')`` equal ``targets`` ``(B, T)`` as sequences:
    ``(B,)`` bool. Each row is cut after its first ``eos_id`` (a row without EOS loses its
    trailing ``pad_id``); one wrong, missing or extra token makes the row wrong."""
    _checks.tensor("predictions", predictions, kind="int", ndim=2, what="(B, T')")
    _checks.tensor("targets", targets, kind="int", ndim=2, what="(B, T)")
    eos_id, pad_id = _checks.as_int("eos_id", eos_id), _checks.as_int("pad_id", pad_id)
    if predictions.shape[0] != targets.shape[0]:
        raise ValueError(
            f"predictions (B, T') = {tuple(predictions.shape)} and targets (B, T) = "
            f"{tuple(targets.shape)} must have the same batch size"
        )
    same = [
        _until_eos(p, eos_id, pad_id) == _until_eos(t, eos_id, pad_id)
        for p, t in zip(predictions.tolist(), targets.tolist(), strict=True)
    ]
    return torch.tensor(same, dtype=torch.bool, device=predictions.device)


@torch.no_grad()
def sequence_accuracy(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    bos_id: int,
    eos_id: int,
    *,
    pad_id: int = PAD_ID,
    max_len: int | None = None,
    beam_size: int | None = None,
    batch_size: int = 512,
) -> float:
    """The share of ``src`` ``(B, S)`` whose decoded output equals ``tgt`` ``(B, T + 1)``
    = ``[BOS, y..., EOS, PAD...]`` exactly (section "Decoding the trained model").

    Greedy decoding, or beam search with ``beam_size``, in eval mode, ``batch_size`` rows at a
    time; ``max_len`` (outputs, BOS included) defaults to ``tgt.shape[1]``.
    """
    from minitransformer.decoding import beam_search, greedy_decode

    _checks.module("model", model)
    _checks.tensor("src", src, kind="int", ndim=2, what="(B, S)")
    _checks.tensor("tgt", tgt, kind="int", ndim=2, what="(B, T + 1)")
    if src.shape[0] != tgt.shape[0]:
        raise ValueError(
            f"src (B, S) = {tuple(src.shape)} and tgt (B, T + 1) = {tuple(tgt.shape)} must have "
            "the same batch size"
        )
    if src.shape[0] == 0:
        raise ValueError("sequence_accuracy needs at least one sequence, got B = 0")
    bos_id, eos_id = _checks.as_int("bos_id", bos_id), _checks.as_int("eos_id", eos_id)
    pad_id = _checks.as_int("pad_id", pad_id)
    max_len = tgt.shape[1] if max_len is None else _checks.positive_int("max_len", max_len)
    if beam_size is not None:
        beam_size = _checks.positive_int("beam_size", beam_size)
    batch_size = _checks.positive_int("batch_size", batch_size)
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for i in range(0, src.shape[0], batch_size):
            s, t = src[i : i + batch_size], tgt[i : i + batch_size]
            if beam_size is None:
                out = greedy_decode(model, s, max_len, bos_id, eos_id, pad_id=pad_id)
            else:
                out = beam_search(
                    model, s, max_len, bos_id, eos_id, beam_size=beam_size, pad_id=pad_id
                )
            correct += int(exact_match(out, t, eos_id, pad_id).sum())
    finally:
        model.train(was_training)
    return correct / src.shape[0]


# --------------------------------------------------------------------------------------------
# Calibration
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """How well a model's confidence matches its accuracy (section "Label smoothing").

    Each prediction's confidence is its largest probability; the predictions are grouped into
    ``len(counts)`` equal bins of confidence over ``[0, 1]`` (bin ``b`` holds confidences in
    ``(b / n, (b + 1) / n]``, the first bin 0 too). Per bin: ``counts`` predictions, their
    mean ``confidence`` and the share of them that were right, ``accuracy`` (NaN for an empty
    bin). ``ece`` is the expected calibration error of Guo et al. (2017),
    ``sum_b counts_b / N * |accuracy_b - confidence_b|``, and ``mean_confidence`` and
    ``mean_accuracy`` are over all ``N`` predictions. A model is over-confident where the
    confidence exceeds the accuracy, under-confident where it falls short."""

    counts: list[int]
    confidence: list[float]
    accuracy: list[float]
    ece: float
    mean_confidence: float
    mean_accuracy: float


def calibration(
    probs: Tensor, target: Tensor, num_bins: int = 10, ignore_index: int | None = None
) -> Calibration:
    """The :class:`Calibration` of predicted distributions ``probs`` ``(..., V)`` (rows of
    non-negative floats that sum to 1) against integer ids ``target`` ``(...)``; tokens whose
    target is ``ignore_index`` are left out. Computed in float64."""
    _checks.tensor("probs", probs, kind="float")
    if probs.ndim == 0:
        raise ValueError("probs must have a class dimension (..., V), got a 0-d tensor")
    num_bins = _checks.positive_int("num_bins", num_bins)
    if ignore_index is not None:
        ignore_index = _checks.as_int("ignore_index", ignore_index)
    _checks.tensor("target", target, kind="int")
    if tuple(target.shape) != tuple(probs.shape[:-1]):
        raise ValueError(
            f"target (...) = {tuple(target.shape)} must match probs (..., V) = "
            f"{tuple(probs.shape)} without its last dimension"
        )
    num_classes = probs.shape[-1]
    _check_target(target, num_classes, ignore_index)
    keep = torch.ones_like(target, dtype=torch.bool)
    if ignore_index is not None:
        keep = target != ignore_index
    p, y = probs.detach()[keep].double(), target[keep].long()  # (N, V), (N,)
    if p.shape[0] == 0:
        raise ValueError("calibration got no predictions (empty, or every target ignored)")
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()):
        raise ValueError("probs must be finite and non-negative (probabilities, not logits)")
    row_sums = p.sum(-1)
    worst = float((row_sums - 1).abs().max())
    if worst > 1e-3:
        raise ValueError(
            f"each row of probs must sum to 1, but a row sums to {1 + worst:.4g} or "
            f"{1 - worst:.4g} (pass softmax(logits), not logits)"
        )
    confidence, predicted = p.max(-1)  # (N,), (N,)
    right = (predicted == y).double()
    # bin b holds (b / n, (b + 1) / n]; a confidence of exactly 0 goes to bin 0
    bins = (torch.ceil(confidence * num_bins).long() - 1).clamp(0, num_bins - 1)
    counts = torch.bincount(bins, minlength=num_bins)
    conf_sum = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, confidence)
    right_sum = torch.zeros(num_bins, dtype=torch.float64).index_add_(0, bins, right)
    n = counts.double()
    mean_conf = torch.where(counts > 0, conf_sum / n.clamp(min=1), torch.nan)
    mean_acc = torch.where(counts > 0, right_sum / n.clamp(min=1), torch.nan)
    gaps = torch.where(counts > 0, (right_sum - conf_sum).abs(), 0.0)
    total = confidence.shape[0]
    return Calibration(
        counts=counts.tolist(),
        confidence=mean_conf.tolist(),
        accuracy=mean_acc.tolist(),
        ece=float(gaps.sum()) / total,
        mean_confidence=float(confidence.mean()),
        mean_accuracy=float(right.mean()),
    )
