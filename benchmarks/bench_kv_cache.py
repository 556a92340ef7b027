"""A cached decoding step against its weight-read floor; cached against uncached greedy decoding.

Setting (chapter "Inference: the KV cache and the cost of attention"): the encoder-decoder
``Transformer`` with d_model 256, 4 + 4 layers, 8 heads, d_ff 1024, a vocabulary of 1000,
eval mode, float32, one 32-token source (batch 1), one thread by default.

Three things are timed in one process, for a few rounds:

* the **weight-read floor**: the matrix-vector products a cached step runs, one per linear
  layer (per decoder layer the packed Q/K/V projection, W^O, the cross-attention W^Q and W^O,
  the FFN's two layers; then the output projection), back to back with nothing in between,
  over the very tensors the step reads (``floor_products`` takes them from the step's own
  plan). The benchmark checks with ``FlopCounterMode`` that they are exactly the products of
  a step. Each step has to read these ~16 MB of weights with these kernels, so no step made
  of them can be faster than this;
* a **cached step**: ``model.decode`` of one new token with a ``KVCache``, as greedy decoding
  makes it. Each step of a run of ``n`` is timed right after one pass of the floor, and the
  round's ratio is the median of these paired ratios: both halves of a pair see the same
  machine, which matters on a shared one;
* **greedy decoding** of ``n`` new tokens with and without the cache, in alternating order
  (``use_cache=False`` re-runs the decoder over the whole prefix every step); both must give
  the same tokens.

The tables give the median and the spread (min-max) over the rounds. Times are process CPU
time by default (``--clock``): on one thread it leaves out the moments other programs had the
processor. Each time is taken after synchronising an accelerator; torch.utils.benchmark's
Timer does not fit these per-step pairs on two clocks.

Targets: a step <= 1.5x the floor; a speed-up >= 7x at 256 new tokens and >= 14x at 512, in
every round. Exit status 1 if one is missed (``--no-check`` only prints).

The cached step is the decoder's fast path (``Decoder._step_plan``, ``model._layer_step``):
from the second step of a run on, the layers' products and kernels are called with
``torch.nn.functional`` over the tensors that the run's first fast step gathered, without
module calls, attribute look-ups, per-layer checks or head transposes. Without autograd the
weights with more outputs than inputs (the Q/K/V projections, the FFN's first layer, the
output projection) are read from copies stored ``(in, out)`` (``minitransformer._layout``):
the same products summed in another order. Each round also times two more paths, each step
paired with its own floor over the parameters as stored: the fast path over the parameters
(``Decoder.pack_weights = False``; its logits are the module path's bit for bit) and the
module path (``Decoder.fast_step = False``).

Why the copies (AMD EPYC with 32 MB of L3, PyTorch's MKL, one thread, 2026-12-06): MKL runs
``F.linear`` of one row over ``nn.Linear``'s ``(out, in)`` layout, a dot product per output, at
8-10 GB/s once the matrix has left the L2 cache, and over ``(in, out)``, a row of outputs per
input, at 20-45 GB/s. After a cache flush a 4096 x 256 matrix (the output projection of
``bench_hf.py``'s small shape) took 629 us against 282 us, 1024 x 256 199 us against 110 us,
768 x 256 161 us against 120 us; 256 x 1024, with fewer outputs, went the other way (130 us
against 182 us): hence the rule "more outputs than inputs". At a batch of 8 both layouts run
alike (MKL packs the matrix itself). Here the copies made the floor 1.2-1.5x faster (medians
over 5 rounds) and the step 1.1-1.4x; on the small GPT-2 shape, whose output projection is 4
of its 17 MB, a step went from 2.0-2.4 ms to 1.3-1.5 ms.

Where a step's time goes beyond the floor (one thread, same machine; it is shared, and the
floor moved between 0.8 and 1.5 ms from round to round):

* The step / floor ratio rose with the copies (medians 1.55 -> 1.71 at 256 new tokens, 1.70
  -> 1.89 at 512): they shortened the floor more than the step, whose fixed part (~0.7-0.9
  ms) stayed. A hand-written step of the small GPT-2 shape over the same tensors, with no
  checks and no cache bookkeeping, measured 1.11 ms; without its attention 0.83 ms; without
  its LayerNorms and GELUs too 0.65 ms; the floor 0.56 ms. So the four attention kernels take
  ~70 us each inside a step (5-20 us alone: their keys and values come from memory), the
  small operators ~0.2 ms, and the products run ~1.15x slower inside a step than back to
  back. The package's step is within 0.05-0.15 ms of that hand-written one: Python around
  the calls is no longer what is left.
* The 1.5x target would need that fixed part under half a floor (~0.5 ms), less than the
  attention kernels and LayerNorms take alone in a step. Attention written otherwise was
  slower than the fused kernel in the hand-written step (1.18 ms against 1.28 ms as matmul,
  softmax, matmul; in another run 1.08 ms against 1.14 ms as elementwise products and sums).
  Fewer operator calls would need fused kernels (add + LayerNorm, QKV + attention), which
  eager PyTorch on CPU does not offer.
* Earlier, on the parameters' layout (same kind of machine, 3 rounds): 123 operator calls per
  step, views included; a LayerNorm ~2 us, an add ~1 us, an attention kernel 5-25 us from 32
  to 512 keys; interleaving each floor product with one attention kernel added 50-200 us
  beyond the two parts' own times; cutting the ~40 cheap calls (in-place adds, the cache's
  slices) would save ~15 us.
* ``torch.compile`` (inductor, gcc 12, one thread), measured on the parameters' layout but
  not adopted: the fast path's layer loop compiled as it is (dynamic shapes; 2 graphs, ~14 s
  to compile) measured 1.82-1.83x of that floor against 1.92-1.95x eager at 128 tokens. A
  separate step function over a fixed 64-position cache with a mask (static shapes) reached
  1.60-1.64x with ``cpp_wrapper`` (1.78-1.89x without; eager 2.0-2.2x; 11-17 s to compile
  cold), at the price of a second copy of the step, attention over the whole preallocated
  cache, and a C++ compiler on the learner's machine.

What the step path avoids: module calls and their attribute look-ups (the run's first fast
step gathers the tensors), per-layer checks (the first layer's are run for all), the head
transposes (views at one query row), masks (built once per run: none for a one-token step,
none for a source without padding), validation of the memory and source mask after the first
step, slicing of the cross-attention keys and values; Q, K and V come from one product,
dropout and attention-weight bookkeeping cost nothing in eval mode.

Run: ``.venv/bin/python benchmarks/bench_kv_cache.py [--rounds 5] [--threads N] [--device cpu]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from minitransformer._layout import step_weight
from minitransformer.data import src_padding_mask
from minitransformer.decoding import greedy_decode
from minitransformer.kv_cache import KVCache
from minitransformer.model import Transformer

D_MODEL, LAYERS, HEADS, D_FF, VOCAB, SRC_LEN = 256, 4, 8, 1024, 1000, 32
STEP_TARGET = 1.5  # cached step / weight-read floor, at most
PATHS = ("fast", "params", "module")  # see paired_steps
SPEEDUP_TARGETS = {256: 7.0, 512: 14.0}  # uncached / cached greedy decoding, at least


def clocks(device: torch.device):
    """``now()`` -> (wall, CPU) seconds, after synchronising ``device`` if it is an accelerator."""
    sync = torch.accelerator.synchronize if device.type != "cpu" else (lambda: None)

    def now() -> tuple[float, float]:
        sync()
        return time.perf_counter(), time.process_time()

    return now


def timed(fn, now) -> tuple[float, float]:
    """Wall-clock and process CPU seconds of one call of ``fn``. On one thread the CPU time
    leaves out the moments other programs had the processor."""
    start = now()
    fn()
    end = now()
    return end[0] - start[0], end[1] - start[1]


def floor_products(model: Transformer, device: torch.device, packed: bool) -> list[tuple]:
    """``(input, weight, bias)`` of each matrix-vector product of a cached step, in order, over
    the very tensors the step reads (its plan, ``Decoder._step_plan``): ``packed``, the
    copies of ``step_weight`` where it makes them (the default step, without autograd), else
    the parameters as ``nn.Linear`` stores them."""
    products = []
    for layer in model.decoder.layers:
        step = layer._step_weights(packed)
        cross, _ = step.cross
        w1, b1, w2, b2, _ = step.ffn
        for a in (step.self_attn, cross):
            products += [(a.w_in, a.b_in), (a.w_o, a.b_o)]
        products += [(w1, b1), (w2, b2)]
    products.append((step_weight(model.output.weight) if packed else model.output.weight, None))
    return [(torch.randn(1, 1, w.shape[1], device=device), w, b) for w, b in products]


def matmul_flops(fn) -> int:
    """FLOPs of the matrix products (``mm``/``addmm``) that ``fn`` runs."""
    with FlopCounterMode(display=False) as counter:
        fn()
    ops = counter.get_flop_counts().get("Global", {})
    return sum(n for op, n in ops.items() if str(op).split(".")[-1] in ("mm", "addmm"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[256, 512],
        help="numbers of new tokens (default: 256 512)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch.set_num_threads (default 1; 0 keeps torch's choice)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="cpu",
        help="the clock of the times and targets: process CPU time (default; on "
        "one thread it leaves out the moments other programs ran, the "
        "faithful number on a shared machine) or wall-clock time (always "
        "on an accelerator)",
    )
    parser.add_argument("--no-check", action="store_true", help="print only, exit 0")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    clock = 0 if args.clock == "wall" or device.type != "cpu" else 1
    now = clocks(device)

    torch.manual_seed(0)
    model = (
        Transformer(
            VOCAB,
            VOCAB,
            d_model=D_MODEL,
            num_heads=HEADS,
            num_layers=LAYERS,
            d_ff=D_FF,
            dropout=0.0,
        )
        .eval()
        .to(device)
    )
    src = torch.randint(3, VOCAB, (1, SRC_LEN), generator=torch.Generator().manual_seed(1))
    src = src.to(device)
    src_mask = src_padding_mask(src)  # what greedy_decode passes: all True here
    products = {packed: floor_products(model, device, packed) for packed in (True, False)}
    print(
        f"model: d_model={D_MODEL}, {LAYERS}+{LAYERS} layers, {HEADS} heads, d_ff={D_FF}, "
        f"vocab={VOCAB}; source {SRC_LEN} tokens, batch 1; torch {torch.__version__}, "
        f"{device}, {torch.get_num_threads()} thread(s); targets on {args.clock} time"
    )

    def floor(packed: bool = True) -> None:
        for x, w, b in products[packed]:
            F.linear(x, w, b)

    with torch.inference_mode():
        memory = model.encode(src, src_mask)  # (1, S, d_model)

    def paired_steps(n: int, path: str = "fast") -> tuple[list[float], list[float]]:
        """A run of n cached steps as greedy_decode makes them, each right after one pass of
        its floor: (floor, step) times on the chosen clock, so that each pair sees the same
        machine (the floor reads the same weights the previous step read). ``path``: "fast",
        the default step (the fast path over step_weight's copies); "params", the fast path
        over the parameters (``Decoder.pack_weights = False``); "module", the module path
        (``Decoder.fast_step = False``). The last two pair with the floor over the parameters."""
        model.decoder.fast_step, model.decoder.pack_weights = path != "module", path == "fast"
        floors, steps = [], []
        cache = KVCache.for_model(model, n)
        token = torch.ones(1, 1, dtype=torch.long, device=device)
        for _ in range(n):
            floors.append(timed(lambda: floor(path == "fast"), now)[clock])
            start = now()
            logits = model.decode(token, memory, src_mask=src_mask, cache=cache)
            token = logits[:, -1].argmax(-1, keepdim=True)
            steps.append(now()[clock] - start[clock])
        model.decoder.fast_step = model.decoder.pack_weights = True
        return floors, steps

    def decode(n: int, use_cache: bool):
        return lambda: greedy_decode(
            model, src, max_len=n + 1, bos_id=1, eos_id=None, use_cache=use_cache
        )

    with torch.inference_mode():
        cache = KVCache.for_model(model, 2)
        model.decode(
            torch.ones(1, 1, dtype=torch.long, device=device),
            memory,
            src_mask=src_mask,
            cache=cache,
        )
        step_flops = matmul_flops(
            lambda: model.decode(
                torch.ones(1, 1, dtype=torch.long, device=device),
                memory,
                src_mask=src_mask,
                cache=cache,
            )
        )
        if step_flops != matmul_flops(floor):
            print(
                f"ERROR: the floor's products ({matmul_flops(floor)} FLOPs) are not those of "
                f"a step ({step_flops} FLOPs)"
            )
            return 1
        for _ in range(20):  # warm-up: allocator, caches
            floor(True), floor(False)
        for path in PATHS:
            paired_steps(8, path)
        decode(8, True)()
        decode(8, False)()

    ok = True
    for n in args.lengths:
        if not torch.equal(decode(n, True)(), decode(n, False)()):
            print(f"ERROR: cached and uncached tokens differ at n={n}")
            return 1
        speedup: list[float] = []
        per = {key: [] for key in ("floor", "params floor", *PATHS)}  # median times per round
        ratio = {path: [] for path in PATHS}  # median step / floor per round
        for r in range(args.rounds):
            with torch.inference_mode():
                jobs = {"cached": decode(n, True), "uncached": decode(n, False)}
                order = list(jobs) if r % 2 == 0 else list(jobs)[::-1]
                got = {name: timed(jobs[name], now)[clock] for name in order}
                paths = {path: paired_steps(n, path) for path in PATHS[:: 1 if r % 2 else -1]}
            for path, (floors, steps) in paths.items():
                per[path].append(statistics.median(steps))
                pairs = zip(steps, floors, strict=True)
                ratio[path].append(statistics.median(step / f for step, f in pairs))
            per["floor"].append(statistics.median(paths["fast"][0]))
            per["params floor"].append(statistics.median(paths["params"][0]))
            speedup.append(got["uncached"] / got["cached"])

        def spread(xs: list[float], fmt: str) -> str:
            return f"median {statistics.median(xs):{fmt}} (rounds {min(xs):{fmt}}-{max(xs):{fmt}})"

        def ms(key: str, per=per) -> str:
            return spread([1e3 * t for t in per[key]], ".3f") + " ms"

        def times(a: str, b: str, per=per) -> str:  # a's time over b's, round by round
            return spread([x / y for x, y in zip(per[a], per[b], strict=True)], ".2f") + "x"

        step_ok = max(ratio["fast"]) <= STEP_TARGET
        target = SPEEDUP_TARGETS.get(n)
        fast_ok = target is None or min(speedup) >= target
        ok = ok and step_ok and fast_ok
        print(f"{n:4d} new tokens: floor {ms('floor')}, cached step {ms('fast')}")
        print(
            f"     step / floor {spread(ratio['fast'], '.2f')}x, target <= {STEP_TARGET}x "
            f"{'met' if step_ok else 'MISSED'}"
        )
        print(
            f"     over the parameters as stored: floor {ms('params floor')} "
            f"({times('params floor', 'floor')} the floor), step {ms('params')} "
            f"({times('params', 'fast')} the step), step / floor "
            f"{spread(ratio['params'], '.2f')}x"
        )
        print(
            f"     module path: step {ms('module')} ({times('module', 'params')} the fast "
            f"path's over the parameters), step / floor {spread(ratio['module'], '.2f')}x"
        )
        print(
            f"     speed-up of caching {spread(speedup, '.2f')}x"
            + (f", target >= {target:.0f}x {'met' if fast_ok else 'MISSED'}" if target else "")
        )
    print("targets met" if ok else "TARGET MISSED")
    return 0 if ok or args.no_check else 1


if __name__ == "__main__":
    sys.exit(main())
