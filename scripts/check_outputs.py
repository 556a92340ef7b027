#!/usr/bin/env python3
"""Check that notebooks are committed as recorded: run top to bottom, outputs kept.

    python scripts/check_outputs.py book/attention.ipynb [...]

The chapters are committed with their outputs (strict nbval compares them, and JupyterLab
shows them before a run). A notebook saved after "Clear All Outputs", stripped by a tool such
as nbstripout, or saved half-run fails here: every non-empty code cell must have an execution
count, the counts must rise from top to bottom (one kernel, in order, as `make notebooks`
records), and some cell must have an output. The pre-commit hook `notebooks-keep-outputs` and
tests/test_book.py run it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def problems(path: Path) -> list[str]:
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    code = [c for c in cells if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    found = []
    counts = [c.get("execution_count") for c in code]
    if None in counts:
        found.append(f"{counts.count(None)} of {len(code)} code cells were never run")
    elif counts != sorted(counts) or len(set(counts)) != len(counts):
        found.append("the code cells did not run once each, top to bottom")
    if code and not any(c.get("outputs") for c in code):
        found.append("no cell has an output")
    return [f"{path}: {p} (run `make notebooks NOTEBOOKS={path}`)" for p in found]


def main(argv: list[str]) -> int:
    found = [p for arg in argv for p in problems(Path(arg))]
    print("\n".join(found), file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
