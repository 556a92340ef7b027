#!/usr/bin/env python3
"""requirements.lock: one hashed lock for every platform and Python the course supports.

    python scripts/lock.py covers         # is this interpreter covered? (make install asks)
    python scripts/lock.py compile UV     # re-resolve requirements.txt with the uv at UV
    python scripts/lock.py check UV       # resolve the lock for every platform and Python

The lock is a universal resolution (``uv pip compile --universal``): every line carries the
environment markers that select it, so one file serves Linux x86-64 and aarch64, macOS arm64
and Windows x86-64, on CPython 3.11, 3.12 and 3.13 (``COVERED``). torch is PyTorch's CPU-only
build (``2.13.0+cpu``) on Linux x86-64 with CPython 3.11, from PyTorch's CPU index or a local
wheel folder; everywhere else it is PyPI's wheel, which is a CPU build on macOS and Windows and
carries CUDA libraries (several GB, unused here) on Linux, because the hashes of PyTorch's CPU
wheels for those Pythons could not be recorded where the lock was made (no access to PyTorch's
index). ``tests/test_lock.py`` runs ``check``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"

PYTHONS = ("3.11", "3.12", "3.13")
# (platform.system(), platform.machine() lower-cased) -> uv's name of that platform.
PLATFORMS = {
    ("Linux", "x86_64"): "x86_64-manylinux_2_28",
    ("Linux", "aarch64"): "aarch64-manylinux_2_28",
    ("Darwin", "arm64"): "aarch64-apple-darwin",
    ("Windows", "amd64"): "x86_64-pc-windows-msvc",
}
COVERED = "CPython 3.11-3.13 on Linux x86-64 and aarch64, macOS arm64 (14 or newer), Windows x86-64"
# torch 2.13's macOS wheels are for macOS 14 (Sonoma) and newer.
MACOS_TARGET = "14.0"

# The CPU-only build where its hash can be recorded (a local wheel or PyTorch's CPU index).
TORCH_LINES = (
    "torch==2.13.0+cpu ; sys_platform == 'linux' and platform_machine == 'x86_64' "
    "and python_version == '3.11'\n"
    "torch==2.13.0 ; sys_platform != 'linux' or platform_machine != 'x86_64' "
    "or python_version != '3.11'\n"
)


def this_platform() -> tuple[str, str]:
    return platform.system(), platform.machine().lower()


def covers() -> int:
    """0 if this interpreter is one the lock covers, else 1 with what to do instead."""
    version = ".".join(platform.python_version_tuple()[:2])
    implementation = platform.python_implementation()
    where = this_platform()
    musl = sysconfig.get_config_var("HOST_GNU_TYPE") and "musl" in str(
        sysconfig.get_config_var("HOST_GNU_TYPE")
    )
    ok = implementation == "CPython" and version in PYTHONS and where in PLATFORMS and not musl
    if ok:
        return 0
    if sys.version_info < (3, 11):  # noqa: UP036  (run by any python3, before the venv)
        print(
            f"The course needs Python 3.11 or newer (numpy 2.4, torch 2.13); this is "
            f"{platform.python_version()}. Install 3.11, 3.12 or 3.13 and run "
            f"make install PYTHON=python3.12 (say).",
            file=sys.stderr,
        )
        return 1
    print(
        f"requirements.lock covers {COVERED}.\n"
        f"This is {implementation} {platform.python_version()} on {where[0]} {where[1]}"
        f"{' (musl)' if musl else ''}, which it does not cover. Either:\n"
        f"  * use a covered Python: make install PYTHON=python3.12 (or python3.11, python3.13);\n"
        f"  * or install the direct pins of requirements.txt without hashes (pip resolves what "
        f"they pull in):\n"
        f"      make install-unlocked\n"
        f"    after which every make target uses that environment.",
        file=sys.stderr,
    )
    return 1


def compile_lock(uv: str) -> int:
    """Re-resolve requirements.txt into requirements.lock, for every covered environment."""
    lines = [
        line
        for line in (ROOT / "requirements.txt").read_text().splitlines(keepends=True)
        if not line.startswith("-e ")
    ]
    requirements = "".join(
        TORCH_LINES if line.strip() == "torch==2.13.0" else line for line in lines
    )
    work = ROOT / "_build" / "lock"
    work.mkdir(parents=True, exist_ok=True)
    (work / "requirements.in").write_text(requirements)
    torch_source = (
        ["--find-links", os.environ["PIP_FIND_LINKS"]]
        if os.environ.get("PIP_FIND_LINKS")
        else [
            "--extra-index-url",
            "https://download.pytorch.org/whl/cpu",
            "--index-strategy",
            "unsafe-best-match",
        ]
    )
    command = [
        uv,
        "pip",
        "compile",
        str(work / "requirements.in"),
        "--universal",
        "--python-version",
        PYTHONS[0],
        "--generate-hashes",
        "--no-header",
        *torch_source,
        "-o",
        str(work / "requirements.lock"),
    ]
    if subprocess.run(command, check=False).returncode:
        return 1
    version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True)
    LOCK.write_text(
        f"# Generated by 'make lock' from requirements.txt ({version.stdout.strip()}, universal).\n"
        f"# Covers {COVERED}.\n"
        "# Do not edit: change requirements.txt and run 'make lock'. 'make install' installs "
        "exactly this.\n" + (work / "requirements.lock").read_text()
    )
    return 0


def resolve(uv: str, uv_platform: str, python: str) -> subprocess.CompletedProcess[str]:
    """``uv pip install --dry-run`` of the lock, as it would install on that platform, read
    from the index (offline, from uv's cache, a package that only this platform installs may be
    missing)."""
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": MACOS_TARGET}
    command = [
        uv,
        "pip",
        "install",
        "--dry-run",
        "--no-deps",
        "--require-hashes",
        "--python-platform",
        uv_platform,
        "--python-version",
        python,
        "--target",
        str(ROOT / "_build" / "lock" / "target"),
        "-r",
        str(LOCK),
    ]
    if os.environ.get("PIP_FIND_LINKS"):
        command += ["--find-links", os.environ["PIP_FIND_LINKS"]]
    else:
        command += [
            "--extra-index-url",
            "https://download.pytorch.org/whl/cpu",
            "--index-strategy",
            "unsafe-best-match",
        ]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def check(uv: str) -> int:
    failed = 0
    for (system, machine), uv_platform in PLATFORMS.items():
        for python in PYTHONS:
            run = resolve(uv, uv_platform, python)
            last = (run.stdout + run.stderr).strip().splitlines()
            print(
                f"{system} {machine}, CPython {python}: "
                f"{'ok' if run.returncode == 0 else 'FAILED'} ({last[-1] if last else ''})"
            )
            failed += run.returncode != 0
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["covers"]:
        return covers()
    if argv[:1] == ["compile"] and len(argv) == 2:
        return compile_lock(argv[1])
    if argv[:1] == ["check"] and len(argv) == 2:
        return check(argv[1])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
