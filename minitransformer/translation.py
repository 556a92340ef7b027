"""A real translation task, generated offline: English number, date and amount expressions in
German (or French).

The paper's results are translations, scored with BLEU. This module makes a narrow but real
language pair that trains on a CPU in about a minute. The target side is written by two
libraries that encode each language's own rules, so nothing is downloaded:

* **numbers** by ``num2words``: "twenty-three" -> "dreiundzwanzig", where the ones come before
  the tens (the alignment crosses), and "three hundred and forty-two" -> one closed compound,
  "dreihundertzweiundvierzig";
* **dates** by ``babel`` from CLDR, the Unicode locale data operating systems use, in its
  ``full`` and ``long`` formats: "Monday, March 1, 2021" -> "Montag, 1. März 2021", a
  different order and a different form of the day;
* **amounts** in euros by ``num2words``: "twenty-three euro, fifty cents" ->
  "dreiundzwanzig Euro und fünfzig Cent", several words on both sides.

The strings are those of the installed ``num2words`` and ``babel`` (``requirements.lock`` pins
them); another version of CLDR may word a date differently.

**Splits are disjoint by construction.** Each kind's domain (the numbers 0 .. 99,999, the days
of 1900 .. 2099, the amounts 0.01 .. 999.99 EUR) is cut into blocks: 100 consecutive numbers,
one calendar month, one euro. Block ``b`` goes to ``"test"`` if ``b % 20 == 0``, to
``"valid"`` if ``b % 20 == 1``, else to ``"train"``: whole ranges are held out (the test set
has 2,000 .. 2,099, and the model never sees any of them), and no value, so no source
sentence, is in two splits. :func:`translation_pairs` draws a split's pairs without
replacement, deterministically from a seed.

**Tokenisation: characters** (:class:`CharVocab`), not the lm chapter's BPE. German writes a
number as one word, so a word- or subword-level model must learn each compound as a unit, or
BPE pieces learned from this tiny corpus; characters let the model spell "drei" + "und" +
"zwanzig" from the parts it has seen, with a vocabulary of about 60 symbols per side.
"""

from __future__ import annotations

import datetime
import random
from collections.abc import Iterable, Iterator, Sequence
from decimal import Decimal
from typing import Any

import torch

from minitransformer._checks import positive_int
from minitransformer.data import BOS_ID, EOS_ID, FIRST_TOKEN, PAD_ID, Batch

__all__ = [
    "KINDS",
    "LANGUAGES",
    "SPLITS",
    "DATE_FORMATS",
    "number_text",
    "date_text",
    "amount_text",
    "split_of",
    "domain",
    "translation_pairs",
    "CharVocab",
    "make_translation_batch",
]

KINDS = ("number", "date", "amount")
LANGUAGES = ("de", "fr")  # targets; the source is English
SPLITS = ("train", "valid", "test")
DATE_FORMATS = ("full", "long")  # CLDR's worded formats ("medium" and "short" are digits)

NUMBER_MAX = 99_999
FIRST_YEAR, LAST_YEAR = 1900, 2099
AMOUNT_MAX_CENTS = 99_999  # 999.99 EUR
_BLOCKS = 20  # block b: test if b % 20 == 0, valid if b % 20 == 1, else train


def _choice(name: str, value: object, options: Sequence[str]) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, one of {', '.join(options)}; got {value!r}")
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(options)}, got {value!r}")
    return value


def _int_in(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low:,}, {high:,}], got {value:,}")
    return value


def number_text(n: int, lang: str = "en") -> str:
    """``n`` (0 .. 99,999) in words: ``number_text(23, "de") == "dreiundzwanzig"``."""
    from num2words import num2words

    return str(num2words(_int_in("n", n, 0, NUMBER_MAX), lang=_choice("lang", lang, _LANGS)))


