"""Forward time of ``MultiHeadAttention`` against ``torch.nn.MultiheadAttention``.

Setting (chapter "Multi-head attention"): B = 8, T = S = 512, d_model = 512, h = 8, float32,
self-attention, eval mode, no autograd, CPU unless ``--device`` says otherwise. The four
variants run in one process, in alternating order, many rounds; we report the median time of
each and, as the headline, the median of the per-round ratios (each ratio compares runs made
moments apart, which cancels most of the noise of a shared machine). Runs are timed with
``torch.utils.benchmark.Timer``, which synchronises an accelerator. The targets are checked on
wall-clock time; on the CPU the same ratios in CPU time are printed as a cross-check.

Targets:
  explicit path (returns the (B, h, T, S) weights)  <= 1.3 x torch with need_weights=True
  fused path (need_weights=False)                    <= 0.8 x torch with need_weights=True

Both are compared with torch's default ``need_weights=True`` (the like-for-like "returns
weights" path). For honesty the script also prints each ratio against torch with
``need_weights=False``, which takes torch's own fused fast path.

Both of ours project Q, K and V with one matrix product, as torch does.

Run: ``.venv/bin/python benchmarks/bench_attention.py [--rounds 15] [--device cpu]``; exit status 1
if a target is missed (pass ``--no-check`` to only print).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
from torch.utils.benchmark import Timer

from minitransformer.attention import MultiHeadAttention

B, T, D_MODEL, H = 8, 512, 512, 8
TARGET_EXPLICIT, TARGET_FUSED = 1.3, 0.8


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="alternating rounds (default 15)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()
    device = torch.device(args.device)

    torch.manual_seed(0)
    reference = torch.nn.MultiheadAttention(D_MODEL, H, batch_first=True).eval().to(device)
    ours = MultiHeadAttention.from_torch(reference).eval()
    x = torch.randn(B, T, D_MODEL, device=device)

    variants = {
        "ours, explicit (weights)": lambda: ours(x, x, x),
        "ours, fused (need_weights=False)": lambda: ours(x, x, x, need_weights=False),
        "torch, need_weights=True": lambda: reference(x, x, x),
        "torch, need_weights=False": lambda: reference(x, x, x, need_weights=False),
    }
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}  # wall clock
    cpu: dict[str, list[float]] = {name: [] for name in names}  # CPU time of this process
    with torch.inference_mode():
        for fn in variants.values():  # warm-up: allocator, thread pool, kernels
            fn()
            fn()
        for r in range(args.rounds):
            order = names[r % len(names) :] + names[: r % len(names)]  # rotate the order
            for name in order:
                start_cpu = time.process_time()
                times[name].append(Timer("fn()", globals={"fn": variants[name]}).timeit(1).mean)
                cpu[name].append(time.process_time() - start_cpu)

    def ratio(a: str, b: str, table: dict[str, list[float]] = times) -> float:
        return statistics.median(x / y for x, y in zip(table[a], table[b], strict=True))

    print(
        f"MultiHeadAttention forward, B={B}, T=S={T}, d_model={D_MODEL}, h={H}, float32, "
        f"{device}, {torch.get_num_threads()} threads, {args.rounds} alternating rounds"
    )
    for name in names:
        print(f"  {name:34s} median {1e3 * statistics.median(times[name]):8.1f} ms")
    explicit_w = ratio(names[0], names[2])
    fused_w = ratio(names[1], names[2])
    explicit_nw = ratio(names[0], names[3])
    fused_nw = ratio(names[1], names[3])
    print("Ratios (median of per-round ratios; lower is faster):")
    print(
        f"  explicit / torch(need_weights=True)  = {explicit_w:.2f}  (target <= {TARGET_EXPLICIT})"
    )
    print(f"  fused    / torch(need_weights=True)  = {fused_w:.2f}  (target <= {TARGET_FUSED})")
    print(
        f"  explicit / torch(need_weights=False) = {explicit_nw:.2f}  "
        "(for honesty: torch's fused path)"
    )
    print(f"  fused    / torch(need_weights=False) = {fused_nw:.2f}")
    if device.type == "cpu":
        print("CPU-time ratios (less sensitive to other processes on a shared machine):")
        print(f"  explicit / torch(need_weights=True)  = {ratio(names[0], names[2], cpu):.2f}")
        print(f"  fused    / torch(need_weights=True)  = {ratio(names[1], names[2], cpu):.2f}")
    ok = explicit_w <= TARGET_EXPLICIT and fused_w <= TARGET_FUSED
    print("targets met" if ok else "TARGET MISSED")
    return 0 if ok or args.no_check else 1


if __name__ == "__main__":
    sys.exit(main())
