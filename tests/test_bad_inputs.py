"""Bad input gets a clear error: every public callable, driven with wrong kinds, sizes and shapes.

CONTRIBUTING.md ("Conventions of the package API"): a wrong *kind* of argument (not a tensor,
not an int, a float tensor of token ids, a non-boolean mask) raises ``TypeError``; a right
kind with a wrong value (a size that is not positive, a NaN or infinite parameter, a
probability outside ``[0, 1)``, a shape that does not fit the documented one) raises
``ValueError``; and the message names the argument. Never a silent NaN, never a wrong answer,
never an error from inside torch.

Each :class:`Spec` below gives a callable, a function that builds valid arguments for it, and
the category of each argument. Hypothesis draws a callable, one of its arguments and a bad
value for that argument's category (sizes and shapes drawn too), calls it with the others
valid, and checks the exception's type and that its message names the argument.
``test_every_public_callable_has_a_spec`` keeps the table complete: a new public function
without a spec (or a stated reason to have none) fails it.
"""

from __future__ import annotations

import datetime
import functools
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import matplotlib
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

matplotlib.use("Agg")

from minitransformer import (  # noqa: E402
    attention,
    data,
    decoding,
    flash,
    gpt2,
    kv_cache,
    kv_memory,
    lm,
    model,
    paged,
    plotting,
    positional,
    quantize,
    tokenizer,
    training,
    translation,
)

# -- the bad values of each category, and the error each must raise -------------------------

NOT_A_TENSOR = [[[1.0, 2.0]], 3.0, "x", None]


def bad_values(category: str, draw) -> tuple[Any, type[Exception]]:
    """One bad value for an argument of ``category``, and the exception it must raise.

    A category ending in "?" marks an optional argument: None is valid there."""
    optional = category.endswith("?")
    category = category.rstrip("?")
    while True:
        value, expected = _bad_value(category, draw)
        if not (optional and value is None):
            return value, expected


def _bad_value(category: str, draw) -> tuple[Any, type[Exception]]:
    if category in ("size", "count"):
        low = 1 if category == "size" else 0
        return draw(
            st.one_of(
                st.tuples(st.integers(-(10**6), low - 1), st.just(ValueError)),
                st.tuples(st.sampled_from([1.5, 2.0, "4", True, None]), st.just(TypeError)),
            )
        )
    if category == "probability":
        return draw(
            st.one_of(
                st.tuples(
                    st.sampled_from([-0.5, 1.0, 1.5, math.nan, math.inf]), st.just(ValueError)
                ),
                st.tuples(st.sampled_from(["0.1", None]), st.just(TypeError)),
            )
        )
    if category == "positive_real":
        return draw(
            st.one_of(
                st.tuples(
                    st.sampled_from([0.0, -1.0, math.nan, math.inf, -math.inf]), st.just(ValueError)
                ),
                st.tuples(st.sampled_from(["2", None]), st.just(TypeError)),
            )
        )
    if category == "top_p":  # (0, 1]
        return draw(
            st.one_of(
                st.tuples(
                    st.sampled_from([0.0, -0.5, 1.5, math.nan, math.inf]), st.just(ValueError)
                ),
                st.tuples(st.sampled_from(["0.9", None, True]), st.just(TypeError)),
            )
        )
    if category == "nonneg_real":
        return draw(
            st.one_of(
                st.tuples(st.sampled_from([-1.0, math.nan, math.inf]), st.just(ValueError)),
                st.tuples(st.sampled_from(["2", None]), st.just(TypeError)),
            )
        )
    if category == "real":  # any finite number
        return draw(
            st.one_of(
                st.tuples(st.sampled_from([math.nan, math.inf, -math.inf]), st.just(ValueError)),
                st.tuples(st.sampled_from(["2", None]), st.just(TypeError)),
            )
        )
    if category == "tensor":  # any dtype
        return draw(st.sampled_from(NOT_A_TENSOR)), TypeError
    if category == "float_tensor":
        return draw(
            st.one_of(
                st.tuples(st.sampled_from(NOT_A_TENSOR), st.just(TypeError)),
                st.tuples(
                    st.sampled_from(
                        [
                            torch.ones(2, 3, 4, dtype=torch.long),
                            torch.ones(2, 3, 4, dtype=torch.bool),
                        ]
                    ),
                    st.just(TypeError),
                ),
            )
        )
    if category == "int_tensor":
        return draw(
            st.one_of(
                st.tuples(st.sampled_from(NOT_A_TENSOR), st.just(TypeError)),
                st.tuples(
                    st.sampled_from([torch.ones(2, 5), torch.ones(2, 5, dtype=torch.bool)]),
                    st.just(TypeError),
                ),
            )
        )
    if category == "mask":
        return draw(
            st.one_of(
                st.tuples(st.sampled_from([[[True]], 1.0, "x"]), st.just(TypeError)),
                st.tuples(
                    st.sampled_from(
                        [torch.ones(1, 1, 1, 1), torch.ones(1, 1, 1, 1, dtype=torch.long)]
                    ),
                    st.just(TypeError),
                ),
            )
        )
    if category == "text":
        return draw(st.sampled_from([b"bytes", 3, None])), TypeError
    if category == "module":
        return draw(st.sampled_from([None, "model", 3, torch.zeros(2)])), TypeError
    raise AssertionError(f"unknown category {category}")


@dataclass
class Spec:
    """A public callable, how to build valid arguments, and each argument's category.

    ``shapes`` lists, per tensor argument, builders of a wrongly *shaped* (or wrongly valued)
    tensor, given the valid arguments: each must raise ``ValueError`` naming the argument.
    """

    name: str
    fn: Callable[..., Any]
    valid: Callable[[], dict[str, Any]]
    args: dict[str, str]
    shapes: dict[str, list[Callable[[dict], Any]]] = field(default_factory=dict)


# -- a small model for the callables that need one ------------------------------------------

V, D, H, FF = 13, 16, 2, 32


@functools.cache
def _tiny_gpt2_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=V, n_embd=8, n_head=2, n_layer=1, n_positions=8)
    return transformers.GPT2LMHeadModel(config).state_dict(), config.to_dict()


def _tiny_gpt2() -> dict[str, Any]:
    """``from_hf_gpt2``'s valid arguments: a tiny random GPT-2's state_dict and config."""
    state, config = _tiny_gpt2_state()
    return {"source": state, "config": dict(config)}


def small_model() -> model.Transformer:
    torch.manual_seed(0)
    return model.Transformer(
        V, V, d_model=D, num_heads=H, num_layers=1, d_ff=FF, dropout=0.0, max_len=12
    ).eval()


MODEL = small_model()
# A translator that trains in a fraction of a second.
TINY_RECIPE = translation.TranslatorRecipe(
    steps=2,
    batch_size=3,
    vocab_size=262,
    bpe_pairs=6,
    d_model=8,
    num_heads=2,
    d_ff=16,
    num_layers=1,
    checkpoints=2,
    checkpoint_every=1,
    valid_pairs=3,
)
LM = lm.DecoderOnlyTransformer(
    V, d_model=D, num_heads=H, num_layers=1, d_ff=FF, max_len=12, dropout=0.0
).eval()
MHA = attention.MultiHeadAttention(D, H).eval()


def ids(B: int = 2, L: int = 5) -> torch.Tensor:
    return torch.randint(3, V, (B, L), generator=torch.Generator().manual_seed(L))


