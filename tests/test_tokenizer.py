"""Byte-level BPE (minitransformer.tokenizer) against Hugging Face ``tokenizers`` trained on the
same text, against a from-scratch BPE loop that recounts every pair, and on arbitrary unicode."""

from __future__ import annotations

import itertools
import json
import unicodedata
from collections import Counter
from pydoc_data.topics import topics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minitransformer.tokenizer import (
    BYTE_ORDER,
    ENDOFTEXT,
    PAD,
    BPETokenizer,
    pretokenize,
)

SPECIALS = (PAD, ENDOFTEXT)
CORPUS = [topics[name] for name in sorted(topics)]  # 79 documents, about 465,000 characters


def gpt2_bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (openai/gpt-2, src/encoder.py), as HF uses it."""
    bs = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


CHAR_TO_BYTE = {c: b for b, c in gpt2_bytes_to_unicode().items()}


@pytest.fixture(scope="module")
def tok() -> BPETokenizer:
    return BPETokenizer.train(CORPUS, 1024)


# -- Hugging Face tokenizers, the independent reference -------------------------------------


def hf_train(texts, vocab_size, special_tokens=SPECIALS, min_frequency=2):
    """HF's byte-level BPE with the settings equivalent to ours: GPT-2's pre-tokenizer without
    the prefix space, all 256 bytes in the alphabet, the same specials and min_frequency."""
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models, pre_tokenizers, trainers

    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    return hf


def hf_vocab_and_merges(hf, num_special):
    """HF's vocabulary as ``id -> bytes`` and its merges as id pairs, in our terms."""
    model = json.loads(hf.to_str())["model"]
    vocab = {
        i: token.encode() if i < num_special else bytes(CHAR_TO_BYTE[c] for c in token)
        for token, i in model["vocab"].items()
    }
    merges = [
        tuple(model["vocab"][t] for t in (m.split(" ") if isinstance(m, str) else m))
        for m in model["merges"]
    ]
    return [vocab[i] for i in range(len(vocab))], merges


@pytest.fixture(scope="module")
def hf_1024():
    return hf_train(CORPUS, 1024)


def test_byte_order_is_gpt2s_printable_character_order():
    # HF sorts its initial alphabet by the characters GPT-2 maps the bytes to.
    to_char = gpt2_bytes_to_unicode()
    assert list(BYTE_ORDER) == sorted(range(256), key=lambda b: to_char[b])
    assert BYTE_ORDER[0] == ord("!") and to_char[ord(" ")] == "Ġ"


@pytest.mark.parametrize("vocab_size, min_frequency", [(1024, 2), (4096, 2), (8000, 5)])
def test_same_vocabulary_merges_and_ids_as_hugging_face(vocab_size, min_frequency, tok, hf_1024):
    hf = (
        hf_1024
        if (vocab_size, min_frequency) == (1024, 2)
        else hf_train(CORPUS, vocab_size, min_frequency=min_frequency)
    )
    ours = (
        tok
        if hf is hf_1024
        else BPETokenizer.train(CORPUS, vocab_size, min_frequency=min_frequency)
    )
    vocab, merges = hf_vocab_and_merges(hf, len(SPECIALS))
    assert ours.vocab == vocab
    assert ours.merges == merges
    if vocab_size == 8000:  # min_frequency stops both before vocab_size, at the same merge
        assert ours.vocab_size == len(vocab) < 8000
    text = "\n".join(CORPUS[::7])
    assert ours.encode(text) == hf.encode(text).ids
    assert ours.decode(ours.encode(text)) == hf.decode(hf.encode(text).ids) == text


