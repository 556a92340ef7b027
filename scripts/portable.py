#!/usr/bin/env python3
"""Replay the notebooks as other CPUs compute them: ``make test-portable``.

A notebook's stored outputs were recorded on one machine. Another CPU rounds differently: its
vector width (torch's kernels for SSE, AVX2 or AVX-512), its BLAS code path (MKL's per-CPU
paths) and its number of threads (how a reduction is split) all change the last bits of a
float32 result. Each *set-up* below makes this machine compute as such a CPU would, and the
notebooks run under nbval against their stored outputs: every printed number, and every
number in the prose, must come out the same.

    python scripts/portable.py                 # every set-up this machine can run
    python scripts/portable.py scalar avx2-t3  # some of them
    python scripts/portable.py --list          # the set-ups, and which run here
    python scripts/portable.py --record scalar # record under one, replay natively (both ways)

These variables can only make a CPU *narrower* than this one: an AVX2 machine cannot compute
as an AVX-512 one does. The ``avx512`` set-up runs where the CPU has AVX-512 and is skipped
(and said so) elsewhere; that is why the notebooks' claims are written to hold on any CPU
(CONTRIBUTING.md, "Outputs replay on any CPU") rather than tuned until these replays pass.

Before the replays, a fingerprint (the last bits of a float32 matmul, softmax and layer norm)
is printed for each set-up: set-ups with different fingerprints compute differently here.
Exits non-zero if any replay fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name: (what it stands for, environment). MINITRANSFORMER_NUM_THREADS is torch's number of
# threads in the notebooks' kernels (set by an IPython startup file: torch caps OMP_NUM_THREADS
# at the number of cores, so 3 or 4 threads on a 2-core machine need torch.set_num_threads).
SETUPS: dict[str, tuple[str, dict[str, str]]] = {
    "scalar": (
        "no vectorisation, MKL's compatibility path, 1 thread (the narrowest CPU)",
        {
            "ATEN_CPU_CAPABILITY": "default",
            "MKL_CBWR": "COMPATIBLE",
            "ONEDNN_MAX_CPU_ISA": "SSE41",
            "MINITRANSFORMER_NUM_THREADS": "1",
        },
    ),
    "avx2-t3": (
        "torch's AVX2 kernels, MKL's AVX2 path, 3 threads (an AVX2 laptop)",
        {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "MINITRANSFORMER_NUM_THREADS": "3"},
    ),
    "mkl-compat-t4": (
        "this CPU's torch kernels, MKL's compatibility path, 4 threads",
        {"MKL_CBWR": "COMPATIBLE", "MINITRANSFORMER_NUM_THREADS": "4"},
    ),
    "t8": (
        "this CPU's kernels on 8 threads (an 8-core laptop's reduction splits)",
        {"MINITRANSFORMER_NUM_THREADS": "8"},
    ),
    "avx512": (
        "torch's AVX-512 kernels and MKL's AVX-512 path, 2 threads (where the CPU has them)",
        {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "MINITRANSFORMER_NUM_THREADS": "2"},
    ),
}
# The two that differ most from a 2-thread AVX2 or AVX-512 recorder; CI runs these.
CI_SETUPS = ["scalar", "avx2-t3"]

# Read by the notebooks' kernels (IPython runs every file of its profile's startup folder).
_STARTUP = """
import os
if os.environ.get("MINITRANSFORMER_NUM_THREADS"):
    import torch
    torch.set_num_threads(int(os.environ["MINITRANSFORMER_NUM_THREADS"]))
"""

_PROBE = (
    "import torch\n"
    + _STARTUP
    + """
torch.manual_seed(0)
a, b = torch.randn(257, 263), torch.randn(263, 251)
x = a @ b
y = torch.randn(1_000_003)  # a reduction long enough to be split between threads
parts = [x.sum(), torch.softmax(x, -1)[:, :7].sum(), torch.layer_norm(x, (251,)).abs().sum(),
         y.sum()]
print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads(),
      " ".join(float(p).hex() for p in parts))