def date_text(day: datetime.date, lang: str = "en", fmt: str = "full") -> str:
    """``day`` in CLDR's ``full`` or ``long`` format for ``lang``:
    ``date_text(date(2021, 3, 1), "de") == "Montag, 1. März 2021"``."""
    from babel.dates import format_date

    if not isinstance(day, datetime.date) or isinstance(day, datetime.datetime):
        raise TypeError(f"day must be a datetime.date, got {type(day).__name__}")
    _int_in("day.year", day.year, FIRST_YEAR, LAST_YEAR)
    fmt = _choice("fmt", fmt, DATE_FORMATS)
    return str(format_date(day, format=fmt, locale=_choice("lang", lang, _LANGS)))


def amount_text(cents: int, lang: str = "en") -> str:
    """An amount of euros, given in cents (1 .. 99,999), in words:
    ``amount_text(2350, "de") == "dreiundzwanzig Euro und fünfzig Cent"``."""
    from num2words import num2words

    cents = _int_in("cents", cents, 1, AMOUNT_MAX_CENTS)
    value = Decimal(cents) / 100  # exact: no binary rounding of 0.29
    lang = _choice("lang", lang, _LANGS)
    return str(num2words(value, to="currency", lang=lang, currency="EUR"))


_LANGS = ("en", *LANGUAGES)


def _block(kind: str, value: object) -> int:
    """The block of ``value``: 100 numbers, one calendar month, one euro (100 cents)."""
    if kind == "date":
        if not isinstance(value, datetime.date) or isinstance(value, datetime.datetime):
            raise TypeError(f"value must be a datetime.date for dates, got {type(value).__name__}")
        return value.year * 12 + value.month - 1
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"value must be an int for {kind}s, got {type(value).__name__}")
    return value // 100


def split_of(kind: str, value: int | datetime.date) -> str:
    """Which split ``value`` (a number, a date, or an amount in cents) belongs to."""
    b = _block(_choice("kind", kind, KINDS), value) % _BLOCKS
    return "test" if b == 0 else "valid" if b == 1 else "train"


def domain(kind: str, split: str) -> list[int] | list[datetime.date]:
    """Every value of ``kind`` in ``split``, in order."""
    kind, split = _choice("kind", kind, KINDS), _choice("split", split, SPLITS)
    values: Iterable[int | datetime.date]
    if kind == "number":
        values = range(NUMBER_MAX + 1)
    elif kind == "amount":
        values = range(1, AMOUNT_MAX_CENTS + 1)
    else:
        first = datetime.date(FIRST_YEAR, 1, 1).toordinal()
        last = datetime.date(LAST_YEAR, 12, 31).toordinal()
        values = (datetime.date.fromordinal(d) for d in range(first, last + 1))
    return [v for v in values if split_of(kind, v) == split]  # type: ignore[return-value]


def translation_pairs(
    n: int,
    *,
    split: str,
    seed: int,
    kinds: Sequence[str] = KINDS,
    lang: str = "de",
) -> list[tuple[str, str]]:
    """``n`` (English, ``lang``) pairs from ``split``, the kinds in turn (``kinds[i % k]``),
    each kind's values drawn without replacement from its part of the split with
    ``random.Random(seed)``: the same pairs on every machine. A date gets the ``full`` or the
    ``long`` format, drawn too, the same on both sides."""
    n = positive_int("n", n)
    split, lang = _choice("split", split, SPLITS), _choice("lang", lang, LANGUAGES)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if isinstance(kinds, str) or not kinds:
        raise TypeError(f"kinds must be a non-empty sequence of kinds, got {kinds!r}")
    kinds = [_choice("kinds[]", k, KINDS) for k in kinds]
    rng = random.Random(seed)
    counts = {k: sum(1 for i in range(n) if kinds[i % len(kinds)] == k) for k in set(kinds)}
    drawn: dict[str, Iterator[Any]] = {}
    for kind in sorted(counts):
        values = domain(kind, split)
        if counts[kind] > len(values):
            raise ValueError(
                f"n={n} asks for {counts[kind]:,} {kind} pairs; the {split} split has "
                f"{len(values):,}"
            )
        drawn[kind] = iter(rng.sample(values, counts[kind]))
    pairs = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        value = next(drawn[kind])
        if kind == "number":
            pairs.append((number_text(value), number_text(value, lang)))
        elif kind == "amount":
            pairs.append((amount_text(value), amount_text(value, lang)))
        else:
            fmt = rng.choice(DATE_FORMATS)
            pairs.append((date_text(value, "en", fmt), date_text(value, lang, fmt)))
    return pairs


