"""pytest collects every notebook listed in _toc.yml (under nbval) and no other notebook.

nbval compares the outputs of code cells. The numbers in the prose are inline expressions of
markdown cells (``{eval}`name```, see ``book/_ext/course_book.py``), whose values are stored in
each cell's ``user_expressions`` metadata for JupyterLab. :class:`ExpressionCell` makes each
such markdown cell a test item of its own, run in order between the code cells in the same
kernel: it evaluates the expressions there and compares them, exactly, with the stored values.
So a sentence's number is checked like a printed one, and a stale stored value fails.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
from queue import Empty

import nbformat
import nbval.plugin
import pytest
from hypothesis import settings

ROOT = pathlib.Path(__file__).parent


def toc_notebooks() -> set[pathlib.Path]:
    """The notebooks that _toc.yml lists, as absolute paths."""
    toc = (ROOT / "_toc.yml").read_text()
    files = re.findall(r"^\s*-?\s*(?:file|root):\s*([^\s#]+)", toc, re.M)
    return {(ROOT / f).with_suffix(".ipynb").resolve() for f in files}


_TOC = toc_notebooks()
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from course_book import expressions_in  # noqa: E402

# Property tests explore new random examples on every local run, but CI (which sets CI=true)
# replays a fixed sequence, so that a green commit stays green. Tests' own @settings (example
# counts, deadline=None) are layered on top of the loaded profile.
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")


def pytest_ignore_collect(collection_path: pathlib.Path, config) -> bool | None:
    if collection_path.suffix == ".ipynb":
        return (
            collection_path.resolve() not in _TOC or ".ipynb_checkpoints" in collection_path.parts
        )
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


class ExpressionCell(pytest.Item):
    """A markdown cell's inline expressions, evaluated in the notebook's kernel and compared."""

    def __init__(self, *, cell, index, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.index = cell, index

    def runtest(self):
        kernel = self.parent.kernel
        expressions = expressions_in(self.cell.source)
        recorded = self.cell.metadata.get("user_expressions", [])
        stored = {e["expression"]: e["result"] for e in recorded}
        missing = [e for e in expressions if e not in stored]
        if missing:
            raise ExpressionMismatch(f"no stored value for {missing}: run `make notebooks`")
        request = {str(i): e for i, e in enumerate(expressions)}
        msg_id = kernel.kc.execute("", silent=True, store_history=False, user_expressions=request)
        while True:
            try:
                msg = kernel.get_message(stream="shell", timeout=60)
            except Empty:
                raise ExpressionMismatch("the kernel did not answer within 60 s") from None
            if msg["parent_header"].get("msg_id") == msg_id:
                break
        results = msg["content"]["user_expressions"]
        problems = []
        for key, expr in request.items():
            got = results[key]
            if got["status"] != "ok":
                problems.append(f"{{eval}}`{expr}` raised {got.get('ename')}: {got.get('evalue')}")
            elif got["data"].get("text/plain") != stored[expr]["data"].get("text/plain"):
                problems.append(
                    f"{{eval}}`{expr}` is {got['data'].get('text/plain')}, "
                    f"the notebook stores {stored[expr]['data'].get('text/plain')}"
                )
        if problems:
            raise ExpressionMismatch("; ".join(problems))

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, ExpressionMismatch):
            return f"Markdown cell {self.index}: {excinfo.value}\n\n{self.cell.source[:400]}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.path, 0, f"{self.path.name}::Markdown {self.index}"


class ExpressionMismatch(Exception):
    """An inline expression's value differs from the one stored in the notebook."""


_nbval_collect = nbval.plugin.IPyNbFile.collect


def _collect_with_expressions(self):
    """nbval's items, one per code cell, plus one :class:`ExpressionCell` per markdown cell
    with inline expressions, in notebook order."""
    code_items = iter(_nbval_collect(self))
    for index, cell in enumerate(nbformat.read(str(self.path), as_version=4).cells):
        if cell.cell_type == "code":
            yield next(code_items)
        elif cell.cell_type == "markdown" and expressions_in(cell.source):
            yield ExpressionCell.from_parent(self, name=f"Markdown {index}", cell=cell, index=index)


# nbval collects every notebook with nbval.plugin.IPyNbFile: teach it the markdown cells too.
nbval.plugin.IPyNbFile.collect = _collect_with_expressions
