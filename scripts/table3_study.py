"""The paper's Table 3, rows (A) to (D), at toy scale: many small trainings, several seeds each.

Chapter "The paper's Table 3 at toy scale" (``book/ablations``) loads the result file this
script writes, ``minitransformer/studies/table3.json`` (package data, so that the chapter finds
it from any working directory): the whole study takes too long for a notebook, and the chapter
reruns one of its cells live to show that the file is reproducible.

What is trained lives in the package, :mod:`minitransformer.ablation`: the training chapter's
task and base model (``TASK``, ``BASE``), its recipe shortened to 200 updates of 64 sequences
(``STUDY_RECIPE``: warm-up 40, scale 0.4, linear decay to zero, gradient norm clipped at 1),
the settings of rows (A) to (D) (``SETTINGS``) and one training run (``train_setting``). The
file records all of it, and ``ablation.load_study`` refuses a file whose recipe, task, base or
settings differ from the package's. Row (D) runs twice: on fresh random batches (the chapter's
setting, nothing to overfit), and on a small fixed training set, where a model can overfit.

Each seed fixes the initial weights and the training data, so every setting of one seed sees
the same batches. Measured on 1000 held-out sequences (seed 12345, as in the training
chapter): plain cross-entropy per target token (no smoothing, so that every setting is
measured alike) and greedy exact-match accuracy.

Run: ``nice -n 10 .venv/bin/python scripts/table3_study.py [--seeds 0 1 2 3 4]
[--only base h=1] [--out PATH]`` (one thread; about 135 CPU minutes in all; ``--only``
writes a partial file that the chapter refuses).
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

from minitransformer import ablation

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--only", nargs="+", help="run only the settings with these labels")
    parser.add_argument("--out", type=Path, default=ROOT / "minitransformer" / ablation.STUDY_PATH)
    args = parser.parse_args()
    torch.set_num_threads(1)  # tiny models train fastest on one thread

    plan = [s for s in ablation.SETTINGS if not args.only or s[1] in args.only]
    env = " ".join(
        f"{k}={os.environ[k]}"
        for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "OMP_NUM_THREADS")
        if k in os.environ
    )
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    results = []
    for row, label, changes in plan:
        runs = [ablation.train_setting(changes, seed) for seed in args.seeds]
        entry = {
            "row": row,
            "label": label,
            "changes": changes,
            "params": ablation.parameters(changes),
        }
        for key in runs[0]:
            digits = 1 if key == "cpu_seconds" else 6
            entry[key] = [round(r[key], digits) for r in runs]
        results.append(entry)
        print(
            f"{row:8} {label:12} loss "
            + " ".join(f"{x:.3f}" for x in entry["loss"])
            + "  acc "
            + " ".join(f"{100 * x:.1f}" for x in entry["acc"])
            + f"  ({sum(entry['cpu_seconds']):.0f} CPU s)",
            flush=True,
        )
    out = {
        "computed": datetime.date.today().isoformat(),
        "command": "scripts/table3_study.py " + " ".join(sys.argv[1:]),
        "cpu_seconds": round(time.process_time() - start_cpu),
        "wall_seconds": round(time.perf_counter() - start_wall),
        "cpu": f"{torch.backends.cpu.get_cpu_capability()} kernels, {os.cpu_count()} cores, "
        f"1 thread" + (f" ({env})" if env else ""),
        "torch": torch.__version__,
        "seeds": args.seeds,
        "task": ablation.TASK,
        "base": ablation.BASE,
        "recipe": ablation.STUDY_RECIPE.as_dict(),
        "fixed": {"size": ablation.FIXED_SIZE, "steps": ablation.FIXED_STEPS},
        "settings": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out} ({out['cpu_seconds']} CPU s, {out['wall_seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
