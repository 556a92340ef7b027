"""pytest collects every notebook listed in _toc.yml (under nbval) and no other notebook."""

from __future__ import annotations

import os
import pathlib
import re

import pytest
from hypothesis import settings

ROOT = pathlib.Path(__file__).parent


def toc_notebooks() -> set[pathlib.Path]:
    """The notebooks that _toc.yml lists, as absolute paths."""
    files = re.findall(r"^\s*-?\s*(?:file|root):\s*([^\s#]+)", (ROOT / "_toc.yml").read_text(), re.M)
    return {(ROOT / f).with_suffix(".ipynb").resolve() for f in files}


_TOC = toc_notebooks()

# Property tests explore new random examples on every local run, but CI (which sets CI=true)
# replays a fixed sequence, so that a green commit stays green. Tests' own @settings (example
# counts, deadline=None) are layered on top of the loaded profile.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
    if collection_path.suffix == ".ipynb":
        return collection_path.resolve() not in _TOC or ".ipynb_checkpoints" in collection_path.parts
    return None


def pytest_addoption(parser):
    parser.addoption(
        "--device",
        default=os.environ.get("MINITRANSFORMER_TEST_DEVICE", "cpu"),
        help="torch device for the unit tests that take the `device` fixture (cpu, cuda, "
        "cuda:1, mps); tests skip when that device is not available. Notebooks always run on "
        "the CPU. Default: $MINITRANSFORMER_TEST_DEVICE or cpu.",
    )


@pytest.fixture(scope="session")
def device(request):
    """The torch.device the unit tests run on (``pytest --device cuda``); skips if absent."""
    import torch

    name = request.config.getoption("--device")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        pytest.skip(f"--device {name}: CUDA is not available on this machine")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        pytest.skip(f"--device {name}: MPS is not available on this machine")
    return dev