def qkv() -> dict[str, Any]:
    g = torch.Generator().manual_seed(0)
    return dict(
        query=torch.randn(2, 3, 4, generator=g),
        key=torch.randn(2, 5, 4, generator=g),
        value=torch.randn(2, 5, 6, generator=g),
    )


def with_(key: str, shape: tuple[int, ...], dtype=torch.float32):
    """A builder replacing ``key`` by a tensor of ``shape``."""
    return lambda kw: torch.ones(shape, dtype=dtype)


def a_batch() -> data.Batch:
    return data.make_batch("reverse", 4, 2, 4, V, torch.Generator().manual_seed(0))


def new_ax():
    fig, ax = plotting.figure()
    return ax


SPECS: list[Spec] = [
    # attention
    Spec(
        "attention.scaled_dot_product_attention",
        attention.scaled_dot_product_attention,
        lambda: {**qkv(), "mask": torch.ones(2, 3, 5, dtype=torch.bool)},
        {
            "query": "float_tensor",
            "key": "float_tensor",
            "value": "float_tensor",
            "mask": "mask",
            "dropout_p": "probability",
        },
        {
            "key": [with_("key", (2, 5, 3))],
            "value": [with_("value", (2, 4, 6))],
            "mask": [with_("mask", (2, 5, 3), torch.bool), with_("mask", (7, 2, 3, 5), torch.bool)],
        },
    ),
    Spec(
        "attention.additive_attention",
        attention.additive_attention,
        lambda: {
            **qkv(),
            "w_query": torch.ones(4, 3),
            "w_key": torch.ones(4, 3),
            "w_score": torch.ones(3),
            "mask": torch.ones(2, 3, 5, dtype=torch.bool),
        },
        {
            "query": "float_tensor",
            "key": "float_tensor",
            "value": "float_tensor",
            "w_query": "float_tensor",
            "w_key": "float_tensor",
            "w_score": "float_tensor",
            "mask": "mask",
        },
        {
            "value": [with_("value", (2, 4, 6))],
            "w_query": [with_("w_query", (5, 3))],
            "w_score": [with_("w_score", (3, 1))],
            "mask": [with_("mask", (7, 2, 3, 5), torch.bool)],
        },
    ),
    Spec(
        "attention.AdditiveAttention",
        attention.AdditiveAttention,
        lambda: {"query_dim": 4, "key_dim": 6, "hidden_dim": 3},
        {"query_dim": "size", "key_dim": "size", "hidden_dim": "size"},
    ),
    Spec(
        "attention.check_qkv",
        attention.check_qkv,
        qkv,
        {"query": "float_tensor", "key": "float_tensor", "value": "float_tensor"},
        {"query": [with_("query", (4,))], "value": [with_("value", (3, 5, 6))]},
    ),
    Spec("attention.causal_mask", attention.causal_mask, lambda: {"size": 4}, {"size": "count"}),
    Spec(
        "attention.padding_mask",
        attention.padding_mask,
        lambda: {"lengths": torch.tensor([3, 1]), "max_len": 4},
        {"lengths": "int_tensor", "max_len": "count"},
        {"lengths": [lambda kw: torch.tensor([5, 1]), lambda kw: torch.tensor([[1]])]},
    ),
    Spec(
        "attention.split_heads",
        attention.split_heads,
        lambda: {"x": torch.ones(2, 3, 8), "num_heads": 2},
        {"x": "tensor", "num_heads": "size"},
        {"x": [with_("x", (2, 8))], "num_heads": [lambda kw: 3]},
    ),
    Spec(
        "attention.merge_heads",
        attention.merge_heads,
        lambda: {"x": torch.ones(2, 2, 3, 4)},
        {"x": "tensor"},
        {"x": [with_("x", (2, 3, 4))]},
    ),
    Spec(
        "attention.MultiHeadAttention",
        attention.MultiHeadAttention,
        lambda: {"d_model": 8, "num_heads": 2, "dropout": 0.1, "num_kv_heads": 1, "head_dim": 4},
        {
            "d_model": "size",
            "num_heads": "size",
            "dropout": "probability",
            "num_kv_heads": "size?",
            "head_dim": "size?",
        },
        {"num_kv_heads": [lambda kw: 3]},
    ),
    Spec(
        "MultiHeadAttention.forward",
        lambda **kw: MHA(**kw),
        lambda: {
            "query": torch.ones(2, 3, D),
            "key": torch.ones(2, 5, D),
            "value": torch.ones(2, 5, D),
            "mask": torch.ones(2, 1, 3, 5, dtype=torch.bool),
        },
        {"query": "float_tensor", "key": "float_tensor", "value": "float_tensor", "mask": "mask"},
        {
            "query": [with_("query", (2, 3, D + 1))],
            "key": [with_("key", (3, 5, D))],
            "mask": [with_("mask", (2, 3, 5), torch.bool)],
        },
    ),
    Spec(
        "attention.attention_parameter_count",
        attention.attention_parameter_count,
        lambda: {"d_model": 8, "num_heads": 2, "num_kv_heads": 1, "head_dim": 4},
        {"d_model": "size", "num_heads": "size", "num_kv_heads": "size?", "head_dim": "size?"},
    ),
    Spec(
        "attention.attention_flops",
        attention.attention_flops,
        lambda: {"T": 3, "S": 5, "d_model": 8, "num_heads": 2},
        {"T": "count", "S": "count", "d_model": "size", "num_heads": "size"},
    ),
    Spec(
        "attention.check_mask",
        attention.check_mask,
        lambda: {
            "name": "src_mask",
            "mask": torch.ones(2, 1, 1, 5, dtype=torch.bool),
            "shape": (2, 2, 3, 5),
        },
        {"mask": "mask"},
        {"mask": [with_("mask", (5, 1, 1, 2), torch.bool)]},
    ),
    # positional
    Spec(
        "positional.angular_frequencies",
        positional.angular_frequencies,
        lambda: {"d_model": 8, "base": 100.0},
        {"d_model": "size", "base": "positive_real"},
        {"d_model": [lambda kw: 7], "base": [lambda kw: 1.0]},
    ),
    Spec(
        "positional.wavelengths",
        positional.wavelengths,
        lambda: {"d_model": 8, "base": 100.0},
        {"d_model": "size", "base": "positive_real"},
        {"d_model": [lambda kw: 5]},
    ),
    Spec(
        "positional.sinusoidal_encoding",
        positional.sinusoidal_encoding,
        lambda: {"num_positions": 6, "d_model": 8, "base": 100.0},
        {"num_positions": "count", "d_model": "size", "base": "positive_real"},
        {"d_model": [lambda kw: 3], "base": [lambda kw: 0.5]},
    ),
    Spec(
        "positional.shift_matrix",
        positional.shift_matrix,
        lambda: {"offset": 2, "d_model": 8},
        {"offset": "real", "d_model": "size"},
        {"d_model": [lambda kw: 9]},
    ),
    Spec(
        "positional.PositionalEncoding",
        positional.PositionalEncoding,
        lambda: {"d_model": 8, "max_len": 10, "dropout": 0.1, "base": 100.0},
        {"d_model": "size", "max_len": "size", "dropout": "probability", "base": "positive_real"},
    ),
    Spec(
        "positional.LearnedPositionalEmbedding",
        positional.LearnedPositionalEmbedding,
        lambda: {"d_model": 8, "max_len": 10, "dropout": 0.1, "init_std": 1.0},
        {"d_model": "size", "max_len": "size", "dropout": "probability", "init_std": "nonneg_real"},
    ),
    Spec(
        "positional.rotary_embedding",
        positional.rotary_embedding,
        lambda: {"x": torch.ones(2, 5, 8), "positions": torch.arange(5), "base": 100.0},
        {"x": "float_tensor", "positions": "int_tensor?", "base": "positive_real"},
        {"x": [with_("x", (2, 5, 7))], "positions": [lambda kw: torch.arange(4)]},
    ),
    # model
    Spec(
        "model.FeedForward",
        model.FeedForward,
        lambda: {"d_model": 8, "d_ff": 16, "dropout": 0.1},
        {"d_model": "size", "d_ff": "size", "dropout": "probability"},
        {"activation": [lambda kw: "swish"]},
    ),
    Spec(
        "model.EncoderLayer",
        model.EncoderLayer,
        lambda: {"d_model": 8, "num_heads": 2, "d_ff": 16, "dropout": 0.1},
        {"d_model": "size", "num_heads": "size", "d_ff": "size", "dropout": "probability"},
        {"num_heads": [lambda kw: 3]},
    ),
    Spec(
        "model.DecoderLayer",
        model.DecoderLayer,
        lambda: {"d_model": 8, "num_heads": 2, "d_ff": 16, "dropout": 0.1},
        {"d_model": "size", "num_heads": "size", "d_ff": "size", "dropout": "probability"},
    ),
    Spec(
        "model.Encoder",
        model.Encoder,
        lambda: {"num_layers": 1, "d_model": 8, "num_heads": 2, "d_ff": 16},
        {"num_layers": "size", "d_model": "size", "num_heads": "size", "d_ff": "size"},
    ),
    Spec(
        "model.Decoder",
        model.Decoder,
        lambda: {"num_layers": 1, "d_model": 8, "num_heads": 2, "d_ff": 16},
        {"num_layers": "size", "d_model": "size", "num_heads": "size", "d_ff": "size"},
    ),
    Spec(
        "model.Transformer",
        model.Transformer,
        lambda: {
            "src_vocab_size": 7,
            "tgt_vocab_size": 7,
            "d_model": 8,
            "num_heads": 2,
            "num_layers": 1,
            "d_ff": 16,
            "dropout": 0.1,
            "max_len": 10,
        },
        {
            "src_vocab_size": "size",
            "tgt_vocab_size": "size",
            "d_model": "size",
            "num_heads": "size",
            "num_layers": "size",
            "d_ff": "size",
            "dropout": "probability",
            "max_len": "size",
        },
    ),
    Spec(
        "Transformer.encode",
        MODEL.encode,
        lambda: {"src": ids(), "src_mask": torch.ones(2, 1, 1, 5, dtype=torch.bool)},
        {"src": "int_tensor", "src_mask": "mask"},
        {
            "src": [
                lambda kw: ids(2, 13),
                lambda kw: torch.full((2, 5), V),
                with_("src", (2, 5, 1), torch.long),
            ],
            "src_mask": [
                with_("src_mask", (2, 5), torch.bool),
                with_("src_mask", (3, 1, 1, 5), torch.bool),
            ],
        },
    ),
    Spec(
        "Transformer.decode",
        MODEL.decode,
        lambda: {
            "tgt": ids(2, 4),
            "memory": torch.ones(2, 5, D),
            "src_mask": torch.ones(2, 1, 1, 5, dtype=torch.bool),
        },
        {"tgt": "int_tensor", "memory": "float_tensor", "src_mask": "mask"},
        {
            "memory": [with_("memory", (2, 5, D + 2)), with_("memory", (3, 5, D))],
            "src_mask": [with_("src_mask", (2, 1, 1, 4), torch.bool)],
        },
    ),
    Spec(
        "Transformer.forward",
        lambda **kw: MODEL(**kw),
        lambda: {
            "src": ids(),
            "tgt": ids(2, 4),
            "src_mask": torch.ones(2, 1, 1, 5, dtype=torch.bool),
            "tgt_mask": torch.ones(4, 4, dtype=torch.bool),
        },
        {"src": "int_tensor", "tgt": "int_tensor", "src_mask": "mask", "tgt_mask": "mask"},
        {"tgt": [lambda kw: ids(3, 4)], "tgt_mask": [with_("tgt_mask", (5, 5), torch.bool)]},
    ),
    Spec(
        "model.parameter_breakdown",
        model.parameter_breakdown,
        lambda: {"model": MODEL},
        {"model": "module"},
    ),
    # data
    Spec(
        "data.apply_task",
        data.apply_task,
        lambda: {"task": "reverse", "tokens": ids()[0]},
        {"task": "text", "tokens": "int_tensor"},
        {"task": [lambda kw: "rotate"]},
    ),
    Spec(
        "data.make_batch",
        data.make_batch,
        lambda: {
            "task": "copy",
            "batch_size": 2,
            "min_len": 1,
            "max_len": 4,
            "vocab_size": V,
            "generator": torch.Generator().manual_seed(0),
        },
        {
            "task": "text",
            "batch_size": "size",
            "min_len": "size",
            "max_len": "size",
            "vocab_size": "size",
        },
        {"max_len": [lambda kw: 0], "vocab_size": [lambda kw: 3]},
    ),
    Spec(
        "data.src_padding_mask",
        data.src_padding_mask,
        lambda: {"src": ids()},
        {"src": "int_tensor"},
        {"src": [with_("src", (5,), torch.long)]},
    ),
    Spec("data.strip_special", data.strip_special, lambda: {"row": [1, 5, 6, 2, 0]}, {}),
    # training
    Spec(
        "training.average_checkpoints",
        training.average_checkpoints,
        lambda: {"states": [{"w": torch.ones(2)}, {"w": torch.zeros(2)}]},
        {},
        {
            "states": [
                lambda kw: [],
                lambda kw: [{"w": torch.ones(2)}, {"v": torch.ones(2)}],
                lambda kw: [{"w": torch.ones(2)}, {"w": torch.ones(3)}],
            ]
        },
    ),
    Spec(
        "training.noam_learning_rate",
        training.noam_learning_rate,
        lambda: {"step": 3, "d_model": 8, "warmup_steps": 4, "scale": 0.5},
        {"step": "count", "d_model": "size", "warmup_steps": "size", "scale": "positive_real"},
    ),
    Spec(
        "training.noam_lambda",
        training.noam_lambda,
        lambda: {"d_model": 8, "warmup_steps": 4, "scale": 0.5},
        {"d_model": "size", "warmup_steps": "size", "scale": "positive_real"},
    ),
    Spec(
        "training.make_optimizer",
        training.make_optimizer,
        lambda: {"model": MODEL, "warmup_steps": 4, "scale": 0.5},
        {"model": "module", "warmup_steps": "size", "scale": "positive_real"},
    ),
    Spec(
        "training.smoothed_targets",
        training.smoothed_targets,
        lambda: {"target": torch.tensor([1, 2]), "num_classes": 4, "epsilon": 0.1},
        {"target": "int_tensor", "num_classes": "size", "epsilon": "probability"},
        {"target": [lambda kw: torch.tensor([1, 4])]},
    ),
    Spec(
        "training.calibration",
        training.calibration,
        lambda: {"probs": torch.full((2, 3, 4), 0.25), "target": ids(2, 3) % 4, "num_bins": 5},
        {"probs": "float_tensor", "target": "int_tensor", "num_bins": "size"},
        {
            "probs": [lambda kw: torch.full((2, 3, 4), 0.5), lambda kw: torch.zeros(2, 4, 4)],
            "target": [lambda kw: torch.full((2, 3), 4), lambda kw: ids(3, 3) % 4],
        },
    ),
    Spec(
        "training.LabelSmoothingLoss",
        training.LabelSmoothingLoss,
        lambda: {"epsilon": 0.1},
        {"epsilon": "probability"},
    ),
    Spec(
        "LabelSmoothingLoss.forward",
        lambda **kw: training.LabelSmoothingLoss(0.1)(**kw),
        lambda: {"logits": torch.zeros(2, 3, 5), "target": torch.ones(2, 3, dtype=torch.long)},
        {"logits": "float_tensor", "target": "int_tensor"},
        {
            "target": [
                lambda kw: torch.ones(2, 4, dtype=torch.long),
                lambda kw: torch.full((2, 3), 5),
            ]
        },
    ),
    Spec(
        "training.teacher_forcing",
        training.teacher_forcing,
        lambda: {"tgt": ids(2, 5)},
        {"tgt": "int_tensor"},
        {"tgt": [with_("tgt", (2, 1), torch.long)]},
    ),
    Spec(
        "training.seq2seq_loss",
        training.seq2seq_loss,
        lambda: {"model": MODEL, "batch": a_batch()},
        {"model": "module"},
    ),
    Spec(
        "training.shard_batch",
        training.shard_batch,
        lambda: {"batch": a_batch(), "rank": 0, "world_size": 2},
        {"rank": "count", "world_size": "size"},
        {"rank": [lambda kw: 2]},
    ),
    Spec(
        "training.train",
        training.train,
        lambda: {
            "model": small_model(),
            "batches": [a_batch()],
            "optimizer": torch.optim.SGD(small_model().parameters(), lr=0.1),
            "progress": False,
        },
        {"model": "module"},
    ),
    Spec(
        "training.evaluate_loss",
        training.evaluate_loss,
        lambda: {"model": MODEL, "batches": [a_batch()]},
        {"model": "module"},
    ),
    Spec(
        "training.exact_match",
        training.exact_match,
        lambda: {"predictions": ids(2, 4), "targets": ids(2, 5), "eos_id": 2},
        {"predictions": "int_tensor", "targets": "int_tensor"},
        {"targets": [lambda kw: ids(3, 5)]},
    ),
    Spec(
        "training.sequence_accuracy",
        training.sequence_accuracy,
        lambda: {"model": MODEL, "src": ids(), "tgt": ids(2, 7), "bos_id": 1, "eos_id": 2},
        {"model": "module", "src": "int_tensor", "tgt": "int_tensor"},
        {"tgt": [lambda kw: ids(3, 7)]},
    ),
    # decoding
    Spec(
        "decoding.greedy_decode",
        decoding.greedy_decode,
        lambda: {"model": MODEL, "src": ids(), "max_len": 4, "bos_id": 1, "eos_id": 2},
        {"model": "module", "src": "int_tensor", "max_len": "size"},
        {"src": [with_("src", (5,), torch.long)]},
    ),
    Spec(
        "decoding.beam_search",
        decoding.beam_search,
        lambda: {
            "model": MODEL,
            "src": ids(),
            "max_len": 4,
            "bos_id": 1,
            "eos_id": 2,
            "beam_size": 2,
            "length_penalty": 0.6,
        },
        {"model": "module", "src": "int_tensor", "max_len": "size", "beam_size": "size"},
    ),
    Spec(
        "decoding.beam_search_with_scores",
        decoding.beam_search_with_scores,
        lambda: {
            "model": MODEL,
            "src": ids(),
            "max_len": 4,
            "bos_id": 1,
            "eos_id": 2,
            "beam_size": 2,
        },
        {"model": "module", "src": "int_tensor", "max_len": "size", "beam_size": "size"},
    ),
    Spec(
        "decoding.sequence_score",
        decoding.sequence_score,
        lambda: {"model": MODEL, "src": ids(), "seqs": ids(2, 4), "eos_id": 2},
        {"model": "module", "src": "int_tensor", "seqs": "int_tensor"},
        {"seqs": [lambda kw: ids(3, 4)]},
    ),
    Spec(
        "decoding.length_penalty_factor",
        decoding.length_penalty_factor,
        lambda: {"length": 3, "alpha": 0.6},
        {"length": "count", "alpha": "real"},
    ),
    # kv_cache
    Spec(
        "kv_cache.AttentionCache",
        kv_cache.AttentionCache,
        lambda: {"max_len": 4},
        {"max_len": "size?"},
    ),
    Spec(
        "AttentionCache.update",
        lambda **kw: kv_cache.AttentionCache(4).update(**kw),
        lambda: {"key": torch.ones(1, 2, 3, 4), "value": torch.ones(1, 2, 3, 4)},
        {"key": "float_tensor", "value": "float_tensor"},
        {"value": [with_("value", (1, 2, 2, 4))], "key": [with_("key", (2, 3, 4))]},
    ),
    Spec(
        "kv_cache.KVCache",
        kv_cache.KVCache,
        lambda: {"num_layers": 2, "max_len": 4},
        {"num_layers": "size", "max_len": "size?"},
    ),
    # kv_memory
    Spec(
        "kv_memory.kv_cache_bytes",
        kv_memory.kv_cache_bytes,
        lambda: {
            "num_layers": 2,
            "num_kv_heads": 2,
            "head_dim": 4,
            "seq_len": 8,
            "batch_size": 1,
            "bytes_per_element": 2,
        },
        {
            "num_layers": "size",
            "num_kv_heads": "size",
            "head_dim": "size",
            "seq_len": "count",
            "batch_size": "size",
            "bytes_per_element": "size",
        },
    ),
    Spec("kv_memory.format_bytes", kv_memory.format_bytes, lambda: {"n": 1536}, {"n": "real"}),
    Spec(
        "kv_memory.estimate",
        kv_memory.estimate,
        lambda: {"cfg": kv_memory.MODEL_CONFIGS["gpt2-small"], "seq_len": 16},
        {"seq_len": "count"},
        {"dtype": [lambda kw: "fp12"]},
    ),
    Spec(
        "kv_memory.report",
        kv_memory.report,
        lambda: {"cfg": kv_memory.MODEL_CONFIGS["gpt2-small"], "seq_len": 16},
        {"seq_len": "count"},
    ),
    # flash, paged, quantize
    Spec(
        "flash.tiled_attention",
        flash.tiled_attention,
        lambda: {**qkv(), "block_size": 2},
        {
            "query": "float_tensor",
            "key": "float_tensor",
            "value": "float_tensor",
            "block_size": "size",
        },
        {"key": [with_("key", (2, 5, 3))]},
    ),
    Spec(
        "flash.online_softmax_step",
        flash.online_softmax_step,
        lambda: {
            "m": torch.zeros(3, 1),
            "ell": torch.ones(3, 1),
            "acc": torch.zeros(3, 4),
            "scores": torch.zeros(3, 2),
            "values": torch.zeros(2, 4),
        },
        {
            "m": "float_tensor",
            "ell": "float_tensor",
            "acc": "float_tensor",
            "scores": "float_tensor",
            "values": "float_tensor",
        },
        {"scores": [with_("scores", (4, 2))], "values": [with_("values", (3, 4))]},
    ),
    Spec(
        "flash.peak_memory_bytes",
        flash.peak_memory_bytes,
        lambda: {"fn": lambda: torch.ones(2)},
        {"fn": "text"},
    ),
    Spec(
        "paged.PagedKVCache",
        paged.PagedKVCache,
        lambda: {"num_blocks": 4, "block_size": 2, "num_kv_heads": 2, "head_dim": 4},
        {"num_blocks": "size", "block_size": "size", "num_kv_heads": "size", "head_dim": "size"},
    ),
    Spec(
        "PagedKVCache.append",
        lambda **kw: paged.PagedKVCache(4, 2, 2, 4).append(**kw),
        lambda: {"seq_id": "a", "key": torch.ones(2, 3, 4), "value": torch.ones(2, 3, 4)},
        {"key": "float_tensor", "value": "float_tensor"},
        {"key": [with_("key", (2, 3, 5))], "value": [with_("value", (2, 2, 4))]},
    ),
    Spec(
        "quantize.quantize_int8",
        quantize.quantize_int8,
        lambda: {"x": torch.randn(3, 4), "dim": -1},
        {"x": "float_tensor"},
        {"dim": [lambda kw: 2]},
    ),
    Spec(
        "quantize.Int8AttentionCache",
        quantize.Int8AttentionCache,
        lambda: {"max_len": 4},
        {"max_len": "size?"},
    ),
    Spec(
        "quantize.int8_kv_cache_bytes",
        quantize.int8_kv_cache_bytes,
        lambda: {"num_layers": 2, "num_kv_heads": 2, "head_dim": 4, "seq_len": 8},
        {"num_layers": "size", "num_kv_heads": "size", "head_dim": "size", "seq_len": "count"},
    ),
    # GPT-2's weights
    Spec(
        "gpt2.from_hf_gpt2",
        gpt2.from_hf_gpt2,
        lambda: dict(_tiny_gpt2()),
        {"config": "module"},
        {"config": [lambda kw: {**kw["config"], "n_head": "4"}]},
    ),
    Spec(
        "gpt2.gpt2_weight_map",
        gpt2.gpt2_weight_map,
        lambda: {"num_layers": 2},
        {"num_layers": "size"},
    ),
    # the translation data
    Spec(
        "translation.number_text",
        translation.number_text,
        lambda: {"n": 23, "lang": "de"},
        {"n": "count"},
        {"lang": [lambda kw: "it"]},
    ),
    Spec(
        "translation.date_text",
        translation.date_text,
        lambda: {"day": datetime.date(2021, 3, 1), "lang": "de"},
        {},
        {"fmt": [lambda kw: "short"], "lang": [lambda kw: "xx"]},
    ),
    Spec(
        "translation.amount_text",
        translation.amount_text,
        lambda: {"cents": 250},
        {"cents": "size"},
    ),
    Spec(
        "translation.split_of",
        translation.split_of,
        lambda: {"kind": "number", "value": 5},
        {},
        {"kind": [lambda kw: "word"]},
    ),
    Spec(
        "translation.domain",
        translation.domain,
        lambda: {"kind": "amount", "split": "test"},
        {},
        {"kind": [lambda kw: "word"], "split": [lambda kw: "dev"]},
    ),
    Spec(
        "translation.translation_pairs",
        translation.translation_pairs,
        lambda: {"n": 3, "split": "test", "seed": 0},
        {"n": "size"},
        {"split": [lambda kw: "dev"], "kinds": [lambda kw: ["word"]]},
    ),
    Spec(
        "translation.CharVocab", translation.CharVocab, lambda: {"texts": ["ab"]}, {"texts": "text"}
    ),
    Spec(
        "translation.make_translation_batch",
        translation.make_translation_batch,
        lambda: {
            "pairs": [("ab", "ba")],
            "src_vocab": translation.CharVocab(["ab"]),
            "tgt_vocab": translation.CharVocab(["ab"]),
        },
        {},
        {"pairs": [lambda kw: []]},
    ),
    Spec(
        "translation.translation_tokenizer",
        translation.translation_tokenizer,
        lambda: {"pairs": [("twenty-three", "dreiundzwanzig")] * 3, "vocab_size": 265},
        {"vocab_size": "size"},
        {"pairs": [lambda kw: []], "vocab_size": [lambda kw: 10]},
    ),
    Spec(
        "translation.translate",
        translation.translate,
        lambda: {
            "model": MODEL,
            "sources": ["abc", "ja"],
            "tokenizer": translation.CharVocab(["abcdefghij"]),
            "beam_size": 2,
        },
        {"model": "module", "beam_size": "size", "batch_size": "size", "length_penalty": "real"},
    ),
    Spec(
        "translation.corpus_scores",
        translation.corpus_scores,
        lambda: {"hypotheses": ["ein Euro"], "references": ["ein Euro"]},
        {},
        {
            "hypotheses": [lambda kw: []],
            "references": [lambda kw: ["a", "b"]],
        },
    ),
    Spec(
        "translation.ngram_matches",
        translation.ngram_matches,
        lambda: {"hypothesis": ["a", "b"], "reference": ["a"], "n": 1},
        {"n": "size"},
    ),
    Spec(
        "translation.brevity_penalty",
        translation.brevity_penalty,
        lambda: {"hyp_len": 3, "ref_len": 4},
        {"hyp_len": "count", "ref_len": "count"},
    ),
    Spec(
        "translation.train_translator",
        translation.train_translator,
        lambda: {"recipe": TINY_RECIPE, "seed": 0, "progress": False},
        {},
    ),
    Spec(
        "translation.score_by_kind",
        translation.score_by_kind,
        lambda: {
            "model": MODEL,
            "tokenizer": translation.CharVocab(["abcdefghij"]),
            "pairs": [("abc", "cba"), ("ab", "ba")],
            "kinds": ["number", "date"],
        },
        {"model": "module", "beam_size": "size", "length_penalty": "real"},
    ),
    # tokenizer and language model
    Spec("tokenizer.pretokenize", tokenizer.pretokenize, lambda: {"text": "a b"}, {"text": "text"}),
    Spec(
        "BPETokenizer.train",
        tokenizer.BPETokenizer.train,
        lambda: {"text": "low lower lowest " * 5, "vocab_size": 270},
        {"text": "text", "vocab_size": "size"},
        {"vocab_size": [lambda kw: 100]},
    ),
    Spec(
        "tokenizer.merge_pair",
        tokenizer.merge_pair,
        lambda: {"ids": [5, 5, 5], "pair": (5, 5), "new_id": 9},
        {"new_id": "count"},
        {"ids": [lambda kw: [5, -1]], "pair": [lambda kw: (5, -2)]},
    ),
    Spec(
        "BPETokenizer.encode",
        tokenizer.BPETokenizer().encode,
        lambda: {"text": "hi"},
        {"text": "text"},
    ),
    Spec(
        "lm.DecoderOnlyTransformer",
        lm.DecoderOnlyTransformer,
        lambda: {
            "vocab_size": V,
            "d_model": 8,
            "num_heads": 2,
            "num_layers": 1,
            "d_ff": 16,
            "max_len": 8,
            "dropout": 0.1,
        },
        {
            "vocab_size": "size",
            "d_model": "size",
            "num_heads": "size",
            "num_layers": "size",
            "d_ff": "size",
            "max_len": "size",
            "dropout": "probability",
        },
        {"positions": [lambda kw: "rotary"], "activation": [lambda kw: "tanh"]},
    ),
    Spec(
        "DecoderOnlyTransformer.forward",
        lambda **kw: LM(**kw),
        lambda: {"tokens": ids()},
        {"tokens": "int_tensor"},
        {"tokens": [lambda kw: ids(2, 13), with_("tokens", (5,), torch.long)]},
    ),
    Spec(
        "lm.lm_loss",
        lm.lm_loss,
        lambda: {"model": LM, "tokens": ids()},
        {"model": "module", "tokens": "int_tensor"},
        {"tokens": [with_("tokens", (2, 1), torch.long)]},
    ),
    Spec(
        "lm.evaluate_lm",
        lm.evaluate_lm,
        lambda: {"model": LM, "tokens": torch.randint(3, V, (40,)), "seq_len": 8},
        {"model": "module", "tokens": "int_tensor", "seq_len": "size"},
    ),
    Spec(
        "lm.train_lm",
        lm.train_lm,
        lambda: {
            "model": lm.DecoderOnlyTransformer(
                V, d_model=8, num_heads=2, num_layers=1, d_ff=16, max_len=8
            ),
            "tokens": torch.randint(3, V, (60,)),
            "steps": 1,
            "seq_len": 8,
            "batch_size": 2,
        },
        {
            "model": "module",
            "tokens": "int_tensor",
            "steps": "size",
            "seq_len": "size",
            "batch_size": "size",
            "lr": "positive_real",
        },
    ),
    Spec(
        "decoding.next_token_probs",
        decoding.next_token_probs,
        lambda: {"logits": torch.zeros(2, V), "temperature": 0.7, "top_k": 3, "top_p": 0.9},
        {
            "logits": "float_tensor",
            "temperature": "positive_real",
            "top_k": "size?",
            "top_p": "top_p?",
        },
    ),
    Spec(
        "decoding.generate",
        decoding.generate,
        lambda: {"model": LM, "prompt": ids(1, 3), "max_new_tokens": 2, "top_p": 0.9},
        {
            "model": "module",
            "prompt": "int_tensor",
            "max_new_tokens": "count",
            "temperature": "nonneg_real",
            "top_k": "size?",
            "top_p": "top_p?",
        },
    ),
    Spec(
        "lm.next_token_probs",
        lm.next_token_probs,
        lambda: {"logits": torch.zeros(2, V), "temperature": 0.7, "top_k": 3},
        {"logits": "float_tensor", "temperature": "positive_real", "top_k": "size?"},
    ),
    Spec(
        "lm.generate",
        lm.generate,
        lambda: {"model": LM, "prompt": ids(1, 3), "max_new_tokens": 2},
        {"model": "module", "prompt": "int_tensor", "max_new_tokens": "count"},
    ),
    Spec(
        "lm.bigram_log_probs",
        lm.bigram_log_probs,
        lambda: {"tokens": torch.randint(0, V, (30,)), "vocab_size": V, "alpha": 0.5},
        {"tokens": "int_tensor", "vocab_size": "size", "alpha": "positive_real"},
    ),
    Spec(
        "lm.bigram_loss",
        lm.bigram_loss,
        lambda: {
            "log_probs": torch.log_softmax(torch.zeros(V, V), -1),
            "tokens": torch.randint(0, V, (30,)),
        },
        {"log_probs": "float_tensor", "tokens": "int_tensor"},
        {"log_probs": [with_("log_probs", (V, V + 1))]},
    ),
    Spec(
        "lm.encode_corpus",
        lm.encode_corpus,
        lambda: {"tokenizer": tokenizer.BPETokenizer(), "texts": ["a", "b"]},
        {"tokenizer": "module"},
    ),
    # plotting
    Spec(
        "plotting.heatmap",
        plotting.heatmap,
        lambda: {"ax": new_ax(), "matrix": torch.rand(3, 4)},
        {},
        {"matrix": [with_("matrix", (3, 4, 2)), with_("matrix", (0, 4))]},
    ),
    Spec(
        "plotting.attention_heatmaps",
        plotting.attention_heatmaps,
        lambda: {"weights": torch.rand(2, 3, 4)},
        {},
        {"weights": [with_("weights", (2, 2, 3, 4))]},
    ),
    Spec(
        "plotting.mask_heatmap",
        plotting.mask_heatmap,
        lambda: {"ax": new_ax(), "mask": torch.ones(3, 3, dtype=torch.bool)},
        {},
        {"mask": [with_("mask", (3,), torch.bool)]},
    ),
    Spec(
        "plotting.line_plot",
        plotting.line_plot,
        lambda: {"ax": new_ax(), "x": [1, 2, 3], "series": {"a": [1, 2, 3]}},
        {},
        {"series": [lambda kw: {"a": [1, 2]}]},
    ),
    Spec(
        "plotting.figure",
        plotting.figure,
        lambda: {"ncols": 2, "nrows": 1},
        {"ncols": "size", "nrows": "size"},
    ),
]

