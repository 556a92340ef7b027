"""Byte-level byte-pair encoding (BPE): how text becomes the token ids a language model reads.

Explained in the chapter "From the paper to a language model" (``book/lm``), section
"Byte-pair encoding". The paper used BPE (Sennrich et al., 2016) with a shared vocabulary of
about 37,000 tokens; GPT-2 (Radford et al., 2019) made it *byte-level*: the base vocabulary is
the 256 byte values, so every string, in any script, has an encoding and nothing is unknown.

Training (:meth:`BPETokenizer.train`) is a loop:

1. split the text into chunks (:func:`pretokenize`) and write each chunk as its UTF-8 bytes;
2. count every pair of adjacent tokens, weighted by how often the chunk occurs;
3. merge the most frequent pair into a new token, everywhere it occurs; repeat from 2 until
   the vocabulary has ``vocab_size`` tokens or no pair occurs ``min_frequency`` times.

Ties: of pairs that are equally frequent, the pair of the smallest ids ``(left, right)``
(compared left id first) is merged first, so the result never depends on dictionary order.
Step 2 is not redone from scratch: after a merge only the counts of the pairs next to its
occurrences change, and a heap finds the most frequent pair. On the 416,000 training characters of
``pydoc_data.topics`` that is about 30 times faster at 1024 tokens than recounting every pair
after every merge, and 100 times at 4096 (a fraction of a second instead of 10 to 40 s).

Encoding a chunk replays the merges in the order they were learned: repeatedly merge the
adjacent pair that was learned earliest (the leftmost one if it occurs twice), until no
learned pair is left. Decoding concatenates the tokens' bytes. Both training and encoding keep
the tokens in linked lists, so that a merge costs time in proportion to what it changes: a
chunk as long as a book's worth of spaces, or a single 80,000-letter word, takes as long per
byte as ordinary words (``benchmarks/bench_tokenizer.py`` against Hugging Face).

Layout of the vocabulary (the same as Hugging Face ``tokenizers``, so the ids agree; tested):

* ids ``0 .. k-1``: the ``k`` special tokens, in the order given (default ``<|pad|>``,
  ``<|endoftext|>``). They never come out of ordinary text (see :meth:`BPETokenizer.encode`).
* ids ``k .. k+255``: the 256 single bytes, in GPT-2's order (:data:`BYTE_ORDER`);
* ids ``k+256 ..``: one per merge, in the order learned. A merge that forms a token that
  already exists (``"ab" + "c"`` after ``"a" + "bc"``) reuses its id.

Pre-tokenisation is GPT-2's: a regular expression cuts text into words with their leading
space (``" the"``), runs of digits, runs of punctuation, and whitespace, so that merges never
cross a word boundary (no token ``"e t"``) and frequent words become single tokens. Python's
``re`` has no ``\\p{L}`` (letter) or ``\\p{N}`` (number) class, and its ``\\s`` counts the
control characters ``\\x1c``-``\\x1f`` as space, so :func:`pretokenize` spells GPT-2's classes
out from Python's Unicode database (:func:`gpt2_pattern`): it cuts as GPT-2 and Hugging Face do
(tested on text in many scripts), except for characters newer than Python's Unicode version.

GPT-2's own files: :meth:`BPETokenizer.from_gpt2_files` reads a ``vocab.json`` and
``merges.txt`` (GPT-2's, or any byte-level BPE saved by Hugging Face ``tokenizers``), and
:meth:`BPETokenizer.save_gpt2_files` writes them. GPT-2 lists its one special token,
``<|endoftext|>``, after the merges (id 50256); ``specials_first=False`` is that layout.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import json
import os
import re
import sys
import unicodedata
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from torch import Tensor

from minitransformer._checks import as_int, positive_int
from minitransformer._checks import ids as id_tensor

__all__ = [
    "PAD",
    "ENDOFTEXT",
    "BYTE_ORDER",
    "BYTE_TO_CHAR",
    "GPT2_SPLIT",
    "gpt2_pattern",
    "pretokenize",
    "merge_pair",
    "BPETokenizer",
]

#: The padding token's string (id 0 with the default special tokens).
PAD = "<|pad|>"
#: GPT-2's end-of-text token, which separates documents and ends a generated text.
ENDOFTEXT = "<|endoftext|>"

# GPT-2 stores tokens as printable strings: it maps each byte to a printable character, the 188
# printable Latin-1 bytes to themselves and the 68 others (control characters, the space, ...)
# to U+0100 onwards (the space becomes "Ġ"). Its vocabulary, and that of Hugging Face's
# byte-level BPE, lists the bytes in the order of those characters. We keep that order, so that
# ids agree with theirs: it also decides which of two equally frequent pairs is merged first.
_PRINTABLE = [
    *range(ord("!"), ord("~") + 1),
    *range(ord("¡"), ord("¬") + 1),
    *range(ord("®"), ord("ÿ") + 1),
]
#: The 256 byte values in vocabulary order (the printable ones, then the others).
BYTE_ORDER: tuple[int, ...] = tuple(_PRINTABLE + [b for b in range(256) if b not in _PRINTABLE])
#: GPT-2's printable character for each byte, as its ``vocab.json`` and ``merges.txt`` write
#: tokens: a printable byte stands for itself, the others are U+0100 onwards in
#: :data:`BYTE_ORDER` (the space is ``"Ġ"``, U+0120).
BYTE_TO_CHAR: dict[int, str] = {
    b: chr(b if i < len(_PRINTABLE) else 256 + i - len(_PRINTABLE))
    for i, b in enumerate(BYTE_ORDER)
}
_CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}

#: GPT-2's pre-tokenisation pattern (openai/gpt-2, ``src/encoder.py``), in its own notation:
#: contractions, an optional space and letters, an optional space and numbers, an optional
#: space and other symbols, whitespace not followed by a non-space (so that the last space
#: before a word stays with the word), other whitespace.
GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

# Unicode's White_Space characters: what \s means to GPT-2's regex (and to Rust's, which
# Hugging Face uses); Python's \s adds \x1c-\x1f.
_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"


def _category_classes(majors: str) -> dict[str, str]:
    """For each letter of ``majors`` (``"L"``: letters, ``"N"``: numbers), a character class
    body listing, as ranges, every code point whose Unicode category starts with it."""
    category = unicodedata.category
    first_letters = [category(chr(c))[0] for c in range(sys.maxunicode + 1)]
    parts: dict[str, list[str]] = {major: [] for major in majors}
    start = 0
    for major, run in itertools.groupby(first_letters):
        end = start + len(list(run))  # this run is start .. end - 1
        if major in parts:
            first, last = re.escape(chr(start)), re.escape(chr(end - 1))
            parts[major].append(first if end - start == 1 else f"{first}-{last}")
        start = end
    return {major: "".join(ranges) for major, ranges in parts.items()}


@functools.cache
def gpt2_pattern() -> re.Pattern[str]:
    """:data:`GPT2_SPLIT` for Python's ``re``: ``\\p{L}`` and ``\\p{N}`` spelled out from
    ``unicodedata`` and ``\\s`` as Unicode's White_Space. Built on first use (a fraction of
    a second), then kept."""
    classes = _category_classes("LN")
    letters, numbers = classes["L"], classes["N"]
    return re.compile(
        rf"""'s|'t|'re|'ve|'m|'ll|'d| ?[{letters}]+| ?[{numbers}]+"""
        rf"""| ?[^{_SPACE}{letters}{numbers}]+|[{_SPACE}]+(?![^{_SPACE}])|[{_SPACE}]+"""
    )


