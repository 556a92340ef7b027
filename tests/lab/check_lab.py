#!/usr/bin/env python3
"""Browser check of the learner's notebooks: every chapter opened in JupyterLab, offline.

Usage (from the repository root; `make check-lab` runs exactly this):

    .venv/bin/python tests/lab/check_lab.py --jobs 2 --screenshots _build/lab-screenshots

The script copies `book/` to a temporary folder (so that nothing it runs or types can be saved
over the committed notebooks), starts JupyterLab from this virtual environment on 127.0.0.1 (a
free port, a random token, its own settings, workspace, config and runtime folders, no news, no
update check, `--allow-root` when run as root), and opens each chapter of `_toc.yml` that is a
notebook in the system Chromium (`/usr/bin/chromium`) through Playwright, aborting every request
that does not go to that server. JupyterLab's windowing is set to "none", so that every cell is
laid out and can be measured (its default, "contentVisibility", only skips painting the cells
out of view; what a cell shows is the same), and `window.jupyterapp` is exposed so that the
check can read each cell's tags and outputs and the kernel's state.

What a chapter must contain is read from the notebook itself: its figure caption cells (and
the `{glue:figure}` directives of a chapter not yet converted), inline expressions with their
stored values, `{exercise}` titles, `{solution}` cells, cells tagged `solution`,
`raises-exception` and `allow-stderr`. For each chapter, once as committed (before running) and
once after Run All Cells (through the Run menu; the check waits until the kernel is idle and
every code cell has run, and reports the run time), it asserts:

* the output areas show as many images as the notebook has figures, each caption cell comes
  right after a cell that shows its image and renders as "Figure N: ...";
* no raw markup is visible: `{glue`, `{term}`, `{eval}`, `{numref}`, `{doc}`, `{ref}`, `{cite}`,
  `{py:`, `{prf:`, `:label:`, `:class:`, jupyterlab-myst's "Unknown Directive"/"Unknown Role"
  boxes, or a reference or citation it marks as not found (in yellow); no role left as its
  source text (a `{glue:text}`name:.2f`` shown as "name:.2f", a `{py:func}`~x.y`` as "~x.y");
* every inline expression shows its stored value (not `<code>name</code>`);
* every exercise title shows as "Exercise N (Title)"; every `{solution}` dropdown is closed, and
  every code cell tagged `solution` is collapsed to its first line, a comment (so is every
  code cell of a `{solution-start}` ... `{solution-end}` block, the older form);
* no error output outside cells tagged `raises-exception`, and each such cell shows its error;
  no output shows a machine path (`/work/`, `/home/`, `/tmp/`, `site-packages`, `.venv`);
  no stderr box (JupyterLab's pink one) except in cells tagged `allow-stderr`; progress bars
  are widgets (a progress element), not text in stderr;
* no page or console error, except the short, explained list KNOWN_BENIGN below.

Before Run All it also asserts that the notebook, opened with its kernel connected, is not
marked modified and that saving it (File > Save) writes exactly the committed file, so that
a learner's autosave changes nothing in git; that every stored solution's output is hidden
with its code; and that no link of a rendered cell leads nowhere (a `cite:` or `api:`
address, or `#`). Once per run it clicks one link of each kind (LINK_KINDS: a chapter, a
section of another document, a glossary term, a citation), each in a fresh tab of the first
chapter that has one, and asserts that JupyterLab opens its target (a text file at the
line of its fragment).

After the run of the warm-up it types a wrong answer into the softmax exercise's stub (the
textbook softmax, without the subtraction of the maximum), runs the stub and its checker, and
asserts that the checker's whole hint (the message the package's checker gives for that
answer, computed here) is shown and not clipped: its text is nowhere wider than its box.

Screenshots: JupyterLab scrolls inside the notebook panel, not the page, so a full-page
screenshot would show one screen. The window is a tall 1280 x 2400 px, and the notebook panel
is scrolled a panel's height at a time, one screenshot each:
SCREENSHOTS/<chapter>-before-01.png, ...-after-01.png, ..., and <chapter>-hint.png for the hint.

With `--jobs N` it runs N such JupyterLabs and browsers at once, in processes of their own, each
with every N-th chapter; the book-wide checks below see all their findings.

It prints one line per chapter, then every failure, and exits 1 if anything failed (2 for a
usage problem: no Chromium, no toc, JupyterLab does not start). A check that finds nothing to
check fails: the whole book must have at least one figure, inline expression, exercise and
solution (see --min-*).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import nbformat

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "html"))
sys.path.insert(0, str(ROOT / "book" / "_ext"))
from check_html import (  # noqa: E402
    CHROMIUM_ARGS,
    JS_BOX_HELPERS,
    PageResult,
    empty_folder,
    find_chromium,
    local_only,
    machine_path_line,
    read_toc,
    report,
)
from course_book import EVAL_ROLE, SOLUTION_CELL, parse_caption_cell  # noqa: E402

VIEWPORT = {"width": 1280, "height": 2400}
# Markup that must never be visible as text in a rendered markdown cell.
RAW_MARKUP = [
    "{glue",
    "{term}",
    "{eval}",
    "{numref}",
    "{doc}",
    "{ref}",
    "{cite",
    "{py:",
    "{prf:",
    ":label:",
    ":class:",
    "Unknown Directive",
    "Unknown Role",
]
ROLE = re.compile(r"\{([\w:.-]+)\}`([^`]*)`")
EXERCISE = re.compile(r"^(`{3,}|:{3,})\{exercise\}[ \t]*(?P<title>[^\n]*)$", re.M)
GLUE_FIGURE = re.compile(r"^(`{3,}|:{3,})\{glue:figure\}", re.M)
# sphinx-exercise's gated solution, the form of the chapters not yet converted: the cells
# between the two markers are the solution (its code too).
SOLUTION_START = re.compile(r"^(`{3,}|:{3,})\{solution-start\}", re.M)
SOLUTION_END = re.compile(r"^(`{3,}|:{3,})\{solution-end\}", re.M)
TQDM_TEXT = re.compile(r"\d+%\|")  # a tqdm bar printed as text: " 40%|████      | 4/10"
# Messages of the page that change nothing a learner sees. Keep this list short and explained.
KNOWN_BENIGN = [
    # jupyterlab-myst resolves references only within the notebook: a {term} (the glossary) or a
    # {ref} to another chapter logs this, once per rendering, and shows its text as a plain link
    # (the HTML book links it). A reference it cannot resolve that a reader would notice is
    # shown in yellow, which the cell checks report.
    (
        re.compile(r"^Cross reference target was not found: "),
        "jupyterlab-myst: references to other documents",
    ),
]

# The exercise that is tried with a wrong answer: (chapter, how its stub starts, the answer).
TRIAL_CHAPTER = "book/warmup"
TRIAL_STUB = "def softmax("
TRIAL_ANSWER = (
    "def softmax(x, dim=-1):\n    return torch.exp(x) / torch.exp(x).sum(dim=dim, keepdim=True)\n"
)

# --------------------------------------------------------------------------------------
# JavaScript run in the page (window.jupyterapp: LabApp.expose_app_in_browser).

JS_NOTEBOOK = "const panel = window.jupyterapp.shell.currentWidget, nb = panel.content;"

JS_LOADED = """(n) => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.content.widgets) return false;
  if (panel.content.widgets.length !== n) return false;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  const md = panel.content.widgets.filter(c => c.model.type === 'markdown');
  return !!kernel && kernel.status === 'idle'
    && md.every(c => c.rendered && c.node.querySelector('.myst, .jp-MarkdownOutput'));
}"""

JS_DIALOG = """() => Array.from(document.querySelectorAll('.jp-Dialog'))
  .map(d => d.innerText.slice(0, 200))"""

# Count the kernel's execute_input and error messages from now on (listening once per page).
JS_WATCH_KERNEL = (
    """() => {"""
    + JS_NOTEBOOK
    + """
  const kernel = panel.sessionContext.session.kernel;
  const listening = !!window.__labcheck;
  window.__labcheck = {inputs: 0, errors: 0, last: Date.now()};
  if (listening) return;
  kernel.iopubMessage.connect((_, msg) => {
    const t = msg.header.msg_type;
    if (t === 'execute_input') window.__labcheck.inputs++;
    if (t === 'error') window.__labcheck.errors++;
    window.__labcheck.last = Date.now();
  });
  kernel.statusChanged.connect(() => { window.__labcheck.last = Date.now(); });
}"""
)

JS_RUN_STATE = (
    """() => {"""
    + JS_NOTEBOOK
    + """
  const w = window.__labcheck;
  return {inputs: w.inputs, errors: w.errors, idle_ms: Date.now() - w.last,
          status: panel.sessionContext.session.kernel.status};
}"""
)

JS_SCROLLER = """() => document.querySelector(
  '.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer')"""

JS_SCROLL_TO = """(top) => {
  const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
  s.scrollTop = top;
  return {top: s.scrollTop, height: s.clientHeight, total: s.scrollHeight};
}"""

# What each cell shows: one plain object per cell, in notebook order.
JS_CELLS = (
    """() => {"""
    + JS_NOTEBOOK
    + JS_BOX_HELPERS
    + """
  const vis = el => !!el && el.checkVisibility({visibilityProperty: true, opacityProperty: true})
                    && el.getBoundingClientRect().height > 0;
  return nb.widgets.map((cell, index) => {
    const m = cell.model, node = cell.node;
    const info = {index, type: m.type, tags: m.getMetadata('tags') || [],
                  source: m.sharedModel.getSource()};
    if (m.type === 'markdown') {
      const out = node.querySelector('.myst, .jp-MarkdownOutput');
      info.rendered = !!cell.rendered && vis(out);
      info.text = out ? out.innerText : '';
      info.codes = out ? Array.from(out.querySelectorAll('code')).map(c => c.textContent) : [];
      info.captions = out
        ? Array.from(out.querySelectorAll('figure figcaption')).map(f => f.innerText) : [];
      info.details = out ? Array.from(out.querySelectorAll('details')).map(d => ({
          open: d.open, summary: (d.querySelector('summary') || d).innerText.slice(0, 80),
          body_shown: Array.from(d.children).some(c => c.tagName !== 'SUMMARY' && vis(c))})) : [];
      // jupyterlab-myst's marks for what it cannot resolve: "Cross Reference Not Found",
      // "Citation Not Found" (the key shown in yellow).
      info.not_found = out ? Array.from(out.querySelectorAll('[title$="Not Found"]'))
                                  .map(e => `${e.title}: ${e.innerText.slice(0, 60)}`) : [];
      info.links = out ? Array.from(out.querySelectorAll('a')).map((a, n) => ({
          n, href: a.getAttribute('href') || '', text: a.innerText.trim().slice(0, 60),
          title: a.title || '', code: !!a.querySelector('code')})) : [];
    } else if (m.type === 'code') {
      const placeholder = node.querySelector('.jp-InputPlaceholder');
      info.input_collapsed = vis(placeholder) && !vis(node.querySelector('.jp-InputArea-editor'));
      info.placeholder = placeholder ? placeholder.innerText.trim() : '';
      const area = node.querySelector('.jp-Cell-outputWrapper');
      info.outputs_shown = !!area && vis(area)
          && Array.from(area.querySelectorAll('.jp-OutputArea-output')).some(vis);
      info.outputs = [];
      const children = cell.outputArea ? cell.outputArea.widgets : [];
      for (let j = 0; j < m.outputs.length; j++) {
        const o = m.outputs.get(j).toJSON();
        const child = children[j] ? children[j].node : null;
        const shown = child ? child.querySelector('.jp-OutputArea-output') : null;
        const pre = shown ? shown.querySelector('pre') : null;
        info.outputs.push({
          type: o.output_type, name: o.name || '', ename: o.ename || '',
          mimes: Object.keys(o.data || {}),
          mime: shown ? shown.getAttribute('data-mime-type') || '' : '',
          text: shown ? shown.innerText : '',
          visible: vis(shown),
          images: shown ? Array.from(shown.querySelectorAll('img'))
                             .filter(i => i.complete && i.naturalWidth > 0 && vis(i)).length : 0,
          progress: shown ? shown.querySelectorAll(
            'progress, .widget-hprogress, .widget-vprogress, [role="progressbar"]').length : 0,
          overflow: pre ? Math.max(0, pre.scrollWidth - pre.clientWidth) : 0,
          cut: pre ? cutBy(pre) : null,
        });
      }
    }
    return info;
  });
}"""
)

JS_CELL_NODE_TOP = (
    """(i) => {"""
    + JS_NOTEBOOK
    + """
  const s = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-WindowedPanel-outer');
  const node = nb.widgets[i].node;
  return node.getBoundingClientRect().top - s.getBoundingClientRect().top + s.scrollTop;
}"""
)

JS_SOURCE = (
    """(i) => {""" + JS_NOTEBOOK + """ return nb.widgets[i].model.sharedModel.getSource(); }"""
)

JS_DIRTY = """() => { """ + JS_NOTEBOOK + """ return panel.context.model.dirty; }"""

JS_SAVE = """async () => {
  await window.jupyterapp.commands.execute('docmanager:save');
  return true;
}"""

# Click link `n` of markdown cell `i`; JupyterLab opens its target in a new tab.
JS_LINK_NODE = (
    """([i, n]) => {"""
    + JS_NOTEBOOK
    + """ return nb.widgets[i].node.querySelectorAll('.myst a, .jp-MarkdownOutput a')[n]; }"""
)

# The tab JupyterLab shows now: its file and, for a text editor, the cursor's line.
JS_CURRENT = """() => {
  const w = window.jupyterapp.shell.currentWidget;
  if (!w || !w.context) return null;
  const editor = w.content && w.content.editor;
  return {path: w.context.path, id: w.id,
          line: editor && editor.getCursorPosition ? editor.getCursorPosition().line : null};
}"""

# What a link of a rendered markdown cell points to, by the kind of link it should be.
LINK_KINDS = {
    "chapter": re.compile(r"^[\w-]+\.ipynb$"),
    "section": re.compile(r"^(?!glossary\.md)[\w-]+\.(md#line=\d+|ipynb#[\w-]+)$"),
    "glossary": re.compile(r"^glossary\.md#line=\d+$"),
    "citation": re.compile(r"^references\.bib#line=\d+$"),
}
# Links that JupyterLab cannot follow: a Sphinx role's address, or nowhere.
DEAD_LINK = re.compile(r"^(cite:|api:|#$|$)")


# --------------------------------------------------------------------------------------
# What a chapter must show, read from the notebook.


@dataclass
class Figure:
    cell: int  # the caption cell
    label: str
    caption: str


@dataclass
class Expectations:
    n_cells: int
    n_code: int  # code cells JupyterLab sends to the kernel (not empty)
    figures: list[Figure] = field(default_factory=list)
    glue_figures: int = 0  # {glue:figure} directives: figures JupyterLab cannot show
    values: dict[int, list[tuple[str, str | None]]] = field(
        default_factory=dict
    )  # cell -> (name, value)
    exercises: list[str] = field(default_factory=list)  # titles, in order
    solutions: list[int] = field(default_factory=list)  # {solution} (or {solution-start}) cells
    solution_code: list[int] = field(default_factory=list)  # code cells of a solution
    raises: list[int] = field(default_factory=list)  # code cells tagged raises-exception
    roles: dict[int, list[tuple[str, str]]] = field(default_factory=dict)  # cell -> (role, content)


def stored_value(cell, name: str) -> str | None:
    """The value of inline expression `name` stored in the cell (what JupyterLab shows)."""
    for entry in cell.metadata.get("user_expressions", []):
        if entry.get("expression") == name and entry.get("result", {}).get("status") == "ok":
            text = entry["result"].get("data", {}).get("text/plain")
            try:
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError):
                return text
            return value if isinstance(value, str) else text
    return None


def expectations(path: Path) -> Expectations:
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    exp = Expectations(n_cells=len(nb.cells), n_code=sum(1 for c in code if c.source.strip()))
    gated = False  # inside a {solution-start} ... {solution-end}
    for i, cell in enumerate(nb.cells):
        tags = cell.metadata.get("tags", [])
        if cell.cell_type == "code":
            if "solution" in tags or gated:
                exp.solution_code.append(i)
            if "raises-exception" in tags:
                exp.raises.append(i)
            continue
        if cell.cell_type != "markdown":
            continue
        source = cell.source
        fields = parse_caption_cell(source)
        if fields is not None:
            exp.figures.append(Figure(i, fields.get("label", ""), fields.get("caption", "")))
        exp.glue_figures += len(GLUE_FIGURE.findall(source))
        names = EVAL_ROLE.findall(source)
        if names:
            exp.values[i] = [(name, stored_value(cell, name)) for name in names]
        exp.exercises += [m["title"].strip() for m in EXERCISE.finditer(source)]
        if SOLUTION_CELL.match(source.strip()) or SOLUTION_START.search(source):
            exp.solutions.append(i)
        if SOLUTION_START.search(source) or SOLUTION_END.search(source):
            gated = bool(SOLUTION_START.search(source)) and not SOLUTION_END.search(source)
        roles = [(r, c) for r, c in ROLE.findall(source) if r.startswith(("glue", "py:"))]
        if roles:
            exp.roles[i] = roles
    return exp


def plain(text: str) -> str:
    """Text as compared: no emphasis or code marks, straight quotes, spaces collapsed."""
    text = re.sub(r"[`*_]", "", text).translate(
        str.maketrans("\u2018\u2019\u201c\u201d\xa0", "''\"\" ")
    )
    return re.sub(r"\s+", " ", text).strip()


# --------------------------------------------------------------------------------------
# The checks of one state of a chapter ("before" or "after" Run All).


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:120]


def check_cells(cells: list[dict], exp: Expectations, res: PageResult, state: str) -> None:
    """The assertions of the module docstring on JS_CELLS's answer."""
    at = f"{state}: "
    by_index = {c["index"]: c for c in cells}
    if len(cells) != exp.n_cells:
        res.fail(f"{at}JupyterLab shows {len(cells)} cells, the notebook has {exp.n_cells}")
        return

    # Figures.
    images = sum(o["images"] for c in cells if c["type"] == "code" for o in c["outputs"])
    n_figures = len(exp.figures) + exp.glue_figures
    res.stats[f"images_{state}"] = images
    if images != n_figures:
        what = (
            f" ({exp.glue_figures} of them {{glue:figure}} directives,"
            " which JupyterLab cannot show)"
            if exp.glue_figures
            else ""
        )
        res.fail(f"{at}{images} images in the outputs, but {n_figures} figures{what}")
    for number, fig in enumerate(exp.figures, start=1):
        above = next(
            (by_index[j] for j in range(fig.cell - 1, -1, -1) if by_index[j]["type"] == "code"),
            None,
        )
        if (
            above is None
            or above["index"] != fig.cell - 1
            or not any(o["images"] for o in above["outputs"])
        ):
            res.fail(f"{at}figure {fig.label}: the cell above its caption shows no image")
        caption = by_index[fig.cell]["captions"]
        if (
            not caption
            or not caption[0].replace("\xa0", " ").startswith(f"Figure {number}:")
            or len(caption[0].split(":", 1)[1].strip()) < 3
        ):
            res.fail(
                f"{at}figure {fig.label}: the caption cell does not render as "
                f"'Figure {number}: ...' "
                f"(shows {caption[0][:60] if caption else 'no caption'!r})"
            )

    # Markdown: rendered, no raw markup, roles, inline expressions, exercises, solutions.
    raw, not_rendered, not_found, role_src = [], [], [], []
    for c in cells:
        if c["type"] != "markdown":
            continue
        if not c["rendered"]:
            not_rendered.append(f"cell {c['index']}: {first_line(c['source'])}")
            continue
        text = c["text"].replace("\xa0", " ")
        for marker in RAW_MARKUP:
            at_marker = text.find(marker)
            if at_marker >= 0:
                raw.append(
                    f"cell {c['index']}: {marker!r} in "
                    f"...{text[max(0, at_marker - 40) : at_marker + 60]!r}"
                )
        not_found += [f"cell {c['index']}: {t}" for t in c["not_found"]]
        for role, content in exp.roles.get(c["index"], []):
            shown = content.strip()
            raw_form = (
                role.startswith("glue") or shown.startswith("~") or re.search(r"<[^>]+>$", shown)
            )
            if raw_form and shown in text:
                role_src.append(f"cell {c['index']}: {{{role}}} shows its source text {shown!r}")
        for name, value in exp.values.get(c["index"], []):
            if value is None:
                res.fail(
                    f"{at}cell {c['index']}: inline expression {name!r} has no stored value "
                    "(run make notebooks)"
                )
            elif name in c["codes"]:
                res.fail(
                    f"{at}cell {c['index']}: inline expression {name!r} shown as its name, "
                    "not its value"
                )
            elif value not in text:
                res.fail(
                    f"{at}cell {c['index']}: inline expression {name!r} does not show {value!r}"
                )
        for d in c["details"]:
            if d["open"] or d["body_shown"]:
                res.fail(
                    f"{at}cell {c['index']}: a dropdown ({d['summary']!r}) is open when it should "
                    "be collapsed"
                )
    for items, what in [
        (not_rendered, "markdown cells not rendered"),
        (raw, "places show raw markup"),
        (
            not_found,
            "references or citations that jupyterlab-myst cannot resolve (shown in yellow)",
        ),
        (role_src, "roles shown as source text"),
    ]:
        if items:
            res.fail(f"{at}{len(items)} {what}", items)
    all_text = plain(" ".join(c.get("text", "") for c in cells))
    for number, title in enumerate(exp.exercises, start=1):
        if f"Exercise {number} ({plain(title)})" not in all_text:
            res.fail(f"{at}the exercise title 'Exercise {number} ({plain(title)})' is not shown")
    for i in exp.solutions:
        if not by_index[i].get("details"):
            res.fail(f"{at}cell {i}: the solution does not render as a dropdown")
    dead = [
        f"cell {c['index']}: [{link['text']}]({link['href'] or 'nowhere'})"
        for c in cells
        if c["type"] == "markdown"
        for link in c.get("links", [])
        if DEAD_LINK.match(link["href"])
    ]
    if dead:
        res.fail(
            f"{at}{len(dead)} links lead nowhere in JupyterLab (run "
            "scripts/normalize_notebooks.py)",
            dead,
        )
    # As stored. (Running a cell shows its new output: after Run All, a solution's verdict
    # shows under its collapsed code.)
    for i in exp.solution_code if state == "before" else []:
        if by_index[i].get("outputs_shown"):
            res.fail(
                f"{at}cell {i}: the solution's output shows under the closed solution (store "
                "it with jupyter.outputs_hidden: scripts/normalize_notebooks.py)"
            )
    for i in exp.solution_code:
        c = by_index[i]
        line = first_line(c["source"])
        if not c["input_collapsed"]:
            res.fail(
                f"{at}cell {i}: the solution's code is not collapsed (store it with "
                "jupyter.source_hidden)"
            )
        elif not line.startswith("#") or c["placeholder"] != line:
            res.fail(
                f"{at}cell {i}: the collapsed solution shows {c['placeholder']!r}, not its "
                "first line as a comment"
            )

    # Outputs: errors, stderr, progress bars.
    unexpected, stderr, bars, widgets, paths = [], [], [], [], []
    for c in cells:
        if c["type"] != "code":
            continue
        tags = c["tags"]
        errors = [o for o in c["outputs"] if o["type"] == "error"]
        if errors and "raises-exception" not in tags:
            unexpected += [
                f"cell {c['index']}: {first_line(o['text']) or o['ename']}" for o in errors
            ]
        if "raises-exception" in tags and not any(o["visible"] for o in errors):
            res.fail(f"{at}cell {c['index']} is tagged raises-exception but shows no error")
        for o in c["outputs"]:
            line = machine_path_line(o["text"])
            if line:
                paths.append(f"cell {c['index']}: {line}")
            if o["type"] == "stream" and o["name"] == "stderr":
                if TQDM_TEXT.search(o["text"]):
                    bars.append(f"cell {c['index']}: {first_line(o['text'])}")
                elif "allow-stderr" not in tags:
                    stderr.append(f"cell {c['index']}: {first_line(o['text'])}")
            if "application/vnd.jupyter.widget-view+json" in o["mimes"] and not o["progress"]:
                widgets.append(f"cell {c['index']}: {first_line(o['text']) or '(nothing shown)'}")
    for items, what in [
        (unexpected, "error outputs in cells not tagged raises-exception"),
        (stderr, "stderr outputs (the pink box) in cells not tagged allow-stderr"),
        (bars, "progress bars printed as text to stderr (use tqdm.auto: a widget in JupyterLab)"),
        (widgets, "widget outputs that show no progress bar"),
        (paths, "outputs show a machine path (print the error's message instead of its traceback)"),
    ]:
        if items:
            res.fail(f"{at}{len(items)} {what}", items)


