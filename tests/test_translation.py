"""The English->German translation data (minitransformer.translation): the libraries' real
strings, splits disjoint by construction, determinism from a seed, character round trips."""

from __future__ import annotations

import datetime

import pytest
import torch

from minitransformer.data import BOS_ID, EOS_ID, PAD_ID
from minitransformer.translation import (
    KINDS,
    SPLITS,
    CharVocab,
    amount_text,
    date_text,
    domain,
    make_translation_batch,
    number_text,
    split_of,
    translation_pairs,
)


def test_the_strings_are_the_languages_own():
    assert number_text(23) == "twenty-three"
    assert number_text(23, "de") == "dreiundzwanzig"  # the ones before the tens
    assert number_text(342, "de") == "dreihundertzweiundvierzig"  # one closed compound
    assert number_text(71, "fr") == "soixante et onze"
    day = datetime.date(2021, 3, 1)
    assert date_text(day) == "Monday, March 1, 2021"
    assert date_text(day, "de") == "Montag, 1. März 2021"
    assert date_text(day, "de", "long") == "1. März 2021"
    assert amount_text(2350, "de") == "dreiundzwanzig Euro und fünfzig Cent"
    assert amount_text(29) == "zero euro, twenty-nine cents"  # Decimal: no 0.28999...


@pytest.mark.parametrize("kind", KINDS)
def test_splits_partition_the_domain_in_whole_blocks(kind):
    parts = {split: domain(kind, split) for split in SPLITS}
    sets = {split: set(values) for split, values in parts.items()}
    assert not sets["train"] & sets["valid"] and not sets["train"] & sets["test"]
    assert not sets["valid"] & sets["test"]
    every = domain_size = sum(len(v) for v in parts.values())
    assert every == len(set().union(*sets.values())) == domain_size
    share = len(parts["test"]) / domain_size
    assert 0.04 < share < 0.06  # one block in 20
    if kind == "number":  # whole hundreds held out: 2,000 .. 2,099 is all test
        assert split_of("number", 2000) == split_of("number", 2099) == "test"
        assert {split_of("number", n) for n in range(2000, 2100)} == {"test"}
        assert split_of("number", 2100) == "valid"


def test_pairs_are_deterministic_disjoint_and_mixed():
    train = translation_pairs(600, split="train", seed=0)
    assert train == translation_pairs(600, split="train", seed=0)
    assert train != translation_pairs(600, split="train", seed=1)
    test = translation_pairs(600, split="test", seed=0)
    assert not {s for s, _ in train} & {s for s, _ in test}  # no source sentence in both
    assert len({s for s, _ in train}) == 600  # drawn without replacement
    number, date, amount = (s for s, _ in train[:3])  # the kinds in turn
    assert not any(c.isdigit() for c in number) and "euro" not in number
    assert any(c.isdigit() for c in date) and "euro" in amount
    assert any(" " in t for _, t in test)  # multi-word targets, for BLEU


def test_asking_for_more_pairs_than_a_split_holds_is_refused():
    size = len(domain("number", "test"))
    with pytest.raises(ValueError, match=f"the test split has {size:,}"):
        translation_pairs(size + 1, split="test", seed=0, kinds=["number"])


def test_char_vocab_round_trips_and_batches():
    pairs = translation_pairs(30, split="valid", seed=3)
    src_vocab = CharVocab(s for s, _ in pairs)
    tgt_vocab = CharVocab(t for _, t in pairs)
    for s, t in pairs:
        assert src_vocab.decode(src_vocab.encode(s)) == s
        assert tgt_vocab.decode([BOS_ID, *tgt_vocab.encode(t), EOS_ID, PAD_ID]) == t
    batch = make_translation_batch(pairs, src_vocab, tgt_vocab)
    longest = max(len(t) for _, t in pairs)
    assert batch.tgt_in.shape == batch.tgt_out.shape == (30, longest + 1)
    assert torch.equal(batch.tgt_in[:, 0], torch.full((30,), BOS_ID))
    for b, (s, t) in enumerate(pairs):
        assert src_vocab.decode(batch.src[b]) == s
        assert tgt_vocab.decode(batch.tgt_out[b]) == t
        assert batch.tgt_out[b, len(t)] == EOS_ID
        assert torch.equal(batch.tgt_in[b, 1 : len(t) + 1], batch.tgt_out[b, : len(t)])


def test_bad_input_is_a_clear_error():
    with pytest.raises(ValueError, match=r"n must be in \[0, 99,999\], got 100,000"):
        number_text(100_000)
    with pytest.raises(TypeError, match="n must be an int, got bool"):
        number_text(True)
    with pytest.raises(ValueError, match="lang must be one of en, de, fr, got 'it'"):
        number_text(3, "it")
    with pytest.raises(TypeError, match="day must be a datetime.date"):
        date_text(datetime.datetime(2021, 3, 1))
    with pytest.raises(ValueError, match="day.year must be in"):
        date_text(datetime.date(1850, 1, 1))
    with pytest.raises(ValueError, match="fmt must be one of full, long"):
        date_text(datetime.date(2021, 3, 1), fmt="short")
    with pytest.raises(ValueError, match="cents must be in"):
        amount_text(0)
    with pytest.raises(ValueError, match="split must be one of train, valid, test"):
        translation_pairs(3, split="dev", seed=0)
    with pytest.raises(TypeError, match="kinds must be a non-empty sequence"):
        translation_pairs(3, split="test", seed=0, kinds="number")
    with pytest.raises(TypeError, match="seed must be an int"):
        translation_pairs(3, split="test", seed=None)  # type: ignore[arg-type]
    vocab = CharVocab(["abc"])
    with pytest.raises(ValueError, match=r"characters this vocabulary has not seen: \['z'\]"):
        vocab.encode("abz")
    with pytest.raises(ValueError, match="not an id of this vocabulary"):
        vocab.decode([99])
    with pytest.raises(TypeError, match=r"texts\[1\] must be a str"):
        CharVocab(["a", 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="texts must be an iterable of str"):
        CharVocab(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pairs must hold at least one"):
        make_translation_batch([], vocab, vocab)
