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


def test_french_is_the_same_draw_in_another_language():
    # The target language changes the targets only: the same sources, split and order.
    german = translation_pairs(300, split="test", seed=4)
    french = translation_pairs(300, split="test", seed=4, lang="fr")
    assert [s for s, _ in french] == [s for s, _ in german]
    assert french == translation_pairs(300, split="test", seed=4, lang="fr")
    assert {t for _, t in french}.isdisjoint({t for _, t in german})
    # French spells large numbers in several words, so BLEU sees n-grams in them too.
    assert number_text(1984, "fr") == "mille neuf cent quatre-vingt-quatre"
    assert number_text(80, "fr") == "quatre-vingts" and number_text(81, "fr") == "quatre-vingt-un"
    assert amount_text(101, "fr") == "un euro et un centime"  # singular
    assert amount_text(2350, "fr") == "vingt-trois euros et cinquante centimes"
    assert date_text(datetime.date(2021, 3, 1), "fr") == "lundi 1 mars 2021"
    numbers = [t for _, t in french[0::3]]
    assert sum(" " in t for t in numbers) > 0.9 * len(numbers)


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


# -- tokenizer, decoding and scores --------------------------------------------------------------

import dataclasses  # noqa: E402
import math  # noqa: E402

import sacrebleu  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from sacrebleu.metrics import BLEU  # noqa: E402

from minitransformer.data import strip_special  # noqa: E402
from minitransformer.decoding import beam_search, greedy_decode  # noqa: E402
from minitransformer.model import Transformer  # noqa: E402
from minitransformer.training import average_checkpoints  # noqa: E402
from minitransformer.translation import (  # noqa: E402
    SPECIAL_TOKENS,
    TranslatorRecipe,
    brevity_penalty,
    corpus_scores,
    load_study,
    ngram_matches,
    score_by_kind,
    train_translator,
    translate,
    translation_tokenizer,
)

TINY = TranslatorRecipe(
    steps=3,
    batch_size=4,
    vocab_size=280,
    bpe_pairs=12,
    d_model=16,
    num_heads=2,
    d_ff=32,
    num_layers=1,
    checkpoints=2,
    checkpoint_every=1,
    valid_pairs=3,
)


def test_the_shared_tokenizer_puts_the_specials_at_the_ids_of_the_data_module():
    pairs = translation_pairs(300, split="train", seed=0)
    tok = translation_tokenizer(pairs, 400)
    assert tok.vocab_size == 400
    assert [tok.encode(s, allow_special=True) for s in SPECIAL_TOKENS] == [
        [PAD_ID],
        [BOS_ID],
        [EOS_ID],
    ]
    for source, target in translation_pairs(60, split="test", seed=3):
        for text in (source, target):  # held-out text round-trips, special ids never appear
            ids = tok.encode(text)
            assert tok.decode(ids) == text and min(ids) > EOS_ID
    # One vocabulary: the year is the same ids on both sides.
    assert tok.encode(" 2021") == tok.encode(" 2021")
    with pytest.raises(TypeError, match=r"pairs\[0\]"):
        translation_tokenizer([("a", "b", "c")])


def _model(vocab: int) -> Transformer:
    torch.manual_seed(0)
    return Transformer(vocab, vocab, d_model=16, num_heads=2, num_layers=1, d_ff=32, max_len=80)


def test_translate_is_the_decoders_output_decoded():
    pairs = translation_pairs(40, split="train", seed=1)
    tok = translation_tokenizer(pairs, 300)
    model = _model(tok.vocab_size).train()
    sources = [s for s, _ in pairs[:7]]
    batch = make_translation_batch([(s, "") for s in sources], tok, tok)
    limit = batch.src.shape[1] + 51
    model.eval()
    ids = greedy_decode(model, batch.src, limit, BOS_ID, EOS_ID, src_mask=batch.src_mask)
    beam = beam_search(
        model, batch.src, limit, BOS_ID, EOS_ID, src_mask=batch.src_mask, length_penalty=1.0
    )
    model.train()
    assert translate(model, sources, tok) == [tok.decode(strip_special(r)) for r in ids]
    assert translate(model, sources, tok, beam_size=4, length_penalty=1.0) == [
        tok.decode(strip_special(r)) for r in beam
    ]
    assert model.training  # the mode is put back
    with pytest.raises(TypeError, match="sources"):
        translate(model, "one sentence", tok)


def test_corpus_scores_are_sacrebleus():
    hyps = ["Montag, 1. März 2021", "dreiundzwanzig", "vier Euro und zwei Cent"]
    refs = ["Montag, 1. März 2021", "zweiundzwanzig", "vierhundert Euro und zwei Cent"]
    s = corpus_scores(hyps, refs)
    assert s.bleu == sacrebleu.corpus_bleu(hyps, [refs]).score
    assert s.chrf == sacrebleu.corpus_chrf(hyps, [refs]).score
    assert s.exact == 1 / 3
    assert "tok:13a" in s.bleu_signature and "nc:6" in s.chrf_signature
    # A corpus of single words has no bigrams: BLEU is 0 even when every word is right.
    assert corpus_scores(["dreiundzwanzig"], ["dreiundzwanzig"]).bleu == 0.0
    with pytest.raises(TypeError, match="references"):
        corpus_scores(["a"], [3])
    with pytest.raises(TypeError, match="hypotheses"):
        corpus_scores("a", ["a"])


