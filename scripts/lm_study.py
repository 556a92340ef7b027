"""Measurements for the chapter "From the paper to a language model" (book/lm).

What byte-level BPE does to sequence length and vocabulary size on Python's own documentation
(pydoc_data.topics), the decoder-only model's held-out perplexity against a bigram baseline on
3 seeds, seeded samples, and the KV-cache bytes per token. Everything runs on the CPU with
torch threads 2 and downloads nothing.

    python scripts/lm_study.py                 # the full study (about 5 minutes on 2 cores)
    python scripts/lm_study.py --quick         # a smoke test (seconds)

Timings are medians over alternating rounds, with their spread (min-max); a shared machine
inflates them, so compare them with one another rather than with another machine.
"""

from __future__ import annotations

import argparse
import math
import platform
import statistics
import sys
import time

import torch

from minitransformer.kv_cache import KVCache
from minitransformer.kv_memory import kv_cache_bytes
from minitransformer.lm import (
    DecoderOnlyTransformer,
    bigram_log_probs,
    bigram_loss,
    encode_corpus,
    evaluate_lm,
    generate,
    pydoc_split,
    train_lm,
)
from minitransformer.model import Transformer, parameter_breakdown
from minitransformer.tokenizer import BPETokenizer

#: The chapter's model and training run (the cells of book/lm use these).
VOCAB_SIZE = 1024
# No dropout: 300 steps see the training tokens about 9 times, too few to overfit much, and
# dropout's random masks cost about 30 % of a step on the CPU (held-out perplexity of seed 0
# with one thread: 35.0 without dropout, 38.3 with 0.1; measured on the earlier split by name,
# whose held-out text held copies of training topics).
MODEL = dict(d_model=128, num_heads=4, num_layers=2, d_ff=512, dropout=0.0)
# 250 steps keep the chapter's run near a minute on 2 idle cores (300 steps: perplexity about 35
# on the earlier split by name; the split by content's held-out text is harder).
SEQ_LEN, BATCH_SIZE, STEPS, LR, WARMUP = 64, 64, 250, 1e-2, 25
BIGRAM_ALPHAS = (1.0, 0.1, 0.03, 0.01)
#: (temperature, top_k) of the samples; temperature 0 is greedy.
SAMPLING = ((0.0, None), (0.7, 10), (1.0, 50))
PROMPT = "The"


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f})"


def timed(fn, *args, **kwargs):
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def bpe_table(train_docs, held_docs, sizes, rounds):
    print("\n== BPE: sequence length and vocabulary size ==")
    chars = sum(map(len, train_docs))
    raw_bytes = sum(len(d.encode("utf-8")) for d in train_docs)
    print(f"training text: {chars:,} characters, {raw_bytes:,} UTF-8 bytes")
    times = {v: [] for v in sizes}
    tokenizers = {}
    for _ in range(rounds):  # alternate the sizes, so that a slow moment hits all of them
        for v in sizes:
            tokenizers[v], seconds = timed(BPETokenizer.train, train_docs, v)
            times[v].append(seconds)
    print(
        f"{'vocab':>6} {'merges':>6} {'train tokens':>12} {'tok/char':>8} {'char/tok':>8} "
        f"{'held-out tok':>12} {'emb. share':>10}  training time"
    )
    for v in sizes:
        tok = tokenizers[v]
        n_train = sum(len(tok.encode(d)) for d in train_docs)
        n_held = sum(len(tok.encode(d)) for d in held_docs)
        model = DecoderOnlyTransformer(tok.vocab_size, max_len=SEQ_LEN, **MODEL)
        total = sum(p.numel() for p in model.parameters())
        share = model.embed.weight.numel() / total
        print(
            f"{tok.vocab_size:>6} {len(tok.merges):>6} {n_train:>12,} {n_train / chars:>8.3f} "
            f"{chars / n_train:>8.2f} {n_held:>12,} {share:>9.1%}  {spread(times[v])}"
        )
    with torch.device("meta"):  # no memory: the paper's base model, 37,000 shared tokens
        base = Transformer(37000, 37000)
    counts = parameter_breakdown(base)
    print(
        f"(UTF-8: {raw_bytes / chars:.3f} bytes per character. The embedding share "
        f"is of our {MODEL['num_layers']}-layer d_model={MODEL['d_model']} model, tied. The "
        f"paper's base model: {counts['embeddings'] / 1e6:.1f}M of {counts['total'] / 1e6:.1f}M "
        f"parameters, {counts['embeddings'] / counts['total']:.1%}.)"
    )
    return tokenizers