# --------------------------------------------------------------------------------------
# JupyterLab.


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """JupyterLab from this venv on 127.0.0.1, serving a copy of `book/`, with its own settings."""

    def __init__(self, book: Path, timeout: float) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="check-lab-"))
        self.root = self.tmp / "book"
        skip = shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__")
        shutil.copytree(book, self.root, ignore=skip)
        # scripts/ beside it, as in the checkout: the ablations chapter imports its study script.
        shutil.copytree(book.parent / "scripts", self.tmp / "scripts", ignore=skip)
        self.port, self.token, self.timeout = free_port(), secrets.token_hex(16), timeout
        self.origin = f"http://127.0.0.1:{self.port}"
        settings = self.tmp / "settings"
        for plugin, values in {
            "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
            "notebook-extension/tracker": {"windowingMode": "none"},
            "docmanager-extension/plugin": {"autosave": False},
        }.items():
            f = settings / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(values))
        config = self.tmp / "config"
        config.mkdir()
        (config / "jupyter_server_config.json").write_text(
            json.dumps(
                {
                    "IdentityProvider": {"token": self.token},
                    "ServerApp": {
                        "ip": "127.0.0.1",
                        "port": self.port,
                        "port_retries": 0,
                        "open_browser": False,
                        "root_dir": str(self.root),
                        "allow_root": os.geteuid() == 0,
                    },
                    "LabApp": {
                        "news_url": None,
                        "check_for_updates_class": "jupyterlab.NeverCheckForUpdate",
                        "extension_manager": "readonly",
                        "expose_app_in_browser": True,
                        "user_settings_dir": str(settings),
                        "workspaces_dir": str(self.tmp / "workspaces"),
                    },
                }
            )
        )
        self.env = dict(
            os.environ,
            JUPYTER_CONFIG_DIR=str(config),
            JUPYTER_RUNTIME_DIR=str(self.tmp / "runtime"),
            IPYTHONDIR=str(self.tmp / "ipython"),
            MPLCONFIGDIR=str(self.tmp / "matplotlib"),
        )
        self.log = self.tmp / "lab.log"
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> Lab:
        jupyter = Path(sys.executable).with_name("jupyter")
        self.process = subprocess.Popen(
            [str(jupyter), "lab"],
            env=self.env,
            cwd=self.root,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            try:
                with urllib.request.urlopen(
                    f"{self.origin}/api/status?token={self.token}", timeout=5
                ):
                    return self
            except OSError:
                time.sleep(0.5)
        log = self.log_tail()
        self.__exit__()
        raise RuntimeError(f"JupyterLab did not start; its log ends:\n{log}")

    def log_tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def url(self, path: str) -> str:
        return f"{self.origin}{path}{'&' if '?' in path else '?'}token={self.token}"

    def shutdown_kernels(self, request) -> None:
        """Stop every kernel (each chapter starts its own)."""
        for kernel in request.get(self.url("/api/kernels")).json():
            request.delete(self.url(f"/api/kernels/{kernel['id']}"))

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)


