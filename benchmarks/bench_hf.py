"""Greedy generation with the KV cache: the package against Hugging Face ``transformers``.

Setting (chapter "From the paper to a language model", section "Your model is GPT-2"): one
random ``GPT2LMHeadModel`` per shape, and the same weights loaded into the package's
``DecoderOnlyTransformer`` with ``from_hf_gpt2``; float32, eval mode, in one process. Each
generates 256 new tokens after a 32-token prompt, greedily, with its KV cache:
``transformers``' ``generate(do_sample=False, use_cache=True)`` against the package's
``generate(temperature=0)``. Both must give the same tokens (checked; a differing run is
reported).

Shapes: ``small`` (d_model 256, 4 layers, 4 heads, vocabulary 4096) and ``124M`` (GPT-2
small: d_model 768, 12 layers, 12 heads, vocabulary 50257). Batches of 1 and 8, at 1 and 2
threads. The two implementations alternate within each round; the tables give tokens per
second (new tokens x batch / time) of each, and the ratio of their times, as the median and
the spread (min-max) over the rounds. Times are process CPU time at 1 thread (it leaves out
the moments other programs had the processor) and wall-clock time at 2.

Targets (issue "From the course's model to GPT-2"): at least 2x ``transformers`` at the small
shape, and no slower than it at 124M, in every round, for B = 1 and B = 8. Exit status 1 if
one is missed (``--no-check`` only prints).

What makes the package's step faster (chapter "Inference", and ``bench_kv_cache.py``): the
cached step's fast path, over tensors gathered once per run, with the weights that have more
outputs than inputs read from copies stored ``(in, out)``. On the AMD EPYC machine where this
was measured (PyTorch's MKL), a one-row ``F.linear`` over ``nn.Linear``'s ``(out, in)`` layout
reads the matrix 1.3-2.2 times slower than over ``(in, out)`` for the wide matrices: one row
through GPT-2 small's 50257 x 768 output projection takes 13.3 ms over ``transformers``'
``lm_head`` (an ``nn.Linear``), 7.3 ms over the package's copy.

Why the small shape misses 2x at B = 8 (same machine, one thread, 2026-12-06): the step is
memory-bound, and both implementations read the same bytes. A step reads the ~17 MB of
weights and, per layer, the cached keys and values of 8 rows x 4 heads x 64 x 4 bytes x 2
per position: 2.6 MB at the run's mean length, 4.7 MB at its end. They do not stay in the
L3 cache beside the weights. In a hand-written step over the package's tensors (no checks,
no bookkeeping), the four attention kernels took ~1.6-1.7 ms of 4.1-4.3 ms (a kernel reads
its 2.6 MB at ~6 GB/s there, at ~30 GB/s alone); without them the step took 2.5-2.9 ms.
``transformers`` took 6.4-7.7 ms a step: 2x needs at most 3.2-3.9 ms, not much more than the
products and small operators alone. Prepacked oneDNN products
(``torch.ops.mkldnn``, inductor's private operators) in that hand-written step gave 1.5-2.0x
(median 1.71, 5 rounds): measured, not adopted. At B = 1 the keys and values are 8 times
smaller and what differs between the two implementations is the fixed cost of a step.

Run: ``.venv/bin/python benchmarks/bench_hf.py [--rounds 5] [--shapes small 124M]
[--threads 1 2] [--batches 1 8] [--new-tokens 256]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from minitransformer.gpt2 import from_hf_gpt2
from minitransformer.lm import generate

SHAPES = {
    "small": {"n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 4096},
    "124M": {"n_embd": 768, "n_layer": 12, "n_head": 12, "vocab_size": 50257},
}
TARGETS = {"small": 2.0, "124M": 1.0}  # HF time / ours, at least
PROMPT = 32


def build(shape: str, max_len: int):
    import transformers  # a test and book dependency, not the package's

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        **SHAPES[shape], n_positions=max_len, bos_token_id=0, eos_token_id=0, pad_token_id=0
    )
    hf = transformers.GPT2LMHeadModel(config).eval()
    return hf, from_hf_gpt2(hf)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()
    n_new = args.new_tokens
    print(
        f"greedy generation, {PROMPT}-token prompt + {n_new} new tokens, KV cache, float32, "
        f"{args.rounds} rounds; tokens/s median (min-max); ratio = HF time / ours"
    )
    print(
        f"{'shape':<6} {'thr':>3} {'B':>2}  {'transformers tok/s':>22}  "
        f"{'ours tok/s':>22}  {'ratio':>17}  same"
    )
    missed = []
    for shape in args.shapes:
        hf, ours = build(shape, PROMPT + n_new)
        for threads in args.threads:
            torch.set_num_threads(threads)
            clock = time.process_time if threads == 1 else time.perf_counter
            for B in args.batches:
                prompt = torch.randint(
                    1, SHAPES[shape]["vocab_size"], (B, PROMPT),
                    generator=torch.Generator().manual_seed(B),
                )  # fmt: skip

                def run_hf(prompt=prompt, hf=hf):
                    return hf.generate(
                        prompt,
                        max_new_tokens=n_new,
                        do_sample=False,
                        use_cache=True,
                        eos_token_id=None,
                    )

                def run_ours(prompt=prompt, ours=ours):
                    return generate(ours, prompt, n_new, temperature=0)

                with torch.inference_mode():
                    run_hf(prompt[:, :4]), run_ours(prompt[:, :4])  # warm-up
                times: dict[str, list[float]] = {"hf": [], "ours": []}
                same = True
                for r in range(args.rounds):
                    order = [("hf", run_hf), ("ours", run_ours)]
                    outputs = {}
                    for name, fn in order if r % 2 == 0 else order[::-1]:
                        start = clock()
                        with torch.inference_mode():
                            outputs[name] = fn()
                        times[name].append(clock() - start)
                    same &= torch.equal(outputs["hf"], outputs["ours"])
                ratios = [h / o for h, o in zip(times["hf"], times["ours"], strict=True)]

                def rate(ts: list[float], B=B) -> str:
                    tps = sorted(B * n_new / t for t in ts)
                    return f"{statistics.median(tps):7.0f} ({tps[0]:.0f}-{tps[-1]:.0f})"

                print(
                    f"{shape:<6} {threads:>3} {B:>2}  {rate(times['hf']):>22}  "
                    f"{rate(times['ours']):>22}  {statistics.median(ratios):5.2f} "
                    f"({min(ratios):.2f}-{max(ratios):.2f})  {same}",
                    flush=True,
                )
                if min(ratios) < TARGETS[shape]:
                    missed.append(
                        f"{shape}, {threads} thread(s), B={B}: {min(ratios):.2f}x in the worst "
                        f"round, target {TARGETS[shape]}x"
                    )
    for line in missed:
        print("target missed:", line)
    return 1 if missed and not args.no_check else 0


if __name__ == "__main__":
    sys.exit(main())
