"""The paper's Table 3, rows (A) to (D), at toy scale: many small trainings, several seeds each.

Chapter "The paper's Table 3 at toy scale" (``book/ablations``) loads the result file this
script writes, ``book/data/table3.json``: the whole study takes minutes, too long for a
notebook, and the chapter reruns one setting live to show that the file is reproducible.

Every setting changes one thing of the toy base model: the training chapter's (1 encoder and 1
decoder layer, d_model 64, h = 4 heads of d_k = 16, d_ff 128, no dropout, label smoothing 0.1)
on its reverse task (vocabulary 13, lengths 4 to 8), with its recipe shortened to ``--steps``
updates of ``--batch`` sequences (warm-up 40, then the paper's decay times a linear decay to
zero). Rows: (A) the number of heads at d_k = d_model / h; (B) a smaller d_k at h = 4; (C) more
layers, a wider d_model (d_k = d_model / h, d_ff unchanged) or a wider d_ff; (D) dropout and
label smoothing. Row (D) runs twice: on fresh random batches (the chapter's setting, nothing
to overfit), and on a small fixed training set of ``--fixed-size`` sequences seen for
``--fixed-steps`` updates, where a model can overfit.

Each seed fixes the initial weights and the training data, so every setting of one seed sees
the same batches. Measured on 1000 held-out sequences (seed 12345, as in the training
chapter): plain cross-entropy per target token (no smoothing, so that every setting is
measured alike) and greedy exact-match accuracy.

Run: ``.venv/bin/python scripts/table3_study.py [--seeds 0 1 2 3 4] [--only base "h=1"]
[--out book/data/table3.json]`` (one thread; about 26 minutes on a shared 2-core machine).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch

from minitransformer.data import BOS_ID, EOS_ID, PAD_ID, Batch, make_batch
from minitransformer.model import Transformer, parameter_breakdown
from minitransformer.training import (
    LabelSmoothingLoss,
    evaluate_loss,
    make_optimizer,
    sequence_accuracy,
    train,
)

# The task and the base model of the training chapter.
VOCAB, MIN_LEN, MAX_LEN = 13, 4, 8
HELD_OUT_SEED, HELD_OUT_SIZE = 12345, 1000
BASE = {
    "num_layers": 1,
    "d_model": 64,
    "num_heads": 4,
    "d_ff": 128,
    "dropout": 0.0,
    "smoothing": 0.1,
}
# The recipe of the training chapter (batch 128, 400 updates), shortened: the same warm-up,
# scale, clipping and linear decay to zero over every update after the warm-up.
STEPS, BATCH, WARMUP, SCALE, CLIP = 200, 64, 40, 0.5, 1.0
FIXED_SIZE, FIXED_STEPS = 250, 1200

# (row, label, changes to BASE): one row of the paper's Table 3 per letter.
SETTINGS = [
    ("base", "base", {}),
    ("A", "h=1", {"num_heads": 1}),
    ("A", "h=2", {"num_heads": 2}),
    ("A", "h=8", {"num_heads": 8}),
    ("A", "h=16", {"num_heads": 16}),
    ("B", "d_k=4", {"head_dim": 4}),
    ("B", "d_k=8", {"head_dim": 8}),
    ("C", "N=2", {"num_layers": 2}),
    ("C", "N=3", {"num_layers": 3}),
    ("C", "d_model=32", {"d_model": 32}),
    ("C", "d_model=128", {"d_model": 128}),
    ("C", "d_ff=64", {"d_ff": 64}),
    ("C", "d_ff=256", {"d_ff": 256}),
    ("D", "P_drop=0.1", {"dropout": 0.1}),
    ("D", "P_drop=0.3", {"dropout": 0.3}),
    ("D", "eps_ls=0", {"smoothing": 0.0}),
]
# Row (D) again, on a small fixed training set.
FIXED_SETTINGS = [
    ("D fixed", "base", {}),
    ("D fixed", "P_drop=0.1", {"dropout": 0.1}),
    ("D fixed", "P_drop=0.3", {"dropout": 0.3}),
    ("D fixed", "eps_ls=0", {"smoothing": 0.0}),
]


def held_out() -> Batch:
    return make_batch(
        "reverse",
        HELD_OUT_SIZE,
        MIN_LEN,
        MAX_LEN,
        VOCAB,
        torch.Generator().manual_seed(HELD_OUT_SEED),
    )


def run(
    changes: dict,
    seed: int,
    *,
    steps: int = STEPS,
    batch: int = BATCH,
    fixed_size: int | None = None,
) -> dict:
    """Train the base model with ``changes`` for ``steps`` updates; data and weights from
    ``seed``. With ``fixed_size``, every batch is drawn (with replacement) from one fixed set of
    that many sequences. Returns the held-out results (and the training set's accuracy)."""
    config = {**BASE, **changes}
    smoothing = config.pop("smoothing")
    gen = torch.Generator().manual_seed(seed)
    if fixed_size is None:

        def next_batch() -> Batch:
            return make_batch("reverse", batch, MIN_LEN, MAX_LEN, VOCAB, gen)
    else:
        data = make_batch("reverse", fixed_size, MIN_LEN, MAX_LEN, VOCAB, gen)

        def next_batch() -> Batch:
            rows = torch.randint(0, fixed_size, (batch,), generator=gen)
            return Batch(data.src[rows], data.tgt_in[rows], data.tgt_out[rows])

    torch.manual_seed(seed)
    model = Transformer(VOCAB, VOCAB, max_len=MAX_LEN + 2, **config)
    optimizer, scheduler = make_optimizer(
        model, warmup_steps=WARMUP, scale=SCALE, total_steps=steps, decay_steps=steps - WARMUP
    )
    history = train(
        model,
        next_batch,
        optimizer,
        scheduler,
        LabelSmoothingLoss(smoothing, ignore_index=PAD_ID),
        num_steps=steps,
        clip_grad_norm=CLIP,
        progress=False,
    )
    test = held_out()
    result = {
        "loss": evaluate_loss(model, [test]),  # plain cross-entropy, eval mode
        "acc": sequence_accuracy(model, test.src, test.tgt, BOS_ID, EOS_ID),
        "seconds": history.seconds,
    }
    if fixed_size is not None:
        result["train_loss"] = evaluate_loss(model, [data])
        result["train_acc"] = sequence_accuracy(model, data.src, data.tgt, BOS_ID, EOS_ID)
    return result


def parameters(changes: dict) -> int:
    config = {**BASE, **changes}
    config.pop("smoothing")
    with torch.device("meta"):  # counted without allocating
        model = Transformer(VOCAB, VOCAB, max_len=MAX_LEN + 2, **config)
    return parameter_breakdown(model)["total"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--only", nargs="+", help="run only the settings with these labels")
    parser.add_argument("--no-fixed", action="store_true", help="skip row (D) on fixed data")
    parser.add_argument("--fixed-size", type=int, default=FIXED_SIZE)
    parser.add_argument("--fixed-steps", type=int, default=FIXED_STEPS)
    parser.add_argument("--out", type=Path, default=Path("book/data/table3.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models train fastest on one thread

    plan: list[tuple[tuple, dict]] = [(s, {}) for s in SETTINGS]
    if not args.no_fixed:
        fixed = {"steps": args.fixed_steps, "fixed_size": args.fixed_size}
        plan += [(s, fixed) for s in FIXED_SETTINGS]
    if args.only:
        plan = [p for p in plan if p[0][1] in args.only]
    env = " ".join(
        f"{k}={os.environ[k]}"
        for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")
        if k in os.environ
    )
    start = time.perf_counter()
    results = []
    for (row, label, changes), options in plan:
        runs = [run(changes, seed, **options) for seed in args.seeds]
        entry = {
            "row": row,
            "label": label,
            "changes": changes,
            "params": parameters(changes),
            **options,
        }
        for key in runs[0]:
            digits = 1 if key == "seconds" else 4
            entry[key] = [round(r[key], digits) for r in runs]
        results.append(entry)
        print(
            f"{row:8} {label:12} loss "
            + " ".join(f"{x:.3f}" for x in entry["loss"])
            + "  acc "
            + " ".join(f"{100 * x:.1f}" for x in entry["acc"])
            + f"  ({sum(entry['seconds']):.0f} s)",
            flush=True,
        )
    out = {
        "computed": datetime.date.today().isoformat(),
        "command": "scripts/table3_study.py " + " ".join(sys.argv[1:]),
        "seconds": round(time.perf_counter() - start),
        "cpu": f"{torch.backends.cpu.get_cpu_capability()} kernels, {os.cpu_count()} cores, "
        f"1 thread" + (f" ({env})" if env else ""),
        "torch": torch.__version__,
        "seeds": args.seeds,
        "task": {
            "task": "reverse",
            "vocab_size": VOCAB,
            "min_len": MIN_LEN,
            "max_len": MAX_LEN,
            "held_out_seed": HELD_OUT_SEED,
            "held_out_size": HELD_OUT_SIZE,
        },
        "base": BASE,
        "recipe": {
            "steps": STEPS,
            "batch": BATCH,
            "warmup_steps": WARMUP,
            "scale": SCALE,
            "decay_steps": "steps - warmup_steps",
            "clip_grad_norm": CLIP,
        },
        "fixed": {"size": args.fixed_size, "steps": args.fixed_steps},
        "settings": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} ({out['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
