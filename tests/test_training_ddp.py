"""Data-parallel training (torch.distributed, gloo on the CPU) equals training on one process.

Why the two agree: every process holds the same weights (DistributedDataParallel broadcasts
rank 0's at the start) and computes the mean loss of its shard, B / W of the global batch of
B rows. In the backward pass DDP averages the gradients over the W processes. With equal
shards (the same number of counted target tokens on every process) the mean over processes of
the per-shard mean losses is the mean loss of the whole batch, so the averaged gradient is the
gradient one process computes on the global batch. Every process then takes the same optimizer
step (clipping sees the averaged gradient, hence the global norm), and the weights stay equal,
up to rounding (sums taken in another order). Over hundreds of updates those rounding
differences grow, as between two CPUs, so the test compares after a few updates.

What breaks the equality: shards of unequal size, or with different numbers of padding
tokens (each process averages over its own token count, and the mean of means is then not the
global mean); dropout (each process draws its own masks); and, with Adam, gradients that are
zero in exact arithmetic. The key projection's bias is one: adding the same constant to every
score of a query leaves the softmax unchanged, so its true gradient is 0 and the computed one
is rounding noise of about 1e-9. Adam divides by the gradient's running RMS and turns that
noise into a step of about the learning rate, with the noise's sign, which differs between the
runs. Those weights then differ (harmlessly: they cannot change the output), so with Adam we
compare the losses and the model's outputs; with SGD, every weight.
"""

from __future__ import annotations

import importlib.util
import pathlib
import socket

import pytest
import torch
from torch import distributed as dist

from minitransformer.data import make_batch
from minitransformer.model import Transformer
from minitransformer.training import make_optimizer, train

VOCAB, LENGTH, GLOBAL_BATCH, UPDATES, WORLD = 13, 5, 8, 4, 2


def _run(optimizer_name: str) -> dict:
    """Train the same seeded model on the same seeded global batches; return what to compare."""
    torch.manual_seed(0)
    model = Transformer(
        VOCAB,
        VOCAB,
        d_model=32,
        num_heads=4,
        num_layers=1,
        d_ff=64,
        dropout=0.0,
        max_len=LENGTH + 2,
    )
    if optimizer_name == "sgd":
        optimizer, scheduler = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), None
    else:
        optimizer, scheduler = make_optimizer(model, warmup_steps=2, scale=0.5)
    gen = torch.Generator().manual_seed(1)  # the same global batches on every process
    history = train(
        model,
        lambda: make_batch("reverse", GLOBAL_BATCH, LENGTH, LENGTH, VOCAB, gen),
        optimizer,
        scheduler,
        num_steps=UPDATES,
        clip_grad_norm=1.0,
        progress=False,
    )
    probe = make_batch("reverse", 16, LENGTH, LENGTH, VOCAB, torch.Generator().manual_seed(2))
    with torch.no_grad():
        logits = model.eval()(probe.src, probe.tgt_in, src_mask=probe.src_mask)
    return {
        "loss": history.loss,
        "logits": logits,
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
    }


def _worker(rank: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        results = {name: _run(name) for name in ("sgd", "adam")}
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with gloo is not available",
)
def test_two_processes_equal_one_process_on_the_global_batch(tmp_path):
    out = str(tmp_path / "ddp.pt")
    torch.multiprocessing.spawn(_worker, args=(_free_port(), out), nprocs=WORLD, join=True)
    ddp = torch.load(out)
    for name in ("sgd", "adam"):
        one = _run(name)  # this process: no process group, the whole batch
        assert ddp[name]["loss"] == pytest.approx(one["loss"], abs=1e-6, rel=0)
        torch.testing.assert_close(ddp[name]["logits"], one["logits"], atol=1e-5, rtol=0)
    worst = max(
        (ddp["sgd"]["params"][n] - p).abs().max().item() for n, p in _run("sgd")["params"].items()
    )
    assert worst <= 1e-6, f"largest weight difference after {UPDATES} SGD updates: {worst:.2e}"


def test_example_script_runs_on_one_process(tmp_path, monkeypatch):
    """scripts/train_ddp.py without torchrun: one process, the same call of train()."""
    path = pathlib.Path(__file__).parents[1] / "scripts" / "train_ddp.py"
    spec = importlib.util.spec_from_file_location("train_ddp", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # not under torchrun
    save = tmp_path / "one.pt"
    assert script.main(["--steps", "2", "--batch-size", "8", "--quiet", "--save", str(save)]) == 0
    state = torch.load(save)
    assert state["tgt_embed.weight"].shape == (VOCAB, 64)
