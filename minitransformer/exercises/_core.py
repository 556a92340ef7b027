"""The engine behind every checker: cases, a reference and a table of known mistakes.

A checker is declared, not programmed (the package docstring shows a whole one):

* its **cases**, built by the decorated function from a seeded local ``torch.Generator``;
* a **reference** with the learner's signature (the package's function, or a formula);
* a table of **mistakes**, most specific first: :func:`like` (a wrong implementation),
  :func:`when` (a predicate on the answer) and :func:`raises` (the learner's code crashed).

For each case the engine hands the learner's function deep **copies** of the inputs and computes
the reference from other copies, so an answer that changes its inputs cannot corrupt the
reference. If the answer differs, the hint of the first mistake that reproduces it is raised,
else a description of the difference (shape, dtype, which entries, by how much).

**An input changed in place is rejected**, even when the result is right, with a hint of its
own (it names the argument): the caller's tensor would change too, so the next call (the next
layer, head or cell) would see other numbers, and autograd refuses in-place changes of tensors
it saved. Only the arguments in ``may_modify`` may change (a cache that must be written).

A checker leaves the global random state of ``torch``, ``random`` and NumPy as it found it, and
runs the learner's code under ``torch.no_grad()``.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import numbers
import random
import re
import string
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["ExerciseError", "NotAttempted", "Case", "Mistake", "like", "when", "raises",
           "checker", "close", "seeded"]


class ExerciseError(AssertionError):
    """A wrong answer; the message names the likely mistake first, then the fix."""

    def _render_traceback_(self) -> list[str]:
        """How IPython shows it: one sentence per line (they wrap well in a narrow box), without
        the checker's internals; when the learner's code crashed, its traceback comes first."""
        lines: list[str] = []
        cause = self.__cause__
        if cause is not None:
            tb = cause.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next  # the engine's own frames tell the learner nothing
            lines += "".join(traceback.format_exception(type(cause), cause, tb)).rstrip().splitlines()
            lines += ["", "The checker says:"]
        first, *rest = _SENTENCE_END.split(str(self))
        return lines + [f"ExerciseError: {first}"] + [f"    {s}" for s in rest]


_SENTENCE_END = re.compile(r"(?<=\.)\s+(?=[A-Z`])|(?<=;)\s+")


class NotAttempted(Exception):
    """The learner's stub still raises ``NotImplementedError``."""


class Case:
    """One call of the learner's function: ``where`` says it in words ("on 4-D inputs with a
    mask") and ``inputs`` are passed in the order given. When the answer is wrong, ``otherwise``
    follows the description of a difference that no known mistake explains; ``hint`` follows
    it for *any* wrong answer, the mistakes unasked (a case that only tests that nothing is
    hard-wired, after the others passed)."""

    def __init__(self, where: str = "", /, *, otherwise: str | None = None, hint: str | None = None,
                 **inputs: object) -> None:
        self.where, self.otherwise, self.hint, self.inputs = where, otherwise, hint, inputs

    def __repr__(self) -> str:
        return f"Case({self.where!r}, {', '.join(self.inputs)})"


@dataclass(frozen=True)
class Mistake:
    """A row of a mistakes table; build it with :func:`like`, :func:`when` or :func:`raises`.

    ``hint`` is a format string over the fields ``got``, ``want``, ``got_type``, ``where`` and
    the case's inputs by name (a ``torch.Size`` prints as a tuple), or a function that takes
    some of those fields by name and returns the text.
    """

    hint: str | Callable[..., str]
    wrong: Sequence[Callable[..., object]] = ()
    when: Callable[..., object] | None = None
    raises: type[BaseException] | None = None


def like(wrong: Callable[..., object] | Sequence[Callable[..., object]], hint: str | Callable[..., str]) -> Mistake:
    """The answer equals what ``wrong`` (a wrong implementation with the learner's signature,
    or a list of them) returns on the same inputs. Skipped on a case where ``wrong`` crashes or
    gives the right answer."""
    return Mistake(hint, wrong=tuple(wrong) if isinstance(wrong, (list, tuple)) else (wrong,))


def when(predicate: Callable[..., object], hint: str | Callable[..., str]) -> Mistake:
    """``predicate`` holds; it takes any of the hint fields by name (``got``, ``want``, the
    inputs...). It is asked only when the answer is wrong; if it raises, it does not hold."""
    return Mistake(hint, when=predicate)


def raises(exception: type[BaseException], hint: str | Callable[..., str]) -> Mistake:
    """The learner's function raised ``exception``; ``hint`` follows the error message."""
    return Mistake(hint, raises=exception)