# Public callables with no spec, and why.
EXEMPT = {
    "translation.TranslationScores": "a frozen dataclass of results",
    "translation.TranslatorRecipe": "a frozen dataclass of settings, checked by train_translator",
    "translation.Translator": "a dataclass of results",
    "translation.load_study": "takes no arguments; its recipe check is in test_translation",
    "attention.Projection": "a view of a weight's rows, built by MultiHeadAttention",
    "attention.AttentionFlops": "a NamedTuple of results",
    "data.Batch": "a NamedTuple of results",
    "training.TrainHistory": "a dataclass of results",
    "training.Calibration": "a dataclass of results",
    "kv_cache.LayerCache": "a dataclass holding two caches",
    "kv_memory.ModelConfig": "a frozen dataclass of published numbers (see test_kv_memory)",
    "paged.OutOfBlocksError": "an exception class",
    "quantize.Int8Tensor": "a dataclass of results",
    "tokenizer.BPETokenizer": "its train and encode have specs; it is built from train's merges",
    "lm.pydoc_split": "takes no arguments",
    "tokenizer.gpt2_pattern": "takes no arguments",
    "gpt2.load_safetensors": "one path; its errors on broken files are checked in test_gpt2",
    "model.table3_configs": "takes no arguments",
    "plotting.use_style": "takes no arguments",
    "plotting.show": "displays a figure; any matplotlib figure",
    "plotting.smallest_text_px": "one Figure argument; its TypeError is checked in test_plotting",
    "plotting.finish_axes": "labels only; every argument is optional text",
    "plotting.history_plot": "draws a TrainHistory",
    "plotting.theory_vs_measurement": "checked in test_plotting",
    "plotting.reference_line": "checked in test_plotting",
    "plotting.bar_plot": "checked in test_plotting",
    "plotting.scatter_plot": "checked in test_plotting",
    "plotting.seeds_plot": "checked in test_plotting",
    "plotting.annotate": "checked in test_plotting",
    "plotting.diagram_axes": "checked in test_plotting",
    "plotting.box": "checked in test_plotting",
    "plotting.arrow": "checked in test_plotting",
    "plotting.note": "checked in test_plotting",
}

