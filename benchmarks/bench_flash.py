"""Peak extra memory of tiled (FlashAttention-style) attention against naive attention.

Setting of the chapter "Inference: the KV cache and the cost of attention" (section
"FlashAttention's idea"): one head, T = S = 4096 positions, d_k = d_v = 64, float32, CPU (or
``--device``), no autograd.

Naive attention is the package's :func:`minitransformer.attention.scaled_dot_product_attention`,
which forms the (T, S) score matrix (and, when gradients are needed, a second (T, S) matrix for
the softmax weights; without gradients it applies the softmax in place).
:func:`minitransformer.flash.tiled_attention` walks over the keys in blocks of 64 with an online
softmax and never holds more than a (T, 64) tile of scores.

Method (:func:`minitransformer.flash.peak_memory_bytes`): a ``TorchDispatchMode`` sees every
tensor operator of the call; each new storage is counted when an operator returns it and
released when its last tensor is freed, and the running maximum is the extra memory the call
needed on top of its inputs (its output included). The count is exact and the same on every
run, whatever else the machine is doing.

Target: tiled peak <= 1/8 of naive peak (exit status 1 if missed). Also checks the two outputs
agree (atol 1e-5) and prints the time of each, for information only: the mean of three calls
outside the tracker, from ``torch.utils.benchmark.Timer`` (which synchronises CUDA).

Run: ``.venv/bin/python benchmarks/bench_flash.py [--T 4096] [--block 64] [--device cpu]
[--no-check]``
"""

from __future__ import annotations

import argparse
import sys

import torch
from torch.utils.benchmark import Timer

from minitransformer.attention import scaled_dot_product_attention
from minitransformer.flash import peak_memory_bytes, tiled_attention

TARGET = 1 / 8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--T", type=int, default=4096, help="sequence length (default 4096)")
    parser.add_argument("--d", type=int, default=64, help="head size d_k = d_v (default 64)")
    parser.add_argument("--block", type=int, default=64, help="key block size (default 64)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.T, args.d, generator=gen).to(args.device) for _ in range(3))
    mib = 2**20

    def naive():
        return scaled_dot_product_attention(q, k, v)

    def tiled():
        return tiled_attention(q, k, v, block_size=args.block)

    with torch.inference_mode():
        naive_peak, (naive_out, _) = peak_memory_bytes(naive)
        tiled_peak, tiled_out = peak_memory_bytes(tiled)
        naive_time, tiled_time = (
            Timer("fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()).timeit(3).median
            for fn in (naive, tiled)
        )
    error = (naive_out - tiled_out).abs().max().item()
    ratio = tiled_peak / naive_peak
    score_matrix = args.T * args.T * 4
    print(f"T = S = {args.T}, d = {args.d}, block = {args.block}, float32, one head, {args.device}")
    print(f"one (T, S) float32 matrix: {score_matrix / mib:8.2f} MiB")
    print(f"naive attention peak:      {naive_peak / mib:8.2f} MiB  ({naive_time:.3f} s per call)")
    print(f"tiled attention peak:      {tiled_peak / mib:8.2f} MiB  ({tiled_time:.3f} s per call)")
    print(f"ratio tiled / naive:       {ratio:8.4f}  (1/{1 / ratio:.1f}; target <= 1/8)")
    print(f"max |naive - tiled|:       {error:.2e}")
    if args.no_check:
        return 0
    if error > 1e-5:
        print("FAIL: outputs differ")
        return 1
    if ratio > TARGET:
        print("FAIL: tiled peak above 1/8 of naive")
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