def checker(
    name: str,
    *,
    reference: Callable[..., object],
    mistakes: Sequence[Mistake] = (),
    returns: str | Sequence[str] = "the result",
    otherwise: str | None = None,
    observe: Callable[..., object] | None = None,
    may_modify: Sequence[str] = (),
    compare: Callable[[object, object], bool] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> Callable[[Callable[..., Sequence[Case]]], Callable[[Callable[..., object]], None]]:
    """Turn a function that builds the cases into the checker ``check_xxx(fn)``.

    The decorated function takes a seeded ``torch.Generator`` (or nothing) and returns the
    :class:`Case` list; its name and docstring become the checker's. The checker prints
    ``Correct: <name>.`` or ``Not attempted yet: <name>. ...`` and returns ``None``; a wrong
    answer raises :class:`ExerciseError`.

    Args:
        name: what the exercise builds, for the verdict line.
        reference: the right answer, with the learner's signature.
        mistakes: the known mistakes, most specific first.
        returns: names of the result (one per element when it is a tuple), format strings over
            the inputs, e.g. ``"causal_mask({size})"``; the case's ``where`` is appended.
        otherwise: the default of :class:`Case`'s ``otherwise``.
        observe: ``observe(fn, **inputs)`` calls any implementation (the learner's, the
            reference, a mistake) and returns what is compared; default ``fn(*inputs)``.
        may_modify: inputs the function is meant to write into.
        compare: ``compare(got, want) -> bool``; default: tensors within ``atol``/``rtol``
            (exact for integer and boolean tensors, whose dtype must match), exact ints,
            and tuples, lists and dicts element by element.
    """
    spec = _Spec(reference, tuple(mistakes), returns, otherwise, observe or _call_in_order,
                 frozenset(may_modify), compare, atol, rtol)

    def decorate(build_cases: Callable[..., Sequence[Case]]) -> Callable[[Callable[..., object]], None]:
        def check(fn: Callable[..., object]) -> None:
            with _global_rng_kept(), torch.no_grad():
                try:
                    for case in spec.cases():
                        spec.run(fn, case)
                except NotAttempted:
                    print(f"Not attempted yet: {name}. Replace the `raise NotImplementedError` "
                          "in the stub with your code and run this cell again.")
                    return
            print(f"Correct: {name}.")

        takes_generator = bool(inspect.signature(build_cases).parameters)
        spec.cases = lambda: build_cases(torch.Generator().manual_seed(0)) if takes_generator else build_cases()
        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(check, attr, getattr(build_cases, attr))
        check.__signature__ = inspect.Signature([inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD)])
        check.name, check.spec = name, spec  # for the tests
        return check

    return decorate