# --------------------------------------------------------------------------------------
# One chapter.


def screenshots(page, shots: Path | None, name: str) -> int:
    """Scroll the notebook panel a screen at a time; one PNG each. Returns the number taken."""
    if shots is None:
        return 0
    top, n = 0, 0
    while True:
        pos = page.evaluate(JS_SCROLL_TO, top)
        page.wait_for_timeout(150)
        n += 1
        page.screenshot(path=str(shots / f"{name}-{n:02d}.png"))
        top = pos["top"] + max(pos["height"] - 100, 100)  # 100 px of overlap between shots
        if pos["top"] + pos["height"] >= pos["total"] - 1 or n >= 99:
            break
    page.evaluate(JS_SCROLL_TO, 0)
    return n


def run_all(page, exp: Expectations, timeout: float) -> tuple[float, str | None]:
    """Run All Cells through the Run menu; wait until every code cell ran and the kernel is
    idle. Returns (seconds, why it stopped early or None)."""
    page.evaluate(JS_WATCH_KERNEL)
    t0 = time.perf_counter()
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).first.click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).first.click()
    while True:
        page.wait_for_timeout(500)
        state = page.evaluate(JS_RUN_STATE)
        done = (
            state["inputs"] >= exp.n_code and state["status"] == "idle" and state["idle_ms"] > 1000
        )
        if done:
            return time.perf_counter() - t0, None
        if state["status"] == "idle" and state["idle_ms"] > 15000:
            return time.perf_counter() - t0, (
                f"Run All stopped after {state['inputs']} of {exp.n_code} "
                f"code cells ({state['errors']} errors)"
            )
        if time.perf_counter() - t0 > timeout:
            return time.perf_counter() - t0, (
                f"Run All did not finish within {timeout:g} s "
                f"({state['inputs']} of {exp.n_code} code cells ran)"
            )


