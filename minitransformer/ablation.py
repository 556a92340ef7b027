"""The paper's Table 3 at toy scale: the base model, its recipe, the settings, one training run,
and the stored study (chapter "The paper's Table 3 at toy scale", ``book/ablations``).

Every setting changes one thing of the toy base model of the chapter "Training a Transformer"
(1 encoder and 1 decoder layer, ``d_model`` 64, ``h = 4`` heads of ``d_k = d_v = 16``,
``d_ff`` 128, no dropout, label smoothing 0.1) and trains it on the reverse task with that
chapter's recipe, shortened (:data:`STUDY_RECIPE`). ``scripts/table3_study.py`` trains every
setting with several seeds and writes the result file that :func:`load_study` reads; the
chapter reruns one cell of it with :func:`train_setting`, the same code.

Two settings change ``d_k`` and ``d_v`` apart, as the paper's row (B) does (``d_k`` shrinks,
``d_v`` stays). The package's attention has one ``head_dim`` for both, so
:func:`narrow_attention` restricts the heads of a fresh model instead: it keeps the
first ``key_dim`` query and key features of each head (and the first ``value_dim`` value
features), with the queries rescaled so that the scores are divided by ``sqrt(key_dim)``.
The result computes exactly what a model built with those sizes computes.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from minitransformer import _checks
from minitransformer.attention import MultiHeadAttention
from minitransformer.data import BOS_ID, EOS_ID, PAD_ID, Batch, make_batch
from minitransformer.model import Transformer, parameter_breakdown
from minitransformer.training import (
    LabelSmoothingLoss,
    evaluate_loss,
    make_optimizer,
    sequence_accuracy,
    train,
)

__all__ = [
    "BASE",
    "SETTINGS",
    "STUDY_PATH",
    "STUDY_RECIPE",
    "TASK",
    "TRAINING_RECIPE",
    "Recipe",
    "LN_WARMUP",
    "held_out",
    "layer_norm_warmup_lr",
    "load_study",
    "train_layer_norm_setting",
    "narrow_attention",
    "parameters",
    "train_setting",
]

TASK: dict[str, Any] = {
    "task": "reverse",
    "vocab_size": 13,
    "min_len": 4,
    "max_len": 8,
    "held_out_seed": 12345,
    "held_out_size": 1000,
}
"""The training chapter's task, to reverse 4 to 8 of 10 content tokens; 1000 held-out sequences."""

BASE: dict[str, Any] = {
    "num_layers": 1,
    "d_model": 64,
    "num_heads": 4,
    "d_ff": 128,
    "dropout": 0.0,
    "smoothing": 0.1,
}
"""The training chapter's model, as options of :class:`~minitransformer.model.Transformer`, and
the label smoothing of its loss."""


@dataclass(frozen=True)
class Recipe:
    """A training recipe: ``steps`` updates of ``batch_size`` fresh sequences, Adam with the
    warm-up schedule of ``warmup_steps`` times ``scale``, then a linear decay to zero over the
    remaining ``steps - warmup_steps`` updates, and the gradient norm clipped at
    ``clip_grad_norm`` (chapter "Training a Transformer", sections "The warm-up schedule" and
    "Training on the reverse task")."""

    steps: int
    batch_size: int
    warmup_steps: int
    scale: float
    clip_grad_norm: float

    @property
    def decay_steps(self) -> int:
        """The updates of the linear decay to zero, all those after the warm-up."""
        return self.steps - self.warmup_steps

    def shortened(self, steps: int, batch_size: int) -> Recipe:
        """The same warm-up, scale and clipping with fewer (or more) updates of another size."""
        return replace(self, steps=steps, batch_size=batch_size)

    def optimizer(
        self, model: nn.Module
    ) -> tuple[torch.optim.Adam, torch.optim.lr_scheduler.LambdaLR]:
        """:func:`~minitransformer.training.make_optimizer` with this recipe."""
        return make_optimizer(
            model,
            warmup_steps=self.warmup_steps,
            scale=self.scale,
            total_steps=self.steps,
            decay_steps=self.decay_steps,
        )

    def as_dict(self) -> dict[str, Any]:
        """Every field and ``decay_steps``, as the study file records them."""
        return {**asdict(self), "decay_steps": self.decay_steps}