def test_special_tokens_and_their_ids_match_hugging_face(tok, hf_1024):
    assert tok.pad_id == hf_1024.token_to_id(PAD) == 0
    assert tok.eos_id == hf_1024.token_to_id(ENDOFTEXT) == 1
    text = f"def f():{ENDOFTEXT}    return 1{ENDOFTEXT}{PAD}x"
    ids = tok.encode(text, allow_special=True)
    assert ids == hf_1024.encode(text).ids
    assert ids.count(tok.eos_id) == 2 and ids.count(tok.pad_id) == 1
    assert tok.decode(ids) == hf_1024.decode(ids, skip_special_tokens=False) == text


def _assigned_in_python(text: str) -> bool:
    """Exclude code points unassigned in Python's Unicode database: a newer Unicode (Hugging
    Face's) may know them as letters or numbers."""
    return not any(unicodedata.category(c) == "Cn" for c in text)


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40).filter(_assigned_in_python))
def test_encoding_of_arbitrary_text_matches_hugging_face(tok, hf_1024, text):
    assert tok.encode(text) == hf_1024.encode(text).ids


@pytest.mark.parametrize(
    "text, gpt2",
    [
        # numerals that are not decimal digits: \p{N} for GPT-2, letters for Python's [^\W\d_]
        ("x²", ["x", "²"]),
        ("½ cup", ["½", " cup"]),
        ("Ⅻb", ["Ⅻ", "b"]),
        ("१२३ ٣٤٥", ["१२३", " ٣٤٥"]),  # Devanagari and Arabic-Indic digits
        # \x1c-\x1f: not Unicode White_Space, though Python's \s counts them
        (".\x1c.", [".\x1c."]),
        ("a\u3000b", ["a", "\u3000", "b"]),  # the ideographic space is White_Space
    ],
)
def test_pretokenization_cuts_where_gpt2_does(text, gpt2, hf_1024):
    assert pretokenize(text) == gpt2
    hf_chunks = [
        bytes(CHAR_TO_BYTE[c] for c in chunk).decode()
        for chunk, _ in hf_1024.pre_tokenizer.pre_tokenize_str(text)
    ]
    assert hf_chunks == gpt2


def test_pretokenize_keeps_leading_spaces_with_words():
    assert pretokenize("Hello  world's __init__(x)\n\n  y") == [
        "Hello",
        " ",
        " world",
        "'s",
        " __",
        "init",
        "__(",
        "x",
        ")",
        "\n\n ",
        " y",
    ]


# -- the merge loop against a from-scratch reference ----------------------------------------


def naive_bpe(texts, vocab_size, special_tokens=SPECIALS, min_frequency=2):
    """BPE as the textbook states it: recount every pair after every merge."""
    k = len(special_tokens)
    vocab = [s.encode() for s in special_tokens] + [bytes([b]) for b in BYTE_ORDER]
    byte_id = {b: k + i for i, b in enumerate(BYTE_ORDER)}
    words = Counter(
        tuple(byte_id[b] for b in chunk.encode()) for t in texts for chunk in pretokenize(t)
    )
    merges = []
    while len(vocab) < vocab_size:
        pairs = Counter()
        for word, n in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += n
        if not pairs:
            break
        pair = min(pairs, key=lambda p: (-pairs[p], p))  # most frequent, then smallest ids
        if pairs[pair] < min_frequency:
            break
        new_id = len(vocab)
        vocab.append(vocab[pair[0]] + vocab[pair[1]])
        merges.append(pair)
        merged = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i : i + 2] == pair:
                    out.append(new_id)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return vocab, merges


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.text(alphabet="ab c\n", max_size=30), min_size=1, max_size=4),
    st.integers(258, 290),
    st.integers(1, 3),
)
def test_incremental_counts_give_the_merges_of_recounting(texts, vocab_size, min_frequency):
    ours = BPETokenizer.train(texts, vocab_size, min_frequency=min_frequency)
    assert (ours.vocab, ours.merges) == naive_bpe(texts, vocab_size, min_frequency=min_frequency)


