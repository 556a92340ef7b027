#!/usr/bin/env python3
"""Bring the book's notebooks to the one form that JupyterLab and the HTML book both read well.

Usage (the recorder, ``scripts/run_notebooks.py``, runs it on every notebook it records)::

    .venv/bin/python scripts/normalize_notebooks.py [--check] [book/NAME.ipynb ...]

With no paths it normalises every notebook of ``_toc.yml``; ``--check`` changes nothing and
exits 1 if a notebook is not normalised (``tests/test_book.py`` asserts the same). Running it
twice changes nothing the second time. What it rewrites, and why:

* **The notebook's metadata** is what JupyterLab writes when it saves the notebook with the
  course's kernel: ``kernelspec`` as the kernel's own spec (``Python 3 (ipykernel)``), and no
  other key than ``kernelspec`` and ``language_info``. Otherwise JupyterLab marks a notebook
  modified as soon as its kernel connects, and its autosave leaves a change in the learner's
  clone that they never made.
* **A solution's output is hidden with its code.** The code cells tagged ``solution`` are
  stored collapsed (``jupyter.source_hidden``) and with their outputs hidden
  (``jupyter.outputs_hidden``, and ``collapsed``, its older name, which JupyterLab writes
  too), so that the answer a solution prints ("Correct", a parameter count) does not show
  under the closed dropdown. The HTML book hides both inside the dropdown
  (``book/_ext/course_book.py``).
* **Links work in JupyterLab**, which follows a relative link to a file (and opens a text
  file at ``#line=N``) but knows none of Sphinx's roles. ``book/_ext/course_book.py`` turns
  each normalised link back into the role for the HTML build, so both read the same:

  - a chapter: ``{doc}`text <name>``` becomes ``[text](name.ipynb)`` (``[text](name.md)``
    for a page); jupyterlab-myst sends ``{doc}`` to ``/files/name``, a 404;
  - a glossary term: ``{term}`text <term>``` becomes ``[text](glossary.md#line=N "Glossary:
    term")``, which opens the glossary at the term's line (jupyterlab-myst links ``{term}``
    to ``#``);
  - a section of another page or chapter: ``{ref}`text <label>``` becomes ``[text](intro.md
    #line=N "Section: label")`` (``[text](name.ipynb#label ...)`` in a chapter);
  - a citation: ``[Vaswani et al. (2017)](cite:vaswani2017attention)`` becomes a link to the
    entry's line of ``references.bib``, whose title shows the work's title and key;
  - a link to the package reference, ``[`split_heads`](api:minitransformer.attention.
    split_heads)``, becomes plain code, ``split_heads``, in JupyterLab (whose file browser
    ends at ``book/``, so there is nothing to open), and the target moves to the cell's
    metadata (``minitransformer.api``), from which the HTML build links that code.

  The line numbers follow ``book/glossary.md`` and ``book/references.bib``: after a change to
  either, run this script again (the test of ``tests/test_book.py`` says so).
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
sys.path.insert(0, str(BOOK / "_ext"))
import course_book  # noqa: E402

#: The kernelspec JupyterLab stores for the course kernel (ipykernel's own kernel.json).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
#: The notebook metadata keys JupyterLab keeps; others (widget state, ...) are dropped.
METADATA_KEYS = ("kernelspec", "language_info")

# {doc}`text <target>` or {doc}`target`.
DOC_ROLE = re.compile(r"\{doc\}`(?:(?P<text>[^`<]*?)\s*<(?P<target>[^`>]+)>|(?P<bare>[^`<>]+))`")


def doc_link(match: re.Match[str], book: Path = BOOK) -> str:
    """``[text](name.ipynb)`` (or ``.md``) for one ``{doc}`` role; a role whose target is not
    a file of the book, or that has no text, is left as it is."""
    target = (match["target"] or match["bare"] or "").strip()
    text = (match["text"] or "").strip()
    for ext in (".ipynb", ".md"):
        if text and (book / f"{target}{ext}").is_file():
            return f"[{text}]({target}{ext})"
    return match[0]


# {term}`text <term>` or {term}`term`.
TERM_ROLE = re.compile(r"\{term\}`(?:(?P<text>[^`<]*?)\s*<(?P<target>[^`>]+)>|(?P<bare>[^`<>]+))`")


def glossary_lines(path: Path) -> dict[str, int]:
    """``{term, lower case: its line}`` (from 0) for every term of the ``{glossary}`` of a page."""
    lines, inside = {}, False
    for number, line in enumerate(path.read_text().splitlines()):
        if re.match(r"^(`{3,}|:{3,})\{glossary\}", line):
            inside = True
        elif inside and re.match(r"^(`{3,}|:{3,})\s*$", line):
            inside = False
        elif inside and line.strip() and not line[0].isspace() and not line.startswith(":"):
            lines.setdefault(line.strip().lower(), number)
    return lines


def bib_entries(path: Path) -> dict[str, tuple[int, str]]:
    """``{key: (its line from 0, the work's title)}`` for every entry of a BibTeX file."""
    entries = {}
    text = path.read_text()
    for match in re.finditer(r"^@\w+\{(?P<key>[^,\s]+),", text, re.M):
        line = text.count("\n", 0, match.start())
        title = re.search(r"^\s*title\s*=\s*\{(.*)\},?\s*$", text[match.end() :], re.M)
        clean = re.sub(r"[{}\\]", "", title.group(1)) if title else match["key"]
        entries[match["key"]] = (line, clean.replace('"', "'"))
    return entries


# {ref}`text <label>` (a section elsewhere: a bare {ref}`label` takes its text from the title,
# which JupyterLab cannot look up, and is left alone).
REF_ROLE = re.compile(r"\{ref\}`(?P<text>[^`<]*?)\s*<(?P<target>[^`>]+)>`")
LABEL = re.compile(r"^\((?P<label>[\w-]+)\)=\s*$", re.M)


def section_labels(book: Path) -> dict[str, tuple[str, int]]:
    """``{label: (file name, line from 0)}`` for every ``(label)=`` of the book's pages and
    notebooks (the line counts only for a page)."""
    labels: dict[str, tuple[str, int]] = {}
    for page in sorted(book.glob("*.md")):
        text = page.read_text()
        for m in LABEL.finditer(text):
            labels.setdefault(m["label"], (page.name, text.count("\n", 0, m.start())))
    for notebook in sorted(book.glob("*.ipynb")):
        for cell in nbformat.read(notebook, as_version=4).cells:
            if cell.cell_type == "markdown":
                for m in LABEL.finditer(cell.source):
                    labels.setdefault(m["label"], (notebook.name, 0))
    return labels


class Links:
    """The link targets of the book's glossary and bibliography, read once."""

    def __init__(self, book: Path = BOOK) -> None:
        self.book = book
        glossary, bib = book / "glossary.md", book / "references.bib"
        self.terms = glossary_lines(glossary) if glossary.is_file() else {}
        self.bib = bib_entries(bib) if bib.is_file() else {}
        self.labels = section_labels(book)
        self.here: set[str] = set()  # the labels of the notebook being normalised

    def ref(self, match: re.Match[str]) -> str:
        label, text = match["target"].strip(), match["text"].strip()
        if label in self.here or label not in self.labels or not text:
            return match[0]  # jupyterlab-myst resolves labels of the same notebook
        file, line = self.labels[label]
        where = f"{file}#line={line}" if file.endswith(".md") else f"{file}#{label}"
        return f'[{text}]({where} "Section: {label}")'

    def doc(self, match: re.Match[str]) -> str:
        return doc_link(match, self.book)

    def term(self, match: re.Match[str]) -> str:
        # A role that a rewrapped paragraph breaks over two lines names the same term.
        target = " ".join((match["target"] or match["bare"]).split())
        text = (match["text"] or "").strip() or target
        line = self.terms.get(target.lower())
        if line is None:
            return match[0]  # not a term of the glossary: Sphinx reports it
        return f'[{text}](glossary.md#line={line} "Glossary: {target}")'

    def citation(self, match: re.Match[str]) -> str:
        entry = self.bib.get(match["key"])
        if entry is None:
            return match[0]  # tests/test_book.py reports an unknown key
        line, title = entry
        where = f'references.bib#line={line} "{title} ({match["key"]} in references.bib)"'
        return f"[{match['text']}]({where})"

    def markdown(self, cell: nbformat.NotebookNode) -> None:
        """Normalise the links of one markdown cell, in place. Links already normalised are
        written again, so that they follow the glossary and the bibliography."""
        source = course_book.TERM_LINK.sub(
            lambda m: f"{{term}}`{m['text']} <{m['term']}>`", cell.source
        )
        source = course_book.BIB_LINK.sub(lambda m: f"[{m['text']}](cite:{m['key']})", source)
        source = course_book.REF_LINK.sub(lambda m: f"{{ref}}`{m['text']} <{m['label']}>`", source)
        source = REF_ROLE.sub(self.ref, source)
        source = DOC_ROLE.sub(self.doc, source)
        source = TERM_ROLE.sub(self.term, source)
        source = course_book.CITATION.sub(self.citation, source)
        api = course_book.api_links_in(cell)
        source = course_book.API_LINK.sub(lambda m: f"`{m['text']}`", source)
        ours = cell.metadata.setdefault(course_book.API_METADATA[0], {})
        if api:
            ours[course_book.API_METADATA[1]] = dict(sorted(api.items()))
        else:
            ours.pop(course_book.API_METADATA[1], None)
        if not ours:
            del cell.metadata[course_book.API_METADATA[0]]
        cell.source = source


def normalize(
    nb: nbformat.NotebookNode, book: Path = BOOK, links: Links | None = None
) -> nbformat.NotebookNode:
    """The normalised form of ``nb`` (a new notebook; ``nb`` is not changed)."""
    nb = copy.deepcopy(nb)
    links = links or Links(book)
    links.here = {
        m["label"]
        for cell in nb.cells
        if cell.cell_type == "markdown"
        for m in LABEL.finditer(cell.source)
    }
    metadata = {key: nb.metadata[key] for key in METADATA_KEYS if key in nb.metadata}
    metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata = nbformat.from_dict(metadata)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            links.markdown(cell)
        if cell.cell_type == "code" and "solution" in cell.metadata.get("tags", []):
            jupyter = cell.metadata.setdefault("jupyter", {})
            jupyter["source_hidden"] = True
            jupyter["outputs_hidden"] = True
            cell.metadata["collapsed"] = True
    return nb


def notebooks_of_the_toc() -> list[Path]:
    toc = (ROOT / "_toc.yml").read_text()
    names = re.findall(r"^\s*-\s*file:\s*(book/\S+)", toc, re.M)
    return [ROOT / f"{name}.ipynb" for name in names if (ROOT / f"{name}.ipynb").is_file()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if needed")
    args = parser.parse_args(argv)
    stale = []
    links: dict[Path, Links] = {}
    for path in args.notebooks or notebooks_of_the_toc():
        text = path.read_text()
        nb = nbformat.reads(text, as_version=4)
        book = path.resolve().parent
        links.setdefault(book, Links(book))
        new = nbformat.writes(normalize(nb, book, links[book])) + "\n"
        if new == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(new)
            print(f"{path}: normalised")
    if args.check and stale:
        print("not normalised (run scripts/normalize_notebooks.py): " + ", ".join(map(str, stale)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