TRAINING_RECIPE = Recipe(steps=400, batch_size=128, warmup_steps=40, scale=0.4, clip_grad_norm=1.0)
"""The recipe of the chapter "Training a Transformer", ``make_optimizer(model,
warmup_steps=40, scale=0.4, total_steps=400, decay_steps=360)``, 128 sequences a batch, the
gradient norm clipped at 1. ``tests/test_ablation.py`` checks it against that chapter."""

STUDY_RECIPE = TRAINING_RECIPE.shortened(steps=200, batch_size=64)
"""The study's budget, the training recipe shortened to 200 updates of 64 sequences (a quarter
of its sequences), with the same warm-up, scale and clipping and the decay over the last 160."""

FIXED_SIZE, FIXED_STEPS = 250, 1200
"""Row (D) on fixed data, a set of 250 sequences sampled into batches for 1200 updates."""

SETTINGS: list[tuple[str, str, dict[str, Any]]] = [
    ("base", "base", {}),
    ("A", "h=1", {"num_heads": 1}),
    ("A", "h=2", {"num_heads": 2}),
    ("A", "h=8", {"num_heads": 8}),
    ("A", "h=16", {"num_heads": 16}),
    ("B", "d_k=8", {"key_dim": 8}),
    ("B", "d_k=4", {"key_dim": 4}),
    ("B", "d_v=4", {"value_dim": 4}),
    ("B", "d_k=d_v=8", {"head_dim": 8}),
    ("B", "d_k=d_v=4", {"head_dim": 4}),
    ("C", "N=2", {"num_layers": 2}),
    ("C", "N=3", {"num_layers": 3}),
    ("C", "d_model=32", {"d_model": 32}),
    ("C", "d_model=128", {"d_model": 128}),
    ("C", "d_ff=64", {"d_ff": 64}),
    ("C", "d_ff=256", {"d_ff": 256}),
    ("D", "P_drop=0.1", {"dropout": 0.1}),
    ("D", "P_drop=0.3", {"dropout": 0.3}),
    ("D", "eps_ls=0", {"smoothing": 0.0}),
    ("D fixed", "base", {"fixed": True}),
    ("D fixed", "P_drop=0.1", {"dropout": 0.1, "fixed": True}),
    ("D fixed", "P_drop=0.3", {"dropout": 0.3, "fixed": True}),
    ("D fixed", "eps_ls=0", {"smoothing": 0.0, "fixed": True}),
]
"""``(row, label, changes)``, one letter per row of the paper's Table 3. ``changes`` are options
of the base (``key_dim`` and ``value_dim`` narrow the heads with :func:`narrow_attention`;
``fixed`` trains on a fixed set of ``FIXED_SIZE`` sequences for ``FIXED_STEPS``
updates). Row (B) shrinks ``d_k`` alone, as the paper does, ``d_v`` alone, and both."""

STUDY_PATH = "studies/table3.json"
"""Where the study file lies inside the package (``scripts/table3_study.py`` writes it)."""

_CHANGES = {"num_layers", "d_model", "num_heads", "d_ff", "dropout", "smoothing", "head_dim"}
_CHANGES |= {"key_dim", "value_dim", "fixed", "norm_first"}


def _row_scales(mha: MultiHeadAttention, key_dim: int, value_dim: int) -> Tensor:
    """One factor per row of ``in_proj_weight`` ``[W^Q; W^K; W^V]``, in float64: 0 for the
    dropped features, ``sqrt(d_k / key_dim)`` for the kept query features, 1 otherwise."""
    h, h_kv, d_k = mha.num_heads, mha.num_kv_heads, mha.d_k
    feature = torch.arange(d_k)  # the row's feature within its head
    keep_qk = (feature < key_dim).to(torch.float64)
    keep_v = (feature < value_dim).to(torch.float64)
    q = keep_qk.repeat(h) * math.sqrt(d_k / key_dim)  # (h d_k,): rows are head-major
    return torch.cat([q, keep_qk.repeat(h_kv), keep_v.repeat(h_kv)])


class _RowScale(nn.Module):
    """A fixed factor per row of a weight ``(rows, d_model)`` or bias ``(rows,)``: the
    parametrisation :func:`narrow_attention` registers, for heads of ``key_dim`` query and
    key features and ``value_dim`` value features."""

    scale: Tensor

    def __init__(self, scale: Tensor, key_dim: int, value_dim: int) -> None:
        super().__init__()
        self.register_buffer("scale", scale)
        self.key_dim, self.value_dim = key_dim, value_dim

    def forward(self, x: Tensor) -> Tensor:
        return x * (self.scale[:, None] if x.dim() == 2 else self.scale)


