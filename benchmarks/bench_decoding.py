"""Batched decoding throughput: greedy and beam search (beam 4), cached, at B = 1, 8 and 64.

Model: the encoder-decoder of ``bench_kv_cache.py`` (chapter "Inference: the KV cache and the
cost of attention"): d_model = 256, 4 + 4 layers, 8 heads, d_ff = 1024, a vocabulary of 1000,
dropout off, float32, a 32-token source per row, one thread. Decoding is forced to ``--new``
tokens per row (``eos_id=None``), so every variant does the same work; tokens per second count
output tokens (B x new), not beam hypotheses.

Before/after pairs, timed in alternating rounds in one process (the headline is the median
of the per-round ratios, which compares runs made moments apart; min-max in brackets):

* beam search: :func:`minitransformer.decoding.beam_search` (one ``topk`` over ``(B, k * V)``
  per step) against the per-example Python loops it replaced (``tests/frozen_beam_search.py``);
  also on a small model (d_model 32, one layer) where that bookkeeping, not the model, is
  most of a step. Both must return the same tokens (checked).
* greedy: the default ``src_mask=None`` (no mask at all for an unpadded source) against the
  all-True mask that was built before.

Times come from ``torch.utils.benchmark.Timer``, one run per measurement. On the CPU it reads
the process's CPU time by default (``--clock cpu``): on one thread that is the time the
decoding ran, without the moments other programs had the processor, the more faithful number
on a shared machine. On CUDA it reads wall time and synchronises the device. Floors (exit
status 1 below them): the new beam search is not slower than the old on the inference model
(ratio >= 0.9 at every B), and at least 1.5x faster on the small model at B = 64.

Run: ``.venv/bin/python benchmarks/bench_decoding.py [--rounds 5] [--new 32] [--device cpu]
[--clock cpu|wall] [--no-check]``
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial

import torch
from torch.utils.benchmark import Timer

from minitransformer.decoding import beam_search, greedy_decode
from minitransformer.model import Transformer

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
from frozen_beam_search import frozen_beam_search  # noqa: E402

VOCAB, SRC_LEN, BEAM = 1000, 32, 4
MODELS = {
    "inference": dict(d_model=256, num_heads=8, num_layers=4, d_ff=1024),
    "small": dict(d_model=32, num_heads=4, num_layers=1, d_ff=64),
}
BATCHES = (1, 8, 64)
FLOOR_SAME_MODEL, FLOOR_SMALL_64 = 0.9, 1.5


def alternate(
    variants: dict[str, Callable[[], object]], rounds: int, threads: int, clock: str
) -> dict[str, list[float]]:
    """Per-variant seconds over ``rounds`` rounds, the order reversed every other round."""
    timer = {"cpu": {"timer": time.process_time}, "wall": {}}[clock]  # wall: synchronises CUDA
    names, times = list(variants), {name: [] for name in variants}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            timed = Timer(stmt="fn()", globals={"fn": variants[name]}, num_threads=threads, **timer)
            times[name].append(timed.timeit(1).times[0])
    return times


def spread(xs: list[float], fmt: str = "{:.2f}") -> str:
    return f"{fmt.format(statistics.median(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--new", type=int, default=32, help="new tokens per row (default 32)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--clock",
        choices=["cpu", "wall"],
        default=None,
        help="process CPU time or wall time (default: cpu on the CPU, wall on other devices)",
    )
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device, max_len = torch.device(args.device), args.new + 1
    clock = args.clock or ("cpu" if device.type == "cpu" else "wall")
    print(
        f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} thread(s), "
        f"{clock} time; "
        f"{args.new} new tokens per row, source {SRC_LEN} tokens, beam {BEAM}, "
        f"{args.rounds} alternating rounds; median [min-max]"
    )
    failures = []
    for model_name, sizes in MODELS.items():
        torch.manual_seed(0)
        model = Transformer(VOCAB, VOCAB, dropout=0.0, **sizes).eval().to(device)
        print(f"\n{model_name} model: {sizes}, vocab {VOCAB}")
        for B in BATCHES:
            gen = torch.Generator().manual_seed(B)
            src = torch.randint(3, VOCAB, (B, SRC_LEN), generator=gen).to(device)  # no padding
            everywhere = torch.ones(B, 1, 1, SRC_LEN, dtype=torch.bool, device=device)
            # partial binds this round's model and src (a lambda would see the loop's last)
            variants = {
                "beam, old": partial(
                    frozen_beam_search, model, src, max_len, 1, None, beam_size=BEAM
                ),
                "beam, new": partial(beam_search, model, src, max_len, 1, None, beam_size=BEAM),
            }
            if model_name == "inference":
                variants["greedy, all-True mask"] = partial(
                    greedy_decode, model, src, max_len, 1, None, src_mask=everywhere
                )
                variants["greedy, no mask"] = partial(greedy_decode, model, src, max_len, 1, None)
            if not torch.equal(variants["beam, old"](), variants["beam, new"]()):
                print(f"ERROR: old and new beam search differ at B={B}")
                return 1
            for fn in variants.values():  # warm-up
                fn()
            times = alternate(variants, args.rounds, args.threads, clock)
            for name, ts in times.items():
                rate = [B * args.new / t for t in ts]
                print(
                    f"  B={B:3d} {name:<22} {spread([1e3 * t for t in ts], '{:.0f}')} ms, "
                    f"{spread(rate, '{:.0f}')} tokens/s"
                )
            for old, new in (
                ("beam, old", "beam, new"),
                ("greedy, all-True mask", "greedy, no mask"),
            ):
                if old in times:
                    ratios = [o / n for o, n in zip(times[old], times[new], strict=True)]
                    print(f"  B={B:3d} speed-up {new!r} over {old!r}: {spread(ratios)}x")
                    if new == "beam, new":
                        ratio = statistics.median(ratios)
                        floor = FLOOR_SMALL_64 if model_name == "small" else FLOOR_SAME_MODEL
                        if (model_name == "inference" or B == 64) and ratio < floor:
                            failures.append(f"{model_name} model, B={B}: {ratio:.2f}x < {floor}x")
    if args.no_check:
        return 0
    for failure in failures:
        print(f"FAIL: beam search speed-up {failure}")
    if failures:
        return 1
    print(
        f"\nOK: beam search speed-up >= {FLOOR_SAME_MODEL}x on the inference model and >= "
        f"{FLOOR_SMALL_64}x on the small model at B = 64"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