"""
)


def probe(env: dict[str, str]) -> tuple[str, int, str] | None:
    """(kernels torch dispatched to, threads, fingerprint) under ``env``; None if it fails."""
    run = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if run.returncode:
        return None
    capability, threads, fingerprint = run.stdout.split(maxsplit=2)
    return capability, int(threads), fingerprint.strip()


def runs_here(name: str, native: tuple[str, int, str] | None) -> str | None:
    """Why set-up ``name`` cannot run on this machine, or None if it can."""
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    env = SETUPS[name][1]
    if not x86 and any(k in env for k in ("ATEN_CPU_CAPABILITY", "MKL_CBWR")):
        return f"its kernel and MKL variables are for x86-64; this is {platform.machine()}"
    # torch reports the widest kernels the CPU runs; asked for wider ones it crashes.
    if name == "avx512" and (native is None or native[0] != "AVX512"):
        return f"this CPU has no AVX-512 (torch's widest kernels here: {native and native[0]})"
    return None


def pytest(paths: list[str], env: dict[str, str], cwd: Path = ROOT) -> int:
    """The notebooks under nbval, two workers, each notebook on one, in kernels that start
    with the set-up's number of threads."""
    command = [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", *paths]
    with tempfile.TemporaryDirectory(prefix="ipython-") as ipython_dir:
        startup = Path(ipython_dir) / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-threads.py").write_text(_STARTUP)
        full_env = {**os.environ, **env, "IPYTHONDIR": ipython_dir}
        return subprocess.run(command, env=full_env, cwd=cwd, check=False).returncode


def record_and_replay(name: str, paths: list[str]) -> int:
    """Record the notebooks under set-up ``name`` in a copy of the book, replay them natively."""
    _, env = SETUPS[name]
    with tempfile.TemporaryDirectory(prefix="portable-") as tmp:
        copy = Path(tmp)
        for item in ("book", "scripts", "tests", "_toc.yml", "conftest.py", "pyproject.toml"):
            source = ROOT / item
            if source.is_dir():
                shutil.copytree(source, copy / item, ignore=shutil.ignore_patterns("_build"))
            else:
                shutil.copy2(source, copy / item)
        notebooks = [p for p in paths if p.endswith(".ipynb")] or [
            str(p.relative_to(ROOT)) for p in sorted((ROOT / "book").glob("*.ipynb"))
        ]
        print(f"== recording {len(notebooks)} notebooks under {name}", flush=True)
        record = subprocess.run(
            [sys.executable, "scripts/run_notebooks.py", *notebooks],
            env={**os.environ, **env},
            cwd=copy,
            check=False,
        )
        if record.returncode:
            return record.returncode
        print("== replaying them natively", flush=True)
        return pytest(notebooks, {}, cwd=copy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "setups", nargs="*", help=f"set-ups to run (default: all of {list(SETUPS)})"
    )
    parser.add_argument("--paths", nargs="+", default=["book"], help="notebooks (default: book)")
    parser.add_argument("--list", action="store_true", help="list the set-ups and stop")
    parser.add_argument("--record", metavar="SETUP", help="record under SETUP, replay natively")
    args = parser.parse_args(argv)
    # "--paths book/x.ipynb scalar t8" reads the set-ups as paths: take them back.
    args.setups += [p for p in args.paths if p in SETUPS]
    args.paths = [p for p in args.paths if p not in SETUPS] or ["book"]
    unknown = [
        s for s in [*args.setups, *([args.record] if args.record else [])] if s not in SETUPS
    ]
    if unknown:
        parser.error(f"unknown set-up {unknown}; known: {', '.join(SETUPS)}")

    native = probe({})
    print(
        f"this machine: {platform.machine()}, torch kernels {native and native[0]}, "
        f"{native and native[1]} threads, fingerprint {native and native[2]}"
    )
    if args.record:
        return record_and_replay(args.record, args.paths)
    chosen, failed = args.setups or list(SETUPS), []
    for name in chosen:
        what, env = SETUPS[name]
        why_not = runs_here(name, native)
        settings = " ".join(f"{k}={v}" for k, v in env.items())
        result = None if why_not else probe(env)
        if why_not or result is None:
            print(f"== {name}: skipped, {why_not or 'torch failed to start'} ({settings})")
            continue
        same = " (the same as native)" if native and result[2] == native[2] else ""
        print(
            f"== {name}: {what}\n   {settings}\n   torch kernels {result[0]}, {result[1]} "
            f"threads, fingerprint {result[2]}{same}",
            flush=True,
        )
        if args.list:
            continue
        if pytest(args.paths, env):
            failed.append(name)
    if failed:
        print(f"failed under: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