def test_incremental_counts_match_recounting_on_real_text():
    texts = CORPUS[:3]
    ours = BPETokenizer.train(texts, 400)
    assert (ours.vocab, ours.merges) == naive_bpe(texts, 400)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(st.text(alphabet="aab c", max_size=30), min_size=1, max_size=4),
    st.integers(258, 280),
    st.integers(1, 2),
)
def test_small_texts_give_hugging_faces_merges(texts, vocab_size, min_frequency):
    ours = BPETokenizer.train(texts, vocab_size, min_frequency=min_frequency)
    vocab, merges = hf_vocab_and_merges(
        hf_train(texts, vocab_size, min_frequency=min_frequency), len(SPECIALS)
    )
    assert (ours.vocab, ours.merges) == (vocab, merges)


@settings(max_examples=30, deadline=None)
@given(
    st.lists(st.text(alphabet="ab", min_size=40, max_size=300), min_size=1, max_size=3),
    st.integers(258, 300),
    st.integers(1, 3),
)
def test_long_words_give_the_merges_of_recounting(words, vocab_size, min_frequency):
    # One chunk each ("ab" has no spaces): runs such as "aaaa" and "abab", where a merge's
    # occurrences overlap or a pair it makes vanishes in the same pass.
    ours = BPETokenizer.train(words, vocab_size, min_frequency=min_frequency)
    assert (ours.vocab, ours.merges) == naive_bpe(words, vocab_size, min_frequency=min_frequency)


def test_ties_go_to_the_smallest_pair_of_ids():
    # "ab" and "cd" both occur twice: (a, b) has the smaller ids, so it is merged first.
    tok = BPETokenizer.train("cd ab cd ab", 260)
    a, b, c, d = (tok.encode(ch)[0] for ch in "abcd")
    assert (a, b) < (c, d)
    assert tok.merges[:2] == [(a, b), (c, d)]


def test_training_stops_at_vocab_size_or_min_frequency():
    assert BPETokenizer.train(CORPUS[:5], 300).vocab_size == 300
    # chunks "abc" and " abd": only (a, b) occurs twice; after it every pair occurs once
    rare = BPETokenizer.train("abc abd", 1000, min_frequency=2)
    assert rare.merges == [(rare.encode("a")[0], rare.encode("b")[0])]
    assert rare.vocab_size == 259
    # with min_frequency=1 it merges until each chunk is one token: ab, abc, then two for " abd"
    whole = BPETokenizer.train("abc abd", 1000, min_frequency=1)
    assert whole.vocab_size == 258 + 4 and whole.encode("abc abd") == [260, 261]


# -- encoding and decoding ------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text() | st.sampled_from(SPECIALS), max_size=4).map("".join))
def test_round_trip_on_arbitrary_unicode(tok, text):
    ids = tok.encode(text)
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    assert tok.pad_id not in ids and tok.eos_id not in ids
    with_special = tok.encode(text, allow_special=True)
    assert tok.decode(with_special) == text
    assert with_special.count(tok.eos_id) == text.count(ENDOFTEXT)


def rescanning_encode(tok, chunk):
    """The textbook encoding loop: rescan every adjacent pair, merge the earliest-learned
    one (the leftmost of equals), until no learned pair is left."""
    rank = {pair: r for r, pair in enumerate(tok.merges)}
    ids = [tok._byte_id[b] for b in chunk.encode("utf-8")]
    while len(ids) > 1:
        ranks = [rank.get(pair, len(rank)) for pair in itertools.pairwise(ids)]
        i = min(range(len(ranks)), key=ranks.__getitem__)
        if ranks[i] == len(rank):
            break
        ids[i : i + 2] = [tok._id_of[tok.vocab[ids[i]] + tok.vocab[ids[i + 1]]]]
    return ids


