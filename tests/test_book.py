"""The book's structure: the table of contents, the intro's chapter map and the notebooks agree."""

from __future__ import annotations

import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOC = (ROOT / "_toc.yml").read_text()


def toc_files() -> list[str]:
    return re.findall(r"^\s*-\s*file:\s*book/(\S+)", TOC, re.M)


def toc_chapters() -> list[str]:
    """The chapters of the parts that hold notebooks, in reading order."""
    return [f for f in toc_files() if (ROOT / "book" / f"{f}.ipynb").exists()]


def test_every_toc_entry_exists():
    missing = [f for f in toc_files() if not any((ROOT / "book" / f"{f}{ext}").exists() for ext in (".ipynb", ".md"))]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_notebook_is_in_the_toc():
    notebooks = {p.stem for p in (ROOT / "book").glob("*.ipynb")}
    assert notebooks <= set(toc_files()), f"notebooks missing from _toc.yml: {sorted(notebooks - set(toc_files()))}"


def test_intro_chapter_map_matches_toc():
    intro = (ROOT / "book" / "intro.md").read_text()
    table = intro.split("(chapter-map)=", 1)[1]
    mapped = re.findall(r"^\|\s*\d+\s*\|\s*\{doc\}`(\w+)`", table, re.M)
    assert mapped == toc_chapters(), (
        f"the intro's chapter map {mapped} differs from the notebooks of _toc.yml {toc_chapters()}"
    )


def test_notebooks_are_committed_with_outputs():
    for f in toc_chapters():
        nb = json.loads((ROOT / "book" / f"{f}.ipynb").read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        assert any(c.get("outputs") for c in code), f"book/{f}.ipynb has no stored outputs: run `make notebooks`"
        for c in code:
            tags = c.get("metadata", {}).get("tags", [])
            errors = [o for o in c.get("outputs", []) if o["output_type"] == "error"]
            assert not errors or "raises-exception" in tags, (
                f"book/{f}.ipynb stores an error in a cell not tagged raises-exception: {''.join(c['source'])[:80]!r}"
            )


def test_solution_cells_are_collapsed_in_jupyter():
    """Code cells between {solution-start} and {solution-end} are stored with hidden source."""
    for f in toc_chapters():
        nb = json.loads((ROOT / "book" / f"{f}.ipynb").read_text())
        inside = False
        for c in nb["cells"]:
            src = "".join(c["source"])
            if c["cell_type"] == "markdown":
                if "{solution-start}" in src:
                    inside = True
                if "{solution-end}" in src:
                    inside = False
            elif inside:
                assert c.get("metadata", {}).get("jupyter", {}).get("source_hidden"), (
                    f"book/{f}.ipynb: solution cell not collapsed: {src[:60]!r}"
                )


def test_where_next_recap_lists_every_package_module():
    """The closing chapter's map of the package names every module, so none is forgotten."""
    nb = json.loads((ROOT / "book" / "where_next.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    package = ROOT / "minitransformer"
    modules = [p.stem for p in package.glob("*.py") if not p.stem.startswith("_")]
    modules += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [m for m in modules if f"`minitransformer.{m}`" not in text]
    assert not missing, f"book/where_next.ipynb's recap does not mention: {missing}"
