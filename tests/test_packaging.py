"""The package's metadata (one version, py.typed, no torch on import) and `make help`."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

import minitransformer

ROOT = Path(__file__).resolve().parents[1]


def test_one_version_source():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert version("minitransformer") == minitransformer.__version__


def test_the_package_says_it_is_typed():
    assert (Path(minitransformer.__file__).parent / "py.typed").is_file()


def test_importing_the_package_imports_no_torch():
    code = "import sys, minitransformer; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_help_lists_every_target():
    makefile = (ROOT / "Makefile").read_text()
    rules = set(re.findall(r"^([a-z][a-z-]*):(?!=)", makefile, re.M))
    (phony,) = re.findall(r"^\.PHONY:(.*)$", makefile, re.M)
    result = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True
    )
    lines = result.stdout.splitlines()
    listed = [line.split()[1] for line in lines]
    assert all(line.startswith("make ") and len(line.split()) > 2 for line in lines)  # described
    assert sorted(listed) == sorted(rules) == sorted(phony.split())