@settings(max_examples=100, deadline=None)
@given(
    st.text(alphabet=" \nabe", max_size=400)
    | st.text(max_size=40)
    | st.builds(
        lambda c, n: c * n, st.sampled_from([" ", "e", "ab", "==", "\n"]), st.integers(0, 500)
    )
)
def test_encoding_equals_the_rescanning_loop(tok, text):
    tok._cache.clear()
    want = [i for chunk in pretokenize(text) for i in rescanning_encode(tok, chunk)]
    assert tok.encode(text) == want


@settings(max_examples=50, deadline=None)
@given(
    st.text(
        alphabet=st.characters(
            min_codepoint=0x4E00, max_codepoint=0x1F64F, exclude_categories=("Cs",)
        ),
        min_size=1,
    )
)
def test_unseen_characters_fall_back_to_bytes(tok, text):
    ids = tok.encode(text)
    assert len(ids) <= len(text.encode("utf-8"))
    assert tok.decode(ids) == text


def test_frequent_words_become_single_tokens(tok):
    for word in [" the", " return", " def", " class"]:
        assert len(tok.encode(word)) == 1, word
    assert len(tok.encode("\n".join(CORPUS))) < len("\n".join(CORPUS)) / 2.5


def test_special_strings_are_plain_text_unless_allowed(tok):
    assert tok.eos_id not in tok.encode(ENDOFTEXT)
    assert tok.encode(ENDOFTEXT, allow_special=True) == [tok.eos_id]
    assert tok.decode([tok.eos_id]) == ENDOFTEXT


def test_decode_takes_tensors_and_replaces_cut_characters(tok):
    ids = tok.encode("naïve café")
    assert tok.decode(torch.tensor(ids)) == "naïve café"
    assert tok.decode(BPETokenizer().encode("é")[:1]) == "\ufffd"


def test_a_tokenizer_rebuilt_from_its_merges_is_the_same(tok):
    again = BPETokenizer(tok.merges, tok.special_tokens)
    assert again.vocab == tok.vocab
    text = CORPUS[3][:2000]
    assert again.encode(text) == tok.encode(text)


def test_an_untrained_tokenizer_encodes_bytes():
    tok = BPETokenizer()
    assert tok.vocab_size == 258
    assert tok.decode(tok.encode("héllo")) == "héllo"
    assert len(tok.encode("héllo")) == len("héllo".encode())
    assert BPETokenizer(special_tokens=()).vocab_size == 256


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(vocab_size=257), ValueError, r"vocab_size must be at least .* = 258, got 257"),
        (dict(vocab_size=0), ValueError, "vocab_size must be positive"),
        (dict(vocab_size=300.0), TypeError, "vocab_size must be an int"),
        (dict(vocab_size=300, min_frequency=0), ValueError, "min_frequency must be positive"),
        (dict(vocab_size=300, special_tokens=[PAD, PAD]), ValueError, "must be distinct"),
        (dict(vocab_size=300, special_tokens=["", ENDOFTEXT]), TypeError, "special_tokens"),
        (dict(vocab_size=300, special_tokens=ENDOFTEXT), TypeError, "special_tokens"),
    ],
)
def test_bad_training_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        BPETokenizer.train("some text", **kwargs)


@pytest.mark.parametrize(
    "text, match",
    [
        (b"bytes", "text must be a str or an iterable of str, got bytes"),
        (42, "text must be a str or an iterable of str, got int"),
        (["ok", 3], r"text\[1\] must be a str, got int"),
    ],
)
def test_training_text_must_be_str(text, match):
    with pytest.raises(TypeError, match=match):
        BPETokenizer.train(text, 300)


def test_bad_encode_and_decode_input(tok):
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        tok.encode(b"abc")
    with pytest.raises(ValueError, match="text is not valid Unicode.*index 1"):
        tok.encode("a\ud800b")
    with pytest.raises(ValueError, match=r"ids\[1\] = 1024 is outside the vocabulary \[0, 1024\)"):
        tok.decode([5, 1024])
    with pytest.raises(TypeError, match=r"ids\[0\] must be an int, got float"):
        tok.decode([1.0])
    with pytest.raises(TypeError, match="ids must be an iterable of ints, got str"):
        tok.decode("abc")
    with pytest.raises(ValueError, match="no <|pad|> token"):
        _ = BPETokenizer(special_tokens=(ENDOFTEXT,)).pad_id