MODULES = [
    "attention",
    "positional",
    "model",
    "data",
    "training",
    "decoding",
    "kv_cache",
    "kv_memory",
    "flash",
    "paged",
    "quantize",
    "tokenizer",
    "lm",
    "gpt2",
    "translation",
    "plotting",
]


def test_every_public_callable_has_a_spec():
    covered = {spec.name for spec in SPECS}
    missing = []
    for module_name in MODULES:
        module = importlib.import_module(f"minitransformer.{module_name}")
        for name in module.__all__:
            if callable(getattr(module, name)):
                qualified = f"{module_name}.{name}"
                if qualified not in covered and qualified not in EXEMPT:
                    missing.append(qualified)
    assert not missing, f"public callables without a bad-input spec in this file: {missing}"


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.name)
def test_the_valid_arguments_are_valid(spec):
    """So that an error in the tests below comes from the bad argument, not from the others."""
    spec.fn(**spec.valid())


CASES = [(spec, arg) for spec in SPECS for arg in spec.args]
SHAPE_CASES = [
    (spec, arg, i)
    for spec in SPECS
    for arg, makers in spec.shapes.items()
    for i in range(len(makers))
]


def check_error(spec: Spec, arg: str, value: Any, expected: type[Exception]) -> None:
    kwargs = spec.valid()
    kwargs[arg] = value
    try:
        spec.fn(**kwargs)
    except Exception as error:  # noqa: BLE001 - the kind of error is what is tested
        exc = error
    else:
        pytest.fail(f"{spec.name}({arg}={value!r}) raised nothing; expected {expected.__name__}")
    described = f"{spec.name}({arg}={value!r}) raised {type(exc).__name__}: {exc}"
    assert isinstance(exc, (ValueError, TypeError)), f"not a clear error: {described}"
    assert type(exc) is expected or isinstance(exc, expected), (
        f"expected {expected.__name__}: {described}"
    )
    assert arg in str(exc), f"the message does not name the argument: {described}"
    assert "torch" not in type(exc).__module__, described


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@pytest.mark.parametrize("spec,arg", CASES, ids=[f"{s.name}-{a}" for s, a in CASES])
@given(data=st.data())
def test_a_bad_kind_or_size_is_a_clear_error(spec, arg, data):
    value, expected = bad_values(spec.args[arg], data.draw)
    check_error(spec, arg, value, expected)


