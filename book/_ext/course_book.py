"""How the book's notebooks are read for the HTML build (a local Sphinx extension).

A chapter shows each figure twice over, once for each kind of reader, from one source:

* the code cell that draws it ends with ``plotting.show(fig)``: the figure is that cell's
  output, visible in JupyterLab and in the HTML book;
* the markdown cell right after it holds the caption, as a MyST figure without an image::

      :::{figure}
      :label: fig-attention-weights
      :alt: A heatmap of ...

      Attention weights of ...
      :::

  JupyterLab (jupyterlab-myst) renders that as "Figure 2: Attention weights of ...", and a
  ``{numref}`fig-attention-weights``` elsewhere in the notebook resolves to "Figure 2".

Sphinx cannot render a figure without an image, so for the HTML build :func:`read_notebook`
moves each such caption into the metadata of the code cell above it (``mystnb.figure`` with the
caption and the name, ``mystnb.image.alt``), which makes myst-nb render that cell's image as a
numbered figure with its caption and alt text, and drops the caption cell. A caption cell that
does not follow a code cell is an error, so the build fails rather than losing a figure.

An exercise's solution is likewise written once for both readers: a markdown cell
``{solution} ex-label`` with ``:class: dropdown`` holding the explanation, followed by the
code cell(s) tagged ``solution`` (stored with ``jupyter.source_hidden``, so JupyterLab shows
them collapsed to their first line, a comment). For the HTML build :func:`gate_solutions`
turns that into sphinx-exercise's gated form (``{solution-start}``, the code cells,
``{solution-end}``), so that the code and its "Correct" verdict sit inside the collapsed
solution too.

Registered in ``_config.yml`` as myst-nb's reader for ``.ipynb`` files
(``nb_custom_formats``).

Numbers in the prose are inline expressions, ``{eval}`name```, where ``name`` is a variable
(a string formatted at the precision the sentence uses) set by an earlier code cell.
``scripts/run_notebooks.py`` records their values in each markdown cell's ``user_expressions``
metadata, where jupyterlab-myst shows them (and re-evaluates them when the cell is run), and
the nbval plugin in ``conftest.py`` checks them against a fresh run. The HTML book is built
from what is stored (``execute_notebooks: off``), as JupyterLab opens it: the same outputs and
the same numbers for both readers, and a build that takes a minute, not one run of every
chapter. :func:`use_stored_expressions` turns each ``{eval}`name``` into the role
``{stored-eval}`` holding the stored value, rendered as myst-nb renders an evaluated string.
:func:`expressions_in` finds them.
"""

from __future__ import annotations

import re

import nbformat
from docutils import nodes

# A colon-fenced figure directive with no argument (no image): options, a blank line, the caption.
CAPTION_CELL = re.compile(
    r"\A:::\{figure\}[ \t]*\n"  # the fence, and nothing after the directive name
    r"(?P<options>(?:[ \t]*:[\w-]+:[^\n]*\n)*)"  # :label: ..., :alt: ...
    r"[ \t]*\n?"
    r"(?P<caption>.*?)\n?"
    r":::[ \t]*\Z",
    re.S,
)
OPTION = re.compile(r"^[ \t]*:([\w-]+):[ \t]*(.*?)[ \t]*$", re.M)
# An inline expression: {eval}`name`, with a plain variable name (myst-nb's default pattern).
EVAL_ROLE = re.compile(r"\{eval\}`([^`]*)`")
NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def expressions_in(source: str) -> list[str]:
    """The inline ``{eval}`` expressions of a markdown cell, in order of appearance.

    Raises ``ValueError`` for an expression that is not a plain variable name: the HTML
    build would not evaluate it (myst-nb's ``nb_eval_name_regex``).
    """
    found = EVAL_ROLE.findall(source)
    bad = [expr for expr in found if not NAME.match(expr)]
    if bad:
        raise ValueError(f"inline expressions must be variable names, got {bad}")
    return found


def parse_caption_cell(source: str) -> dict[str, str] | None:
    """``{"label": ..., "alt": ..., "caption": ...}`` if ``source`` is a caption cell, else None."""
    match = CAPTION_CELL.match(source.strip())
    if match is None:
        return None
    fields = dict(OPTION.findall(match["options"]))
    fields["caption"] = match["caption"].strip()
    return fields


