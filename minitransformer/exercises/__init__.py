"""Checkers for the book's exercises, and the engine they are declared on.

Every exercise has a stub cell (``raise NotImplementedError``), a checker cell
``check_xxx(your_function)`` and a collapsed solution (the intro page, "How the exercises
work"). A checker prints ``Not attempted yet`` for the untouched stub, raises
:class:`ExerciseError` with a hint that names the likely mistake, then the fix, for a wrong
answer, and prints ``Correct`` for a right one. A notebook needs only
``from minitransformer.exercises import check_xxx``.

**Declaring a checker.** A checker is data: its cases, a reference and a table of known
mistakes, in the module of its chapter (``attention.py`` for ``book/attention``)::

    _MISTAKES = [
    like(lambda size: torch.ones(size, size, dtype=torch.bool).tril(-1),
             "your mask leaves out the diagonal: position t may attend to itself, ..."),
    when(lambda got, want: got.shape == want.shape and got.dtype != torch.bool,
             "your mask has dtype {got.dtype}; return a boolean tensor (dtype=torch.bool)"),
    ]

    @checker("causal mask", reference=causal_mask, mistakes=_MISTAKES,
             returns="causal_mask({size})")
    def check_causal_mask():
        \"\"\"Check ``fn(size) -> (size, size)`` boolean mask, True on and below the diagonal.\"\"\"
    return [Case(size=5), Case(size=1), Case(size=8)]

* the decorated function returns the :class:`Case` list; it may take a seeded
  ``torch.Generator`` for random inputs (never the global generator; a module that draws its
  initial weights from it is built with :func:`seeded`). ``Case("with a mask", query=q, ...)``
  passes its inputs in the order given; its text ``where`` ends up in the hints;
* the **reference** has the learner's signature: the package's function, called by keyword
  where the package's API makes an argument keyword-only, or a formula;
* the **mistakes**, most specific first: :func:`like` (a wrong implementation, or a list of
  them, run on the same inputs), :func:`when` (a predicate on the answer), :func:`raises` (the
  learner's code crashed with that exception). Hints are format strings over ``got``, ``want``,
  ``got_type``, ``where`` and the inputs by name, or functions of those fields; predicates take
  any of the fields by name. A predicate that raises does not hold, and :func:`close` raises for
  different shapes, so ``not close(...)`` never fires on an answer of the wrong shape;
* when no mistake matches, the hint describes the difference (type, shape, dtype, which entries
  and by how much), followed by the case's ``otherwise`` (or the checker's). A case's ``hint``
  replaces the mistakes: use it for a case that only checks that nothing is hard-wired.

Options of :func:`checker` cover the rest: ``returns`` names the result (a tuple of names for a
tuple); ``observe(fn, **inputs)`` calls any implementation and returns what is compared (to fold
a step over blocks, or to read a buffer the function writes); ``may_modify`` names the inputs
the function is meant to write into; ``compare``, ``atol`` and ``rtol`` say what counts as equal.

**What the engine guarantees.** The learner's function gets deep copies of the inputs and the
reference other copies; an input changed in place is rejected with a hint that names it, even
when the result is right (the caller's data would change too, see ``_core``); the learner's code
runs under ``torch.no_grad()``; the global random state of torch, ``random`` and NumPy is put
back as it was. ``tests/test_exercises_engine.py`` checks every checker for it: its reference
passes, a stub is not attempted, each ``like`` row is reported with its own hint.
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
from minitransformer.exercises.warmup import check_softmax

__all__ = [
    # the engine
    "ExerciseError", "NotAttempted", "checker", "Case", "Mistake", "like", "when", "raises",
    "close", "seeded",
    # the checkers, in the order of the chapters
    "check_softmax",
    "check_decoder_mask", "check_layer_parameters", "check_next_token",
    "check_encoder_layer",
    "check_attention", "check_causal_mask", "check_cross_attention_shapes",
    "check_split_heads", "check_merge_heads", "check_parameter_count", "check_multi_head_attention",
    "check_sinusoidal_encoding", "check_shift_matrix", "check_pairs_with_full_period",
    "check_rotary_embedding",
    "check_noam_learning_rate", "check_smoothed_targets", "check_teacher_forcing",
    "check_kv_cache_bytes", "check_online_softmax_step", "check_cache_append",
    "check_bpe_merge", "check_lm_loss", "check_top_k_probs",
    "check_quantize_rows",
]
