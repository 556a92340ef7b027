"""The book's structure: the table of contents, the intro's chapter map and the notebooks agree."""

from __future__ import annotations

import ast
import functools
import itertools
import json
import pathlib
import re
import sys

import nbformat
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOC = (ROOT / "_toc.yml").read_text()
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import course_book  # noqa: E402


def toc_files() -> list[str]:
    return re.findall(r"^\s*-\s*file:\s*book/(\S+)", TOC, re.M)


def toc_chapters() -> list[str]:
    """The chapters of the parts that hold notebooks, in reading order."""
    return [f for f in toc_files() if (ROOT / "book" / f"{f}.ipynb").exists()]


def test_every_toc_entry_exists():
    missing = [
        f
        for f in toc_files()
        if not any((ROOT / "book" / f"{f}{ext}").exists() for ext in (".ipynb", ".md"))
    ]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_notebook_is_in_the_toc():
    notebooks = {p.stem for p in (ROOT / "book").glob("*.ipynb")}
    assert notebooks <= set(toc_files()), (
        f"notebooks missing from _toc.yml: {sorted(notebooks - set(toc_files()))}"
    )


def test_intro_chapter_map_matches_toc():
    intro = (ROOT / "book" / "intro.md").read_text()
    table = intro.split("(chapter-map)=", 1)[1]
    mapped = re.findall(r"^\|\s*\d+\s*\|\s*\{doc\}`(\w+)`", table, re.M)
    assert mapped == toc_chapters(), (
        f"the intro's chapter map {mapped} differs from the notebooks of _toc.yml {toc_chapters()}"
    )


def test_notebooks_are_committed_with_outputs():
    """scripts/check_outputs.py (also the pre-commit hook): run top to bottom, outputs kept."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from check_outputs import problems

    for f in toc_chapters():
        path = ROOT / "book" / f"{f}.ipynb"
        assert not problems(path), problems(path)
        nb = json.loads(path.read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
        for c in code:
            tags = c.get("metadata", {}).get("tags", [])
            errors = [o for o in c.get("outputs", []) if o["output_type"] == "error"]
            assert not errors or "raises-exception" in tags, (
                f"book/{f}.ipynb stores an error in a cell not tagged raises-exception: "
                f"{''.join(c['source'])[:80]!r}"
            )


# -- the conventions of the chapters (CONTRIBUTING.md, "Chapters"), checked per notebook -----


def _cells(chapter: str) -> list[nbformat.NotebookNode]:
    return nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4).cells


@pytest.mark.parametrize("chapter", toc_chapters())
def test_solutions_are_one_cell_and_collapsed_code(chapter):
    """A solution is a {solution} dropdown cell, then code cells tagged `solution`, stored
    collapsed in JupyterLab with a comment as the first (the only visible) line."""
    cells = _cells(chapter)
    assert not any("{solution-start}" in c.source for c in cells), (
        f"book/{chapter}.ipynb uses {{solution-start}}: write one {{solution}} cell and tag the "
        "code cells after it `solution` (book/_ext/course_book.py gates them for the HTML)"
    )
    for i, cell in enumerate(cells):
        if cell.cell_type == "markdown" and course_book.SOLUTION_CELL.match(cell.source.strip()):
            assert ":class: dropdown" in cell.source, (
                f"book/{chapter}.ipynb cell {i}: not a dropdown"
            )
            code = cells[i + 1] if i + 1 < len(cells) else None
            is_solution_code = (
                code is not None
                and code.cell_type == "code"
                and "solution" in code.metadata.get("tags", [])
            )
            assert is_solution_code, (
                f"book/{chapter}.ipynb cell {i}: a {{solution}} cell must be followed by its code "
                "cell tagged `solution`"
            )
        if cell.cell_type == "code" and "solution" in cell.metadata.get("tags", []):
            assert cell.metadata.get("jupyter", {}).get("source_hidden"), (
                f"book/{chapter}.ipynb: solution cell not collapsed in JupyterLab: "
                f"{cell.source[:60]!r}"
            )
            assert cell.source.startswith("# "), (
                f"book/{chapter}.ipynb: a collapsed solution shows its first line; make it a "
                f"comment: {cell.source[:60]!r}"
            )


@pytest.mark.parametrize("chapter", toc_chapters())
def test_hidden_code_cells_are_collapsed_in_jupyter(chapter):
    """Cells hidden from the HTML (`remove-cell`) are collapsed in JupyterLab too, behind a
    first line that says what they are for."""
    for cell in _cells(chapter):
        if cell.cell_type == "code" and "remove-cell" in cell.metadata.get("tags", []):
            hidden = cell.metadata.get("jupyter", {}).get("source_hidden")
            assert hidden and cell.source.startswith("# "), (
                f"book/{chapter}.ipynb: a remove-cell cell must be stored collapsed "
                f"(jupyter.source_hidden) with a comment first line: {cell.source[:60]!r}"
            )


@pytest.mark.parametrize("chapter", toc_chapters())
def test_no_stored_progress_bar_widgets(chapter):
    """A stored widget view shows as raw text in an untrusted notebook: `make notebooks` drops
    them (scripts/run_notebooks.py), and a learner's run draws the live bar."""
    nb = nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4)
    assert "widgets" not in nb.metadata, f"book/{chapter}.ipynb stores widget state"
    for i, cell in enumerate(nb.cells):
        for out in cell.get("outputs", []):
            assert "application/vnd.jupyter.widget-view+json" not in out.get("data", {}), (
                f"book/{chapter}.ipynb cell {i} stores a widget view: re-record with make notebooks"
            )