def attach_figure_captions(nb: nbformat.NotebookNode, path: str = "<notebook>") -> int:
    """Move every caption cell into the code cell before it (see the module docstring).

    Returns the number of figures attached. Raises ``ValueError`` for a caption cell without
    a code cell before it, or without a ``:label:``, a caption or an ``:alt:`` text.
    """
    cells, attached = [], 0
    for index, cell in enumerate(nb.cells):
        fields = parse_caption_cell(cell.source) if cell.cell_type == "markdown" else None
        if fields is None:
            cells.append(cell)
            continue
        where = f"{path}, cell {index}"
        missing = [key for key in ("label", "alt", "caption") if not fields.get(key)]
        if missing:
            raise ValueError(f"{where}: the figure caption cell has no {', '.join(missing)}")
        if not cells or cells[-1].cell_type != "code":
            raise ValueError(
                f"{where}: a figure caption cell must follow the code cell that "
                f"draws the figure ({fields['label']})"
            )
        mystnb = cells[-1].metadata.setdefault("mystnb", {})
        mystnb["figure"] = {"caption": fields["caption"], "name": fields["label"]}
        mystnb["image"] = {"alt": fields["alt"]}
        attached += 1
    nb.cells = cells
    return attached


SOLUTION_CELL = re.compile(
    r"\A(?P<fence>`{3,}|:{3,})\{solution\}[ \t]+(?P<label>\S+)[ \t]*\n"
    r"(?P<options>(?:[ \t]*:[\w-]+:[^\n]*\n)*)"
    r"(?P<body>.*?)\n?"
    r"(?P=fence)[ \t]*\Z",
    re.S,
)


def gate_solutions(nb: nbformat.NotebookNode, path: str = "<notebook>") -> int:
    """Wrap each ``{solution}`` cell and the ``solution``-tagged code cells after it into one
    gated solution (see the module docstring). Returns the number of solutions gated."""
    cells, gated, index = [], 0, 0
    while index < len(nb.cells):
        cell = nb.cells[index]
        match = SOLUTION_CELL.match(cell.source.strip()) if cell.cell_type == "markdown" else None
        following = index + 1
        while (
            following < len(nb.cells)
            and nb.cells[following].cell_type == "code"
            and "solution" in nb.cells[following].metadata.get("tags", [])
        ):
            following += 1
        if match is None or following == index + 1:
            cells.append(cell)
            index += 1
            continue
        start = nbformat.v4.new_markdown_cell(
            f"```{{solution-start}} {match['label']}\n{match['options']}```\n{match['body']}"
        )
        end = nbformat.v4.new_markdown_cell("```{solution-end}\n```")
        cells += [start, *nb.cells[index + 1 : following], end]
        gated += 1
        index = following
    nb.cells = cells
    return gated


CITATION = re.compile(r"\[(?P<text>[^\]\n]+)\]\(cite:(?P<key>[^)\s]+)\)")
# The form scripts/normalize_notebooks.py gives a citation, which JupyterLab can follow: a link
# to the entry's line of references.bib (it opens the file there), its title the work's title
# and key: [Vaswani et al. (2017)](references.bib#line=0 "Attention Is All You Need
# (vaswani2017attention in references.bib)").
BIB_LINK = re.compile(
    r"\[(?P<text>[^\]\n]+)\]\(references\.bib#line=\d+ "
    r'"(?:[^"\n]*?)\((?P<key>[^()\s]+) in references\.bib\)"\)'
)
TEXTUAL = re.compile(r".+ \(\d{4}[a-z]?\)")  # Vaswani et al. (2017)
PARENTHETICAL = re.compile(r".+, \d{4}[a-z]?")  # Vaswani et al., 2017


def citation_role(text: str, key: str) -> str:
    """The role for one citation link: ``{cite:t}`` for "Author (Year)", ``{cite:alp}`` (no
    parentheses) for "Author, Year". Raises ``ValueError`` for any other text."""
    if TEXTUAL.fullmatch(text):
        return f"{{cite:t}}`{key}`"
    if PARENTHETICAL.fullmatch(text):
        return f"{{cite:alp}}`{key}`"
    raise ValueError(f"citation [{text}](cite:{key}): write 'Author (Year)' or 'Author, Year'")


