"""requirements.lock resolves on every platform and Python it claims to cover.

Each case asks uv how it would install the lock there (``uv pip install --dry-run
--require-hashes --no-deps --python-platform ... --python-version ...``): every package must have
a hashed distribution for that platform and Python. uv reads the package index, so these tests
need it; away from CI they skip when the index cannot be reached.
"""

from __future__ import annotations

import importlib.util
import itertools
import os
import shutil
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("lock", ROOT / "scripts" / "lock.py")
assert spec and spec.loader
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)

UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")


def _index_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/uv/", timeout=10).close()
        return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def resolutions():
    """uv's answer for every (platform, Python), each read from the index: a package that only
    one platform installs (CUDA's wheels for Linux on 3.12, say) is not in uv's cache after
    another platform's resolution, so none of them can be answered offline."""
    if UV is None:
        pytest.fail("uv is not installed: it is in requirements.txt (make install)")
    if not _index_reachable():
        if os.environ.get("CI"):
            pytest.fail("CI cannot reach https://pypi.org to resolve the lock")
        pytest.skip("https://pypi.org is unreachable: the lock cannot be resolved here")
    cases = list(itertools.product(lock.PLATFORMS, lock.PYTHONS))
    with ThreadPoolExecutor(4) as pool:
        answers = pool.map(lambda case: lock.resolve(UV, lock.PLATFORMS[case[0]], case[1]), cases)
        return dict(zip(cases, answers, strict=True))


@pytest.mark.parametrize("python", lock.PYTHONS)
@pytest.mark.parametrize("where", list(lock.PLATFORMS), ids=lambda w: f"{w[0]}-{w[1]}")
def test_the_lock_resolves(resolutions, where, python):
    run = resolutions[where, python]
    assert run.returncode == 0, f"{where} CPython {python}:\n{run.stdout}\n{run.stderr}"
    assert "Would install" in run.stderr + run.stdout


def test_torch_is_the_cpu_build_where_its_hash_could_be_recorded():
    text = lock.LOCK.read_text()
    assert "torch==2.13.0+cpu ; " in text and "torch==2.13.0 ; " in text
    assert "# Covers " + lock.COVERED in text


def test_this_interpreter_is_covered_or_told_what_to_do(capsys):
    covered = lock.covers()
    if covered:
        assert "make install-unlocked" in capsys.readouterr().err
    else:
        assert sys.version_info[:2] in {(3, 11), (3, 12), (3, 13)}