def expected_hint(checker_source: str) -> str:
    """The hint the package's checker gives for TRIAL_ANSWER (the checker cell's function)."""
    import torch

    from minitransformer import exercises
    from minitransformer.exercises._core import ExerciseError

    name = re.match(r"\s*(check_\w+)\(", checker_source)
    if name is None:
        raise ValueError(f"the cell after the stub is not a checker call: {checker_source[:80]!r}")
    namespace = {"torch": torch}
    exec(TRIAL_ANSWER, namespace)
    answer = namespace[re.match(r"def (\w+)\(", TRIAL_ANSWER).group(1)]
    try:
        getattr(exercises, name.group(1))(answer)
    except ExerciseError as err:
        return str(err)
    raise ValueError(f"{name.group(1)} accepts the wrong answer {TRIAL_ANSWER!r}")


def try_wrong_answer(page, nb_cells: list, res: PageResult, shots: Path | None) -> None:
    """Type TRIAL_ANSWER into the stub, run it and its checker, check the hint is all visible."""
    stub = next(
        (
            i
            for i, c in enumerate(nb_cells)
            if c.cell_type == "code"
            and c.source.lstrip().startswith(TRIAL_STUB)
            and "NotImplementedError" in c.source
        ),
        None,
    )
    if stub is None or stub + 1 >= len(nb_cells) or nb_cells[stub + 1].cell_type != "code":
        res.fail(f"no exercise stub starting {TRIAL_STUB!r} followed by its checker cell")
        return
    hint = expected_hint(nb_cells[stub + 1].source)
    before = len(res.failures)
    page.evaluate(JS_SCROLL_TO, page.evaluate(JS_CELL_NODE_TOP, stub) - 200)
    editor = page.locator(".jp-Notebook .jp-Cell").nth(stub).locator(".cm-content")
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(TRIAL_ANSWER.rstrip("\n"))
    typed = page.evaluate(JS_SOURCE, stub)
    if typed.strip() != TRIAL_ANSWER.strip():
        res.fail(f"typing into the stub gave {typed!r}")
        return
    page.evaluate(JS_WATCH_KERNEL)
    page.keyboard.press("Shift+Enter")  # runs the stub, selects the checker
    page.keyboard.press("Shift+Enter")  # runs the checker
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        page.wait_for_timeout(300)
        state = page.evaluate(JS_RUN_STATE)
        if state["inputs"] >= 2 and state["status"] == "idle" and state["idle_ms"] > 500:
            break
    checker = page.evaluate(JS_CELLS)[stub + 1]
    errors = [o for o in checker["outputs"] if o["type"] == "error"]
    if not errors:
        res.fail(
            "the checker shows no hint for the wrong answer: it shows "
            f"{[first_line(o['text']) for o in checker['outputs']]}"
        )
        return
    shown = re.sub(r"\s+", " ", errors[0]["text"])
    if re.sub(r"\s+", " ", hint) not in shown:
        res.fail(f"the checker's hint is not shown whole: expected {hint!r}, shown {shown[:300]!r}")
    if errors[0]["overflow"] > 1:
        res.fail(
            f"the checker's hint is clipped: {errors[0]['overflow']} px of it are out of its box"
        )
    if errors[0]["cut"]:
        res.fail(f"the checker's hint is cut by {errors[0]['cut']}")
    res.stats["hint"] = "shown" if len(res.failures) == before else "FAIL"
    if shots is not None:
        page.locator(".jp-Notebook .jp-Cell").nth(stub + 1).screenshot(
            path=str(shots / f"{Path(TRIAL_CHAPTER).name}-hint.png")
        )


