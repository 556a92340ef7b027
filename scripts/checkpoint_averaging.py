"""Checkpoint averaging on the reverse task, under two schedules (chapter "Training a
Transformer", section "Averaging checkpoints").

The paper decodes with the average of the weights of the last 5 checkpoints (base model; 20
for big). This study trains the chapter's model (the task, model and recipe of
``scripts/recipe_study.py``) for several seeds under two learning-rate schedules:

* ``noam``: the paper's schedule, warm-up 40 and scale 0.4, never decaying to zero;
* ``decay``: the chapter's recipe, the same schedule times a linear decay to zero over the
  last 360 updates.

It keeps the weights at the last ``--average`` evaluations (every ``--eval-every`` updates)
and measures, on the 1000 held-out sequences, the greedy exact match and the label-smoothed
loss of the last checkpoint and of the average. The result, a small JSON file, is committed as
``book/data/checkpoint_averaging.json`` and read by the chapter (a run takes minutes, more
than a chapter may spend).

Run: ``.venv/bin/python scripts/checkpoint_averaging.py [--seeds 0 1 2 3 4]``
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import recipe_study as recipe  # noqa: E402  (the chapter's task, model and recipe)

from minitransformer.data import BOS_ID, EOS_ID, PAD_ID, make_batch  # noqa: E402
from minitransformer.model import Transformer  # noqa: E402
from minitransformer.training import (  # noqa: E402
    LabelSmoothingLoss,
    evaluate_loss,
    make_optimizer,
    sequence_accuracy,
    train,
)

OUT = pathlib.Path(__file__).resolve().parents[1] / "book" / "data" / "checkpoint_averaging.json"


def run(seed: int, schedule: str, args: argparse.Namespace) -> dict:
    """Train one seed under ``schedule``; the last checkpoint against the average of the last k."""
    gen = torch.Generator().manual_seed(seed)
    batches = [
        make_batch("reverse", recipe.BATCH, recipe.MIN_LEN, recipe.MAX_LEN, recipe.VOCAB, gen)
        for _ in range(recipe.STEPS)
    ]
    held_out = make_batch(
        "reverse",
        recipe.HELD_OUT_SIZE,
        recipe.MIN_LEN,
        recipe.MAX_LEN,
        recipe.VOCAB,
        torch.Generator().manual_seed(recipe.HELD_OUT_SEED),
    )
    torch.manual_seed(seed)
    model = Transformer(
        recipe.VOCAB,
        recipe.VOCAB,
        d_model=recipe.D_MODEL,
        num_heads=recipe.HEADS,
        num_layers=recipe.LAYERS,
        d_ff=recipe.D_FF,
        dropout=recipe.DROPOUT,
        max_len=recipe.MAX_LEN + 2,
    )
    decay = (
        dict(total_steps=recipe.STEPS, decay_steps=recipe.STEPS - recipe.WARMUP)
        if schedule == "decay"
        else {}
    )
    optimizer, scheduler = make_optimizer(
        model, warmup_steps=recipe.WARMUP, scale=recipe.SCALE, **decay
    )
    loss_fn = LabelSmoothingLoss(recipe.SMOOTHING, ignore_index=PAD_ID)
    kept = collections.deque(maxlen=args.average)  # the weights at the last k evaluations

    def accuracy(m) -> float:
        return sequence_accuracy(m, held_out.src, held_out.tgt, BOS_ID, EOS_ID)

    def checkpoint_and_accuracy(m) -> float:
        kept.append({name: w.detach().clone() for name, w in m.state_dict().items()})
        return accuracy(m)

    history = train(
        model,
        batches,
        optimizer,
        scheduler,
        loss_fn,
        clip_grad_norm=recipe.CLIP,
        eval_every=args.eval_every,
        eval_fn=checkpoint_and_accuracy,
        progress=False,
    )
    averaged = Transformer(
        recipe.VOCAB,
        recipe.VOCAB,
        d_model=recipe.D_MODEL,
        num_heads=recipe.HEADS,
        num_layers=recipe.LAYERS,
        d_ff=recipe.D_FF,
        dropout=recipe.DROPOUT,
        max_len=recipe.MAX_LEN + 2,
    )
    averaged.load_state_dict(
        {name: torch.stack([c[name] for c in kept]).mean(0) for name in kept[0]}
    )
    return {
        "seed": seed,
        "last_acc": history.eval_metric[-1],
        "last_loss": evaluate_loss(model, [held_out], loss_fn),
        "avg_acc": accuracy(averaged),
        "avg_loss": evaluate_loss(averaged, [held_out], loss_fn),
        "last_k_acc": history.eval_metric[-args.average :],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--average", type=int, default=5, help="checkpoints averaged (default 5)")
    parser.add_argument("--out", type=pathlib.Path, default=OUT)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results: dict = {
        "average": args.average,
        "eval_every": args.eval_every,
        "steps": recipe.STEPS,
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }
    print(
        f"{'schedule':>8} {'seed':>4}  {'last: acc':>9} {'loss':>6}  {'average: acc':>12} "
        f"{'loss':>6}  accuracy at the last {args.average} evaluations"
    )
    for schedule in ("noam", "decay"):
        results[schedule] = []
        for seed in args.seeds:
            r = run(seed, schedule, args)
            results[schedule].append(r)
            print(
                f"{schedule:>8} {seed:>4}  {r['last_acc']:>9.1%} {r['last_loss']:6.4f}  "
                f"{r['avg_acc']:>12.1%} {r['avg_loss']:6.4f}  "
                f"{' '.join(f'{a:.1%}' for a in r['last_k_acc'])}",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