def citation_texts(bib_path: str) -> dict[str, tuple[str, str]]:
    """``{key: (authors, year)}`` for every entry of a BibTeX file, as the author–year style of
    the HTML book writes them: "Kingma and Ba" for two authors, "Vaswani et al." for more."""
    from pybtex.database import parse_file  # installed with sphinxcontrib-bibtex
    from pybtex.richtext import Text

    texts = {}
    for key, entry in parse_file(bib_path).entries.items():
        people = entry.persons.get("author") or entry.persons.get("editor") or []
        names = [
            Text.from_latex(" ".join(p.prelast_names + p.last_names)).render_as("text")
            for p in people
        ]
        if not names:
            authors = entry.fields.get("organization", entry.fields.get("title", key))
        elif len(names) == 1:
            authors = names[0]
        elif len(names) == 2:
            authors = f"{names[0]} and {names[1]}"
        else:
            authors = f"{names[0]} et al."
        texts[key] = (authors, entry.fields.get("year", ""))
    return texts


def citations_in(source: str) -> list[tuple[str, str]]:
    """``(text, key)`` of every citation link of a markdown cell, in either form."""
    return [(m["text"], m["key"]) for rx in (CITATION, BIB_LINK) for m in rx.finditer(source)]


def convert_citations(nb: nbformat.NotebookNode) -> int:
    """Turn every ``[text](cite:key)`` (or its normalised form, a link into references.bib) of
    the markdown cells into a citation role (module docstring). Returns the number converted."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type == "markdown" and (
            "](cite:" in cell.source or "references.bib" in cell.source
        ):
            for rx in (CITATION, BIB_LINK):
                cell.source, n = rx.subn(lambda m: citation_role(m["text"], m["key"]), cell.source)
                count += n
    return count


API_LINK = re.compile(r"\[`(?P<text>[^`\]\n]+)`\]\(api:(?P<target>[\w.]+)\)")
# Where scripts/normalize_notebooks.py keeps a markdown cell's links to the package reference:
# the cell shows plain code (JupyterLab has nowhere to send the link), and its metadata maps
# each code text to its target, {"minitransformer": {"api": {"split_heads": "minitransformer.
# attention.split_heads"}}}.
API_METADATA = ("minitransformer", "api")
# Inline code: not part of a longer run of backticks, nor a role's content (`{doc}`x``).
INLINE_CODE = re.compile(r"(?<![}`\w])`(?P<text>[^`\n]+)`(?![`\w])")


def api_links_in(cell: nbformat.NotebookNode) -> dict[str, str]:
    """``{code text: dotted target}`` of a markdown cell's links to the package reference, in
    either form (links in the text, or the cell's metadata)."""
    links = dict(cell.metadata.get(API_METADATA[0], {}).get(API_METADATA[1], {}))
    links.update((m["text"], m["target"]) for m in API_LINK.finditer(cell.source))
    return links


def convert_api_links(nb: nbformat.NotebookNode) -> int:
    """Turn every ``[`text`](api:dotted.name)`` of the markdown cells, and every inline code
    that the cell's metadata links (:data:`API_METADATA`), into a ``{py:obj}`` cross-reference
    with that text (module docstring). Returns the number converted."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        if "](api:" in cell.source:
            cell.source, n = API_LINK.subn(
                lambda m: f"{{py:obj}}`{m['text']} <{m['target']}>`", cell.source
            )
            count += n
        linked = cell.metadata.get(API_METADATA[0], {}).get(API_METADATA[1], {})
        if linked:

            def role(m: re.Match[str], linked: dict = linked) -> str:
                target = linked.get(m["text"])
                return f"{{py:obj}}`{m['text']} <{target}>`" if target else m[0]

            cell.source, n = INLINE_CODE.subn(role, cell.source)
            count += n
    return count


# The normalised forms of links to other documents (scripts/normalize_notebooks.py), which
# JupyterLab can follow: [text](attention.ipynb) for a chapter, [text](glossary.md#line=12
# "Glossary: term") for a glossary term (JupyterLab opens the glossary at its line), [text](
# intro.md#line=40 "Section: notation") for a section of another document.
DOC_LINK = re.compile(r"\[(?P<text>[^\]\n]+)\]\((?P<target>[\w-]+)\.(?:ipynb|md)\)")
TERM_LINK = re.compile(
    r'\[(?P<text>[^\]\n]+)\]\(glossary\.md#line=\d+ "Glossary: (?P<term>[^"\n]+)"\)'
)


REF_LINK = re.compile(
    r'\[(?P<text>[^\]\n]+)\]\([\w-]+\.(?:ipynb|md)#[^\s)]+ "Section: (?P<label>[^"\n]+)"\)'
)


def convert_document_links(nb: nbformat.NotebookNode) -> int:
    """Turn the normalised links to chapters and glossary terms back into ``{doc}`` and
    ``{term}`` roles, which Sphinx resolves and checks. Returns the number converted."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        cell.source, n = TERM_LINK.subn(
            lambda m: (
                f"{{term}}`{m['text']}`"
                if m["text"] == m["term"]
                else f"{{term}}`{m['text']} <{m['term']}>`"
            ),
            cell.source,
        )
        count += n
        cell.source, n = REF_LINK.subn(
            lambda m: f"{{ref}}`{m['text']} <{m['label']}>`", cell.source
        )
        count += n
        cell.source, n = DOC_LINK.subn(
            lambda m: f"{{doc}}`{m['text']} <{m['target']}>`", cell.source
        )
        count += n
    return count