def notebook_differences(saved: dict, stored: dict, limit: int = 5) -> list[str]:
    """Where two notebooks (as JSON) differ: the notebook's metadata, then cell by cell."""
    out = []
    for key in sorted(set(saved) | set(stored)):
        if key not in ("cells", "metadata") and saved.get(key) != stored.get(key):
            out.append(f"{key}: {stored.get(key)!r} became {saved.get(key)!r}")
    for key in sorted(set(saved.get("metadata", {})) | set(stored.get("metadata", {}))):
        a, b = stored.get("metadata", {}).get(key), saved.get("metadata", {}).get(key)
        if a != b:
            out.append(f"metadata.{key}: {json.dumps(a)[:120]} became {json.dumps(b)[:120]}")
    cells_a, cells_b = stored.get("cells", []), saved.get("cells", [])
    if len(cells_a) != len(cells_b):
        out.append(f"{len(cells_a)} cells became {len(cells_b)}")
    for i, (a, b) in enumerate(zip(cells_a, cells_b, strict=False)):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                out.append(
                    f"cell {i} {key}: {json.dumps(a.get(key))[:100]} became "
                    f"{json.dumps(b.get(key))[:100]}"
                )
        if len(out) >= limit:
            break
    return out[:limit]


def check_unchanged_by_opening(page, lab: Lab, path: Path, res: PageResult) -> None:
    """Opened with its kernel connected, the notebook is not marked modified, and saving it
    writes exactly the committed file (so a learner's autosave changes nothing in git)."""
    if page.evaluate(JS_DIRTY):
        res.fail(
            "the notebook is marked modified as soon as it opens (its metadata differs "
            "from what JupyterLab writes: scripts/normalize_notebooks.py)"
        )
    page.evaluate(JS_SAVE)
    page.wait_for_timeout(500)
    saved_path = lab.root / path.name
    if saved_path.read_bytes() == path.read_bytes():
        res.stats["save"] = "unchanged"
        return
    res.stats["save"] = "CHANGED"
    diffs = notebook_differences(json.loads(saved_path.read_text()), json.loads(path.read_text()))
    res.fail(
        "opening and saving the notebook in JupyterLab changes the file"
        + ("" if diffs else " (only its formatting)"),
        diffs,
    )


