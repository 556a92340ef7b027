"""Checkers for the book's exercises (the intro, "How the exercises work"), and their engine.

``check_xxx(fn)`` prints ``Not attempted yet`` for the untouched stub and ``Correct`` for a right
answer; for a wrong one it raises :class:`ExerciseError`, whose hint names the likely mistake,
then the fix. A checker is declared, not programmed (``CONTRIBUTING.md``, "Exercises")::

    _MISTAKES = [  # most specific first; the hints are shortened here
        like(lambda size: torch.ones(size, size, dtype=torch.bool).tril(-1),
             "your mask leaves out the diagonal: t may attend to itself"),
        when(lambda got: got.dtype != torch.bool,
             "your mask has dtype {got.dtype}; return bools"),
    ]

    @checker("causal mask", reference=causal_mask, mistakes=_MISTAKES,
             returns="causal_mask({size})")
    def check_causal_mask() -> list[Case]:
        \"\"\"Check ``fn(size)``: a (size, size) bool mask, True on and below
        the diagonal.\"\"\"
        return [Case(size=5), Case(size=1), Case(size=8)]

The function returns the :class:`Case` list (from a seeded ``torch.Generator`` if it takes one);
the reference has the learner's signature; :func:`like` (a wrong implementation), :func:`when` (a
predicate on the answer) and :func:`raises` (an exception) are the mistakes, with hints that are
format strings over ``got``, ``want``, ``got_type``, ``where`` and the inputs. The engine gives
the learner copies, rejects an input changed in place, runs under ``torch.no_grad()`` and leaves
the global random state as it was (``tests/test_exercises_engine.py`` checks every checker).
"""

from minitransformer.exercises._core import (
    Case,
    ExerciseError,
    Mistake,
    NotAttempted,
    checker,
    close,
    like,
    raises,
    seeded,
    when,
)
from minitransformer.exercises.ablations import (
    check_implied_vocabulary,
    check_verdict,
    check_welch_t,
)
from minitransformer.exercises.attention import (
    check_attention,
    check_causal_mask,
    check_cross_attention_shapes,
)
from minitransformer.exercises.inference import (
    check_cache_append,
    check_kv_cache_bytes,
    check_online_softmax_step,
)
from minitransformer.exercises.lm import (
    check_bpe_merge,
    check_lm_loss,
    check_top_k_probs,
)
from minitransformer.exercises.model import (
    check_decoder_mask,
    check_encoder_layer,
    check_layer_parameters,
    check_next_token,
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
from minitransformer.exercises.quantize import check_quantize_rows
from minitransformer.exercises.training import (
    check_noam_learning_rate,
    check_smoothed_targets,
    check_teacher_forcing,
)
from minitransformer.exercises.translation import (
    check_average_checkpoints,
    check_brevity_penalty,
    check_ngram_matches,
)
from minitransformer.exercises.warmup import check_softmax

__all__ = [
    # the engine
    "ExerciseError",
    "NotAttempted",
    "checker",
    "Case",
    "Mistake",
    "like",
    "when",
    "raises",
    "close",
    "seeded",
    # the checkers, in the order of the chapters
    "check_softmax",
    "check_decoder_mask",
    "check_layer_parameters",
    "check_next_token",
    "check_encoder_layer",
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
    "check_brevity_penalty",
    "check_ngram_matches",
    "check_average_checkpoints",
    "check_implied_vocabulary",
    "check_welch_t",
    "check_verdict",
    "check_kv_cache_bytes",
    "check_online_softmax_step",
    "check_cache_append",
    "check_bpe_merge",
    "check_lm_loss",
    "check_top_k_probs",
    "check_quantize_rows",
]