def test_bad_merges():
    with pytest.raises(ValueError, match=r"merges\[0\] = \(0, 5\) uses id 0"):
        BPETokenizer([(0, 5)])
    with pytest.raises(ValueError, match="listed twice"):
        BPETokenizer([(5, 6), (5, 6)])


def test_merge_pair_is_one_left_to_right_merge_step():
    """The public merge step (the chapter's exercise checks against it): overlapping
    occurrences merge from the left, and bad arguments are named."""
    from minitransformer.tokenizer import merge_pair

    assert merge_pair([5, 5, 5], (5, 5), 9) == [9, 5]
    assert merge_pair([5, 5, 5, 5], (5, 5), 9) == [9, 9]
    assert merge_pair(torch.tensor([1, 2, 3, 1, 2]), (1, 2), 7) == [7, 3, 7]
    assert merge_pair([], (1, 2), 7) == []
    with pytest.raises(TypeError, match="ids must be a sequence of ints, got str"):
        merge_pair("abc", (1, 2), 7)
    with pytest.raises(TypeError, match=r"pair must be a pair of ints \(left, right\), got 3"):
        merge_pair([1, 2], 3, 7)
    with pytest.raises(TypeError, match=r"ids\[1\] must be an int"):
        merge_pair([1, 2.5], (1, 2), 7)


# -- GPT-2's files: vocab.json and merges.txt ------------------------------------------------

MULTILINGUAL = [
    "Der Zug fährt um 14:30 Uhr ab. Größe: 2³ m², Straße",
    "Ça coûte 12,50 € — très cher ! L'été, n'est-ce pas ?",
    "東京は日本の首都です。人口は約1400万人。",
    "Москва — столица России, 12,6 млн жителей.",
    "नमस्ते, आप कैसे हैं? १२३",
    "مرحبا بالعالم ٣٤٥",
    "Ⅻ½ x² \x1c tabs\t\tand  spaces\n\n  end",
    "🙂 emoji 👍🏽 and a family 👨\u200d👩\u200d👧",
    "Ελληνικά: αβγ ΔΕΖ; 한국어 문장입니다",
    "it's we've they'll I'd <|endoftext|> __init__(x=1)",
]


@pytest.fixture(scope="module")
def hf_multilingual():
    return hf_train(CORPUS[:20] + MULTILINGUAL * 3, 1500)


def test_reads_hugging_face_files_and_encodes_as_it_does(tmp_path, hf_multilingual):
    hf_multilingual.model.save(str(tmp_path))
    ours = BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    vocab, merges = hf_vocab_and_merges(hf_multilingual, len(SPECIALS))
    assert ours.vocab == vocab and ours.merges == merges
    assert ours.special_tokens == list(SPECIALS) and ours.specials_first
    for text in [*MULTILINGUAL, CORPUS[40][:3000]]:
        # HF splits off its special tokens' strings (added tokens): allow_special does too
        assert ours.encode(text, allow_special=True) == hf_multilingual.encode(text).ids, text
        assert ours.decode(ours.encode(text)) == text


def hf_from_files(folder):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers

    hf = tokenizers.Tokenizer(
        models.BPE.from_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
    )
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return hf


def test_saved_files_are_read_back_the_same_by_hugging_face_and_by_us(tmp_path):
    trained = BPETokenizer.train(CORPUS[:20] + MULTILINGUAL * 3, 1200)
    vocab_path, merges_path = trained.save_gpt2_files(tmp_path)
    assert merges_path.read_text(encoding="utf-8").startswith("#version: 0.2\n")
    again = BPETokenizer.from_gpt2_files(vocab_path, merges_path)
    assert again.vocab == trained.vocab and again.merges == trained.merges
    hf = hf_from_files(tmp_path)
    for text in MULTILINGUAL:
        assert trained.encode(text) == again.encode(text) == hf.encode(text).ids, text