def close(a: Tensor, b: Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """The values of ``a`` are within ``atol + rtol * |b|`` of ``b``'s (NaN never is).

    Raises ``ValueError`` if the shapes differ: a predicate that compares values then does not
    hold, whichever way it is written (``close(...)`` or ``not close(...)``).
    """
    if a.shape != b.shape:
        raise ValueError(f"cannot compare the values of shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol))


def seeded(seed: int, build: Callable[[], Any]) -> Any:
    """``build()`` with torch's global generator seeded (module initialisation draws from it),
    which is put back as it was afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------

_IN_PLACE = (
    "your function changed its argument `{}` in place (with `/=`, `+=`, an indexed assignment "
    "or a method ending in `_` such as `masked_fill_`): the caller's tensor changes too, so the "
    "next call with it gets another answer. Leave the inputs alone and compute new tensors "
    "(`x = x / c` rather than `x /= c`, `masked_fill` rather than `masked_fill_`)."
)


@dataclass
class _Spec:
    reference: Callable[..., object]
    mistakes: tuple[Mistake, ...]
    returns: str | Sequence[str]
    otherwise: str | None
    observe: Callable[..., object]
    may_modify: frozenset[str]
    compare: Callable[[object, object], bool] | None
    atol: float
    rtol: float
    cases: Callable[[], Sequence[Case]] = list

    def run(self, fn: Callable[..., object], case: Case) -> None:
        """Raise :class:`ExerciseError` unless ``fn`` answers ``case`` right, inputs untouched."""
        given = copy.deepcopy(case.inputs)  # the learner's copy; case.inputs stay pristine
        got = self._learner(fn, given, case)
        want = self.observe(self.reference, **copy.deepcopy(case.inputs))
        got = _numbers_like(got, want)
        changed = [n for n, x in case.inputs.items() if n not in self.may_modify and not _unchanged(given[n], x)]
        if self.same(got, want):
            if changed:
                raise ExerciseError(_IN_PLACE.format(changed[0]) + " Apart from that, your answer is right.")
            return
        hint = self.diagnose(got, want, case)
        raise ExerciseError(_IN_PLACE.format(changed[0]) + f" Compared with the right answer: {hint}"
                            if changed else hint)

    def _learner(self, fn: Callable[..., object], given: dict[str, object], case: Case) -> object:
        try:
            return self.observe(fn, **given)
        except NotImplementedError:
            raise NotAttempted from None
        except ExerciseError:  # an observe adapter found a malformed answer
            raise
        except Exception as exc:  # the learner's code crashed: say how, and on what
            hints = [m.hint for m in self.mistakes if m.raises and isinstance(exc, m.raises)]
            fields = _fields(case, None, None)
            hint = _format(hints[0], fields) if hints else (
                "The traceback above shows the line; a shape mismatch is the usual cause.")
            inputs = ", ".join(f"{n} {_brief(x)}" for n, x in case.inputs.items())
            raise ExerciseError(f"your function raised {type(exc).__name__}: {exc} "
                                f"({case.where + ': ' if case.where else ''}{inputs}). {hint}") from exc

    def same(self, got: object, want: object) -> bool:
        if self.compare is not None:
            try:
                return bool(self.compare(got, want))
            except Exception:
                return False
        return _same(got, want, self.atol, self.rtol)

    def diagnose(self, got: object, want: object, case: Case) -> str:
        """The hint of the first mistake that explains ``got``, else what differs."""
        fields = _fields(case, got, want)
        for mistake in () if case.hint else self.mistakes:
            if mistake.raises is not None:
                continue
            if mistake.when is not None:
                if _holds(mistake.when, fields):
                    return _format(mistake.hint, fields)
                continue
            for wrong in mistake.wrong:
                try:
                    theirs = _numbers_like(self.observe(wrong, **copy.deepcopy(case.inputs)), want)
                except Exception:  # this mistake cannot even run on these inputs
                    continue
                if not self.same(theirs, want) and self.same(got, theirs):
                    return _format(mistake.hint, fields)
        names = ([_format(r, fields) for r in self.returns] if isinstance(self.returns, (list, tuple))
                 else _format(self.returns, fields))
        text = _describe(got, want, names, case.where, self.atol, self.rtol)
        otherwise = case.hint or case.otherwise or self.otherwise
        return f"{text}. {_format(otherwise, fields)}" if otherwise else text


def _call_in_order(fn: Callable[..., object], **inputs: object) -> object:
    return fn(*inputs.values())


@contextlib.contextmanager
def _global_rng_kept() -> Iterator[None]:
    """Put the global generators of torch (CPU), ``random`` and NumPy back as they were."""
    states = torch.random.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


def _fields(case: Case, got: object, want: object) -> dict[str, object]:
    return {**case.inputs, "where": case.where, "got": got, "want": want, "got_type": type(got).__name__}


def _holds(predicate: Callable[..., object], fields: Mapping[str, object]) -> bool:
    try:
        return bool(_call_with(predicate, fields))
    except Exception:  # e.g. got[1] of an answer that is not a pair
        return False


def _call_with(fn: Callable[..., Any], fields: Mapping[str, object]) -> Any:
    """Call ``fn`` with the fields its parameters name (all of them for ``**kwargs``)."""
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return fn(**fields)
    missing = [p.name for p in params if p.name not in fields and p.default is p.empty]
    if missing:  # a bug in the checker, not in the learner's answer: fail loudly
        raise TypeError(f"{fn} asks for fields {missing}; there are {sorted(fields)}")
    return fn(**{p.name: fields[p.name] for p in params if p.name in fields})


class _HintFormatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        return super().format_field(tuple(value) if isinstance(value, torch.Size) else value, format_spec)


def _format(hint: str | Callable[..., str], fields: Mapping[str, object]) -> str:
    return _call_with(hint, fields) if callable(hint) else _HintFormatter().vformat(hint, (), fields)


# --------------------------------------------------------------------------------------------
# Comparing answers, and saying what differs
# --------------------------------------------------------------------------------------------


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _numbers_like(got: object, want: object) -> object:
    """Where ``want`` holds a Python number, accept a NumPy scalar or a one-element tensor."""
    if _is_number(want) and (isinstance(got, np.generic) or (isinstance(got, Tensor) and got.numel() == 1)):
        return got.item()
    if isinstance(want, (tuple, list)) and isinstance(got, (tuple, list)) and len(got) == len(want):
        return type(got)(_numbers_like(g, w) for g, w in zip(got, want))
    return got


def _same_kind(a: torch.dtype, b: torch.dtype) -> bool:
    """Floating dtypes match each other; integer and boolean ones only themselves."""
    return a == b or (a.is_floating_point and b.is_floating_point)


def _same(got: object, want: object, atol: float, rtol: float) -> bool:
    if isinstance(want, Tensor):
        if not (isinstance(got, Tensor) and got.shape == want.shape and _same_kind(got.dtype, want.dtype)):
            return False
        return close(got, want, atol, rtol) if want.is_floating_point() else bool(torch.equal(got, want))
    if isinstance(want, (tuple, list)):
        return (isinstance(got, (tuple, list)) and len(got) == len(want)
                and all(_same(g, w, atol, rtol) for g, w in zip(got, want)))
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and all(k in got and _same(got[k], w, atol, rtol) for k, w in want.items())
    if _is_number(want):
        if not _is_number(got):
            return False
        return got == want if isinstance(want, numbers.Integral) else abs(got - want) <= atol + rtol * abs(want)
    return bool(got == want)


def _unchanged(now: object, before: object) -> bool:
    """``now`` holds what ``before`` held: same tensors, parameters and buffers, same values."""
    if isinstance(before, Tensor):
        return (isinstance(now, Tensor) and now.shape == before.shape and now.dtype == before.dtype
                and bool(torch.equal(now, before)))
    if isinstance(before, torch.nn.Module):
        return _unchanged(now.state_dict(), before.state_dict())
    if isinstance(before, Mapping):
        return now.keys() == before.keys() and all(_unchanged(now[k], v) for k, v in before.items())
    if isinstance(before, (list, tuple)):
        return len(now) == len(before) and all(_unchanged(n, b) for n, b in zip(now, before))
    return bool(now == before)


def _brief(x: object) -> str:
    if isinstance(x, Tensor):
        return str(tuple(x.shape))
    if isinstance(x, torch.nn.Module):
        return type(x).__name__
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _show(x: object) -> str:
    """A value as a learner would write it: 1,050,624; 0.0123; [1, 2]; (2, 8, 5, 64)."""
    if isinstance(x, bool) or not _is_number(x):
        if isinstance(x, (tuple, list)):
            inner = ", ".join(_show(v) for v in x)
            return f"({inner}{',' if len(x) == 1 else ''})" if isinstance(x, tuple) else f"[{inner}]"
        return repr(x)
    return f"{x:,}" if isinstance(x, numbers.Integral) else f"{x:.4g}"


def _describe(got: object, want: object, names: str | list[str], where: str, atol: float, rtol: float) -> str:
    """What differs between ``got`` and ``want``, in words: type, shape, dtype or entries."""
    if isinstance(names, list):  # a tuple of results, one name each
        if not isinstance(got, (tuple, list)) or len(got) != len(names):
            what = f"{len(got)} values" if isinstance(got, (tuple, list)) else type(got).__name__
            return f"your function should return {len(names)} values ({', '.join(names)}), got {what}"
        for g, w, n in zip(got, want, names):
            if not _same(g, w, atol, rtol):
                return _describe(g, w, n, where, atol, rtol)
    label = f"{names} {where}".strip()
    if isinstance(want, Tensor):
        if not isinstance(got, Tensor):
            return f"{label} should be a torch.Tensor, got {type(got).__name__}"
        if got.shape != want.shape:
            return f"{label} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if not _same_kind(got.dtype, want.dtype):
            return f"{label} has dtype {got.dtype}, expected {want.dtype}"
        return _entries(got, want, label, atol, rtol)
    if isinstance(want, Mapping):
        if not isinstance(got, Mapping):
            return f"{label} should be a dict, got {type(got).__name__}"
        missing = [k for k in want if k not in got]
        if missing:
            return f"{label} lacks the keys {missing}"
        key = next(k for k, w in want.items() if not _same(got[k], w, atol, rtol))
        return _describe(got[key], want[key], f"{names}[{key!r}]", where, atol, rtol)
    if _is_number(want) and not _is_number(got):
        return f"{label} should be a number, got {type(got).__name__}"
    return f"{label} is {_show(got)}, expected {_show(want)}"


def _entries(got: Tensor, want: Tensor, label: str, atol: float, rtol: float) -> str:
    """Which entries of two tensors of one shape differ, and by how much."""
    if want.dim() == 0:
        return f"{label} is {_show(got.item())}, expected {_show(want.item())}"
    g, w = got.double(), want.double()
    if want.is_floating_point():
        bad = ~torch.isclose(g, w, rtol=rtol, atol=atol)
        broken = ~torch.isfinite(g) & torch.isfinite(w)
        if broken.any():
            at = [int(i) for i in broken.nonzero()[0]]
            return (f"{label} contains inf or NaN in {int(broken.sum())} of {want.numel()} entries, "
                    f"the first at {at}")
    else:
        bad = g != w
    at = [int(i) for i in bad.nonzero()[0]]
    by = f", by up to {float((g - w).abs()[bad].max()):.3g}" if want.is_floating_point() else ""
    return (f"{label} differs from the right answer in {int(bad.sum())} of {want.numel()} entries{by}; "
            f"the first is at {at}: {_show(got[tuple(at)].item())} instead of {_show(want[tuple(at)].item())}")
