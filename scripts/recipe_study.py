"""Seed study of the training chapter's recipe on the reverse task.

The chapter ("Training a Transformer", section "Training on the reverse task") trains a 1+1
layer Transformer (d_model 64, 4 heads, d_ff 128, no dropout) to reverse sequences of 4 to 8
tokens from a vocabulary of 13. A recipe "holds" when, for every seed, greedy exact-match
accuracy on the 1000 held-out sequences (seed 12345) reaches 99 % and, evaluated every
``--eval-every`` updates from then on, never drops below 99 % again. Each seed changes both the
model's initialisation and the training batches.

Floating-point results differ between CPUs; ``--other-cpu`` repeats the study in a child
process with ``ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE`` (torch's unvectorised kernels,
MKL's compatibility path), which simulates another machine.

The committed recipe (peak scale 0.4) holds for seeds 0 to 9 on both: it first reaches 99 % at
update 175 to 250, and the lowest accuracy after that is 99.0 % to 99.9 %. With scale 0.5, one
seed of five fell back to 98.9 % under the simulated CPU.

Run: ``.venv/bin/python scripts/recipe_study.py [--seeds 0 1 2 3 4] [--other-cpu]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch

from minitransformer.data import BOS_ID, EOS_ID, PAD_ID, make_batch
from minitransformer.model import Transformer
from minitransformer.training import LabelSmoothingLoss, make_optimizer, sequence_accuracy, train

# The task and the model (the chapter's cell with D_MODEL, HEADS, LAYERS).
VOCAB, MIN_LEN, MAX_LEN = 13, 4, 8
D_MODEL, HEADS, LAYERS, D_FF, DROPOUT = 64, 4, 1, 128, 0.0
HELD_OUT_SEED, HELD_OUT_SIZE = 12345, 1000
# The recipe: the paper's schedule with a short, scaled warm-up, times a linear decay to
# (almost) zero over every update after the warm-up.
BATCH, STEPS, WARMUP, SCALE, CLIP, SMOOTHING = 128, 400, 40, 0.4, 1.0, 0.1
N_BEAM = 200  # beam search (beam 4) against greedy decoding on the first 200 held-out inputs
OTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE"}
TARGET = 0.99


def run(seed: int, args: argparse.Namespace) -> dict:
    """Train one model with data seed and model seed ``seed``; evaluate every ``eval_every``."""
    gen = torch.Generator().manual_seed(seed)
    batches = [
        make_batch("reverse", args.batch, MIN_LEN, MAX_LEN, VOCAB, gen) for _ in range(args.steps)
    ]
    held_out = make_batch(
        "reverse",
        HELD_OUT_SIZE,
        MIN_LEN,
        MAX_LEN,
        VOCAB,
        torch.Generator().manual_seed(HELD_OUT_SEED),
    )
    torch.manual_seed(seed)
    model = Transformer(
        VOCAB,
        VOCAB,
        d_model=D_MODEL,
        num_heads=HEADS,
        num_layers=LAYERS,
        d_ff=D_FF,
        dropout=DROPOUT,
        max_len=MAX_LEN + 2,
    )
    optimizer, scheduler = make_optimizer(
        model,
        warmup_steps=args.warmup,
        scale=args.scale,
        total_steps=args.steps,
        decay_steps=args.decay,
    )
    eval_seconds = []

    def accuracy(m) -> float:
        start = time.perf_counter()
        acc = sequence_accuracy(m, held_out.src, held_out.tgt, BOS_ID, EOS_ID)
        eval_seconds.append(time.perf_counter() - start)
        return acc

    history = train(
        model,
        batches,
        optimizer,
        scheduler,
        LabelSmoothingLoss(SMOOTHING, ignore_index=PAD_ID),
        clip_grad_norm=CLIP,
        eval_batch=held_out,
        eval_every=args.eval_every,
        eval_fn=accuracy,
        progress=False,
    )
    acc = history.eval_metric
    first = next((i for i, a in enumerate(acc) if a >= TARGET), None)
    src, tgt = held_out.src[:N_BEAM], held_out.tgt[:N_BEAM]
    return {
        "greedy_sub": sequence_accuracy(model, src, tgt, BOS_ID, EOS_ID),
        "beam_sub": sequence_accuracy(model, src, tgt, BOS_ID, EOS_ID, beam_size=4),
        "seed": seed,
        "first": None if first is None else history.eval_steps[first],
        "final": acc[-1],
        "min_after": None if first is None else min(acc[first:]),
        "loss": history.eval_loss[-1],
        "seconds": history.seconds - sum(eval_seconds),  # training alone
        "curve": acc,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--warmup", type=int, default=WARMUP)
    parser.add_argument("--scale", type=float, default=SCALE)
    parser.add_argument(
        "--decay",
        type=int,
        default=None,
        help="updates of linear decay (default: all after the warm-up)",
    )
    parser.add_argument("--curves", action="store_true", help="print every evaluation")
    parser.add_argument(
        "--other-cpu",
        action="store_true",
        help="then repeat the study under the simulated other CPU",
    )
    args = parser.parse_args()
    args.decay = args.steps - args.warmup if args.decay is None else args.decay
    torch.set_num_threads(1)  # as in the chapter: tiny models train fastest on one thread
    env = " ".join(f"{k}={os.environ[k]}" for k in OTHER_CPU if k in os.environ) or "native"
    print(
        f"recipe: batch {args.batch}, {args.steps} updates, warm-up {args.warmup}, scale "
        f"{args.scale}, linear decay over the last {args.decay}; evaluated every "
        f"{args.eval_every}; CPU kernels "
        f"{torch.backends.cpu.get_cpu_capability()} ({env})"
    )
    print(
        f"{'seed':>4}  {'first >= 99%':>12}  {'final acc':>9}  {'min after':>9}  "
        f"{'held-out loss':>13}  {'greedy/beam (200)':>17}  {'train s':>7}"
    )
    holds = True
    for seed in args.seeds:
        r = run(seed, args)
        ok = r["first"] is not None and r["min_after"] >= TARGET
        holds &= ok
        first = "never" if r["first"] is None else str(r["first"])
        min_after = "-" if r["min_after"] is None else f"{100 * r['min_after']:.1f}%"
        print(
            f"{seed:>4}  {first:>12}  {100 * r['final']:>8.1f}%  {min_after:>9}  "
            f"{r['loss']:>13.4f}  {100 * r['greedy_sub']:>7.1f}/{100 * r['beam_sub']:.1f}%  "
            f"{r['seconds']:>7.1f}  {'holds' if ok else 'FAILS'}"
        )
        if args.curves:
            print("      ", " ".join(f"{100 * a:.1f}" for a in r["curve"]))
    print("the recipe holds on every seed" if holds else "the recipe FAILS on some seed")
    if args.other_cpu:
        argv = [a for a in sys.argv[1:] if a != "--other-cpu"]
        child = subprocess.run([sys.executable, __file__, *argv], env={**os.environ, **OTHER_CPU})
        holds &= child.returncode == 0
    return 0 if holds else 1


if __name__ == "__main__":
    sys.exit(main())
