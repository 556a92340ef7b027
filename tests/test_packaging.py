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


def test_citation_and_changelog_name_the_package_version():
    """CITATION.cff's version and the changelog's latest release are minitransformer.__version__,
    released on CITATION.cff's date-released."""
    citation = (ROOT / "CITATION.cff").read_text()
    cited = re.search(r"^version: (\S+)$", citation, re.M)
    released = re.search(r'^date-released: "(\d{4}-\d{2}-\d{2})"$', citation, re.M)
    assert cited and released, "CITATION.cff needs a version and a date-released"
    assert cited.group(1) == minitransformer.__version__
    assert re.search(r"^license:\n  - MIT\n  - CC-BY-4.0$", citation, re.M)
    changelog = (ROOT / "CHANGELOG.md").read_text()
    latest = re.search(r"^## (\d+\.\d+\.\d+) - (\d{4}-\d{2}-\d{2})$", changelog, re.M)
    assert latest, "CHANGELOG.md has no released version"
    assert latest.groups() == (minitransformer.__version__, released.group(1))


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