def link_samples(nb_cells: list) -> dict[str, tuple[int, str, str]]:
    """The first link of each kind of LINK_KINDS in a notebook's markdown: {kind: (cell,
    text, target)}."""
    found: dict[str, tuple[int, str, str]] = {}
    for i, cell in enumerate(nb_cells):
        if cell.cell_type != "markdown":
            continue
        for m in re.finditer(r"\[([^\]\n]+)\]\(([^)\s]+)", cell.source):
            for kind, rx in LINK_KINDS.items():
                if kind not in found and rx.match(m[2]):
                    found[kind] = (i, plain(m[1]), m[2])
    return found


def click_links(
    context, lab: Lab, name: str, exp: Expectations, nb_cells: list, done: set, res, args
) -> None:
    """Click one link of each kind not yet clicked in this run (`done`), each in a fresh tab
    of the chapter, and check that JupyterLab opens its target: the chapter, or the glossary
    or the bibliography at the line of the term or the work. (A text editor opens at that
    line; JupyterLab shows a Markdown page in its Markdown preview, rendered by jupyterlab-myst,
    which opens at the top: its terms have no anchors to scroll to.)"""
    for kind, (i, text, target) in link_samples(nb_cells).items():
        if kind in done:
            continue
        page = context.new_page()
        page.set_default_timeout(60_000)
        try:
            page.goto(lab.url(f"/lab/tree/{name}.ipynb?reset"), wait_until="domcontentloaded")
            page.wait_for_function(
                JS_LOADED, arg=exp.n_cells, timeout=args.timeout * 1000, polling=500
            )
            file, _, fragment = target.partition("#")
            shown = page.evaluate(JS_CELLS)[i]["links"]
            n = next((lk["n"] for lk in shown if file in unquote(lk["href"])), None)
            if n is None:
                res.fail(
                    f"cell {i}: the {kind} link {text!r} ({target}) is not shown as a link "
                    f"(the cell shows {[(lk['text'], lk['href'][:60]) for lk in shown][:6]})"
                )
                continue
            page.evaluate(JS_SCROLL_TO, page.evaluate(JS_CELL_NODE_TOP, i) - 200)
            page.evaluate_handle(JS_LINK_NODE, [i, n]).as_element().click()
            want_line = int(fragment.split("=")[1]) if fragment.startswith("line=") else None
            deadline, now = time.monotonic() + 30, None
            while time.monotonic() < deadline:
                page.wait_for_timeout(300)
                now = page.evaluate(JS_CURRENT)
                if (
                    now
                    and now["path"].endswith(file)
                    and (want_line is None or now["line"] in (want_line, None))
                ):
                    break
            if not now or not now["path"].endswith(file):
                res.fail(
                    f"cell {i}: clicking the {kind} link {text!r} does not open {file} "
                    f"(the current tab is {now['path'] if now else 'none'})"
                )
            elif want_line is not None and now["line"] not in (want_line, None):
                res.fail(
                    f"cell {i}: the {kind} link {text!r} opens {file} at line {now['line']}, "
                    f"not {want_line}"
                )
            else:
                done.add(kind)
                res.stats.setdefault("links", []).append(kind)
        except Exception as exc:
            res.fail(f"could not click the {kind} link {text!r}: {type(exc).__name__}")
        finally:
            page.close()
            lab.shutdown_kernels(context.request)