def _check_text(name: str, text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"{name} must be a str, got {type(text).__name__}")
    return text


def pretokenize(text: str) -> list[str]:
    """Cut ``text`` into the chunks BPE works inside: ``"Hello  world's"`` ->
    ``["Hello", " ", " world", "'s"]``, by GPT-2's rule (:data:`GPT2_SPLIT`). The chunks
    concatenate to ``text``."""
    return gpt2_pattern().findall(_check_text("text", text))


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as err:  # a lone surrogate such as "\ud800" has no UTF-8
        raise ValueError(
            f"text is not valid Unicode: {err.reason} at index {err.start} "
            f"({text[err.start : err.end]!r})"
        ) from None


def _id_list(
    name: str, ids: object, high: int | None = None, *, kind: str = "a sequence"
) -> list[int]:
    """Token ids as a list of Python ints, each in ``[0, high)``: a sequence or iterable of
    ints (NumPy ints and 0-d integer tensors included), or a 1-D integer tensor of any dtype
    of ``_checks.ids``. TypeError/ValueError naming ``name[i]``, before anything is done."""
    if isinstance(ids, Tensor):
        items: Iterable[object] = id_tensor(name, ids, ndim=1, what="(N,)", low=None).tolist()
    elif isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
        raise TypeError(f"{name} must be {kind} of ints, got {type(ids).__name__}")
    else:
        items = ids
    out = [as_int(f"{name}[{i}]", x) for i, x in enumerate(items)]
    for i, x in enumerate(out):
        if x < 0 or (high is not None and x >= high):
            where = f"[0, {high})" if high is not None else ">= 0"
            raise ValueError(f"{name}[{i}] = {x} is outside the vocabulary {where}")
    return out