def narrow_attention(
    model: nn.Module, *, key_dim: int | None = None, value_dim: int | None = None
) -> nn.Module:
    """Give every attention layer of ``model`` heads with ``d_k = key_dim`` and
    ``d_v = value_dim`` features (default: the layer's ``head_dim``); returns ``model``.

    Section "Rows (A) and (B): heads and key size" of the chapter "The paper's Table 3 at toy
    scale". Each
    layer keeps its shapes (``head_dim`` features per head) but multiplies the rows of
    ``in_proj_weight`` and ``in_proj_bias`` by fixed factors (a
    :mod:`torch.nn.utils.parametrize` parametrisation): 0 for query and key features from
    ``key_dim`` on and value features from ``value_dim`` on, and ``sqrt(head_dim / key_dim)``
    for the kept query features. The dropped features are then zero in every query, key and
    value, and ``(q * sqrt(head_dim / key_dim)) . k / sqrt(head_dim) = q . k / sqrt(key_dim)``:
    the layer computes what one built with ``key_dim`` and ``value_dim`` computes, and the
    gradients of the kept weights are the same too (those of the dropped ones are zero, so
    Adam never moves them). Call it before building the optimizer; :func:`parameters` counts
    only the weights that matter.
    """
    _checks.module("model", model)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    if not layers:
        raise ValueError(f"model has no MultiHeadAttention layer: {type(model).__name__}")
    sizes = []  # every layer is checked before any is changed
    for mha in layers:
        if parametrize.is_parametrized(mha):
            raise ValueError("model's attention is narrowed already: narrow a fresh model")
        if mha.rotary:
            raise ValueError("narrow_attention does not handle rotary=True (it mixes features)")
        d_k = mha.d_k
        k = d_k if key_dim is None else _checks.positive_int("key_dim", key_dim)
        v = d_k if value_dim is None else _checks.positive_int("value_dim", value_dim)
        if k > d_k or v > d_k:
            raise ValueError(
                f"key_dim={k} and value_dim={v} must be at most the layer's head_dim={d_k}"
            )
        sizes.append((k, v))
    for mha, (k, v) in zip(layers, sizes, strict=True):
        weight = mha.in_proj_weight
        scale = _row_scales(mha, k, v).to(device=weight.device, dtype=weight.dtype)
        parametrize.register_parametrization(mha, "in_proj_weight", _RowScale(scale, k, v))
        if mha.in_proj_bias is not None:
            parametrize.register_parametrization(
                mha, "in_proj_bias", _RowScale(scale.clone(), k, v)
            )
    return model


def _dead_weights(mha: MultiHeadAttention) -> int:
    """The weights of a narrowed layer that never matter: the rows of the dropped query, key
    and value features (with their biases), and the columns of ``W^O`` that read the dropped
    value features. Counted from the sizes, so it works on the ``meta`` device."""
    if not parametrize.is_parametrized(mha, "in_proj_weight"):
        return 0
    parametrizations = cast(nn.ModuleDict, mha.parametrizations)
    narrowed = cast(nn.ModuleList, parametrizations["in_proj_weight"])[0]
    if not isinstance(narrowed, _RowScale):  # another parametrisation drops nothing
        return 0
    h, h_kv, d_k = mha.num_heads, mha.num_kv_heads, mha.d_k
    qk_rows = (h + h_kv) * (d_k - narrowed.key_dim)
    v_rows = h_kv * (d_k - narrowed.value_dim)
    per_row = mha.d_model + (mha.in_proj_bias is not None)
    return (qk_rows + v_rows) * per_row + h * (d_k - narrowed.value_dim) * mha.d_model