def check_chapter(
    context,
    lab: Lab,
    docname: str,
    book: Path,
    shots: Path | None,
    args,
    known: set[str],
    clicked: set[str],
) -> PageResult:
    res = PageResult(docname)
    name = Path(docname).name
    path = book / f"{name}.ipynb"
    exp = expectations(path)
    res.stats.update(
        figures=len(exp.figures) + exp.glue_figures,
        values=sum(map(len, exp.values.values())),
        exercises=len(exp.exercises),
        solutions=len(exp.solutions),
        raises=len(exp.raises),
    )
    page = context.new_page()
    page.set_default_timeout(60_000)
    messages: list[str] = []
    page.on("pageerror", lambda e: messages.append(f"page error: {str(e).splitlines()[0][:200]}"))
    page.on(
        "console",
        lambda m: (
            messages.append(f"console {m.type}: {m.text[:2000]}") if m.type == "error" else None
        ),
    )
    try:
        page.goto(lab.url(f"/lab/tree/{name}.ipynb?reset"), wait_until="domcontentloaded")
        try:
            page.wait_for_function(
                JS_LOADED, arg=exp.n_cells, timeout=args.timeout * 1000, polling=500
            )
        except Exception:
            dialogs = page.evaluate(JS_DIALOG)
            res.fail(
                "the notebook did not open with an idle kernel and every markdown cell rendered"
                + (f"; a dialog shows: {dialogs}" if dialogs else "")
            )
            return res
        page.wait_for_timeout(1000)  # images and math settle
        check_cells(page.evaluate(JS_CELLS), exp, res, "before")
        screenshots(page, shots, f"{name}-before")
        check_unchanged_by_opening(page, lab, path, res)

        seconds, stopped = run_all(page, exp, args.run_timeout)
        res.stats["run_s"] = seconds
        if stopped:
            res.fail(stopped)
        page.wait_for_timeout(1000)
        check_cells(page.evaluate(JS_CELLS), exp, res, "after")
        screenshots(page, shots, f"{name}-after")
        if docname == TRIAL_CHAPTER:
            try_wrong_answer(page, nbformat.read(path, as_version=4).cells, res, shots)
    except Exception as exc:  # a timeout or a crash: report it, go on with the next chapter
        res.fail(f"could not check the chapter: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    finally:
        page.close()
        lab.shutdown_kernels(context.request)
    click_links(
        context, lab, name, exp, nbformat.read(path, as_version=4).cells, clicked, res, args
    )
    for message in messages:
        if not benign(message, known):
            res.failures.append(message)
    res.failures = merge_states(res.failures)
    return res


def merge_states(failures: list[str]) -> list[str]:
    """One line for a failure seen both before and after Run All."""
    after = {f[len("after: ") :] for f in failures if f.startswith("after: ")}
    before = {f[len("before: ") :] for f in failures if f.startswith("before: ")}
    merged = []
    for f in failures:
        state, _, what = f.partition(": ")
        if state == "before" and what in after:
            merged.append(f"before and after Run All: {what}")
        elif not (state == "after" and what in before):
            merged.append(f)
    return merged


def benign(message: str, seen: set[str]) -> bool:
    """True if every line of `message` is a known harmless one (remembered in `seen`)."""
    why = set()
    for line in message.split(": ", 1)[-1].splitlines():
        match = next((w for rx, w in KNOWN_BENIGN if rx.search(line.strip())), None)
        if line.strip() and match is None:
            return False
        why.add(match)
    seen.update(w for w in why if w)
    return True


# --------------------------------------------------------------------------------------


def check_chapters(chapters: list[str], book: Path, args: argparse.Namespace) -> dict | None:
    """Check ``chapters`` in one JupyterLab and one browser, printing a line per chapter.
    Returns what the book-wide checks need (see :func:`main`), or None if JupyterLab did not
    start."""
    from playwright.sync_api import sync_playwright

    results: list[PageResult] = []
    blocked: dict[str, set[str]] = {}
    known: set[str] = set()
    clicked: set[str] = set()  # the kinds of link clicked so far (click_links)
    try:
        lab = Lab(book, args.timeout).__enter__()
    except RuntimeError as exc:
        print(f"check_lab: {exc}")
        return None
    try:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=args.chromium, headless=True, args=CHROMIUM_ARGS
            )
            context = browser.new_context(
                viewport=VIEWPORT, device_scale_factor=1, service_workers="block"
            )
            current = {"page": ""}
            context.route("**/*", local_only(lab.origin, blocked, current))
            print(
                f"check_lab: {len(chapters)} chapters in JupyterLab at {lab.origin} "
                f"(a copy of {book}), "
                f"Chromium {browser.version}, network blocked",
                flush=True,
            )
            for docname in chapters:
                current["page"] = docname
                t_chapter = time.perf_counter()
                r = check_chapter(
                    context, lab, docname, book, args.screenshots, args, known, clicked
                )
                results.append(r)
                s = r.stats
                run = f"{s['run_s']:.1f} s" if "run_s" in s else "-"
                print(
                    f"  {'PASS' if not r.failures else 'FAIL'}  {docname:<22} "
                    f"figures {s.get('figures', 0):>2} "
                    f"(images {s.get('images_before', '-')}/{s.get('images_after', '-')})  "
                    f"numbers {s.get('values', 0):>2}  exercises {s.get('exercises', 0)}  "
                    f"solutions {s.get('solutions', 0)}  expected errors {s.get('raises', 0)}  "
                    + (f"hint {s['hint']}  " if "hint" in s else "")
                    + f"save {s.get('save', '-')}  "
                    + (f"links clicked {','.join(s['links'])}  " if s.get("links") else "")
                    + f"run all {run}  ({time.perf_counter() - t_chapter:.0f} s in all)",
                    flush=True,
                )
            context.close()
            browser.close()
    finally:
        log = lab.log_tail()
        lab.__exit__()
    return {
        "results": [{"path": r.path, "failures": r.failures, "stats": r.stats} for r in results],
        "blocked": {url: sorted(where) for url, where in blocked.items()},
        "known": sorted(known),
        "clicked": sorted(clicked),
        "log": log,
    }


