"""The engine that runs every checker; how to declare one is in the package docstring.

The learner's function and the reference get their own deep copies of the inputs. An input the
learner changes in place is rejected even when the result is right: the caller's tensor would
change too, so the next call would see other numbers (only ``may_modify`` inputs may change)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import numbers
import random
import re
import string
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor


class ExerciseError(AssertionError):
    """A wrong answer; the message names the likely mistake first, then the fix."""

    def _render_traceback_(self) -> list[str]:
        """For IPython: one sentence per line, after the learner's traceback if their code crashed
        (without the engine's frames)."""
        lines, cause = [], self.__cause__
        if cause is not None:
            tb = cause.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next
            lines += "".join(traceback.format_exception(type(cause), cause, tb)).splitlines()
            lines += ["", "The checker says:"]
        first, *rest = re.split(r"(?<=\.)\s+(?=[A-Z`])|(?<=;)\s+", str(self))
        return lines + [f"ExerciseError: {first}"] + [f"    {s}" for s in rest]


class NotAttempted(Exception):
    """The learner's stub still raises ``NotImplementedError``."""


class Case:
    """One call of the learner's function, ``inputs`` in the order given; ``where`` says it in
    words. ``otherwise`` follows a difference no mistake explains; ``hint`` follows any
    difference, the mistakes unasked (for a case that only checks that nothing is hard-wired)."""

    def __init__(
        self,
        where: str = "",
        /,
        *,
        otherwise: str | None = None,
        hint: str | None = None,
        **inputs: object,
    ) -> None:
        self.where, self.otherwise, self.hint, self.inputs = where, otherwise, hint, inputs


@dataclass(frozen=True)
class Mistake:
    """A row of a mistakes table (:func:`like`, :func:`when`, :func:`raises`). ``hint`` is a format
    string over ``got``, ``want``, ``got_type``, ``where`` and the inputs (a ``torch.Size`` prints
    as a tuple), or a function of those fields by name."""

    hint: str | Callable[..., str]
    wrong: tuple[Callable[..., Any], ...] = ()
    when: Callable[..., Any] | None = None
    raises: type[BaseException] | None = None


def hard_wired(what: str) -> str:
    """The hint of a case that differs from the first only in what a learner could hard-wire
    (sizes, the pad id, the vocabulary): ``Case(..., hint=hard_wired("the sizes"))``."""
    return (
        f"Your answer is right for the first case but not for this one: does it hard-wire {what}?"
    )


def like(
    wrong: Callable[..., Any] | Sequence[Callable[..., Any]], hint: str | Callable[..., str]
) -> Mistake:
    """The answer equals that of ``wrong`` (or of any in a list), a wrong implementation with the
    learner's signature; skipped on a case where it crashes or gives the right answer."""
    return Mistake(hint, wrong=(wrong,) if callable(wrong) else tuple(wrong))


def when(predicate: Callable[..., Any], hint: str | Callable[..., str]) -> Mistake:
    """``predicate``, of any hint fields by name, holds for a wrong answer; one that raises does
    not hold."""
    return Mistake(hint, when=predicate)


def raises(exception: type[BaseException], hint: str | Callable[..., str]) -> Mistake:
    """The learner's function raised ``exception``; ``hint`` follows the error message."""
    return Mistake(hint, raises=exception)


def checker(
    name: str,
    *,
    reference: Callable[..., Any],
    mistakes: Sequence[Mistake] = (),
    returns: str | Sequence[str] = "the result",
    otherwise: str | None = None,
    observe: Callable[..., Any] | None = None,
    may_modify: Sequence[str] = (),
    compare: Callable[[Any, Any], bool] | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> Callable[[Callable[..., Sequence[Case]]], Callable[..., None]]:
    """Turn the function that returns the :class:`Case` list (of a seeded ``torch.Generator``, or
    of nothing) into the checker ``check_xxx(fn)``, with its name and docstring. The checker
    prints ``Correct: <name>.`` or ``Not attempted yet: <name>. ...``; for a wrong answer it raises
    :class:`ExerciseError` with the hint of the first mistake that matches.

    Args:
        name: what the exercise builds, for the verdict line.
        reference: the right answer, with the learner's signature.
        mistakes: the known mistakes, most specific first.
        returns: what the result is called (a tuple of names for a tuple), format strings over
            the inputs such as ``"causal_mask({size})"``; the case's ``where`` follows.
        otherwise: the default of the cases' ``otherwise``.
        observe: ``observe(fn, **inputs)`` runs any implementation and returns what is compared;
            by default ``fn(*inputs)``.
        may_modify: the inputs the function is meant to write into.
        compare: ``compare(got, want) -> bool``; by default floating tensors within
            ``atol + rtol * |want|``, other tensors and ints equal, containers element-wise.
    """

    def decorate(build: Callable[..., Sequence[Case]]) -> Callable[..., None]:
        spec = _Spec(
            build,
            reference,
            tuple(mistakes),
            returns,
            otherwise,
            observe,
            frozenset(may_modify),
            compare,
            atol,
            rtol,
        )

        def check(fn: Callable[..., Any]) -> None:
            try:
                with _global_rng_kept(), torch.no_grad():
                    for case in spec.cases():
                        spec.run(fn, case)
            except NotAttempted:
                print(
                    f"Not attempted yet: {name}. Replace the `raise NotImplementedError` in the "
                    "stub with your code and run this cell again."
                )
                return
            print(f"Correct: {name}.")

        for attr in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(check, attr, getattr(build, attr))
        param = inspect.Parameter("fn", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        vars(check).update(__signature__=inspect.Signature([param]), name=name, spec=spec)
        return check

    return decorate


def close(a: Tensor, b: Tensor, atol: float = 1e-5, rtol: float = 1e-4) -> bool:
    """``a`` is within ``atol + rtol * |b|`` of ``b`` (NaN never is). Raises ``ValueError`` for
    different shapes, so that a predicate comparing values does not hold, either way round."""
    if a.shape != b.shape:
        raise ValueError(f"cannot compare shapes {tuple(a.shape)} and {tuple(b.shape)}")
    return bool(torch.allclose(a.double(), b.double(), atol=atol, rtol=rtol))


def seeded(seed: int, build: Callable[[], Any]) -> Any:
    """``build()`` with torch's global generator seeded (module initialisation draws from it),
    then put back as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


_IN_PLACE = (
    "your function changed its argument `{}` in place (with `/=`, `+=`, an indexed "
    "assignment or a method ending in `_` such as `masked_fill_`): the caller's data "
    "changes too, so the next call with it gets another answer. Leave the inputs alone "
    "and compute new tensors (`x = x / c` rather than `x /= c`, `masked_fill` rather "
    "than `masked_fill_`)."
)


@dataclass
class _Spec:
    build: Callable[..., Sequence[Case]]
    reference: Callable[..., Any]
    mistakes: tuple[Mistake, ...]
    returns: str | Sequence[str]
    otherwise: str | None
    observe: Callable[..., Any] | None
    may_modify: frozenset[str]
    compare: Callable[[Any, Any], bool] | None
    atol: float
    rtol: float

    def same(self, got: Any, want: Any) -> bool:
        if self.compare:
            return _call_with(self.compare, {"got": got, "want": want}, predicate=True)
        return _same(got, want, self.atol, self.rtol)

    def cases(self) -> Sequence[Case]:
        if inspect.signature(self.build).parameters:
            return self.build(torch.Generator().manual_seed(0))
        return self.build()

    def call(self, fn: Callable[..., Any], inputs: dict[str, Any], want: Any = None) -> Any:
        got = self.observe(fn, **inputs) if self.observe else fn(*inputs.values())
        return got if want is None else _numbers_like(got, want)

    def run(self, fn: Callable[..., Any], case: Case) -> None:
        """Raise :class:`ExerciseError` unless ``fn`` answers ``case`` right, inputs untouched."""
        given = copy.deepcopy(case.inputs)  # the learner's copy: case.inputs stay pristine
        try:
            got = self.call(fn, given)
        except NotImplementedError:
            raise NotAttempted from None
        except ExerciseError:  # an observe adapter found a malformed answer
            raise
        except Exception as exc:  # the learner's code crashed: say how, and on what
            hints = [m.hint for m in self.mistakes if m.raises and isinstance(exc, m.raises)]
            hint = (
                _format(hints[0], _fields(case))
                if hints
                else "The traceback above shows the line; a shape mismatch is the usual cause."
            )
            inputs = ", ".join(f"{n} {_brief(x)}" for n, x in case.inputs.items())
            where = f"{case.where}: " if case.where else ""
            raise ExerciseError(
                f"your function raised {type(exc).__name__}: {exc} ({where}{inputs}). {hint}"
            ) from exc
        want = self.call(self.reference, copy.deepcopy(case.inputs))
        got = _numbers_like(got, want)
        changed = [
            n
            for n, x in case.inputs.items()
            if n not in self.may_modify and not _unchanged(given[n], x)
        ]
        right = self.same(got, want)
        if right and not changed:
            return
        hint = "Apart from that, your answer is right." if right else self.diagnose(got, want, case)
        if changed:
            hint = (
                _IN_PLACE.format(changed[0])
                + (" " if right else " Compared with the right answer: ")
                + hint
            )
        raise ExerciseError(hint)

    def diagnose(self, got: Any, want: Any, case: Case) -> str:
        """The hint of the first mistake that explains ``got``, else what differs."""
        fields = _fields(case, got, want)
        for m in () if case.hint else self.mistakes:
            if (
                m.when is not None
                and _call_with(m.when, fields, predicate=True)
                or any(self._shows(wrong, got, want, case) for wrong in m.wrong)
            ):
                return _format(m.hint, fields)
        names = self.returns if isinstance(self.returns, str) else list(self.returns)
        text = _describe(got, want, _format(names, fields), case.where, self.atol, self.rtol)
        advice = case.hint or case.otherwise or self.otherwise
        return f"{text}. {_format(advice, fields)}" if advice else text

    def _shows(self, wrong: Callable[..., Any], got: Any, want: Any, case: Case) -> bool:
        """``wrong`` gives ``got`` on this case, and that is not the right answer."""
        try:
            theirs = self.call(wrong, copy.deepcopy(case.inputs), want)
        except Exception:  # this mistake cannot even run on these inputs
            return False
        return not self.same(theirs, want) and self.same(got, theirs)


@contextlib.contextmanager
def _global_rng_kept() -> Iterator[None]:
    states = torch.random.get_rng_state(), random.getstate(), np.random.get_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(states[0])
        random.setstate(states[1])
        np.random.set_state(states[2])


def _fields(case: Case, got: Any = None, want: Any = None) -> dict[str, Any]:
    return {
        **case.inputs,
        "where": case.where,
        "got": got,
        "want": want,
        "got_type": type(got).__name__,
    }


def _call_with(fn: Callable[..., Any], fields: Mapping[str, Any], predicate: bool = False) -> Any:
    """Call ``fn`` with the fields its parameters name; one that does not exist is a bug in the
    checker and fails loudly. A ``predicate`` that raises does not hold (``got[1]`` of an answer
    that is no pair)."""
    params = inspect.signature(fn).parameters.values()
    if missing := [p.name for p in params if p.name not in fields and p.default is p.empty]:
        raise TypeError(f"{fn} asks for {missing}; the fields are {sorted(fields)}")
    try:
        answer = fn(**{p.name: fields[p.name] for p in params if p.name in fields})
        return bool(answer) if predicate else answer
    except Exception:
        if predicate:
            return False
        raise


class _Formatter(string.Formatter):
    def format_field(self, value: Any, format_spec: str) -> str:
        return super().format_field(
            tuple(value) if isinstance(value, torch.Size) else value, format_spec
        )


def _format(hint: str | Sequence[str] | Callable[..., str], fields: Mapping[str, Any]) -> Any:
    if callable(hint):
        return _call_with(hint, fields)
    if isinstance(hint, str):
        return _Formatter().vformat(hint, (), fields)
    return [_format(h, fields) for h in hint]


# -- comparing answers, and saying what differs ----------------------------------------------


def _is_number(x: Any) -> bool:
    return isinstance(x, numbers.Number) and not isinstance(x, bool)


def _numbers_like(got: Any, want: Any) -> Any:
    """Where ``want`` is a Python number, a NumPy scalar or one-element tensor stands for one."""
    one = isinstance(got, np.generic) or isinstance(got, Tensor) and got.numel() == 1
    if _is_number(want) and one:
        return got.item()
    if isinstance(want, (tuple, list)) and isinstance(got, (tuple, list)) and len(got) == len(want):
        return type(got)(_numbers_like(g, w) for g, w in zip(got, want, strict=True))
    return got


def _unchanged(now: Any, before: Any) -> bool:
    if isinstance(before, torch.Generator):  # drawing from a generator is what it is for
        return True
    if isinstance(before, torch.nn.Module):
        now, before = now.state_dict(), before.state_dict()
    if isinstance(before, Tensor):
        same_kind = (now.shape, now.dtype) == (before.shape, before.dtype)
        return same_kind and bool(torch.equal(now, before))
    if isinstance(before, Mapping):
        return now.keys() == before.keys() and all(_unchanged(now[k], v) for k, v in before.items())
    if isinstance(before, (list, tuple)):
        return len(now) == len(before) and all(
            _unchanged(n, b) for n, b in zip(now, before, strict=True)
        )
    return bool(now == before)


def _brief(x: Any) -> str:
    if isinstance(x, (Tensor, torch.nn.Module)):
        return str(tuple(x.shape)) if isinstance(x, Tensor) else type(x).__name__
    return repr(x) if len(repr(x)) <= 40 else repr(x)[:37] + "..."


def _show(x: Any) -> str:
    """A value as a learner writes it: 1,050,624; 0.0123; (2, 8, 5, 64)."""
    if isinstance(x, (tuple, list)):
        inner = ", ".join(map(_show, x)) + ("," if len(x) == 1 and isinstance(x, tuple) else "")
        return f"({inner})" if isinstance(x, tuple) else f"[{inner}]"
    if not _is_number(x):
        return repr(x)
    return f"{x:,}" if isinstance(x, numbers.Integral) else f"{x:.4g}"


def _describe(
    got: Any, want: Any, names: str | list[str], where: str, atol: float, rtol: float
) -> str:
    """What differs between ``got`` and ``want`` (a tuple of results if ``names`` is a list)."""
    if isinstance(names, str):
        names, got, want = [names], [got], [want]
    elif not isinstance(got, (tuple, list)) or len(got) != len(names):
        what = f"{len(got)} values" if isinstance(got, (tuple, list)) else type(got).__name__
        count = "a pair" if len(names) == 2 else f"a tuple of {len(names)}"
        return f"your function should return {count} ({', '.join(names)}), got {what}"
    texts = (
        _difference(g, w, f"{n} {where}".strip(), atol, rtol)
        for g, w, n in zip(got, want, names, strict=True)
    )
    # none when only the checker's own compare tells them apart
    return next((t for t in texts if t), f"your answer differs from the right one {where}".strip())


def _difference(got: Any, want: Any, label: str, atol: float, rtol: float) -> str | None:
    """What differs between ``got`` and ``want``, in words, or None if :func:`_same`."""
    if isinstance(want, Tensor):
        if not isinstance(got, Tensor):
            return f"{label} should be a torch.Tensor, got {type(got).__name__}"
        if got.shape != want.shape:
            return f"{label} has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
        if got.dtype != want.dtype and not (got.is_floating_point() and want.is_floating_point()):
            return f"{label} has dtype {got.dtype}, expected {want.dtype}"
        return _entries(got, want, label, atol, rtol)
    if _is_number(want) and not _is_number(got):
        return f"{label} should be a number, got {type(got).__name__}"
    if (
        _is_number(want)
        and isinstance(want, numbers.Integral)
        and not isinstance(got, numbers.Integral)
    ):
        return f"{label} is {_show(got)}, a {type(got).__name__}: return an int"
    if _same(got, want, atol, rtol):
        return None
    return f"{label} is {_show(got)}, expected {_show(want)}"


def _same(got: Any, want: Any, atol: float, rtol: float) -> bool:
    """Floating tensors within ``atol + rtol * |want|``, other tensors and integers equal (dtype
    included), containers element by element."""
    if isinstance(want, Tensor):
        return _difference(got, want, "", atol, rtol) is None
    if isinstance(want, (tuple, list)):
        return (
            isinstance(got, (tuple, list))
            and len(got) == len(want)
            and all(_same(g, w, atol, rtol) for g, w in zip(got, want, strict=True))
        )
    if isinstance(want, Mapping):
        return isinstance(got, Mapping) and all(
            k in got and _same(got[k], w, atol, rtol) for k, w in want.items()
        )
    if _is_number(want) and isinstance(want, numbers.Integral):
        # a count is an int: 8.0 for 8 is a different answer (a float that happened to be whole)
        return _is_number(got) and isinstance(got, numbers.Integral) and got == want
    if _is_number(want):
        return _is_number(got) and abs(got - want) <= atol + rtol * abs(want)
    return bool(got == want)


def _entries(got: Tensor, want: Tensor, label: str, atol: float, rtol: float) -> str | None:
    """Which entries of two tensors of one shape differ, and by how much (None if none do)."""
    g, w, floating = got.double(), want.double(), want.is_floating_point()
    if floating and (~torch.isfinite(g) & torch.isfinite(w)).any():
        bad = ~torch.isfinite(g) & torch.isfinite(w)
        return (
            f"{label} holds inf or NaN in {int(bad.sum())} of {bad.numel()} entries, the first "
            f"at {bad.nonzero()[0].tolist()}"
        )
    bad = ~torch.isclose(g, w, rtol=rtol, atol=atol) if floating else got != want
    if not bad.any():
        return None
    by = f", by up to {float((g - w).abs()[bad].max()):.3g}" if floating else ""
    at = tuple(bad.nonzero()[0].tolist())
    shown = _show(got[at].item()), _show(want[at].item())
    return (
        f"{label} differs from the right answer in {int(bad.sum())} of {bad.numel()} "
        f"entries{by}; the first at {list(at)}: {shown[0]} instead of {shown[1]}"
    )