# A Python string's repr, whose quotes myst-nb strips from an evaluated text/plain value.
QUOTED = re.compile(r"""^(".*"|'.*')$""", re.S)


def stored_value(result: dict) -> str | None:
    """The text an inline expression's stored result shows (its ``text/plain``, a string's
    quotes stripped, as myst-nb's ``{eval}`` shows it), or None if nothing usable is stored."""
    text = result.get("data", {}).get("text/plain")
    if result.get("status") != "ok" or not isinstance(text, str):
        return None
    return text[1:-1] if QUOTED.match(text) else text


def use_stored_expressions(nb: nbformat.NotebookNode) -> int:
    """Replace each ``{eval}`name``` of a markdown cell by ``{stored-eval}`value```, the value
    recorded in the cell's ``user_expressions``, delimited by more backticks than it holds.
    An expression with no stored value is left as it is: myst-nb, with no kernel, warns, and
    the ``-W`` build fails until the chapter is recorded. Returns the number replaced."""
    count = 0
    for cell in nb.cells:
        if cell.cell_type != "markdown" or "{eval}" not in cell.source:
            continue
        stored = {
            item.get("expression"): stored_value(item.get("result", {}))
            for item in cell.metadata.get("user_expressions", [])
        }

        def role(m: re.Match[str], stored: dict = stored) -> str:
            nonlocal count
            value = stored.get(m[1])
            if value is None:
                return m[0]
            count += 1
            fence = "`" * (max((len(run) for run in re.findall("`+", value)), default=0) + 1)
            pad = " " if value.startswith("`") or value.endswith("`") else ""
            return f"{{stored-eval}}{fence}{pad}{value}{pad}{fence}"

        cell.source = EVAL_ROLE.sub(role, cell.source)
    return count


def stored_eval_role(name, rawtext, text, lineno, inliner, options=None, content=None):
    """``{stored-eval}`value```: the value as myst-nb renders an evaluated ``text/plain``."""
    return [nodes.inline(rawtext, text, classes=["output", "text_plain"])], []


def read_notebook(text: str, path: str = "<notebook>") -> nbformat.NotebookNode:
    """myst-nb's reader for the book's ``.ipynb`` files: nbformat, then the inline expressions
    given their stored values, the captions moved, the solutions gated, and the citations and
    API links turned into roles."""
    nb = nbformat.reads(text, as_version=4)
    use_stored_expressions(nb)  # first: a caption cell's values go with it into a figure
    attach_figure_captions(nb, path)
    gate_solutions(nb, path)
    convert_document_links(nb)
    convert_citations(nb)
    convert_api_links(nb)
    return nb


def setup(app):
    """The ``{stored-eval}`` role; the reader itself is named in ``nb_custom_formats``."""
    app.add_role("stored-eval", stored_eval_role)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