@pytest.mark.parametrize(
    "spec,arg,i", SHAPE_CASES, ids=[f"{s.name}-{a}-{i}" for s, a, i in SHAPE_CASES]
)
def test_a_wrong_shape_or_value_is_a_clear_error(spec, arg, i):
    value = spec.shapes[arg][i](spec.valid())
    check_error(spec, arg, value, ValueError)


@settings(max_examples=25, deadline=None)
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 4),
    S=st.integers(1, 4),
    d=st.integers(1, 5),
    wrong=st.integers(1, 5),
)
def test_attention_shapes_drawn_at_random(B, T, S, d, wrong):
    """Mismatched d_k or S, drawn by hypothesis: a ValueError naming the tensors, never a
    torch-internal broadcasting error, and never a result."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(B, T, d, generator=g),
        torch.randn(B, S, d, generator=g),
        torch.randn(B, S, 2, generator=g),
    )
    bad_k = torch.randn(B, S, d + wrong, generator=g)
    bad_v = torch.randn(B, S + wrong, 2, generator=g)
    for args, name in (((q, bad_k, v), "key"), ((q, k, bad_v), "value")):
        for fn in (attention.scaled_dot_product_attention, flash.tiled_attention):
            with pytest.raises(ValueError, match=name):
                fn(*args)
    out, weights = attention.scaled_dot_product_attention(q, k, v)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()


# -- one rule for token ids and indices (minitransformer._checks.ids) ------------------------

from minitransformer import _checks  # noqa: E402

#: Integer dtypes torch has but the rule refuses, and dtypes that are not integers at all.
REFUSED_DTYPES = [
    getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)
] + [torch.float32, torch.float64, torch.bool]


def _cache_after_reorder(index: torch.Tensor, *, whole: bool) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    cache = kv_cache.KVCache(2, 4)
    for layer in cache.layers:
        layer.self_attn.update(
            torch.randn(3, 2, 2, 4, generator=g), torch.randn(3, 2, 2, 4, generator=g)
        )
    if whole:
        cache.reorder(index)
    else:
        cache.layers[0].self_attn.reorder(index)
    return tuple(t for layer in cache.layers for t in layer.self_attn.get())


def _memory() -> torch.Tensor:
    with torch.no_grad():
        return MODEL.encode(ids(2, 4))


#: name -> (the argument, its shape, the upper bound of valid values, call(value) -> result).
ID_TAKERS: dict[str, tuple[str, tuple[int, ...], int, Callable[[torch.Tensor], Any]]] = {
    "Transformer.encode": ("src", (2, 4), V, lambda x: MODEL.encode(x)),
    "Transformer.decode": ("tgt", (2, 3), V, lambda x: MODEL.decode(x, _memory())),
    "Transformer.forward src": ("src", (2, 4), V, lambda x: MODEL(x, ids(2, 3))),
    "Transformer.forward tgt": ("tgt", (2, 3), V, lambda x: MODEL(ids(2, 4), x)),
    "Transformer.embed": ("tokens", (2, 3), V, lambda x: MODEL.embed(x, MODEL.src_embed)),
    "Transformer.attention_weights": (
        "tgt",
        (2, 3),
        V,
        lambda x: MODEL.attention_weights(ids(2, 4), x)["cross"],
    ),
    "decoding.greedy_decode": (
        "src",
        (2, 4),
        V,
        lambda x: decoding.greedy_decode(MODEL, x, 5, 1, 2),
    ),
    "decoding.beam_search_with_scores": (
        "src",
        (2, 4),
        V,
        lambda x: decoding.beam_search_with_scores(MODEL, x, 5, 1, 2, beam_size=2),
    ),
    "decoding.sequence_score src": (
        "src",
        (2, 4),
        V,
        lambda x: decoding.sequence_score(MODEL, x, ids(2, 3), 2),
    ),
    "decoding.sequence_score seqs": (
        "seqs",
        (2, 3),
        V,
        lambda x: decoding.sequence_score(MODEL, ids(2, 4), x, 2),
    ),
    "decoding.generate": (
        "prompt",
        (2, 2),
        V,
        lambda x: decoding.generate(LM, x, 3, generator=torch.Generator().manual_seed(0)),
    ),
    "AttentionCache.reorder": ("index", (4,), 3, lambda x: _cache_after_reorder(x, whole=False)),
    "KVCache.reorder": ("index", (4,), 3, lambda x: _cache_after_reorder(x, whole=True)),
    "BPETokenizer.decode": ("ids", (6,), 258, lambda x: tokenizer.BPETokenizer().decode(x)),
    "merge_pair ids": ("ids", (6,), 300, lambda x: tokenizer.merge_pair(x, (5, 6), 9)),
    "merge_pair pair": ("pair", (2,), 300, lambda x: tokenizer.merge_pair([5, 6, 7], x, 9)),
}


#: Takers with no upper bound (merge_pair knows no vocabulary): only negative ids are wrong.
UNBOUNDED = {"merge_pair ids", "merge_pair pair"}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    which=st.sampled_from(sorted(ID_TAKERS)),
    dtype=st.sampled_from(_checks.ID_DTYPES),
    data=st.data(),
)
def test_every_integer_dtype_gives_the_ids_of_int64(which, dtype, data):
    _, shape, high, call = ID_TAKERS[which]
    high = min(high, torch.iinfo(dtype).max + 1)  # int8 holds ids up to 127
    values = data.draw(st.lists(st.integers(0, high - 1), min_size=shape[-1], max_size=shape[-1]))
    x = torch.tensor(values).repeat(*shape[:-1], 1)
    assert _same(call(x.to(dtype)), call(x))


@pytest.mark.parametrize("which", sorted(ID_TAKERS))
def test_ids_out_of_range_negative_included_are_a_value_error(which):
    arg, shape, high, call = ID_TAKERS[which]
    for bad in (-1,) if which in UNBOUNDED else (-1, high):
        x = torch.full(shape, 3)
        x.view(-1)[-1] = bad  # one bad id, in the last place: the whole range is checked
        for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8):
            info = torch.iinfo(dtype)
            if not info.min <= bad <= info.max:
                continue
            with pytest.raises(ValueError, match=arg):
                call(x.to(dtype))


@pytest.mark.parametrize("dtype", REFUSED_DTYPES, ids=str)
@pytest.mark.parametrize("which", sorted(ID_TAKERS))
def test_other_dtypes_are_a_type_error_naming_the_argument(which, dtype):
    arg, shape, _, call = ID_TAKERS[which]
    with pytest.raises(TypeError, match=arg):
        call(torch.full(shape, 1).to(dtype))


# -- a call that raises leaves the object as it was ---------------------------------------------


def _state(obj: Any) -> Any:
    """Everything an object holds, compared by value (tensors by their bytes, so that
    uninitialised buffers, NaN included, compare equal to themselves)."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", obj.dtype, tuple(obj.shape), obj.detach().cpu().numpy().tobytes())
    if isinstance(obj, dict):
        return {k: _state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_state(v) for v in obj)
    if hasattr(obj, "__dict__") and not isinstance(obj, (type, torch.nn.Module)):
        return (type(obj).__name__, _state(vars(obj)))
    return obj