def test_gpt2s_layout_puts_endoftext_after_the_merges(tmp_path):
    """GPT-2's vocab.json: 256 bytes, the merges, then <|endoftext|> (50256 in GPT-2)."""
    plain = BPETokenizer.train(CORPUS[:20], 800, special_tokens=())
    plain.save_gpt2_files(tmp_path)
    table = json.loads((tmp_path / "vocab.json").read_text(encoding="utf-8"))
    table[ENDOFTEXT] = len(table)
    (tmp_path / "vocab.json").write_text(json.dumps(table), encoding="utf-8")
    gpt2 = BPETokenizer.from_gpt2_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    assert not gpt2.specials_first and gpt2.eos_id == 800 == gpt2.vocab_size - 1
    assert gpt2.vocab[:800] == plain.vocab and gpt2.merges == plain.merges
    assert gpt2.encode("a<|endoftext|>b", allow_special=True) == [
        *plain.encode("a"),
        800,
        *plain.encode("b"),
    ]
    assert gpt2.decode([800]) == ENDOFTEXT
    hf = hf_from_files(tmp_path)
    for text in MULTILINGUAL:
        assert gpt2.encode(text) == hf.encode(text).ids, text
    rebuilt = BPETokenizer(gpt2.merges, gpt2.special_tokens, specials_first=False)
    assert rebuilt.vocab == gpt2.vocab


def test_gpt2_files_that_do_not_agree_are_refused(tmp_path):
    trained = BPETokenizer.train(CORPUS[:5], 400)
    vocab_path, merges_path = trained.save_gpt2_files(tmp_path)
    lines = merges_path.read_text(encoding="utf-8").splitlines()
    table = json.loads(vocab_path.read_text(encoding="utf-8"))

    def refused(vocab, merges, words):
        (tmp_path / "v.json").write_text(vocab, encoding="utf-8")
        (tmp_path / "m.txt").write_text(merges, encoding="utf-8")
        with pytest.raises(ValueError, match=words):
            BPETokenizer.from_gpt2_files(tmp_path / "v.json", tmp_path / "m.txt")

    good_vocab, good_merges = json.dumps(table), "\n".join(lines)
    refused("{", good_merges, "not valid JSON")
    refused(json.dumps({"a": "1"}), good_merges, "must map token strings to integer ids")
    refused(good_vocab, "\n".join([*lines, "a b c"]), r"line \d+: 'a b c' is not two tokens")
    refused(good_vocab, "\n".join([*lines, "a \x00"]), "not one of GPT-2's 256 byte characters")
    late = lines[-1].split(" ")[0] + "zz zz"  # a token no merge forms
    refused(good_vocab, "\n".join([*lines, late]), "uses a token that no earlier merge forms")
    swapped = dict(table)
    a, b = lines[1].split(" ")
    swapped[a + b], swapped[ENDOFTEXT] = swapped[ENDOFTEXT], swapped[a + b]
    refused(json.dumps(swapped), good_merges, "has id")
    refused(json.dumps({**table, "extra": len(table)}), good_merges, "special tokens")


def test_specials_last_layout():
    tok = BPETokenizer(
        [(BYTE_ORDER.index(ord("a")), BYTE_ORDER.index(ord("b")))], specials_first=False
    )
    assert tok.vocab[256] == b"ab" and tok.pad_id == 257 and tok.eos_id == 258
    assert tok.encode("ab<|pad|>", allow_special=True) == [256, 257]
    with pytest.raises(TypeError, match="specials_first must be a bool"):
        BPETokenizer(specials_first=1)  # type: ignore[arg-type]