@pytest.mark.parametrize("chapter", toc_chapters())
def test_figures_are_shown_by_their_cell_and_captioned_after_it(chapter):
    """Each `plotting.show(fig)` cell is followed by its caption cell (label, alt text,
    caption), and each caption cell follows such a cell; no figure goes through glue."""
    cells, labels = _cells(chapter), []
    for i, cell in enumerate(cells):
        caption = (
            course_book.parse_caption_cell(cell.source) if cell.cell_type == "markdown" else None
        )
        if cell.cell_type == "code" and "plotting.show(" in cell.source:
            after = (
                course_book.parse_caption_cell(cells[i + 1].source) if i + 1 < len(cells) else None
            )
            assert after is not None, (
                f"book/{chapter}.ipynb cell {i}: a figure needs a caption cell right after it"
            )
        if caption is not None:
            before = cells[i - 1] if i > 0 else None
            drawn = (
                before is not None
                and before.cell_type == "code"
                and "plotting.show(" in before.source
            )
            assert drawn, (
                f"book/{chapter}.ipynb cell {i}: caption {caption.get('label')} does not follow "
                "the cell that draws it"
            )
            assert caption.get("label", "").startswith("fig-"), (
                f"book/{chapter}.ipynb cell {i}: label fig-..."
            )
            alt = caption.get("alt", "")
            assert len(alt) >= 20 and "TODO" not in alt, (
                f"book/{chapter}.ipynb {caption['label']}: write an alt text"
            )
            assert caption.get("caption"), f"book/{chapter}.ipynb {caption['label']}: empty caption"
            labels.append(caption["label"])
    assert len(labels) == len(set(labels)), (
        f"book/{chapter}.ipynb: duplicate figure labels {labels}"
    )


@pytest.mark.parametrize("chapter", toc_chapters())
def test_numbers_reach_the_prose_through_inline_expressions(chapter):
    """No glue (JupyterLab cannot show it); every {eval} is a variable name with a stored value."""
    for i, cell in enumerate(_cells(chapter)):
        assert not any(word in cell.source for word in ("{glue", "myst_nb", "glue(")), (
            f"book/{chapter}.ipynb cell {i} uses glue: use {{eval}}`name` (CONTRIBUTING.md)"
        )
        if cell.cell_type == "markdown":
            expressions = course_book.expressions_in(cell.source)
            stored = [e["expression"] for e in cell.metadata.get("user_expressions", [])]
            assert stored == expressions, (
                f"book/{chapter}.ipynb cell {i}: stored values {stored} do not match the "
                f"expressions {expressions}: run `make notebooks`"
            )