class CharVocab:
    """Characters as token ids, in :mod:`minitransformer.data`'s layout: ``PAD_ID``,
    ``BOS_ID``, ``EOS_ID``, then one id per character of ``texts``, in sorted order.

    ``encode`` refuses a character it has not seen (naming it); ``decode`` stops at the first
    ``EOS_ID`` and leaves out ``PAD_ID`` and ``BOS_ID``.
    """

    def __init__(self, texts: Iterable[str]) -> None:
        if isinstance(texts, str) or not hasattr(texts, "__iter__"):
            raise TypeError(f"texts must be an iterable of str, got {type(texts).__name__}")
        chars: set[str] = set()
        for i, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] must be a str, got {type(text).__name__}")
            chars.update(text)
        self.chars = sorted(chars)
        self._id = {c: FIRST_TOKEN + i for i, c in enumerate(self.chars)}

    @property
    def vocab_size(self) -> int:
        """The three special ids and one per character."""
        return FIRST_TOKEN + len(self.chars)

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        unknown = sorted({c for c in text if c not in self._id})
        if unknown:
            raise ValueError(f"text has characters this vocabulary has not seen: {unknown}")
        return [self._id[c] for c in text]

    def decode(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            i = int(i)
            if i == EOS_ID:
                break
            if i in (PAD_ID, BOS_ID):
                continue
            if not FIRST_TOKEN <= i < self.vocab_size:
                raise ValueError(
                    f"ids holds {i}, not an id of this vocabulary [0, {self.vocab_size})"
                )
            out.append(self.chars[i - FIRST_TOKEN])
        return "".join(out)

    def __repr__(self) -> str:
        return f"CharVocab(vocab_size={self.vocab_size})"


def make_translation_batch(
    pairs: Sequence[tuple[str, str]], src_vocab: CharVocab, tgt_vocab: CharVocab
) -> Batch:
    """``pairs`` as one padded :class:`~minitransformer.data.Batch` (``src``, ``tgt_in``,
    ``tgt_out``), in the layout of :func:`~minitransformer.data.make_batch`: ``src`` the
    English characters, ``tgt_in`` ``BOS`` + the target's, ``tgt_out`` the target's + ``EOS``,
    each padded with ``PAD_ID`` to the longest of the batch."""
    if not pairs:
        raise ValueError("pairs must hold at least one (source, target) pair")
    src = [src_vocab.encode(s) for s, _ in pairs]
    tgt = [tgt_vocab.encode(t) for _, t in pairs]
    S, T = max(map(len, src)), max(map(len, tgt)) + 1
    batch = Batch(
        torch.full((len(pairs), S), PAD_ID, dtype=torch.long),
        torch.full((len(pairs), T), PAD_ID, dtype=torch.long),
        torch.full((len(pairs), T), PAD_ID, dtype=torch.long),
    )
    for b, (s, t) in enumerate(zip(src, tgt, strict=True)):
        batch.src[b, : len(s)] = torch.tensor(s, dtype=torch.long)
        batch.tgt_in[b, : len(t) + 1] = torch.tensor([BOS_ID, *t], dtype=torch.long)
        batch.tgt_out[b, : len(t) + 1] = torch.tensor([*t, EOS_ID], dtype=torch.long)
    return batch