def _check_changes(changes: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(changes, Mapping):
        raise TypeError(f"changes must be a dict of options, got {type(changes).__name__}")
    unknown = sorted(set(changes) - _CHANGES)
    if unknown:
        raise ValueError(f"changes has unknown options {unknown}; known: {sorted(_CHANGES)}")
    return dict(changes)


def _build(changes: Mapping[str, Any]) -> tuple[Transformer, float]:
    """The base model with ``changes`` (in the current default device), and its smoothing."""
    config = {**BASE, **_check_changes(changes)}
    smoothing = config.pop("smoothing")
    key_dim, value_dim = config.pop("key_dim", None), config.pop("value_dim", None)
    config.pop("fixed", None)
    vocab, max_len = TASK["vocab_size"], TASK["max_len"]
    model = Transformer(vocab, vocab, max_len=max_len + 2, **config)  # BOS + y + EOS
    if key_dim is not None or value_dim is not None:
        narrow_attention(model, key_dim=key_dim, value_dim=value_dim)
    return model, smoothing


def parameters(changes: Mapping[str, Any]) -> int:
    """The number of parameters that matter in the base model with ``changes``: those of a model
    built with these sizes (counted on the ``meta`` device, without memory; the weights that
    :func:`narrow_attention` drops are not counted)."""
    with torch.device("meta"):
        model, _ = _build(changes)
    dead = sum(_dead_weights(m) for m in model.modules() if isinstance(m, MultiHeadAttention))
    return parameter_breakdown(model)["total"] - dead


def held_out() -> Batch:
    """The 1000 held-out sequences of the training chapter (seed 12345)."""
    return make_batch(
        TASK["task"],
        TASK["held_out_size"],
        TASK["min_len"],
        TASK["max_len"],
        TASK["vocab_size"],
        torch.Generator().manual_seed(TASK["held_out_seed"]),
    )


def train_setting(
    changes: Mapping[str, Any], seed: int, *, recipe: Recipe = STUDY_RECIPE
) -> dict[str, float]:
    """Train the base model with ``changes`` on ``recipe`` and measure it: one cell of the study.

    Section "Rows (A) to (D) at toy scale". ``seed`` fixes the initial weights and the training
    data, so every setting of one seed sees the same batches. With ``"fixed": True`` in
    ``changes``, the batches are drawn (with replacement) from one set of ``FIXED_SIZE``
    sequences for ``FIXED_STEPS`` updates (same warm-up, scale and clipping).

    Returns ``loss`` (plain cross-entropy per target token on :func:`held_out`, in eval mode,
    without smoothing, so that every setting is measured alike), ``acc`` (greedy exact match on
    the same sequences), ``cpu_seconds`` (CPU time of the training and the measurement) and,
    for a fixed set, ``train_loss`` and ``train_acc`` on that set.
    """
    seed = _checks.as_int("seed", seed)
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe, got {type(recipe).__name__}")
    changes = _check_changes(changes)
    fixed = bool(changes.get("fixed", False))
    if fixed:
        recipe = recipe.shortened(FIXED_STEPS, recipe.batch_size)
    start = time.process_time()
    task = TASK["task"], TASK["min_len"], TASK["max_len"], TASK["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    data = make_batch(task[0], FIXED_SIZE, *task[1:], gen) if fixed else None

    def next_batch() -> Batch:
        if data is None:
            return make_batch(task[0], recipe.batch_size, *task[1:], gen)
        rows = torch.randint(0, FIXED_SIZE, (recipe.batch_size,), generator=gen)
        return Batch(data.src[rows], data.tgt_in[rows], data.tgt_out[rows])

    torch.manual_seed(seed)
    model, smoothing = _build(changes)
    optimizer, scheduler = recipe.optimizer(model)
    train(
        model,
        next_batch,
        optimizer,
        scheduler,
        LabelSmoothingLoss(smoothing, ignore_index=PAD_ID),
        num_steps=recipe.steps,
        clip_grad_norm=recipe.clip_grad_norm,
        progress=False,
    )
    test = held_out()
    result = {
        "loss": evaluate_loss(model, [test]),
        "acc": sequence_accuracy(model, test.src, test.tgt, BOS_ID, EOS_ID),
    }
    if data is not None:
        result["train_loss"] = evaluate_loss(model, [data])
        result["train_acc"] = sequence_accuracy(model, data.src, data.tgt, BOS_ID, EOS_ID)
    result["cpu_seconds"] = time.process_time() - start
    return result


LN_WARMUP: dict[str, Any] = {
    "num_layers": 2,
    "peak_lr": 1e-2,
    "warmup_steps": 40,
    "steps": 200,
    "batch_size": 64,
}
"""The set-up that compares post-LN with pre-LN, each with and without warm-up, in the
ablations chapter's section "Beyond Table 3". The base model with 2 + 2 layers, no label
smoothing and no gradient clipping, Adam with the paper's betas (0.9, 0.98) and eps 1e-9, a peak
learning rate of 1e-2 reached after 40 updates (or from the first, without warm-up), then a
linear decay to zero at update 200, batches of 64 fresh sequences."""


def layer_norm_warmup_lr(step: int, *, warmup: bool) -> float:
    """The learning rate of update ``step`` (from 1) in :data:`LN_WARMUP`: with ``warmup`` a
    linear ramp to the peak over the first ``warmup_steps``, without it the peak from the first
    update; after the warm-up both decay linearly to zero at ``steps``. The two schedules
    differ only in the first ``warmup_steps`` updates."""
    step = _checks.positive_int("step", step)
    if not isinstance(warmup, bool):
        raise TypeError(f"warmup must be a bool, got {warmup!r}")
    peak, w, steps = LN_WARMUP["peak_lr"], LN_WARMUP["warmup_steps"], LN_WARMUP["steps"]
    if step <= w:
        return peak * step / w if warmup else peak
    return peak * max(0.0, (steps - step + 1) / (steps - w))


def train_layer_norm_setting(*, norm_first: bool, warmup: bool, seed: int) -> dict[str, float]:
    """Train the model of :data:`LN_WARMUP`, post-LN (``norm_first=False``, the paper) or
    pre-LN, with or without warm-up, and measure it on :func:`held_out` as
    :func:`train_setting` does: ``loss`` (cross-entropy per target token; chance is about
    ``log 11`` = 2.4, the content tokens and EOS), ``acc`` (greedy exact match),
    ``cpu_seconds``. ``seed`` fixes the weights and the batches."""
    if not isinstance(norm_first, bool) or not isinstance(warmup, bool):
        raise TypeError(f"norm_first and warmup must be bools, got {norm_first!r} and {warmup!r}")
    seed = _checks.as_int("seed", seed)
    start = time.process_time()
    torch.manual_seed(seed)
    changes = {"num_layers": LN_WARMUP["num_layers"], "smoothing": 0.0, "norm_first": norm_first}
    model, _ = _build(changes)  # pre-LN: with the final LayerNorms of encoder and decoder
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9
    )  # lr 1: the schedule gives the rate itself
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda done: layer_norm_warmup_lr(done + 1, warmup=warmup)
    )
    gen = torch.Generator().manual_seed(seed)
    task = TASK["task"], TASK["min_len"], TASK["max_len"], TASK["vocab_size"]
    train(
        model,
        lambda: make_batch(task[0], LN_WARMUP["batch_size"], *task[1:], gen),
        optimizer,
        scheduler,
        LabelSmoothingLoss(0.0, ignore_index=PAD_ID),
        num_steps=LN_WARMUP["steps"],
        progress=False,
    )
    test = held_out()
    return {
        "loss": evaluate_loss(model, [test]),
        "acc": sequence_accuracy(model, test.src, test.tgt, BOS_ID, EOS_ID),
        "cpu_seconds": time.process_time() - start,
    }


