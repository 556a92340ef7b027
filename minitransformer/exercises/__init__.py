"""Checkers for the book's exercises.

Every exercise in the book follows one pattern (see the intro page, "How the exercises work"):

1. a **stub** cell the learner fills in (it starts as ``raise NotImplementedError``);
2. a **checker** cell, ``check_xxx(your_function)``, calling a checker from this package;
3. a collapsed **solution** that defines a reference answer and runs the same checker.

A checker

* prints ``Not attempted yet`` for an untouched stub (the notebook keeps running);
* raises :class:`ExerciseError` with a hint that names the likely mistake for a wrong answer;
* prints ``Correct`` for a right one (checkers return ``None``; tests read the printed line).

Checkers live in one module per topic and are re-exported here, so a notebook only needs
``from minitransformer.exercises import check_xxx``.
"""

from minitransformer.exercises._core import ExerciseError, NotAttempted, checker
from minitransformer.exercises.warmup import check_softmax
from minitransformer.exercises.model import (
    check_decoder_mask,
    check_layer_parameters,
    check_next_token,
)
from minitransformer.exercises.attention import (
    check_attention,
    check_causal_mask,
    check_cross_attention_shapes,
)
from minitransformer.exercises.multihead import (
    check_merge_heads,
    check_multi_head_attention,
    check_parameter_count,
    check_split_heads,
)
from minitransformer.exercises.positional import (
    check_pairs_with_full_period,
    check_rotary_embedding,
    check_shift_matrix,
    check_sinusoidal_encoding,
)
from minitransformer.exercises.inference import (
    check_cache_append,
    check_kv_cache_bytes,
    check_online_softmax_step,
)
from minitransformer.exercises.quantize import check_quantize_rows
from minitransformer.exercises.training import (
    check_noam_learning_rate,
    check_smoothed_targets,
    check_teacher_forcing,
)

__all__ = [
    "ExerciseError",
    "NotAttempted",
    "checker",
    "check_softmax",
    "check_decoder_mask",
    "check_layer_parameters",
    "check_next_token",
    "check_attention",
    "check_causal_mask",
    "check_cross_attention_shapes",
    "check_split_heads",
    "check_merge_heads",
    "check_parameter_count",
    "check_multi_head_attention",
    "check_sinusoidal_encoding",
    "check_shift_matrix",
    "check_pairs_with_full_period",
    "check_rotary_embedding",
    "check_noam_learning_rate",
    "check_smoothed_targets",
    "check_teacher_forcing",
    "check_kv_cache_bytes",
    "check_online_softmax_step",
    "check_cache_append",
    "check_quantize_rows",
]