def _filled_cache(batch: tuple[int, ...] = (3, 3)) -> kv_cache.KVCache:
    g = torch.Generator().manual_seed(0)
    cache = kv_cache.KVCache(len(batch), 2)
    for B, layer in zip(batch, cache.layers, strict=True):
        layer.self_attn.update(torch.randn(B, 2, 2, 4, generator=g), torch.randn(B, 2, 2, 4))
        layer.cross_attn.update(
            torch.randn(B, 2, 5, 4), torch.randn(B, 2, 5, 4), source=torch.zeros(B, 5, 8)
        )
    return cache


def _paged() -> paged.PagedKVCache:
    pool = paged.PagedKVCache(num_blocks=3, block_size=2, num_kv_heads=1, head_dim=2)
    pool.append("a", torch.ones(1, 3, 2), torch.ones(1, 3, 2))  # 2 blocks
    pool.append("empty", torch.ones(1, 0, 2), torch.ones(1, 0, 2))  # started, no block
    return pool


def _tokenizer() -> tokenizer.BPETokenizer:
    tok = tokenizer.BPETokenizer.train("hello hello world", 262)
    tok.encode("hello")  # something in its cache of chunks
    return tok


K1 = torch.zeros(3, 2, 1, 4)
#: (the method, a builder of the object, a failing call, the exception) for every method that
#: changes its object.
MUTATORS = [
    ("AttentionCache.update wrong B", lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.update(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4)), ValueError),
    ("AttentionCache.update wrong dtype", lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.update(K1.double(), K1.double()), ValueError),
    ("AttentionCache.update key/value mismatch", lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.update(K1, torch.zeros(3, 2, 2, 4)), ValueError),
    ("AttentionCache.update static twice", lambda: _filled_cache().layers[0].cross_attn,
     lambda c: c.update(torch.zeros(3, 2, 5, 4), torch.zeros(3, 2, 5, 4)), ValueError),
    ("AttentionCache.update int keys", lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.update(K1.long(), K1), TypeError),
    ("AttentionCache.append wrong dtype (falls back to update)",
     lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.append(torch.zeros(2, 2, 1, 4), torch.zeros(2, 2, 1, 4)), ValueError),
    ("AttentionCache.reorder out of range", lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.reorder(torch.tensor([0, 3])), ValueError),
    ("AttentionCache.reorder float index", lambda: _filled_cache().layers[0].self_attn,
     lambda c: c.reorder(torch.tensor([0.0])), TypeError),
    ("AttentionCache.holds another source", lambda: _filled_cache().layers[0].cross_attn,
     lambda c: c.holds(torch.ones(3, 5, 8)), ValueError),
    ("KVCache.reorder fits layer 0, not layer 1", lambda: _filled_cache((3, 2)),
     lambda c: c.reorder(torch.tensor([2, 0])), ValueError),
    ("PagedKVCache.append out of blocks", _paged,
     lambda p: p.append("a", torch.ones(1, 5, 2), torch.ones(1, 5, 2)),
     paged.OutOfBlocksError),
    ("PagedKVCache.append out of blocks, a started empty sequence", _paged,
     lambda p: p.append("empty", torch.ones(1, 5, 2), torch.ones(1, 5, 2)),
     paged.OutOfBlocksError),
    ("PagedKVCache.append wrong shape", _paged,
     lambda p: p.append("b", torch.ones(2, 1, 2), torch.ones(2, 1, 2)), ValueError),
    ("PagedKVCache.append unhashable", _paged,
     lambda p: p.append([1], torch.ones(1, 1, 2), torch.ones(1, 1, 2)), TypeError),
    ("PagedKVCache.free unknown", _paged, lambda p: p.free("b"), KeyError),
    ("BPETokenizer.encode lone surrogate", _tokenizer,
     lambda t: t.encode("new words \ud800"), ValueError),
    ("BPETokenizer.encode not a str", _tokenizer, lambda t: t.encode(b"hello"), TypeError),
    ("BPETokenizer.decode a bad last id", _tokenizer,
     lambda t: t.decode([5, 6, 10**6]), ValueError),
]  # fmt: skip


@pytest.mark.parametrize("name,make,call,error", MUTATORS, ids=[m[0] for m in MUTATORS])
def test_a_call_that_raises_leaves_the_object_as_it_was(name, make, call, error):
    obj = make()
    before = _state(obj)
    with pytest.raises(error):
        call(obj)
    assert _state(obj) == before


def test_every_mutating_method_is_in_the_atomicity_table():
    """The public methods that change their object, each with a failing call above."""
    methods = {
        "AttentionCache": ["update", "append", "reorder", "holds"],
        "KVCache": ["reorder"],
        "PagedKVCache": ["append", "free"],
        "BPETokenizer": ["encode", "decode"],
    }
    covered = {name.split(" ")[0] for name, *_ in MUTATORS}
    assert covered == {f"{cls}.{m}" for cls, ms in methods.items() for m in ms}