# A float formatted with a precision: an f-string or format() spec such as ".2f", ".1%" or
# ".3e", printf-style "%.2f", or round(x, 2). Integers (",", "d") are exact and may bypass.
_FLOAT_FORMAT = re.compile(
    r"""\{[^{}]*?:[^{}'"]*?\.\d+[efgEG%][^{}]*\}"""  # f"{x:.2f}", "{:.1%}".format(x)
    r"""|(?<![\w.])format\([^()]*,\s*["'][^"']*\.\d+[efgEG%]"""  # format(x, ".2f")
    r"""|%[-+ 0#]*\d*\.\d+[efgEG]"""  # "%.2f" % x
    r"""|(?<![\w.])(?:np\.)?round\([^()]*,\s*\d+\)"""  # round(x, 2), np.round(x, 2)
)


@pytest.mark.parametrize("chapter", toc_chapters())
def test_printed_floats_go_through_fmt(chapter):
    """A measured float reaches an output or the prose through minitransformer.report.fmt,
    which refuses, while the notebooks are recorded, a value on a rounding edge (0.645 at two
    decimals), so that another CPU prints the same digits. Cells whose output nbval does not
    compare (nbval-ignore-output: timings, progress bars) may format as they like."""
    for i, cell in enumerate(_cells(chapter)):
        if cell.cell_type != "code" or "nbval-ignore-output" in cell.metadata.get("tags", []):
            continue
        for line in cell.source.splitlines():
            code = line.split("#", 1)[0] if "'" not in line and '"' not in line else line
            match = _FLOAT_FORMAT.search(code)
            assert match is None, (
                f"book/{chapter}.ipynb cell {i} formats a float without fmt: "
                f"{match.group(0)!r} in {line.strip()!r}. Use minitransformer.report.fmt(value, "
                f"spec) (CONTRIBUTING.md, 'Numbers in the text')."
            )


@functools.cache
def _citation_texts() -> dict[str, tuple[str, str]]:
    """The bibliography's author-year texts, parsed once (pybtex takes seconds per parse)."""
    return course_book.citation_texts(str(ROOT / "book" / "references.bib"))


@pytest.mark.parametrize("chapter", toc_chapters())
def test_citations_read_the_same_in_jupyterlab_and_html(chapter):
    """Citations are [text](cite:key) links whose text is what the HTML bibliography style
    prints for that key: "Vaswani et al. (2017)" in running text, "Vaswani et al., 2017" in
    parentheses. ({cite} roles would show as bare keys in JupyterLab.)"""
    texts = _citation_texts()
    for i, cell in enumerate(_cells(chapter)):
        if cell.cell_type != "markdown":
            continue
        assert "{cite" not in cell.source, (
            f"book/{chapter}.ipynb cell {i}: write citations as [Author et al. (Year)](cite:key) "
            "(CONTRIBUTING.md), not {cite} roles, which JupyterLab shows as bare keys"
        )
        for text, key in course_book.citations_in(cell.source):
            assert key in texts, (
                f"book/{chapter}.ipynb cell {i}: {key} is not in book/references.bib"
            )
            authors, year = texts[key]
            assert text in (f"{authors} ({year})", f"{authors}, {year}"), (
                f"book/{chapter}.ipynb cell {i}: [{text}](cite:{key}) should read "
                f"'{authors} ({year})' or '{authors}, {year}', as the bibliography prints it"
            )


@pytest.mark.parametrize("chapter", toc_chapters())
def test_api_links_name_real_objects(chapter):
    """Links to the package reference are [`text`](api:minitransformer.x.y) (shown as code in
    JupyterLab, a cross-reference in the HTML), and each names an object that exists."""
    import importlib

    for i, cell in enumerate(_cells(chapter)):
        if cell.cell_type != "markdown":
            continue
        assert "{py:" not in cell.source, (
            f"book/{chapter}.ipynb cell {i}: write [`name`](api:minitransformer.module.name) "
            "(CONTRIBUTING.md), not {py:...} roles, which JupyterLab shows as source"
        )
        for target in course_book.api_links_in(cell).values():
            parts = target.split(".")
            for cut in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
                try:
                    obj = importlib.import_module(".".join(parts[:cut]))
                except ImportError:
                    continue
                for attr in parts[cut:]:
                    assert hasattr(obj, attr), f"book/{chapter}.ipynb cell {i}: no {target}"
                    obj = getattr(obj, attr)
                break
            else:
                raise AssertionError(f"book/{chapter}.ipynb cell {i}: cannot import {target}")


sys.path.insert(0, str(ROOT / "scripts"))
import normalize_notebooks  # noqa: E402

BARE_REF = re.compile(r"\{ref\}`(?P<label>[\w-]+)`")