def _hand_bleu(hyps: list[list[str]], refs: list[list[str]]) -> float:
    """Corpus BLEU from Papineni et al. (2002): clipped n-gram precisions summed over the
    corpus for n = 1..4, their geometric mean, times the brevity penalty; no smoothing."""
    log_p = 0.0
    for n in range(1, 5):
        counts = [ngram_matches(h, r, n) for h, r in zip(hyps, refs, strict=True)]
        matches, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
        if matches == 0:
            return 0.0
        log_p += math.log(matches / total) / 4
    bp = brevity_penalty(sum(map(len, hyps)), sum(map(len, refs)))
    return 100 * bp * math.exp(log_p)


def test_bleu_by_hand_on_a_tiny_corpus_equals_sacrebleu():
    hyps = ["the cat sat on the mat", "a dog ran in the park today"]
    refs = ["the cat sat on a mat", "the dog ran in the big park today"]
    # Worked out: 1-grams 11/13, 2-grams 7/11, 3-grams 4/9, 4-grams 2/7; 13 against 14
    # reference words, so bp = exp(1 - 14/13).
    want = 100 * math.exp(1 - 14 / 13) * (11 / 13 * 7 / 11 * 4 / 9 * 2 / 7) ** 0.25
    h, r = [x.split() for x in hyps], [x.split() for x in refs]
    assert _hand_bleu(h, r) == pytest.approx(want, rel=1e-12)
    bleu = BLEU(tokenize="none", smooth_method="none")
    assert bleu.corpus_score(hyps, [refs]).score == pytest.approx(want, rel=1e-12)


words = st.lists(st.sampled_from(["drei", "und", "zwanzig", "Euro", "Cent", "1", "."]), max_size=9)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(words, words), min_size=1, max_size=4))
def test_clipped_counts_and_the_penalty_agree_with_sacrebleu(corpus):
    hyps = [" ".join(h) for h, _ in corpus]
    refs = [" ".join(r) for _, r in corpus]
    stats = BLEU(tokenize="none").corpus_score(hyps, [refs])
    for n in range(1, 5):
        counts = [ngram_matches(h, r, n) for h, r in corpus]
        assert stats.counts[n - 1] == sum(c[0] for c in counts)
        assert stats.totals[n - 1] == sum(c[1] for c in counts)
    assert brevity_penalty(stats.sys_len, stats.ref_len) == pytest.approx(stats.bp, abs=1e-12)


def test_the_brevity_penalty_at_its_edges():
    assert brevity_penalty(10, 10) == brevity_penalty(12, 10) == 1.0
    assert brevity_penalty(0, 5) == 0.0
    assert brevity_penalty(5, 10) == pytest.approx(math.exp(-1))
    with pytest.raises(TypeError, match="hypothesis"):
        ngram_matches("a b", ["a"], 1)


def test_average_checkpoints_is_the_mean_and_leaves_the_inputs_alone():
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 2, generator=gen), "b": torch.randn(2)} for _ in range(5)]
    before = [{k: v.clone() for k, v in s.items()} for s in states]
    avg = average_checkpoints(states)
    for k in ("w", "b"):
        want = torch.stack([s[k].double() for s in states]).mean(0).float()
        assert torch.equal(avg[k], want) and avg[k].dtype == torch.float32
    assert all(torch.equal(s[k], b[k]) for s, b in zip(states, before, strict=True) for k in s)
    with pytest.raises(TypeError, match=r"states\[0\]\['n'\]"):
        average_checkpoints([{"n": torch.ones(2, dtype=torch.long)}])
    with pytest.raises(TypeError, match=r"states\[1\]"):
        average_checkpoints([{"w": torch.ones(2)}, torch.ones(2)])


def test_train_translator_averages_its_last_checkpoints():
    t = train_translator(TINY, seed=0, progress=False)
    assert not t.model.training and not t.averaged.training
    assert t.history.eval_steps == [1, 2, 3] and len(t.history.eval_metric) == 3
    assert t.tokenizer.vocab_size <= TINY.vocab_size
    # The average of the checkpoints of updates 2 and 3; the last one is the model itself.
    assert not torch.equal(t.averaged.output.weight, t.model.output.weight)
    again = train_translator(TINY, seed=0, progress=False)
    assert torch.equal(again.averaged.output.weight, t.averaged.output.weight)  # deterministic
    pairs = translation_pairs(6, split="test", seed=0)
    scores = score_by_kind(t.model, t.tokenizer, pairs)
    assert set(scores) == {"all", *KINDS}
    with pytest.raises(TypeError, match="recipe"):
        train_translator({"steps": 2})
    with pytest.raises(TypeError, match="seed"):
        train_translator(TINY, seed=True)


def test_the_study_file_matches_the_recipe_and_holds_five_seeds():
    study = load_study()
    assert [r["seed"] for r in study["runs"]] == [0, 1, 2, 3, 4]
    assert study["recipe"]["kinds"] == list(TranslatorRecipe().kinds)
    assert dataclasses.asdict(TranslatorRecipe())["steps"] == study["recipe"]["steps"]