def load_study(path: str | Path | None = None) -> dict[str, Any]:
    """The study file that ``scripts/table3_study.py`` wrote: by default the one shipped in the
    package (:data:`STUDY_PATH`, read with ``importlib.resources``, so it is found from any
    working directory and in an installed package), else the JSON file at ``path``.

    Raises ``ValueError`` if the file was computed with another task, base model or recipe
    than this module's (:data:`TASK`, :data:`BASE`, :data:`STUDY_RECIPE`, the fixed set), or
    with settings other than :data:`SETTINGS`: then the file and :func:`train_setting` would
    compute different things.
    """
    if path is None:
        text = resources.files("minitransformer").joinpath(STUDY_PATH).read_text()
    else:
        text = Path(path).read_text()
    study: dict[str, Any] = json.loads(text)
    expected = {
        "task": TASK,
        "base": BASE,
        "recipe": STUDY_RECIPE.as_dict(),
        "fixed": {"size": FIXED_SIZE, "steps": FIXED_STEPS},
    }
    for key, want in expected.items():
        if study.get(key) != want:
            raise ValueError(
                f"the study file's {key} is {study.get(key)!r}, but train_setting uses {want!r}: "
                "rerun scripts/table3_study.py"
            )
    stored = [(s["row"], s["label"], s["changes"]) for s in study["settings"]]
    if stored != [(r, label, dict(c)) for r, label, c in SETTINGS]:
        raise ValueError(
            "the study file's settings differ from ablation.SETTINGS: rerun scripts/table3_study.py"
        )
    return study