@pytest.mark.parametrize("chapter", toc_chapters())
def test_references_to_other_pages_carry_their_text(chapter):
    """A {ref} to a section of another page names its text, {ref}`text <label>`, which the
    normaliser turns into a link JupyterLab can follow; a bare {ref}`label` of another page is
    left as it is, and jupyterlab-myst shows it as "Cross Reference Not Found"."""
    here = {
        m["label"]
        for cell in _cells(chapter)
        if cell.cell_type == "markdown"
        for m in normalize_notebooks.LABEL.finditer(cell.source)
    }
    for i, cell in enumerate(_cells(chapter)):
        if cell.cell_type != "markdown":
            continue
        for m in BARE_REF.finditer(cell.source):
            assert m["label"] in here, (
                f"book/{chapter}.ipynb cell {i}: {m[0]} is a section of another page; write "
                f"{{ref}}`its title <{m['label']}>`, which JupyterLab can follow"
            )


@pytest.mark.parametrize("chapter", toc_chapters())
def test_notebooks_are_normalised(chapter):
    """The committed notebook is what scripts/normalize_notebooks.py makes of it: metadata as
    JupyterLab writes it (open-and-save changes nothing), solutions' outputs hidden with their
    code, links that JupyterLab can follow (at the current lines of the glossary and the
    bibliography)."""
    path = ROOT / "book" / f"{chapter}.ipynb"
    text = path.read_text()
    normalised = nbformat.writes(normalize_notebooks.normalize(nbformat.reads(text, 4))) + "\n"
    assert normalised == text, (
        f"book/{chapter}.ipynb is not normalised: run .venv/bin/python "
        f"scripts/normalize_notebooks.py book/{chapter}.ipynb"
    )


def test_normalising_rewrites_what_jupyterlab_cannot_read_and_is_idempotent():
    nb = _nb(
        nbformat.v4.new_markdown_cell(
            "See {doc}`Attention <attention>`, {term}`keys <key>`, the {term}`softmax`, "
            "{ref}`notation <notation>`, "
            "[Vaswani et al. (2017)](cite:vaswani2017attention) and "
            "[`split_heads`](api:minitransformer.attention.split_heads); `x` stays."
        ),
        nbformat.v4.new_code_cell("# Solution\nf = 1", metadata={"tags": ["solution"]}),
    )
    nb.metadata = {"kernelspec": {"name": "python3", "display_name": "Python 3"}, "widgets": {}}
    links = normalize_notebooks.Links(ROOT / "book")
    once = normalize_notebooks.normalize(nb, ROOT / "book", links)
    text = once.cells[0].source
    key, softmax = links.terms["key"], links.terms["softmax"]
    line, title = links.bib["vaswani2017attention"]
    assert text == (
        f'See [Attention](attention.ipynb), [keys](glossary.md#line={key} "Glossary: key"), '
        f'the [softmax](glossary.md#line={softmax} "Glossary: softmax"), '
        f'[notation](intro.md#line={links.labels["notation"][1]} "Section: notation"), '
        f'[Vaswani et al. (2017)](references.bib#line={line} "{title} (vaswani2017attention in '
        'references.bib)") and `split_heads`; `x` stays.'
    )
    glossary = (ROOT / "book" / "glossary.md").read_text().splitlines()
    assert glossary[key] == "key" and glossary[softmax] == "softmax"
    assert (
        "vaswani2017attention," in (ROOT / "book" / "references.bib").read_text().splitlines()[line]
    )
    assert once.cells[0].metadata["minitransformer"]["api"] == {
        "split_heads": "minitransformer.attention.split_heads"
    }
    assert once.cells[1].metadata["jupyter"] == {"source_hidden": True, "outputs_hidden": True}
    assert once.metadata == {"kernelspec": normalize_notebooks.KERNELSPEC}
    twice = normalize_notebooks.normalize(once, ROOT / "book", links)
    assert nbformat.writes(twice) == nbformat.writes(once)
    assert nb.cells[0].source.startswith("See {doc}")  # the input is left as it was


