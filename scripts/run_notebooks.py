#!/usr/bin/env python3
"""Re-execute the book's notebooks in place and record what JupyterLab shows before a run.

Usage (``make notebooks`` runs it on every chapter of ``_toc.yml``)::

    .venv/bin/python scripts/run_notebooks.py book/attention.ipynb [more.ipynb ...]

Each notebook runs top to bottom in a fresh kernel started in its own folder, as nbval and
the HTML build run it. Code cells get their new outputs (with no execution timestamps, so a
re-run only changes the cells whose output changed). Each markdown cell with inline
expressions (``{eval}`name```) gets their values in its ``user_expressions`` metadata, in
the format jupyterlab-myst writes when a learner runs the cell, so that a notebook opened
in JupyterLab shows its numbers before it is run. The values are taken at the cell's place in
the notebook, after the code cells above it ran: what a learner's Run All shows there, and
what the HTML book, built from the stored outputs, shows.

Progress bars (tqdm's ipywidgets) are not stored: a widget's saved view shows in JupyterLab
only in a trusted notebook, and as raw text (``reverse task: 0%|...``) otherwise; a learner's
run draws the live bar. Their cells are ``nbval-ignore-output`` (CONTRIBUTING, "Chapters").

The recorded notebook is then normalised (``scripts/normalize_notebooks.py``): metadata as
JupyterLab writes it, solutions' outputs hidden with their code, links JupyterLab can follow.

The kernels run with ``MINITRANSFORMER_RECORD=1``, which makes
:func:`minitransformer.report.fmt` refuse a number that sits on a rounding edge: what is
recorded must print the same on another CPU.

Exits non-zero, leaving the notebook file untouched, if a cell raises unexpectedly or an
expression fails to evaluate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from course_book import expressions_in  # noqa: E402
from normalize_notebooks import normalize  # noqa: E402


class ExpressionRecordingClient(NotebookClient):
    """An nbclient that also evaluates each markdown cell's inline expressions in order."""

    async def async_execute_cell(self, cell, cell_index, execution_count=None, store_history=True):
        if cell.cell_type != "markdown":
            return await super().async_execute_cell(
                cell, cell_index, execution_count, store_history
            )
        expressions = expressions_in(cell.source)
        if not expressions:
            cell.metadata.pop("user_expressions", None)
            return cell
        request = {str(i): expr for i, expr in enumerate(expressions)}
        msg_id = self.kc.execute("", silent=True, store_history=False, user_expressions=request)
        reply = await self.async_wait_for_reply(msg_id, cell)
        results = reply["content"]["user_expressions"]
        recorded = []
        for key, expr in request.items():
            result = results[key]
            if result["status"] != "ok":
                raise RuntimeError(
                    f"markdown cell {cell_index}: {{eval}}`{expr}` failed: "
                    f"{result.get('ename')}: {result.get('evalue')}"
                )
            recorded.append({"expression": expr, "result": result})
        cell.metadata["user_expressions"] = recorded
        return cell


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def drop_widgets(nb: nbformat.NotebookNode) -> None:
    """Remove the stored progress-bar widgets: their outputs and the notebook's widget state."""
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs if WIDGET_VIEW not in o.get("data", {})]
    nb.metadata.pop("widgets", None)


def run(path: Path, timeout: int) -> float:
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    client = ExpressionRecordingClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    drop_widgets(nb)
    nbformat.write(normalize(nb, path.resolve().parent), path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell (default 600)")
    args = parser.parse_args(argv)
    os.environ["MINITRANSFORMER_RECORD"] = "1"  # the kernels inherit it: fmt() is strict
    for path in args.notebooks:
        print(f"{path}: running ...", flush=True)
        seconds = run(path, args.timeout)
        print(f"{path}: done in {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