def check_in_parallel(chapters: list[str], args: argparse.Namespace) -> dict | None:
    """:func:`check_chapters` in ``args.jobs`` processes at once, each with its own JupyterLab
    and browser and every ``jobs``-th chapter in reading order; their findings merged."""
    jobs = min(args.jobs, len(chapters))
    with tempfile.TemporaryDirectory(prefix="check-lab-") as tmp:
        procs = []
        for k in range(jobs):
            command = [sys.executable, __file__, "--toc", str(args.toc), "--shard", str(k)]
            command += ["--jobs", str(jobs), "--json", f"{tmp}/{k}.json"]
            command += ["--chromium", args.chromium, "--timeout", str(args.timeout)]
            command += ["--run-timeout", str(args.run_timeout)]
            command += ["--screenshots", str(args.screenshots)] if args.screenshots else []
            for chapter in chapters[k::jobs]:
                command += ["--chapter", chapter]
            procs.append(subprocess.Popen(command))
        codes = [proc.wait() for proc in procs]
        parts = []
        for k, code in enumerate(codes):
            path = Path(tmp, f"{k}.json")
            if code != 0 or not path.is_file():
                print(f"check_lab: the check of {chapters[k::jobs]} ended with status {code}")
                return None
            parts.append(json.loads(path.read_text()))
    order = {c: i for i, c in enumerate(chapters)}
    return {
        "results": sorted(
            (r for part in parts for r in part["results"]), key=lambda r: order[r["path"]]
        ),
        "blocked": {
            url: sorted({w for part in parts for w in part["blocked"].get(url, [])})
            for url in {url for part in parts for url in part["blocked"]}
        },
        "known": sorted({k for part in parts for k in part["known"]}),
        "clicked": sorted({c for part in parts for c in part["clicked"]}),
        "log": "\n".join(part["log"] for part in parts),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--toc", type=Path, default=ROOT / "_toc.yml", help="_toc.yml (default: the repository's)"
    )
    ap.add_argument("--screenshots", type=Path, help="save screenshots here")
    ap.add_argument("--chromium", help="Chromium executable (default: chromium on PATH)")
    ap.add_argument(
        "--chapter",
        action="append",
        default=[],
        help="check only chapters whose name contains this (repeatable); "
        "skips the book-wide minimum counts",
    )
    ap.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="check the chapters in this many JupyterLabs at once (default 1): a chapter "
        "mostly waits on the browser or on its kernel, so 2 on 2 cores save about a third",
    )
    # One of --jobs' processes: its index, and where it writes its findings for the parent.
    ap.add_argument("--shard", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    ap.add_argument(
        "--timeout",
        type=float,
        default=120,
        help="seconds for JupyterLab to start and for a notebook to open (default 120)",
    )
    ap.add_argument(
        "--run-timeout",
        type=float,
        default=1200,
        help="seconds for Run All of one chapter (default 1200)",
    )
    for what in ("figures", "values", "exercises", "solutions"):
        ap.add_argument(
            f"--min-{what}",
            type=int,
            default=1,
            help=f"fail if the whole book has fewer {what} (default 1)",
        )
    args = ap.parse_args(argv)

    if not args.toc.is_file():
        print(f"check_lab: no {args.toc}")
        return 2
    toc = read_toc(args.toc)
    book = args.toc.parent / "book"
    chapters = [p for p in toc.pages if (args.toc.parent / f"{p}.ipynb").is_file()]
    if args.shard is not None:  # the parent names each chapter whole: no substring matches
        chapters = [c for c in chapters if c in args.chapter]
    elif args.chapter:
        chapters = [c for c in chapters if any(s in c for s in args.chapter)]
    if not chapters:
        print(
            f"check_lab: no notebook chapters in {args.toc}"
            + (f" match {args.chapter}" if args.chapter else "")
        )
        return 2
    args.chromium = find_chromium(args.chromium)
    if args.chromium is None:
        print("check_lab: no Chromium found: apt-get install chromium (or pass --chromium).")
        return 2
    if args.shard is not None:  # one of --jobs' processes: the parent reports
        found = check_chapters(chapters, book, args)
        if found is None:
            return 2
        args.json.write_text(json.dumps(found))
        return 0

    shots = args.screenshots
    empty_folder(shots)
    t0 = time.perf_counter()
    if args.jobs > 1:
        found = check_in_parallel(chapters, args)
    else:
        found = check_chapters(chapters, book, args)
    if found is None:
        return 2
    results = [PageResult(r["path"], r["failures"], stats=r["stats"]) for r in found["results"]]
    clicked = set(found["clicked"])

    book_failures = [
        f"request to the network blocked: {url} (from {', '.join(where)})"
        for url, where in sorted(found["blocked"].items())
    ]
    if not args.chapter:
        for what in ("figures", "values", "exercises", "solutions"):
            total, least = sum(r.stats.get(what, 0) for r in results), getattr(args, f"min_{what}")
            if total < least:
                book_failures.append(
                    f"found {total} {what} in the whole book, expected at least {least}: "
                    "is the check still finding them?"
                )
    if not args.chapter and set(LINK_KINDS) - clicked:
        book_failures.append(
            "no link of these kinds was clicked: " + ", ".join(sorted(set(LINK_KINDS) - clicked))
        )
    trial = next((r for r in results if r.path == TRIAL_CHAPTER), None)
    if trial is not None and "hint" not in trial.stats:
        book_failures.append(f"the wrong answer was not tried in {TRIAL_CHAPTER}")
    for why in found["known"]:
        print(f"check_lab: ignored known harmless messages: {why}")
    print(
        f"check_lab: {len(results)} chapters in {time.perf_counter() - t0:.1f} s"
        + (f" ({args.jobs} at once)" if args.jobs > 1 else "")
        + (f"; screenshots in {shots}" if shots else "")
    )
    status = report("check_lab", "chapters", results, book_failures)
    if any("could not check" in f or "did not open" in f for r in results for f in r.failures):
        print(f"\nJupyterLab's log ends:\n{found['log']}")
    return status


if __name__ == "__main__":
    sys.exit(main())