def test_the_html_reads_normalised_links_as_roles():
    nb = _nb(
        nbformat.v4.new_markdown_cell(
            'See [Attention](attention.ipynb), [keys](glossary.md#line=3 "Glossary: key"), '
            '[softmax](glossary.md#line=9 "Glossary: softmax"), '
            '[Vaswani et al. (2017)](references.bib#line=0 "Attention Is All You Need '
            '(vaswani2017attention in references.bib)") and `split_heads`, not `{doc}`x``; '
            'the [notation](intro.md#line=51 "Section: notation").',
            metadata={"minitransformer": {"api": {"split_heads": "minitransformer.attention.x"}}},
        )
    )
    course_book.convert_document_links(nb)
    course_book.convert_citations(nb)
    course_book.convert_api_links(nb)
    assert nb.cells[0].source == (
        "See {doc}`Attention <attention>`, {term}`keys <key>`, {term}`softmax`, "
        "{cite:t}`vaswani2017attention` and "
        "{py:obj}`split_heads <minitransformer.attention.x>`, not `{doc}`x``; "
        "the {ref}`notation <notation>`."
    )


# -- the HTML reader (book/_ext/course_book.py) ------------------------------------------


def _nb(*cells):
    nb = nbformat.v4.new_notebook()
    nb.cells = list(cells)
    return nb


CAPTION = (
    ":::{figure}\n:label: fig-x\n:alt: A line that rises from left to right.\n\n"
    "A caption, with $x$.\n:::"
)


def test_caption_cells_become_the_figure_of_the_cell_before():
    draw = nbformat.v4.new_code_cell("plotting.show(fig)")
    nb = _nb(draw, nbformat.v4.new_markdown_cell(CAPTION), nbformat.v4.new_markdown_cell("Prose."))
    assert course_book.attach_figure_captions(nb) == 1
    assert [c.source for c in nb.cells] == ["plotting.show(fig)", "Prose."]
    assert draw.metadata["mystnb"] == {
        "figure": {"caption": "A caption, with $x$.", "name": "fig-x"},
        "image": {"alt": "A line that rises from left to right."},
    }


def test_caption_cells_must_follow_code_and_be_complete():
    with pytest.raises(ValueError, match="must follow the code cell"):
        course_book.attach_figure_captions(
            _nb(nbformat.v4.new_markdown_cell("Prose."), nbformat.v4.new_markdown_cell(CAPTION))
        )
    no_alt = CAPTION.replace(":alt: A line that rises from left to right.\n", "")
    with pytest.raises(ValueError, match="no alt"):
        course_book.attach_figure_captions(
            _nb(nbformat.v4.new_code_cell("x"), nbformat.v4.new_markdown_cell(no_alt))
        )
    # a figure with an image is an ordinary figure, left alone
    image = ":::{figure} picture.png\n:label: fig-y\n\nCaption\n:::"
    assert course_book.parse_caption_cell(image) is None


def test_solutions_are_gated_for_the_html():
    solution = nbformat.v4.new_markdown_cell(
        "```{solution} ex-a\n:class: dropdown\n\nThe idea.\n```"
    )
    code = nbformat.v4.new_code_cell("# Solution\nf = 1", metadata={"tags": ["solution"]})
    after = nbformat.v4.new_markdown_cell("Next.")
    nb = _nb(solution, code, after)
    assert course_book.gate_solutions(nb) == 1
    sources = [c.source for c in nb.cells]
    assert sources[0] == "```{solution-start} ex-a\n:class: dropdown\n```\n\nThe idea."
    assert sources[1:] == ["# Solution\nf = 1", "```{solution-end}\n```", "Next."]
    lone = _nb(
        nbformat.v4.new_markdown_cell("```{solution} ex-b\n:class: dropdown\n\nText only.\n```")
    )
    assert course_book.gate_solutions(lone) == 0  # no code cell: an ordinary {solution}


def test_citation_links_become_roles_for_the_html():
    cell = nbformat.v4.new_markdown_cell(
        "As [Vaswani et al. (2017)](cite:vaswani2017attention) show "
        "([Kingma and Ba, 2015](cite:kingma2015adam))."
    )
    assert course_book.convert_citations(_nb(cell)) == 2
    assert cell.source == "As {cite:t}`vaswani2017attention` show ({cite:alp}`kingma2015adam`)."
    with pytest.raises(ValueError, match="Author"):
        paper = nbformat.v4.new_markdown_cell("[the paper](cite:vaswani2017attention)")
        course_book.convert_citations(_nb(paper))
    assert course_book.citation_texts(str(ROOT / "book" / "references.bib"))["muller2019label"] == (
        "Müller et al.",
        "2019",
    )  # LaTeX accents decoded, as the HTML prints them


