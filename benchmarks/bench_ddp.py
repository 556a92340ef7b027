"""Updates per second of data-parallel training: one process against two (gloo on the CPU).

Setting (chapter "Training a Transformer", section "Scaling out"): the chapter's model
(d_model 64, 4 heads, 1+1 layers, d_ff 128, no dropout), the reverse task with lengths 4-8,
a global batch of 128 sequences, Adam with the warm-up schedule, clipping at 1. Three ways to
spend two cores:

* ``1 process, 1 thread``: the baseline;
* ``1 process, 2 threads``: torch's intra-op parallelism splits each operation;
* ``2 processes, 1 thread each``: ``train`` under ``torch.distributed`` (what ``torchrun
  --nproc_per_node=2`` does), each process computing 64 sequences, DDP averaging the gradients
  (about 60,000 floats per update through gloo on the loopback interface).

Each round runs the configurations in alternating order, each timing ``--updates`` updates
after a few warm-up updates (process start-up is not timed); the report gives the median
updates/s, the spread over rounds, and the median of the per-round ratios to the baseline.

What to expect on a 2-core machine: less than 2x. Two processes halve each update's
arithmetic but not its fixed cost (Python, hundreds of small operator calls, the optimizer and
the scheduler), which is a large part of an update for a model this small, and they add two
all-reduces per update; every update also waits for the slower process, so other programs on
the machine slow both. Intra-op threads suffer even more from a busy machine: each operation
waits for its slowest thread. Data parallelism pays off when one update's arithmetic dwarfs
its fixed cost: larger models and batches, one GPU per process.

Measured on the shared 2-core machine (load average 3 to 7 from other jobs: noisy), two runs:
1 process, 1 thread 35 and 27 updates/s; 2 processes 54 and 21 updates/s (x1.52 and x0.89 of
it); 1 process, 2 threads 9 and 1.6 updates/s (x0.27 and x0.06).

Run: ``.venv/bin/python benchmarks/bench_ddp.py [--rounds 3] [--updates 60]``
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile

import torch
from torch import distributed as dist

from minitransformer.data import make_batch
from minitransformer.model import Transformer
from minitransformer.training import make_optimizer, train

VOCAB, MIN_LEN, MAX_LEN, BATCH, WARMUP_UPDATES = 13, 4, 8, 128, 5


def timed_run(updates: int) -> float:
    """Seconds for ``updates`` updates of the chapter's model (in or out of a process group)."""
    torch.manual_seed(0)
    model = Transformer(
        VOCAB,
        VOCAB,
        d_model=64,
        num_heads=4,
        num_layers=1,
        d_ff=128,
        dropout=0.0,
        max_len=MAX_LEN + 2,
    )
    optimizer, scheduler = make_optimizer(model, warmup_steps=40, scale=0.5)
    gen = torch.Generator().manual_seed(0)

    def batches():
        return make_batch("reverse", BATCH, MIN_LEN, MAX_LEN, VOCAB, gen)

    train(
        model,
        batches,
        optimizer,
        scheduler,
        num_steps=WARMUP_UPDATES,
        clip_grad_norm=1.0,
        progress=False,
    )
    return train(
        model, batches, optimizer, scheduler, num_steps=updates, clip_grad_norm=1.0, progress=False
    ).seconds


def _worker(rank: int, world_size: int, port: int, updates: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    try:
        seconds = timed_run(updates)
        if rank == 0:
            with open(out, "w") as f:
                f.write(repr(seconds))
    finally:
        dist.destroy_process_group()


def run_config(name: str, updates: int) -> float:
    """Updates per second of one configuration."""
    if name.startswith("1 process"):
        torch.set_num_threads(1 if "1 thread" in name else 2)
        return updates / timed_run(updates)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "seconds")
        torch.multiprocessing.spawn(_worker, args=(2, port, updates, out), nprocs=2, join=True)
        with open(out) as f:
            return updates / float(f.read())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=60, help="timed updates per run")
    args = parser.parse_args()
    configs = ["1 process, 1 thread", "1 process, 2 threads", "2 processes, 1 thread each"]
    print(
        f"global batch {BATCH}, lengths {MIN_LEN}-{MAX_LEN}, {args.updates} timed updates, "
        f"{args.rounds} rounds; torch {torch.__version__}, {os.cpu_count()} CPUs"
    )
    rates: dict[str, list[float]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for name in configs if r % 2 == 0 else configs[::-1]:
            rates[name].append(run_config(name, args.updates))
    base = rates[configs[0]]
    for name in configs:
        ratios = [x / b for x, b in zip(rates[name], base, strict=True)]
        print(
            f"{name:>28}: {statistics.median(rates[name]):6.1f} updates/s "
            f"(rounds: {', '.join(f'{x:.1f}' for x in rates[name])}); "
            f"x{statistics.median(ratios):.2f} of 1 process, 1 thread"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