def _id(name: str, value: object) -> int:
    i = as_int(name, value)
    if i < 0:
        raise ValueError(f"{name} must be >= 0, got {i}")
    return i


def merge_pair(ids: Sequence[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """One merge step of BPE: ``ids`` with every occurrence of ``pair`` replaced by
    ``new_id``, scanning left to right, so that of overlapping occurrences the left one merges:
    ``merge_pair([5, 5, 5], (5, 5), 9) == [9, 5]``. Section "Byte-pair encoding"."""
    word = _id_list("ids", ids)
    given: object = pair  # checked at run time, whatever the annotation promises
    if isinstance(given, Tensor) and given.dim() == 1:
        given = id_tensor("pair", given, low=None).tolist()
    if not isinstance(given, (tuple, list)) or len(given) != 2:
        raise TypeError(f"pair must be a pair of ints (left, right), got {given!r}")
    left, right = _id("pair[0]", given[0]), _id("pair[1]", given[1])
    return _merge(word, (left, right), _id("new_id", new_id))


def _merge(word: list[int], pair: tuple[int, int], new_id: int) -> list[int]:
    """:func:`merge_pair` without the argument checks (the training loop's inner step)."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


class BPETokenizer:
    """A byte-level BPE tokenizer: ``encode(str) -> list[int]``, ``decode(list[int]) -> str``.

    Build one with :meth:`train`, or from the ``merges`` of a trained one
    (``BPETokenizer(tok.merges, tok.special_tokens)`` is the same tokenizer). Module docstring:
    the algorithm and the vocabulary's layout.

    Attributes:
        merges: the learned pairs ``(left id, right id)``, in order; merge ``i`` has rank ``i``.
        vocab: ``vocab[id]`` is the token's bytes (a special token's: its UTF-8 string).
        special_tokens: the special tokens' strings, in id order.
        specials_first: whether the special tokens come first (ids ``0 .. k-1``, the
            default), or after the merged tokens, as in GPT-2's vocabulary.
    """

    def __init__(
        self,
        merges: Sequence[tuple[int, int]] = (),
        special_tokens: Sequence[str] = (PAD, ENDOFTEXT),
        *,
        specials_first: bool = True,
    ) -> None:
        if isinstance(special_tokens, str) or not all(
            isinstance(s, str) and s for s in special_tokens
        ):
            raise TypeError(
                f"special_tokens must be a sequence of non-empty str, got {special_tokens!r}"
            )
        if len(set(special_tokens)) != len(special_tokens):
            raise ValueError(f"special_tokens must be distinct, got {list(special_tokens)}")
        if not isinstance(specials_first, bool):
            raise TypeError(f"specials_first must be a bool, got {specials_first!r}")
        self.special_tokens = list(special_tokens)
        self.specials_first = specials_first
        first = len(self.special_tokens) if specials_first else 0  # the first byte's id
        self.vocab: list[bytes] = [s.encode("utf-8") for s in self.special_tokens[:first]]
        self.vocab += [bytes([b]) for b in BYTE_ORDER]
        self._byte_id = [0] * 256  # byte value -> its id
        for i, b in enumerate(BYTE_ORDER):
            self._byte_id[b] = first + i
        self._id_of = {token: i for i, token in enumerate(self.vocab) if i >= first}
        # bytes -> id (not the specials)
        self.merges: list[tuple[int, int]] = []
        self._rank: dict[tuple[int, int], int] = {}  # pair -> rank (when it was learned)
        self._merged: dict[tuple[int, int], int] = {}  # pair -> the id of the merged token
        self._cache: dict[str, list[int]] = {}  # chunk -> ids (text repeats its words)
        for pair in merges:
            self._add_merge(pair)
        self._first_special = 0 if specials_first else len(self.vocab)
        if not specials_first:  # after the merges: no merge can be added any more
            self.vocab += [s.encode("utf-8") for s in self.special_tokens]
        special = "|".join(re.escape(s) for s in sorted(self.special_tokens, key=len, reverse=True))
        self._special_pattern = re.compile(f"({special})") if special else None

    def _add_merge(self, pair: tuple[int, int]) -> int:
        """Record ``pair`` as the next merge; return the id of the token it forms."""
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise TypeError(f"merges must hold pairs of ids (left, right), got {pair!r}")
        a, b = (as_int(f"merges[{len(self.merges)}]", i) for i in pair)
        first = self._byte_id[BYTE_ORDER[0]]
        for i in (a, b):
            if not first <= i < len(self.vocab):
                raise ValueError(
                    f"merges[{len(self.merges)}] = {pair} uses id {i}, not a byte or merged token "
                    f"[{first}, {len(self.vocab)})"
                )
        if (a, b) in self._rank:
            raise ValueError(f"merges[{len(self.merges)}] = {pair} is listed twice")
        token = self.vocab[a] + self.vocab[b]
        new_id = self._id_of.get(token)
        if new_id is None:  # a new token; else the same bytes were formed by another pair
            new_id = len(self.vocab)
            self.vocab.append(token)
            self._id_of[token] = new_id
        self._rank[(a, b)] = len(self.merges)
        self._merged[(a, b)] = new_id
        self.merges.append((a, b))
        return new_id

    # -- training -------------------------------------------------------------------------
    @classmethod
    def train(
        cls,
        text: str | Iterable[str],
        vocab_size: int,
        *,
        special_tokens: Sequence[str] = (PAD, ENDOFTEXT),
        min_frequency: int = 2,
    ) -> BPETokenizer:
        """Learn merges from ``text`` (a str, or an iterable of documents) until the
        vocabulary has ``vocab_size`` tokens (specials and the 256 bytes included) or no pair
        occurs ``min_frequency`` times. Section "Training BPE"; the loop is in the module
        docstring."""
        given: object = text  # checked at run time, whatever the annotation promises
        if isinstance(text, str):
            texts = [text]
        elif isinstance(given, (bytes, bytearray)) or not hasattr(given, "__iter__"):
            raise TypeError(f"text must be a str or an iterable of str, got {type(text).__name__}")
        else:
            texts = [_check_text(f"text[{i}]", t) for i, t in enumerate(text)]
        for t in texts:
            _utf8(t)  # reject lone surrogates
        vocab_size = positive_int("vocab_size", vocab_size)
        min_frequency = positive_int("min_frequency", min_frequency)
        tok = cls((), special_tokens)
        if vocab_size < len(tok.vocab):
            raise ValueError(
                f"vocab_size must be at least 256 bytes + {len(tok.special_tokens)} special "
                f"tokens = {len(tok.vocab)}, got {vocab_size}"
            )

        # 1. Pre-tokenise; each distinct chunk becomes a "word" of byte ids, with its count.
        #    All words are laid out as one doubly linked list of nodes (a node is a token of
        #    a word; word ends are cut), so that a merge rewrites only the nodes it touches:
        #    the work per merge is proportional to the pair's occurrences, not to the length
        #    of the words they are in (one 80,000-letter word trains in seconds, not minutes).
        chunk_counts = Counter(chunk for t in texts for chunk in pretokenize(t))
        sym: list[int] = []  # node -> its token id
        count: list[int] = []  # node -> how often its word occurs
        nxt: list[int] = []  # node -> the next node of its word, or -1
        prv: list[int] = []  # node -> the previous node of its word, or -1
        for chunk, n in chunk_counts.items():
            start = len(sym)
            sym += tok._bytes_to_ids(chunk.encode("utf-8"))
            end = len(sym)
            count += [n] * (end - start)
            nxt += [*range(start + 1, end), -1]
            prv += [-1, *range(start, end - 1)]

        # 2. Count adjacent pairs, and remember where each pair starts (its left node).
        pair_counts: Counter[tuple[int, int]] = Counter()
        where: defaultdict[tuple[int, int], set[int]] = defaultdict(set)
        for i, j in enumerate(nxt):
            if j >= 0:
                pair = (sym[i], sym[j])
                pair_counts[pair] += count[i]
                where[pair].add(i)
        # A max-heap of (count, pair), as a min-heap of (-count, pair): the most frequent pair
        # comes first and, among equal counts, the smallest pair (the tie-breaking rule).
        # Entries go stale when a count drops; a stale entry is put back with its new count.
        heap = [(-n, pair) for pair, n in pair_counts.items()]
        heapq.heapify(heap)

        # 3. Merge the most frequent pair, update the counts of the pairs around each of its
        #    occurrences, repeat. Occurrences are merged left to right (node order is word
        #    order), so of overlapping ones ("aaa" and the pair "aa") the left one merges, as
        #    in merge_pair. A position in ``where`` may be stale (an earlier merge changed
        #    it): it is checked before it is merged.
        while len(tok.vocab) < vocab_size and heap:
            negative_count, pair = heapq.heappop(heap)
            n = pair_counts[pair]
            if -negative_count != n:  # stale entry
                if n > 0:
                    heapq.heappush(heap, (-n, pair))
                continue
            if n < min_frequency:
                break  # the most frequent pair is too rare: so is every other
            new_id = tok._add_merge(pair)
            a, b = pair
            grown = set()  # pairs whose count went up (new pairs with new_id)
            for i in sorted(where.pop(pair)):
                j = nxt[i]
                if sym[i] != a or j < 0 or sym[j] != b:
                    continue  # stale: this pair is no longer here
                c, h, k = count[i], prv[i], nxt[j]
                pair_counts[pair] -= c
                if h >= 0:
                    pair_counts[(sym[h], a)] -= c
                    p = (sym[h], new_id)
                    pair_counts[p] += c
                    where[p].add(h)
                    grown.add(p)
                if k >= 0:
                    pair_counts[(b, sym[k])] -= c
                    p = (new_id, sym[k])
                    pair_counts[p] += c
                    where[p].add(i)
                    grown.add(p)
                    prv[k] = i
                sym[i], nxt[i] = new_id, k
                sym[j] = nxt[j] = prv[j] = -1  # node j is gone
            for p in grown:  # a new pair can vanish again in the same pass ("abab")
                if pair_counts[p] > 0:
                    heapq.heappush(heap, (-pair_counts[p], p))
        return tok

    # -- encoding and decoding ------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """How many tokens there are (specials, 256 bytes and one per distinct merged token)."""
        return len(self.vocab)

    def _special_id(self, token: str) -> int:
        if token not in self.special_tokens:
            raise ValueError(
                f"this tokenizer has no {token} token; its special tokens are {self.special_tokens}"
            )
        return self._first_special + self.special_tokens.index(token)

    @property
    def pad_id(self) -> int:
        """The id of :data:`PAD` (``"<|pad|>"``)."""
        return self._special_id(PAD)

    @property
    def eos_id(self) -> int:
        """The id of :data:`ENDOFTEXT` (``"<|endoftext|>"``), which ends a document."""
        return self._special_id(ENDOFTEXT)

    def _bytes_to_ids(self, data: bytes) -> list[int]:
        return [self._byte_id[b] for b in data]

    def _encode_chunk(self, chunk: str) -> list[int]:
        ids = self._cache.get(chunk)
        if ids is None:
            ids = self._apply_merges(self._bytes_to_ids(chunk.encode("utf-8")))
            self._cache[chunk] = ids
        return list(ids)

    def _apply_merges(self, ids: list[int]) -> list[int]:
        """Merge the earliest-learned adjacent pair, the leftmost of equal ranks, until no
        learned pair is left. The tokens form a linked list and a heap holds ``(rank,
        position)`` of every adjacent learned pair, so a chunk of n bytes takes O(n log n)
        (16,000 spaces in milliseconds; rescanning all pairs after each merge took 36 s).
        Positions are the left token's index in ``ids``: a merged token keeps its left
        part's, so they stay in text order. A heap entry goes stale when a neighbour merges;
        it is checked when it comes out."""
        rank, merged = self._rank, self._merged
        nxt = [*range(1, len(ids)), -1]
        prv = [-1, *range(len(ids) - 1)]
        heap = [
            (r, i) for i in range(len(ids) - 1) if (r := rank.get((ids[i], ids[i + 1]))) is not None
        ]
        heapq.heapify(heap)
        while heap:
            r, i = heapq.heappop(heap)
            j = nxt[i]
            if ids[i] < 0 or j < 0 or rank.get((ids[i], ids[j])) != r:
                continue  # stale: i is gone, or its right neighbour changed
            ids[i] = merged[(ids[i], ids[j])]
            ids[j] = -1  # gone
            k = nxt[i] = nxt[j]
            if k >= 0:
                prv[k] = i
                if (q := rank.get((ids[i], ids[k]))) is not None:
                    heapq.heappush(heap, (q, i))
            h = prv[i]
            if h >= 0 and (q := rank.get((ids[h], ids[i]))) is not None:
                heapq.heappush(heap, (q, h))
        return [t for t in ids if t >= 0]

    def encode(self, text: str, *, allow_special: bool = False) -> list[int]:
        """``text`` -> token ids. Section "Encoding and decoding".

        By default a special token's string in ``text`` (``"<|endoftext|>"``) is encoded as
        ordinary text, so that text cannot forge a document boundary; with
        ``allow_special=True`` it becomes the special token's id (as Hugging Face's
        ``Tokenizer.encode`` does).
        """
        _utf8(_check_text("text", text))  # reject lone surrogates up front
        pieces = [text]
        if allow_special and self._special_pattern is not None:
            pieces = self._special_pattern.split(text)  # odd positions: the specials
        ids: list[int] = []
        for i, piece in enumerate(pieces):
            if i % 2:
                ids.append(self._special_id(piece))
            else:
                for chunk in pretokenize(piece):
                    ids += self._encode_chunk(chunk)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Token ids (a list, or a 1-D tensor) -> text. Special tokens decode to their strings.

        ``decode(encode(text)) == text`` for every ``text``. Ids cut inside a multi-byte
        character (``encode("é")[:1]``) decode to U+FFFD, the replacement character.
        """
        vocab = self.vocab
        parts = [vocab[i] for i in _id_list("ids", ids, len(vocab), kind="an iterable")]
        return b"".join(parts).decode("utf-8", errors="replace")

    # -- GPT-2's files ----------------------------------------------------------------------
    def save_gpt2_files(self, folder: str | os.PathLike[str]) -> tuple[Path, Path]:
        """Write ``vocab.json`` (token -> id) and ``merges.txt`` (one merge per line) into
        ``folder``, in GPT-2's format: each byte written as its :data:`BYTE_TO_CHAR`
        character, the special tokens as themselves. Hugging Face's
        ``tokenizers.models.BPE.from_file`` and :meth:`from_gpt2_files` read them. Returns
        the two paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        first = self._first_special
        specials = range(first, first + len(self.special_tokens))
        vocab = {
            (self.vocab[i].decode("utf-8") if i in specials else _to_chars(self.vocab[i])): i
            for i in range(len(self.vocab))
        }
        lines = [f"{_to_chars(self.vocab[a])} {_to_chars(self.vocab[b])}" for a, b in self.merges]
        vocab_path, merges_path = folder / "vocab.json", folder / "merges.txt"
        vocab_path.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        merges_path.write_text("#version: 0.2\n" + "".join(f"{m}\n" for m in lines), "utf-8")
        return vocab_path, merges_path

    @classmethod
    def from_gpt2_files(
        cls, vocab: str | os.PathLike[str], merges: str | os.PathLike[str]
    ) -> BPETokenizer:
        """The tokenizer of a ``vocab.json`` and ``merges.txt`` in GPT-2's format: GPT-2's own
        (50,000 merges, then ``<|endoftext|>`` at id 50256), or one that Hugging Face
        ``tokenizers`` or :meth:`save_gpt2_files` wrote. The ids are the file's: a vocabulary
        entry that no byte or merge forms is a special token, and the special tokens must come
        first or last. Refuses, naming the file and the line or token, a merge of unknown
        tokens, and a ``vocab.json`` whose ids do not follow the merges."""
        vocab_path, merges_path = Path(vocab), Path(merges)
        try:
            table = json.loads(vocab_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise ValueError(f"{vocab_path} is not valid JSON: {error}") from error
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in table.items()
        ):
            raise ValueError(f"{vocab_path} must map token strings to integer ids")
        pairs: list[tuple[bytes, bytes]] = []
        lines = merges_path.read_text(encoding="utf-8").splitlines()
        for number, line in enumerate(lines, 1):
            if not line.strip() or (number == 1 and line.startswith("#version")):
                continue
            parts = line.split(" ")
            if len(parts) != 2 or not all(parts):
                raise ValueError(f"{merges_path}, line {number}: {line!r} is not two tokens")
            try:
                pairs.append((_from_chars(parts[0]), _from_chars(parts[1])))
            except KeyError as error:
                raise ValueError(
                    f"{merges_path}, line {number}: {line!r} has {error.args[0]!r}, which is "
                    "not one of GPT-2's 256 byte characters"
                ) from None
        formed = {_to_chars(bytes([b])) for b in range(256)}
        formed |= {_to_chars(a + b) for a, b in pairs}
        specials = [t for _, t in sorted((i, t) for t, i in table.items() if t not in formed)]
        specials_first = bool(specials) and table[specials[0]] == 0
        plain = cls((), ())  # the merges' ids without special tokens: bytes at 0 .. 255
        for number, (a, b) in enumerate(pairs, 1):
            left, right = plain._id_of.get(a), plain._id_of.get(b)
            if left is None or right is None:
                raise ValueError(
                    f"{merges_path}, merge {number}: {a!r} + {b!r} uses a token that no "
                    "earlier merge forms"
                )
            plain._add_merge((left, right))
        shift = len(specials) if specials_first else 0
        merged = [(a + shift, b + shift) for a, b in plain.merges]
        tok = cls(merged, specials, specials_first=specials_first)
        for token, i in table.items():
            ours = tok._id_of.get(_from_chars(token)) if token in formed else None
            if ours is None:
                ours = tok._special_id(token)
            if ours != i:
                raise ValueError(
                    f"{vocab_path}: {token!r} has id {i}, but the merges of {merges_path} "
                    f"(with the special tokens {specials} "
                    f"{'first' if specials_first else 'last'}) give it id {ours}"
                )
        if len(table) != tok.vocab_size:
            raise ValueError(
                f"{vocab_path} has {len(table)} tokens, its merges and special tokens form "
                f"{tok.vocab_size}"
            )
        return tok

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self.merges)}, "
            f"special_tokens={self.special_tokens})"
        )


def _to_chars(token: bytes) -> str:
    """A token's bytes as GPT-2 writes them (:data:`BYTE_TO_CHAR`)."""
    return "".join(BYTE_TO_CHAR[b] for b in token)


def _from_chars(text: str) -> bytes:
    """The inverse of :func:`_to_chars`; ``KeyError`` for a character that is not a byte's."""
    return bytes(_CHAR_TO_BYTE[c] for c in text)
