"""Data-parallel training of the reverse task on the CPU (chapter "Training a Transformer",
section "Scaling out").

Run it on two processes, then on one, and compare::

    .venv/bin/torchrun --nproc_per_node=2 scripts/train_ddp.py
    .venv/bin/python scripts/train_ddp.py

``torchrun`` starts the processes and tells each its ``RANK`` and the ``WORLD_SIZE``; the
script joins them into a process group (the ``gloo`` backend, which runs on CPUs) and calls the
same :func:`minitransformer.training.train` as the chapter. Every process builds the same model
and draws the same global batches from the same seed; ``train`` gives each process its shard,
wraps the model in ``DistributedDataParallel`` (which averages the gradients over the processes
in every backward pass) and shows progress on rank 0 only. With sequences of equal length the
two runs compute the same updates up to rounding. How fast the rounding differences grow
depends on the optimizer. SGD (``--optimizer sgd``) moves each weight in proportion to its
gradient, so after tens of updates the weights still agree to about 1e-6. Adam divides by the
gradient's running size: a gradient that is zero in exact arithmetic (the key projection's
bias) or close to it becomes a full step whose sign is that of the rounding noise, and on some
CPUs the two runs then drift apart by 1e-4 or more within tens of updates. Either way, over
hundreds of updates the runs end at different weights of the same quality, as on two CPUs
(``--save`` writes rank 0's weights for a comparison; ``tests/test_training_ddp.py`` checks
the agreement after a few updates).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch import distributed as dist

from minitransformer.data import BOS_ID, EOS_ID, make_batch
from minitransformer.model import Transformer
from minitransformer.training import TrainHistory, make_optimizer, sequence_accuracy, train

VOCAB = 13


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="updates (default 200)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="global batch, split over the processes (default 128)",
    )
    parser.add_argument("--min-len", type=int, default=6)
    parser.add_argument(
        "--max-len",
        type=int,
        default=6,
        help="equal lengths (the default) give every process the same number "
        "of target tokens, so the updates equal one process's",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--optimizer",
        choices=["adam", "sgd"],
        default="adam",
        help="the chapter's recipe (default), or SGD with momentum, whose steps "
        "keep rounding noise as small as it is (see the module docstring)",
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "float64"],
        nargs="+",
        default=["float32"],
        help="train in this precision; several train one after the other, each from the "
        "same initial weights and batches (default float32)",
    )
    parser.add_argument("--save", help="rank 0 writes the trained state_dict here")
    parser.add_argument(
        "--snapshots",
        help="rank 0 writes {dtype: {update: state_dict}} here, for the updates of "
        "--snapshot-steps (default: the last)",
    )
    parser.add_argument("--snapshot-steps", type=int, nargs="+", default=None)
    parser.add_argument("--quiet", action="store_true", help="no progress bar, no report")
    return parser.parse_args(argv)


def _train_once(
    args: argparse.Namespace, dtype: torch.dtype, world_size: int
) -> tuple[Transformer, TrainHistory, dict[int, dict[str, torch.Tensor]]]:
    """Train one model in ``dtype``; return it, its history and the requested snapshots."""
    gen = torch.Generator().manual_seed(args.seed)  # the same global batches on every rank
    torch.manual_seed(args.seed)
    model = Transformer(
        VOCAB,
        VOCAB,
        d_model=64,
        num_heads=4,
        num_layers=1,
        d_ff=128,
        dropout=0.0,
        max_len=args.max_len + 2,
    ).to(dtype)  # the same initial weights in either precision (float32's, widened)
    if args.optimizer == "adam":
        optimizer, scheduler = make_optimizer(
            model,
            warmup_steps=40,
            scale=0.4,
            total_steps=args.steps,
            decay_steps=max(args.steps - 40, 0),
        )
    else:
        optimizer, scheduler = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), None
    wanted = set(args.snapshot_steps or [args.steps])
    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    def snapshot(m: torch.nn.Module) -> float:  # train's eval_fn, called after every update
        done = len(snapshots_seen) + 1
        snapshots_seen.append(done)
        if done in wanted:
            snapshots[done] = {k: v.detach().clone() for k, v in m.state_dict().items()}
        return 0.0

    snapshots_seen: list[int] = []
    history = train(
        model,
        lambda: make_batch("reverse", args.batch_size, args.min_len, args.max_len, VOCAB, gen),
        optimizer,
        scheduler,
        num_steps=args.steps,
        clip_grad_norm=1.0,
        eval_fn=snapshot if args.snapshots else None,
        eval_every=1,
        progress=not args.quiet,
        desc=f"{world_size} process(es), {str(dtype).removeprefix('torch.')}",
    )
    return model, history, snapshots


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)  # one core per process
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1  # set by torchrun
    if distributed:
        dist.init_process_group("gloo")  # rank, world size and address come from torchrun
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    try:
        snapshots = {}
        for dtype in args.dtype:
            model, history, snapshots[dtype] = _train_once(args, getattr(torch, dtype), world_size)
        if rank == 0:
            if args.save:
                torch.save(model.state_dict(), args.save)
            if args.snapshots:
                torch.save(snapshots, args.snapshots)
            if not args.quiet:
                held_out = make_batch(
                    "reverse",
                    500,
                    args.min_len,
                    args.max_len,
                    VOCAB,
                    torch.Generator().manual_seed(12345),
                )
                acc = sequence_accuracy(model, held_out.src, held_out.tgt, BOS_ID, EOS_ID)
                print(
                    f"{world_size} process(es), {args.steps} updates of {args.batch_size} "
                    f"sequences ({args.batch_size // world_size} per process) in "
                    f"{history.seconds:.1f} s: {args.steps / history.seconds:.1f} updates/s, "
                    f"final loss {history.loss[-1]:.4f}, held-out exact match {acc:.1%}"
                )
    finally:
        if distributed:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