def lm_study(tok, train_docs, held_docs, seeds, steps):
    print(f"\n== The language model (vocab {tok.vocab_size}) ==")
    train_ids, held_ids = encode_corpus(tok, train_docs), encode_corpus(tok, held_docs)
    held_chars = sum(map(len, held_docs)) + len(held_docs)  # + one <|endoftext|> each
    print(
        f"tokens: {len(train_ids):,} training, {len(held_ids):,} held-out "
        f"({len(train_docs)} and {len(held_docs)} topics, each ended by <|endoftext|>)"
    )
    print(
        f"model: {MODEL}, max_len {SEQ_LEN}; training: {steps} steps of {BATCH_SIZE} x "
        f"{SEQ_LEN} tokens, AdamW lr {LR}, warm-up {WARMUP}, cosine to lr/10"
    )

    def per_char(nll: float) -> float:  # bits per character of the held-out text
        return nll * (len(held_ids) - 1) / held_chars / math.log(2)

    print("bigram baseline fitted on the training tokens (held-out perplexity, bits/char):")
    best = None
    for alpha in BIGRAM_ALPHAS:
        nll = bigram_loss(bigram_log_probs(train_ids, tok.vocab_size, alpha=alpha), held_ids)
        print(f"  add-{alpha:g}: {math.exp(nll):.1f}, {per_char(nll):.3f}")
        best = nll if best is None else min(best, nll)
    print(
        f"  best (alpha chosen on the held-out set itself, in the baseline's favour): "
        f"{math.exp(best):.1f}"
    )

    models, results = {}, []
    for seed in seeds:
        torch.manual_seed(seed)
        model = DecoderOnlyTransformer(tok.vocab_size, max_len=SEQ_LEN, **MODEL)
        history, seconds = timed(
            train_lm,
            model,
            train_ids,
            steps=steps,
            seq_len=SEQ_LEN,
            batch_size=BATCH_SIZE,
            lr=LR,
            warmup_steps=WARMUP,
            generator=torch.Generator().manual_seed(seed),
            progress=False,
        )
        losses = history.loss
        nll = evaluate_lm(model, held_ids, seq_len=SEQ_LEN)
        train_nll = evaluate_lm(model, train_ids, seq_len=SEQ_LEN)  # the same measure
        results.append((seed, seconds, statistics.mean(losses[-20:]), train_nll, nll))
        models[seed] = model.eval()
    print(
        f"{'seed':>4} {'train s':>8} {'last-20 train loss':>18} {'train-text loss':>15} "
        f"{'held-out loss':>13} {'held-out ppl':>12} "
        f"{'bits/char':>9} {'vs best bigram':>14}"
    )
    for seed, seconds, train_loss, train_nll, nll in results:
        print(
            f"{seed:>4} {seconds:>8.1f} {train_loss:>18.3f} {train_nll:>15.3f} {nll:>13.3f} "
            f"{math.exp(nll):>12.2f} "
            f"{per_char(nll):>9.3f} {math.exp(nll) / math.exp(best):>13.1%}"
        )
    ppl = [math.exp(r[4]) for r in results]
    print(
        f"held-out perplexity: median {statistics.median(ppl):.2f}, spread "
        f"{min(ppl):.2f}-{max(ppl):.2f} (best bigram {math.exp(best):.1f}); training "
        f"{spread([r[1] for r in results])}"
    )
    return models[seeds[0]], seeds[0]


def samples(model, tok, seed):
    print(f"\n== Samples (model of seed {seed}, prompt {PROMPT!r}, generator seed 0) ==")
    prompt = torch.tensor([tok.encode(PROMPT)])
    for temperature, top_k in SAMPLING:
        out = generate(
            model,
            prompt,
            SEQ_LEN - prompt.shape[1],
            temperature=temperature,
            top_k=top_k,
            generator=torch.Generator().manual_seed(0),
        )
        label = "greedy" if temperature == 0 else f"temperature {temperature}, top-k {top_k}"
        print(f"-- {label}:\n{tok.decode(out[0])!r}")


def kv_cache_study(model, tok):
    print("\n== KV cache bytes per token ==")
    layers, heads = len(model.decoder.layers), model.num_heads
    head_dim = model.d_model // heads
    dtype_bytes = next(model.parameters()).element_size()
    formula = 2 * layers * heads * head_dim * dtype_bytes
    calculator = kv_cache_bytes(
        num_layers=layers,
        num_kv_heads=heads,
        head_dim=head_dim,
        seq_len=1,
        bytes_per_element=dtype_bytes,
    )
    print(
        f"formula 2 x {layers} layers x {heads} KV heads x {head_dim} head_dim x "
        f"{dtype_bytes} bytes (fp32) = {formula:,} bytes per token (calculator: {calculator:,})"
    )
    B, n = 4, SEQ_LEN - 1
    cache = KVCache.for_model(model, 1 + n)
    generate(
        model,
        torch.full((B, 1), tok.eos_id),
        n,
        cache=cache,
        generator=torch.Generator().manual_seed(0),
    )
    used = sum(layer.self_attn.used_nbytes for layer in cache.layers)
    print(
        f"measured after generating {B} x {n} tokens: nbytes {cache.nbytes:,} = "
        f"{cache.nbytes // (B * (1 + n)):,} per token and sequence ({1 + n} positions "
        f"allocated); filled {cache.length} positions: {used // (B * cache.length):,} per token"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke test: tiny sizes")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--rounds", type=int, default=3, help="timing rounds of the tokenizers")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    sizes = [258, 512, 1024, 2048, 4096]
    if args.quick:
        sizes, args.seeds, args.steps, args.rounds = [258, 300], args.seeds[:1], 3, 1
    print(
        f"Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, CPU capability "
        f"{torch.backends.cpu.get_cpu_capability()}"
    )
    train_docs, held_docs = pydoc_split()
    print(
        f"pydoc_data.topics: {len(train_docs) + len(held_docs)} topics, "
        f"{sum(map(len, train_docs + held_docs)):,} characters; held out by content "
        f"(no shared 12-word passage): {len(held_docs)} topics, "
        f"{sum(map(len, held_docs)):,} characters"
    )
    tokenizers = bpe_table(train_docs, held_docs, sizes, args.rounds)
    vocab = VOCAB_SIZE if VOCAB_SIZE in tokenizers else sizes[-1]
    model, seed = lm_study(tokenizers[vocab], train_docs, held_docs, args.seeds, args.steps)
    samples(model, tokenizers[vocab], seed)
    kv_cache_study(model, tokenizers[vocab])
    return 0


if __name__ == "__main__":
    sys.exit(main())
