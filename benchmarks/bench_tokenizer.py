"""Byte-level BPE (``minitransformer.tokenizer``) against Hugging Face ``tokenizers`` on the inputs
that a merge loop rescanning every pair makes quadratic.

Setting (chapter "From the paper to a language model", section "Byte-pair encoding"): both
tokenizers are trained with the same settings (GPT-2's pre-tokenisation, all 256 bytes, the
same special tokens, ``min_frequency`` 2; the tests check that they learn the same merges and
encode alike) and timed in one process, in alternating order, for a few rounds:

* **encoding 16,000 spaces**, one pre-tokenisation chunk, with a tokenizer trained to 1024
  tokens on ``pydoc_data.topics`` (the chapter's corpus);
* **training on one 80,000-letter word** (letters a-h, seeded), to 1024 tokens;
* **encoding that word** with the tokenizer trained on it.

Ours is pure Python and HF's is Rust, so a constant factor is expected; what must not happen
is a factor that grows with the chunk (the rescanning loop took 36 s on the spaces, where HF
takes milliseconds, and 150 s to train on the word). Our chunk cache is cleared before each
encode, so that each round encodes from scratch. Times are process CPU time (the medians over
the rounds; one thread: HF's training runs in parallel otherwise, so
``RAYON_NUM_THREADS=1`` is set before it is imported).

Targets: each of ours <= 30x HF's time on the same input, and the merges and ids equal HF's.
Exit status 1 if one is missed (``--no-check`` only prints).

Run: ``.venv/bin/python benchmarks/bench_tokenizer.py [--rounds 3]``
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pydoc_data.topics import topics

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402

from minitransformer.tokenizer import ENDOFTEXT, PAD, BPETokenizer  # noqa: E402

SPECIALS = [PAD, ENDOFTEXT]
VOCAB = 1024
TARGET = 30.0


def hf_train(texts: list[str], vocab_size: int) -> Tokenizer:
    """HF's byte-level BPE with our settings (as tests/test_tokenizer.py builds it)."""
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    hf.train_from_iterator(texts, trainer)
    return hf


def cpu_time(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.process_time()
    out = fn()
    return time.process_time() - start, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()

    corpus = [topics[name] for name in sorted(topics)]
    spaces = " " * 16_000
    word = "".join(random.Random(0).choice("abcdefgh") for _ in range(80_000))
    ours_corpus, hf_corpus = BPETokenizer.train(corpus, VOCAB), hf_train(corpus, VOCAB)
    ours_word, hf_word = BPETokenizer.train(word, VOCAB), hf_train([word], VOCAB)

    def encode(tok: BPETokenizer, text: str) -> Callable[[], list[int]]:
        def run() -> list[int]:
            tok._cache.clear()  # from scratch every round
            return tok.encode(text)

        return run

    cases: dict[str, tuple[Callable[[], object], Callable[[], object], Callable]] = {
        "encode 16,000 spaces": (
            encode(ours_corpus, spaces),
            lambda: hf_corpus.encode(spaces).ids,
            lambda a, b: a == b,
        ),
        "train on an 80,000-letter word": (
            lambda: BPETokenizer.train(word, VOCAB).merges,
            lambda: hf_train([word], VOCAB),
            lambda a, b: len(a) == b.get_vocab_size() - len(SPECIALS) - 256,
        ),
        "encode that word": (
            encode(ours_word, word),
            lambda: hf_word.encode(word).ids,
            lambda a, b: a == b,
        ),
    }
    failed = []
    print(f"{'case':32s} {'ours (s)':>9s} {'HF (s)':>9s} {'ratio':>7s}  same result")
    for name, (ours, hf, same) in cases.items():
        times: dict[str, list[float]] = {"ours": [], "hf": []}
        agree = True
        for r in range(args.rounds):
            order = [("ours", ours), ("hf", hf)] if r % 2 == 0 else [("hf", hf), ("ours", ours)]
            results = {}
            for who, fn in order:
                t, results[who] = cpu_time(fn)
                times[who].append(t)
            agree &= bool(same(results["ours"], results["hf"]))
        t_ours, t_hf = statistics.median(times["ours"]), statistics.median(times["hf"])
        ratio = t_ours / max(t_hf, 1e-6)
        print(f"{name:32s} {t_ours:9.3f} {t_hf:9.3f} {ratio:7.1f}  {'yes' if agree else 'NO'}")
        if ratio > TARGET or not agree:
            failed.append(name)
    if failed and not args.no_check:
        print(f"missed (target <= {TARGET:g}x HF, same result): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
