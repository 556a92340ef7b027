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

**Tokenisation.** Two that the course teaches. :func:`translation_tokenizer` learns one
byte-level BPE (the lm chapter's :class:`~minitransformer.tokenizer.BPETokenizer`) from both
sides of the training pairs, a shared vocabulary as in the paper: with 500 tokens a sentence
comes out about 4 times shorter in tokens than in characters (the chapter "A real
translation" shows the pieces), which is what lets that chapter train in under a minute.
:class:`CharVocab` keeps one token per character, the simplest choice, and the one that needs
no training.

:func:`translate` decodes English sentences with a trained model, greedily or with beam
search, and :func:`corpus_scores` scores them with ``sacrebleu`` (BLEU and chrF, with their
signatures) and by exact match.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import random
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from typing import Any, Protocol

import torch
from torch import nn

from minitransformer._checks import finite_float, module, positive_int
from minitransformer.data import BOS_ID, EOS_ID, FIRST_TOKEN, PAD_ID, Batch, strip_special
from minitransformer.decoding import beam_search, greedy_decode
from minitransformer.model import Transformer
from minitransformer.tokenizer import BPETokenizer
from minitransformer.training import (
    LabelSmoothingLoss,
    TrainHistory,
    average_checkpoints,
    make_optimizer,
    train,
)

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
    "SPECIAL_TOKENS",
    "translation_tokenizer",
    "make_translation_batch",
    "translate",
    "TranslationScores",
    "corpus_scores",
    "ngram_matches",
    "brevity_penalty",
    "TranslatorRecipe",
    "Translator",
    "train_translator",
    "score_by_kind",
    "STUDY_PATH",
    "load_study",
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


SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
"""The special tokens of :func:`translation_tokenizer`, at ids ``PAD_ID``, ``BOS_ID``,
``EOS_ID``."""


class _Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def translation_tokenizer(pairs: Sequence[tuple[str, str]], vocab_size: int = 500) -> BPETokenizer:
    """One byte-level BPE learned from both sides of ``pairs`` (the training split's), with
    ``vocab_size`` tokens in all: :data:`SPECIAL_TOKENS` at ids 0, 1, 2 (``PAD_ID``,
    ``BOS_ID``, ``EOS_ID``), the 256 bytes, then the merges. One vocabulary for both
    languages, as the paper shares one between English and German (section 5.1): digits,
    names and punctuation that the two sides have in common get the same ids."""
    given: object = pairs  # checked at run time, whatever the annotation promises
    if isinstance(given, str) or not pairs:
        raise ValueError("pairs must hold at least one (English, target) pair")
    texts: list[str] = []
    for i, pair in enumerate(pairs):
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise TypeError(f"pairs[{i}] must be a (source, target) tuple of str, got {pair!r}")
        texts.extend(pair)
    return BPETokenizer.train(texts, vocab_size, special_tokens=SPECIAL_TOKENS)


def make_translation_batch(
    pairs: Sequence[tuple[str, str]], src_vocab: _Tokenizer, tgt_vocab: _Tokenizer
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


def translate(
    model: nn.Module,
    sources: Sequence[str],
    tokenizer: _Tokenizer,
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    batch_size: int = 256,
) -> list[str]:
    """``sources`` (English) translated by the encoder-decoder ``model``, in eval mode: greedy
    for ``beam_size=1``, else :func:`~minitransformer.decoding.beam_search` with
    ``length_penalty`` (the paper's beam 4, alpha 0.6). Outputs stop at EOS or at the paper's
    limit, the input's length + 50 tokens (or the model's ``max_len`` positions, if fewer).
    ``tokenizer`` encodes the sources and decodes the
    outputs (one vocabulary for both sides, :func:`translation_tokenizer`)."""
    module("model", model)
    if isinstance(sources, str):
        raise TypeError("sources must be a sequence of str, not one str")
    beam_size = positive_int("beam_size", beam_size)
    batch_size = positive_int("batch_size", batch_size)
    length_penalty = finite_float("length_penalty", length_penalty)
    out: list[str] = []
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(sources), batch_size):
            chunk = [(s, "") for s in sources[start : start + batch_size]]
            batch = make_translation_batch(chunk, tokenizer, tokenizer)
            src, src_mask = batch.src, batch.src_mask  # (B, S), its padding mask
            # BOS + input length + 50, or as many positions as the model has
            max_len = min(src.shape[1] + 51, getattr(model, "max_len", src.shape[1] + 51))
            if beam_size == 1:
                ids = greedy_decode(model, src, max_len, BOS_ID, EOS_ID, src_mask=src_mask)
            else:
                ids = beam_search(
                    model,
                    src,
                    max_len,
                    BOS_ID,
                    EOS_ID,
                    beam_size=beam_size,
                    length_penalty=length_penalty,
                    src_mask=src_mask,
                )
            out.extend(tokenizer.decode(strip_special(row)) for row in ids)
    finally:
        model.train(was_training)
    return out


@dataclass(frozen=True)
class TranslationScores:
    """Corpus scores of one system output, as :func:`corpus_scores` returns them.

    Attributes:
        bleu: sacrebleu's corpus BLEU, 0 to 100.
        chrf: sacrebleu's corpus chrF (character 6-grams, beta 2), 0 to 100.
        exact: the share of outputs equal to their reference, 0 to 1.
        bleu_signature: sacrebleu's signature of the BLEU settings, to report beside it.
        chrf_signature: the same for chrF.
    """

    bleu: float
    chrf: float
    exact: float
    bleu_signature: str
    chrf_signature: str


def corpus_scores(hypotheses: Sequence[str], references: Sequence[str]) -> TranslationScores:
    """BLEU and chrF of ``hypotheses`` against one reference each, computed by ``sacrebleu``
    with its defaults (BLEU: the ``13a`` tokenizer, exponential smoothing; chrF: character
    6-grams, beta 2), as papers report them, and the exact-match rate."""
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
            raise TypeError(f"{name} must be a sequence of str")
    if len(hypotheses) != len(references) or not hypotheses:
        raise ValueError(
            "hypotheses and references must be non-empty and of the same length, got "
            f"{len(hypotheses)} and {len(references)}"
        )
    # The book extra (pip install ".[book]"); the modules that define the two classes.
    from sacrebleu.metrics.bleu import BLEU
    from sacrebleu.metrics.chrf import CHRF

    bleu, chrf = BLEU(), CHRF()
    hyps, refs = list(hypotheses), [list(references)]
    exact = sum(h == r for h, r in zip(hyps, references, strict=True)) / len(hyps)
    return TranslationScores(
        bleu=bleu.corpus_score(hyps, refs).score,
        chrf=chrf.corpus_score(hyps, refs).score,
        exact=exact,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
    )


def ngram_matches(hypothesis: Sequence[str], reference: Sequence[str], n: int) -> tuple[int, int]:
    """BLEU's clipped ("modified") n-gram counts of one sentence: ``(matches, total)``, where
    ``total`` is the number of ``n``-grams of ``hypothesis`` and ``matches`` counts each of
    them at most as often as it occurs in ``reference`` (Papineni et al., 2002, section
    2.1). Both are lists of tokens; corpus BLEU sums both counts over the sentences."""
    n = positive_int("n", n)
    for name, tokens in (("hypothesis", hypothesis), ("reference", reference)):
        if isinstance(tokens, str) or not all(isinstance(t, str) for t in tokens):
            raise TypeError(f"{name} must be a sequence of str tokens (split the sentence first)")

    def grams(tokens: Sequence[str]) -> dict[tuple[str, ...], int]:
        counts: dict[tuple[str, ...], int] = {}
        for i in range(len(tokens) - n + 1):
            gram = tuple(tokens[i : i + n])
            counts[gram] = counts.get(gram, 0) + 1
        return counts

    hyp, ref = grams(hypothesis), grams(reference)
    return sum(min(c, ref.get(g, 0)) for g, c in hyp.items()), sum(hyp.values())


def brevity_penalty(hyp_len: int, ref_len: int) -> float:
    """BLEU's brevity penalty for a corpus of ``hyp_len`` output tokens against ``ref_len``
    reference tokens: 1 if the output is at least as long, else ``exp(1 - ref_len /
    hyp_len)``, and 0 for an empty output."""
    hyp_len = positive_int("hyp_len", hyp_len, allow_zero=True)
    ref_len = positive_int("ref_len", ref_len, allow_zero=True)
    if hyp_len >= ref_len:
        return 1.0
    return 0.0 if hyp_len == 0 else math.exp(1 - ref_len / hyp_len)


@dataclass(frozen=True)
class TranslatorRecipe:
    """The chapter "A real translation"'s model and training, the paper's recipe at toy
    scale: a post-LN encoder-decoder with tied embeddings, Adam (0.9, 0.98, 1e-9) with the
    warm-up schedule and no decay to zero, label smoothing 0.1, and the average of the last
    ``checkpoints`` checkpoints, written every ``checkpoint_every`` updates (the paper: the
    last 5, every 10 minutes). ``kinds`` are drawn in turn; the shared BPE of
    ``vocab_size`` tokens is learned from the first ``bpe_pairs`` training pairs."""

    steps: int = 600
    batch_size: int = 64
    kinds: tuple[str, ...] = KINDS
    vocab_size: int = 500
    bpe_pairs: int = 20_000
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256
    dropout: float = 0.0
    label_smoothing: float = 0.1
    warmup_steps: int = 60
    scale: float = 0.5
    clip_grad_norm: float = 1.0
    checkpoints: int = 5
    checkpoint_every: int = 25
    valid_pairs: int = 300


@dataclass
class Translator:
    """What :func:`train_translator` returns.

    Attributes:
        model: the weights of the last update, in eval mode.
        averaged: the average of the last ``recipe.checkpoints`` checkpoints, in eval mode.
        tokenizer: the shared BPE of both languages.
        history: the training losses and, every ``checkpoint_every`` updates, the
            validation loss and greedy BLEU on ``recipe.valid_pairs`` validation pairs.
        recipe: the recipe it was trained with.
        seed: the seed of the pairs and of the initial weights.
        batch_shapes: how many training batches had each shape ``(S, T)``, source and
            target length (the cost of a step depends only on its shape).
    """

    model: Transformer
    averaged: Transformer
    tokenizer: BPETokenizer
    history: TrainHistory
    recipe: TranslatorRecipe
    seed: int
    batch_shapes: dict[tuple[int, int], int]


def train_translator(
    recipe: TranslatorRecipe | None = None, *, seed: int = 0, progress: bool = True
) -> Translator:
    """Train an English -> German translator on ``recipe.steps * recipe.batch_size`` pairs
    of the training split drawn with ``seed`` (the model's initial weights come from
    ``torch.manual_seed(seed)``). About 40 s on one CPU thread with the default recipe."""
    recipe = TranslatorRecipe() if recipe is None else recipe
    if not isinstance(recipe, TranslatorRecipe):
        raise TypeError(f"recipe must be a TranslatorRecipe, got {type(recipe).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    r = recipe
    pairs = translation_pairs(r.steps * r.batch_size, split="train", seed=seed, kinds=r.kinds)
    tokenizer = translation_tokenizer(pairs[: r.bpe_pairs], r.vocab_size)
    batches = [
        make_translation_batch(pairs[i : i + r.batch_size], tokenizer, tokenizer)
        for i in range(0, len(pairs), r.batch_size)
    ]
    valid = translation_pairs(r.valid_pairs, split="valid", seed=seed, kinds=r.kinds)
    valid_batch = make_translation_batch(valid, tokenizer, tokenizer)

    def new_model() -> Transformer:
        torch.manual_seed(seed)
        # Positions for the decoder's limit, input length + 50, on any input of the domain
        # (at most about 25 tokens with 500 BPE tokens).
        return Transformer(
            tokenizer.vocab_size,
            tokenizer.vocab_size,
            d_model=r.d_model,
            num_heads=r.num_heads,
            num_layers=r.num_layers,
            d_ff=r.d_ff,
            dropout=r.dropout,
            max_len=256,
        )

    model = new_model()
    optimizer, scheduler = make_optimizer(model, warmup_steps=r.warmup_steps, scale=r.scale)
    kept: list[dict[str, torch.Tensor]] = []

    def checkpoint_and_bleu(m: nn.Module) -> float:
        kept.append({k: v.detach().clone() for k, v in m.state_dict().items()})
        del kept[: -r.checkpoints]
        hyps = translate(m, [s for s, _ in valid], tokenizer)
        return corpus_scores(hyps, [t for _, t in valid]).bleu

    history = train(
        model,
        batches,
        optimizer,
        scheduler,
        LabelSmoothingLoss(r.label_smoothing, ignore_index=PAD_ID),
        clip_grad_norm=r.clip_grad_norm,
        eval_batch=valid_batch,
        eval_fn=checkpoint_and_bleu,
        eval_every=r.checkpoint_every,
        progress=progress,
        desc=f"translator, seed {seed}",
    )
    averaged = new_model()
    averaged.load_state_dict(average_checkpoints(kept))
    shapes: dict[tuple[int, int], int] = {}
    for b in batches:
        shape = (b.src.shape[1], b.tgt_in.shape[1])
        shapes[shape] = shapes.get(shape, 0) + 1
    return Translator(model.eval(), averaged.eval(), tokenizer, history, recipe, seed, shapes)


def score_by_kind(
    model: nn.Module,
    tokenizer: _Tokenizer,
    pairs: Sequence[tuple[str, str]],
    kinds: Sequence[str] = KINDS,
    *,
    beam_size: int = 1,
    length_penalty: float = 0.6,
) -> dict[str, TranslationScores]:
    """:func:`corpus_scores` of ``model``'s translations of ``pairs``, over all of them
    (``"all"``) and for each kind, where ``pairs`` holds the kinds in turn as
    :func:`translation_pairs` draws them (``pairs[k::len(kinds)]`` is ``kinds[k]``)."""
    hyps = translate(
        model, [s for s, _ in pairs], tokenizer, beam_size=beam_size, length_penalty=length_penalty
    )
    refs = [t for _, t in pairs]
    scores = {"all": corpus_scores(hyps, refs)}
    for k, kind in enumerate(kinds):
        scores[kind] = corpus_scores(hyps[k :: len(kinds)], refs[k :: len(kinds)])
    return scores


STUDY_PATH = "studies/translation.json"
"""The seed study of ``scripts/translation_study.py``, inside the package."""


def load_study() -> dict[str, Any]:
    """The seed study shipped in the package (:data:`STUDY_PATH`, read with
    ``importlib.resources``, so it is found from any working directory and when installed).
    Raises ``ValueError`` if it was computed with another :class:`TranslatorRecipe` than
    this module's default."""
    text = resources.files("minitransformer").joinpath(STUDY_PATH).read_text()
    study: dict[str, Any] = json.loads(text)
    recipe = dataclasses.asdict(TranslatorRecipe())
    recipe["kinds"] = list(recipe["kinds"])
    if study.get("recipe") != recipe:
        raise ValueError(
            f"{STUDY_PATH} was computed with the recipe {study.get('recipe')}, not this "
            f"module's {recipe}: run scripts/translation_study.py"
        )
    return study