def test_api_links_become_cross_references_for_the_html():
    cell = nbformat.v4.new_markdown_cell(
        "See [`split_heads`](api:minitransformer.attention.split_heads)."
    )
    assert course_book.convert_api_links(_nb(cell)) == 1
    assert cell.source == "See {py:obj}`split_heads <minitransformer.attention.split_heads>`."


def test_the_html_shows_the_stored_values_of_inline_expressions():
    def result(text):
        return {"data": {"text/plain": text}, "metadata": {}, "status": "ok"}

    stored = [
        {"expression": "acc_text", "result": result("'95.0 %'")},
        {"expression": "names", "result": result("'`a`, `b`'")},
        {"expression": "n", "result": result("3")},
        {"expression": "bad", "result": {"status": "error", "ename": "NameError"}},
    ]
    cell = nbformat.v4.new_markdown_cell(
        "{eval}`acc_text` of {eval}`n`: {eval}`names`, {eval}`bad`, {eval}`unknown`",
        metadata={"user_expressions": stored},
    )
    assert course_book.use_stored_expressions(_nb(cell)) == 3
    # Unknown or failed ones stay {eval}: with no kernel, the -W build fails on them.
    assert cell.source == (
        "{stored-eval}`95.0 %` of {stored-eval}`3`: {stored-eval}`` `a`, `b` ``, "
        "{eval}`bad`, {eval}`unknown`"
    )


def test_inline_expressions_are_plain_names():
    assert course_book.expressions_in("a {eval}`x1` and {eval}`_y`.") == ["x1", "_y"]
    with pytest.raises(ValueError, match="variable names"):
        course_book.expressions_in("{eval}`f'{x:.2f}'`")


def test_where_next_recap_lists_every_package_module():
    """The closing chapter's map of the package names every module, so none is forgotten."""
    nb = json.loads((ROOT / "book" / "where_next.ipynb").read_text())
    text = "".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    package = ROOT / "minitransformer"
    modules = [p.stem for p in package.glob("*.py") if not p.stem.startswith("_")]
    modules += [p.name for p in package.iterdir() if (p / "__init__.py").exists()]
    missing = [m for m in modules if f"`minitransformer.{m}`" not in text]
    assert not missing, f"book/where_next.ipynb's recap does not mention: {missing}"


def _attribute_docstrings(tree: ast.Module):
    """``(line, first docstring line)`` of each documented constant (module or class level) and
    each property: the docstrings napoleon parses as attributes."""
    bodies = [tree.body] + [n.body for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for body in bodies:
        for stmt, after in itertools.pairwise(body):
            if (
                isinstance(stmt, (ast.Assign, ast.AnnAssign))
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                yield after.lineno, after.value.value.strip().splitlines()[0]
        for stmt in body:
            if isinstance(stmt, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "property" for d in stmt.decorator_list
            ):
                doc = ast.get_docstring(stmt)
                if doc:
                    yield stmt.lineno, doc.splitlines()[0]


def test_attribute_docstrings_do_not_start_as_napoleon_types():
    """napoleon reads an attribute docstring whose first line is ``words: more`` as
    ``type: description``, and the nitpicky book build then fails on the "type" (twice so far:
    ablation.LN_WARMUP, model.ACTIVATIONS). A part before the colon that is all code literals
    is fine (it stays literal); plain words are not."""
    napoleon = pytest.importorskip("sphinx.ext.napoleon.docstring")
    config = pytest.importorskip("sphinx.ext.napoleon").Config()
    parser = napoleon.GoogleDocstring("", config)
    bad = []
    for path in sorted((ROOT / "minitransformer").rglob("*.py")):
        for line, first in _attribute_docstrings(ast.parse(path.read_text(encoding="utf-8"))):
            kind, colon, rest = parser._partition_field_on_colon(first)
            if colon and rest and re.sub(r"``[^`]*``|:\w+:`[^`]*`", "", kind).strip():
                bad.append(f"{path.relative_to(ROOT)}:{line}: {first!r}")
    assert not bad, "docstrings napoleon would read as 'type: description':\n" + "\n".join(bad)
