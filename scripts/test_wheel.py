#!/usr/bin/env python3
"""``make test-wheel``: the package as a learner installs it, not as this checkout runs it.

1. Builds the wheel of this checkout (``pip wheel``).
2. Installs it with the ``[book]`` extra, and nothing else the chapters need, into a fresh
   virtual environment, at the versions of ``requirements.lock`` (as constraints, so that pip
   resolves only what the wheel itself asks for).
3. Copies ``book/`` (and ``scripts/``) to a folder outside the checkout and executes the
   chapters there with that environment's kernel: every cell, the hidden assertions included,
   must run, with ``minitransformer`` imported from the environment's ``site-packages``.

    python scripts/test_wheel.py                    # the training chapter
    python scripts/test_wheel.py training lm        # some chapters
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build" / "wheel"

# Appended to each chapter: the package came from the wheel, not from a checkout.
WHERE_FROM = """
import minitransformer, pathlib
where = pathlib.Path(minitransformer.__file__).resolve()
assert "site-packages" in where.parts, f"minitransformer imported from {where}, not the wheel"
print("minitransformer", minitransformer.__version__, "from", where.parent)
"""


def run(*command: str | Path, **kwargs) -> None:
    print("$", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True, **kwargs)


def constraints_from_lock(path: Path) -> None:
    """requirements.lock without its hashes: pip takes hashes from requirements, not constraints."""
    lines = []
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            lines.append(line.rstrip(" \\"))
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("chapters", nargs="*", default=["training"])
    args = parser.parse_args(argv)
    start = time.perf_counter()
    shutil.rmtree(BUILD, ignore_errors=True)
    BUILD.mkdir(parents=True)

    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--quiet",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        BUILD / "dist",
        ROOT,
    )
    (wheel,) = (BUILD / "dist").glob("minitransformer-*.whl")

    env_dir = BUILD / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    constraints = BUILD / "constraints.txt"
    constraints_from_lock(constraints)
    # The wheel and its [book] extra: what `pip install "minitransformer[book]"` gives a
    # learner. nbclient runs the notebooks; it is the test's, not the chapters'.
    pip_source = []
    if sys.platform == "linux" and not os.environ.get("PIP_FIND_LINKS"):
        pip_source = ["--extra-index-url", "https://download.pytorch.org/whl/cpu"]
    run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        *pip_source,
        "-c",
        constraints,
        f"minitransformer[book] @ {wheel.as_uri()}",
        "nbclient",
    )
    print(f"installed in {time.perf_counter() - start:.0f} s", flush=True)

    with tempfile.TemporaryDirectory(prefix="wheel-book-") as tmp:
        outside = Path(tmp)
        shutil.copytree(ROOT / "book", outside / "book", ignore=shutil.ignore_patterns("_build"))
        shutil.copytree(ROOT / "scripts", outside / "scripts")
        for chapter in args.chapters:
            notebook = outside / "book" / f"{chapter}.ipynb"
            began = time.perf_counter()
            run(python, "-c", EXECUTE, notebook, cwd=notebook.parent)
            print(
                f"{chapter}: ran from the wheel in {time.perf_counter() - began:.0f} s", flush=True
            )
    print(f"test-wheel passed in {time.perf_counter() - start:.0f} s")
    return 0


# Run inside the fresh environment: execute a notebook in its own folder, as nbval does.
EXECUTE = f"""
import sys, nbformat
from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
nb.cells.append(nbformat.v4.new_code_cell({WHERE_FROM!r}))
client = NotebookClient(nb, timeout=600, kernel_name="python3",
                        resources={{"metadata": {{"path": "."}}}})
client.execute()
print("".join(o.get("text", "") for o in nb.cells[-1].outputs), end="")
"""

if __name__ == "__main__":
    sys.exit(main())
