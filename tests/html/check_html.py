#!/usr/bin/env python3
"""Browser check of the built book: open every HTML page in headless Chromium, offline.

Usage (from the repository root; `make check-html` runs exactly this):

    .venv/bin/python tests/html/check_html.py _build/html --screenshots _build/screenshots

The script serves BUILD_DIR on 127.0.0.1 (a throwaway http.server on a free port that it
starts and stops itself), drives the system Chromium (`/usr/bin/chromium`, Debian package
`chromium`) through Playwright, and aborts every request that does not go to that local
server, so the book is checked exactly as a reader without network access would see it.

Every page is checked twice: in a 1280 px wide window (a laptop) and in a 390 px wide one (a
phone; a plain narrow window, not Chromium's mobile emulation, which would zoom a too-wide page
out to fit and so hide exactly the sideways scrolling this looks for).

At 1280 px, for every page it asserts:

* the page loads with no JavaScript error, no failed local request (404, ...) and no attempt
  to reach the network (a CDN script, stylesheet or font);
* math is rendered: MathJax loaded (from the bundled copy) and finished
  (`MathJax.startup.promise`), every `.math` element holds an `mjx-container`, MathJax reported
  no TeX error (`mjx-merror`), and no raw TeX (`$$`, `\\(`, `\\[`, `\\begin{`, `\\frac`,
  `$x$` ...) is left in the visible text outside code blocks;
* every `<img>` loaded (`complete` and `naturalWidth > 0`) and has an alt text that is not a
  file name, and every `<figure>` shows one;
* no cell output shows a machine path (`/work/`, `/home/`, `/tmp/`, `site-packages`, `.venv`):
  a traceback must show the message a reader needs, not the build machine's files;
* the page names a favicon (`<link rel="icon">`) that loads;
* no cell error output (a traceback, or stderr that holds an exception) appears, except in
  cells tagged `raises-exception`; and each cell tagged `raises-exception` does show its error;
* the sidebar (`nav.bd-docs-nav`) links to every page listed in `_toc.yml`, the top-level
  chapters visibly, and marks the current page;
* every exercise solution (sphinx-exercise `{solution}` with `:class: dropdown`, collapsed by
  sphinx-togglebutton) is collapsed when the page opens, and clicking its toggle button
  reveals it;
* the search page (search.html) finds the longest word of the root page's title.

At both widths it asserts:

* no display equation is clipped: it fits its box, or its box scrolls sideways (to the
  equation's end) and shows that it does (the edge shadow of `book/_static/course.css`: a phone
  draws no scrollbar until one scrolls), and no enclosing box or the window cuts it;
* every error output (a checker's hint, a traceback) wraps: its text is wider than its box
  nowhere, so the whole hint is visible without scrolling.

At 1280 px it also asserts that no code cell, code block or printed output is wider than
its box (the code is formatted to 76 columns, book/ruff.toml; printed output wraps), that no
formula shows a backslash (a TeX escape such as `\\_` rendered as it is, or an unknown
macro: found in MathJax's internal tree), and, at both widths, that no inline formula is cut
and that every figure of a cell output shows its smallest text at 9 px or more (the size that
`minitransformer.plotting.show` records in the PNG, times the scale the page shows it at).
A display equation or a figure that is wider than its box must scroll, with the scroll badge
of `book/_static/reading.js`.

At 390 px it also asserts:

* the page does not scroll sideways (`document.documentElement.scrollWidth <= innerWidth`; a
  failure names the elements that stick out);
* the site-navigation button (☰) is visible and opens the navigation, which links to every page
  of `_toc.yml` and shows every chapter; the contents button, where the page has one, opens the
  page's contents; Escape closes both; a tap on a section in the contents closes them and
  shows that section;
* no code or output box is clipped (one may scroll sideways inside its box);
* no JavaScript error, as at 1280 px.

The bibliography is checked from the HTML files: its labels are author-year ("Vaswani et al.,
2017"), like the citations in the text, and every citation in the text links to an entry
with its label, or the label's year or authors (a textual citation, "Vaswani et al. [2017]").

Book-wide, at least one solution, one image, one page with math, one display equation and
one citation must have been found (a check that finds nothing to check fails rather than
passing silently; see --min-*), every page of `_toc.yml` must have been built, and no HTML or
CSS file may reference an external script, stylesheet, font or image.

A full-page screenshot of each page is saved as SCREENSHOTS/<page path with / -> ->.png
(taken with solutions collapsed), one at phone width as ...-phone.png, and one of the root
page with the phone navigation open as ...-phone-nav.png. The script prints one line per page,
then every failure, and exits 1 if anything failed. The worst page of each kind of defect
(code overflow at 1280 px, display equations that scroll, inline formulas cut, the smallest
figure text at 390 px, TeX escapes) is shot again with that place in view, as
SCREENSHOTS/worst-*.png. The exit status is 1 if anything failed (2 for a usage problem: no
build, no Chromium, no toc). `--json FILE` writes each page's counts and failures.
"""

from __future__ import annotations

import argparse
import functools
import html
import http.server
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

# Flags that work for Debian's chromium as root, with no network (see TOOLCHAIN.md).
# Playwright adds --headless and a fresh temporary --user-data-dir itself.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
VIEWPORT = {"width": 1280, "height": 900}  # wide enough for the theme to show the sidebar
PHONE_VIEWPORT = {"width": 390, "height": 844}  # a current phone's CSS pixels
# Folders of a Sphinx HTML build that hold assets, not pages.
ASSET_DIRS = {
    "_static",
    "_sources",
    "_images",
    "_downloads",
    "_sphinx_design_static",
    "_panels_static",
}
MAX_SHOWN = 5  # at most this many examples of one kind of failure per page
# What must not appear in a cell output: paths of the machine that built the book.
MACHINE_PATH = re.compile(r"/work/|/home/|/tmp/|site-packages|\.venv\b")
# An alt text that is only an image's file name (Sphinx's default when a figure has no alt).
FILE_NAME_ALT = re.compile(r"(^|/)[^\s/]+\.(png|jpe?g|gif|svg|webp)$|_images/", re.I)
# Browser errors that Jupyter Book 1 pages always raise and that change nothing a reader sees.
# They are reported as notes, once per run, not as failures. Keep this list short and explained.
KNOWN_BENIGN = [
    # pydata-sphinx-theme on a first visit with empty localStorage; it falls back to "auto".
    (re.compile(r"Got invalid theme mode: \S*\. Resetting to auto"), "pydata theme, first visit"),
]

# --------------------------------------------------------------------------------------
# JavaScript run in the page. Each returns plain JSON.

JS_MATHJAX_READY = """async (ms) => {
  const mj = window.MathJax;
  if (!mj || !mj.startup || !mj.startup.promise) return 'absent';
  return Promise.race([mj.startup.promise.then(() => 'ready'),
                       new Promise(done => setTimeout(() => done('timeout'), ms))]);
}"""

JS_FONTS_READY = """async (ms) => Promise.race([
  document.fonts.ready.then(() => 'ready'),
  new Promise(done => setTimeout(() => done('timeout'), ms))])"""

JS_MATH = """() => {
  const maths = Array.from(document.querySelectorAll('.math'));
  const untypeset = maths.filter(m => !m.querySelector('mjx-container'))
                         .map(m => m.textContent.trim().slice(0, 80));
  const errors = Array.from(document.querySelectorAll('mjx-merror'))
      .map(e => (e.getAttribute('data-mjx-error') || e.textContent).slice(0, 120));
  // An undefined macro does not give an merror: MathJax's noundefined package shows its name
  // in red instead. Find it in the assistive MathML, or else in the CHTML (a red mtext that
  // starts with a backslash, U+5C).
  for (const c of document.querySelectorAll('mjx-container')) {
    const names = Array.from(c.querySelectorAll('mtext[mathcolor="red"]'))
        .map(t => t.textContent).filter(t => t.startsWith('\\\\'));
    if (names.length) names.forEach(n => errors.push('undefined TeX macro ' + n));
    else if (c.querySelector('mjx-mtext[style*="color: red"] > mjx-c.mjx-c5C:first-child'))
      errors.push('undefined TeX macro (shown in red)');
  }
  return {n_math: maths.length,
          n_containers: document.querySelectorAll('mjx-container').length,
          untypeset, errors};
}"""

# The page text a reader sees, without code (pre/code), scripts and rendered math.
JS_PROSE_TEXT = """() => {
  const clone = document.body.cloneNode(true);
  clone.querySelectorAll('pre, code, kbd, samp, script, style, noscript, textarea, '
                         + 'mjx-container, .highlight').forEach(e => e.remove());
  return clone.textContent;
}"""

JS_IMAGES = """async () => {
  const imgs = Array.from(document.images);
  for (const img of imgs) if (img.loading === 'lazy') img.loading = 'eager';
  await Promise.all(imgs.map(img => img.complete ? null : new Promise(done => {
    img.addEventListener('load', done, {once: true});
    img.addEventListener('error', done, {once: true});
    setTimeout(done, 10000);
  })));
  const empty_figures = Array.from(document.querySelectorAll('figure'))
      .filter(f => !f.querySelector('img, svg, object, embed, iframe, video, canvas'))
      .map(f => f.id || (f.textContent || '').trim().slice(0, 60));
  return {images: imgs.map(img => ({src: img.getAttribute('src') || '', alt: img.alt,
                                    complete: img.complete, width: img.naturalWidth})),
          empty_figures};
}"""

JS_CELL_ERRORS = """() => {
  const EXC = /Traceback \\(most recent call last\\)|^\\s*\\w*(Error|Exception)\\b.*:/m;
  const tagsOf = el => {
    const cell = el.closest('.cell');
    if (!cell) return [];
    return Array.from(cell.classList).filter(c => c.startsWith('tag_')).map(c => c.slice(4));
  };
  const lastLine = t => { const ls = t.split('\\n').map(l => l.trim()).filter(Boolean);
                          return ls.length ? ls[ls.length - 1].slice(0, 160) : ''; };
  const seen = new Set(), errors = [], stderr = [];
  for (const el of document.querySelectorAll('.output')) {
    // The text of the output itself, not of the copy button sphinx-copybutton adds.
    const pre = el.querySelector('pre');
    const text = (pre || el).textContent || '';
    const isTb = el.classList.contains('traceback') || el.classList.contains('error');
    const isErr = el.classList.contains('stderr');
    const warning = text.split('\\n').find(l => /Warning\\b/.test(l));
    if (isTb || (isErr && EXC.test(text)) || text.includes('Traceback (most recent call last)')) {
      if (seen.has(el)) continue; seen.add(el);
      const tags = tagsOf(el);
      errors.push({kind: isTb ? 'traceback' : (isErr ? 'stderr' : 'output'),
                   allowed: tags.includes('raises-exception'), tags, line: lastLine(text)});
    } else if (isErr) {
      stderr.push(warning ? warning.trim().slice(0, 160) : lastLine(text));
    }
  }
  const tagged = Array.from(document.querySelectorAll('.cell.tag_raises-exception'));
  const silent = tagged.filter(c => !c.classList.contains('tag_remove-output')
                                  && !c.querySelector('.output.traceback, .output.error'))
      .map(c => (c.querySelector('.cell_input') || c).textContent.trim())
      .map(t => t.split('\\n')[0].slice(0, 80));
  return {errors, stderr, n_tagged: tagged.length, silent};
}"""

JS_SIDEBAR = """() => {
  const nav = document.querySelector('nav.bd-docs-nav, #bd-docs-nav');
  if (!nav) return null;
  return Array.from(nav.querySelectorAll('a[href]')).map(a => ({
    href: a.href, text: a.textContent.trim(),
    visible: a.checkVisibility({visibilityProperty: true, opacityProperty: true}),
    current: a.classList.contains('current') || !!a.closest('li.current')}));
}"""

JS_SOLUTIONS = """() => Array.from(document.querySelectorAll('.solution')).map((s, i) => {
  const title = s.querySelector(':scope > .admonition-title');
  const body = Array.from(s.children).filter(c => !c.classList.contains('admonition-title'));
  const visible = c => c.checkVisibility({visibilityProperty: true, opacityProperty: true});
  const shown = body.filter(c => visible(c) && c.getBoundingClientRect().height > 0);
  return {id: s.id, index: i, title: title ? title.textContent.trim().slice(0, 80) : '',
          classes: s.className, has_title: !!title, n_body: body.length, n_shown: shown.length};
})"""

JS_SOLUTION_SHOWN = """(id) => {
  const s = document.getElementById(id);
  const body = Array.from(s.children).filter(c => !c.classList.contains('admonition-title'));
  const visible = c => c.checkVisibility({visibilityProperty: true, opacityProperty: true});
  return body.length > 0 && body.every(visible)
         && body.some(c => c.getBoundingClientRect().height > 0);
}"""

JS_OUTPUT_TEXTS = """() => Array.from(document.querySelectorAll('.cell_output .output')).map(el => {
  const pre = el.querySelector('pre');
  return (pre || el).textContent || '';
})"""

JS_FAVICON = """() => Array.from(document.querySelectorAll('link[rel~="icon"]')).map(l => l.href)"""

# A box that clips its content sideways, or an enclosing one that cuts it, for both checks below.
JS_BOX_HELPERS = """
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  // The first enclosing box (or the window) that cuts `el`'s rectangle on the left or right.
  const cutBy = el => {
    const r = el.getBoundingClientRect();
    if (r.left < -1 || r.right > innerWidth + 1) return 'the window';
    for (let p = el.parentElement; p && p !== document.documentElement; p = p.parentElement) {
      if (getComputedStyle(p).overflowX === 'visible') continue;
      const pr = p.getBoundingClientRect();
      if (r.left < pr.left - 1 || r.right > pr.right + 1) {
        const classes = p.className ? String(p.className).trim().split(/\\s+/) : [];
        return [p.tagName.toLowerCase(), ...classes].join('.');
      }
    }
    return null;
  };
"""

# Display equations: {n, scrolling, clipped: [why ...]}.
JS_EQUATIONS = (
    """() => {"""
    + JS_BOX_HELPERS
    + """
  const boxes = Array.from(document.querySelectorAll('mjx-container[display="true"]'));
  const clipped = [], wide = [];
  let scrolling = 0;
  for (const box of boxes) {
    const tex = (box.closest('.math') || box).textContent.replace(/\\s+/g, ' ').trim().slice(0, 60);
    if (!box.checkVisibility()) continue;  // in a collapsed solution or dropdown
    const math = box.querySelector('mjx-math') || box;
    const cut = cutBy(box);
    if (cut) { clipped.push(`cut by ${cut}: ${tex}`); continue; }
    if (box.scrollWidth <= box.clientWidth + 1) continue;  // it fits
    const widths = `${box.scrollWidth} > ${box.clientWidth} px`;
    if (!scrolls(box)) {
      clipped.push(`wider than its box (${widths}), which does not scroll: ${tex}`);
      continue;
    }
    // The cue of book/_static/reading.js and course.css: data-more on the box's parent and
    // the badge it draws, read before scrolling (scrolling moves the cue).
    const holder = box.parentElement;
    const badge = holder ? getComputedStyle(holder, '::after').content : 'none';
    const cue = !!holder && holder.hasAttribute('data-more') && badge && badge !== 'none';
    const before = box.scrollLeft;
    box.scrollLeft = box.scrollWidth;
    const reachable = math.getBoundingClientRect().right <= box.getBoundingClientRect().right + 1;
    box.scrollLeft = before;
    if (!reachable) clipped.push(`its end cannot be scrolled into view: ${tex}`);
    else if (!cue) {
      clipped.push(`scrolls (${widths}) with nothing to show it does (no scroll badge): ${tex}`);
    }
    else { scrolling++; wide.push(`${widths}: ${tex}`); }
  }
  return {n: boxes.length, scrolling, clipped, wide};
}"""
)

# Error outputs (tracebacks, a checker's hint) whose text does not wrap: [last line ...].
JS_UNWRAPPED_ERRORS = (
    """() => {"""
    + JS_BOX_HELPERS
    + """
  const out = [];
  for (const pre of document.querySelectorAll(
      '.cell_output .output.traceback pre, .cell_output .output.error pre,'
      + ' .cell_output .output.stderr pre')) {
    if (!pre.checkVisibility()) continue;  // in a collapsed solution
    const lines = pre.textContent.split('\\n').map(l => l.trim()).filter(Boolean);
    const text = (lines.length ? lines[lines.length - 1] : '').slice(0, 100);
    const cut = cutBy(pre);
    if (pre.scrollWidth > pre.clientWidth + 1)
      out.push(`${pre.scrollWidth} px of text in a ${pre.clientWidth} px box: ${text}`);
    else if (cut) out.push(`cut by ${cut}: ${text}`);
  }
  return out;
}"""
)

# Sideways scrolling of the page, and the outermost elements that stick out to the right.
JS_PAGE_WIDTH = """() => {
  const W = innerWidth, width = document.documentElement.scrollWidth;
  const culprits = [];
  if (width > W + 1) {
    const sticksOut = el => {
      const r = el.getBoundingClientRect();
      return r.width > 0 && r.right > W + 1;
    };
    const clips = el => getComputedStyle(el).overflowX !== 'visible';
    const walk = el => {
      for (const c of el.children) {
        if (!sticksOut(c)) { if (!clips(c)) walk(c); continue; }
        // off-canvas panels do not widen the page
        if (getComputedStyle(c).position === 'fixed') continue;
        const inner = Array.from(c.children).some(sticksOut);
        if (inner && !clips(c)) { walk(c); continue; }
        culprits.push(`<${c.tagName.toLowerCase()} class="${String(c.className).slice(0, 60)}"> `
                      + `to ${Math.round(c.getBoundingClientRect().right)} px: `
                      + (c.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 60));
      }
    };
    walk(document.body);
  }
  return {width, innerWidth: W, culprits: culprits.slice(0, 20)};
}"""

JS_DIALOG_OPEN = """(id) => !!(document.getElementById(id) || {}).open"""

JS_DIALOG_LINKS = """(id) => {
  const d = document.getElementById(id);
  return d ? Array.from(d.querySelectorAll('a[href]'))
                  .filter(a => a.checkVisibility({visibilityProperty: true, opacityProperty: true}))
                  .length : 0;
}"""

# Code and printed output wider than its box: [{kind, px, box, line, cut, scrolls, tag}].
# `line` is the longest line, `cut` names an enclosing box that cuts the box itself.
JS_CODE_BOXES = (
    """() => {"""
    + JS_BOX_HELPERS
    + """
  const out = [];
  const seen = new Set();
  for (const pre of document.querySelectorAll(
      'div.cell_input pre, div.cell_output pre, div.highlight pre')) {
    if (seen.has(pre) || !pre.checkVisibility()) continue;  // a collapsed solution
    seen.add(pre);
    const kind = pre.closest('div.cell_output') ? 'output'
               : pre.closest('div.cell_input') ? 'code cell' : 'code block';
    const lines = pre.textContent.split('\\n');
    const longest = lines.reduce((a, b) => (b.length > a.length ? b : a), '');
    const hidden = pre.scrollWidth - pre.clientWidth;
    const cut = cutBy(pre);
    if (hidden <= 1 && !cut) continue;
    const cell = pre.closest('.cell');
    out.push({kind, px: hidden, box: pre.clientWidth, line: longest.trim().slice(0, 90),
              chars: longest.length, cut, scrolls: scrolls(pre),
              tag: cell ? (cell.id || '') : ''});
  }
  return out;
}"""
)

# Inline formulas that the column or an enclosing box cuts: [tex ...].
JS_INLINE_MATH = (
    """() => {"""
    + JS_BOX_HELPERS
    + """
  const out = [];
  for (const box of document.querySelectorAll('mjx-container:not([display="true"])')) {
    // Not the sidebars' copies (a heading's formula in the contents): off-canvas on a phone.
    if (!box.checkVisibility() || box.closest('.bd-sidebar-secondary, .bd-sidebar-primary'))
      continue;
    // In a box that scrolls sideways (a wide table), a reader scrolls to it: only that box
    // must not be cut.
    let scroller = null;  // the outermost such box
    for (let p = box.parentElement; p && p !== document.body; p = p.parentElement)
      if (scrolls(p)) scroller = p;
    if (scroller) {
      const cutScroller = cutBy(scroller);
      if (cutScroller) out.push(`its scrolling box is cut by ${cutScroller}`);
      continue;
    }
    const cut = cutBy(box);
    // MathJax 4 breaks a long inline formula into several boxes, one per line.
    const parts = box.querySelectorAll(':scope > mjx-linebox, :scope > mjx-math');
    const tex = (box.closest('.math') || box.parentElement || box).textContent
        .replace(/\\s+/g, ' ').trim().slice(0, 60);
    if (cut) { out.push(`cut by ${cut}: ${tex}`); continue; }
    for (const p of parts) {
      const r = p.getBoundingClientRect();
      if (r.right > innerWidth + 1 || r.left < -1) { out.push(`off the window: ${tex}`); break; }
    }
  }
  return out;
}"""
)

# What MathJax shows of a backslash: a TeX escape (\_ in \text{...} without textmacros) or an
# undefined macro, in the text of a token (mtext, mi, mo). [{text, tex}].
JS_MATH_BACKSLASHES = """() => {
  const mj = window.MathJax;
  const doc = mj && mj.startup && mj.startup.document;
  if (!doc || !doc.math) return null;
  const out = [];
  for (const item of doc.math) {
    const shown = [];
    item.root.walkTree(node => {
      if (node.isToken && typeof node.getText === 'function' && node.getText().includes('\\\\'))
        shown.push(node.getText());
    });
    if (shown.length) out.push({text: shown.join(' '), tex: String(item.math).slice(0, 80)});
  }
  return out;
}"""

# Figures in cell outputs: [{src, natural, shown, box, scrolls, cut}], widths in CSS px.
JS_FIGURES = (
    """() => {"""
    + JS_BOX_HELPERS
    + """
  return Array.from(document.querySelectorAll('div.cell_output img')).filter(
      img => img.checkVisibility()).map(img => {
    const box = img.parentElement;
    return {src: img.getAttribute('src') || '', natural: img.naturalWidth,
            shown: img.getBoundingClientRect().width,
            box: box ? box.clientWidth : 0,
            scrolls: !!box && scrolls(box) && box.scrollWidth > box.clientWidth + 1,
            cut: box && scrolls(box) ? cutBy(box) : cutBy(img)};
  });
}"""
)

# The first link of the page's contents (a section of this page), for the drawer check.
JS_CONTENTS_LINK = """(id) => {
  const d = document.getElementById(id);
  const links = d ? Array.from(d.querySelectorAll('a[href^="#"]'))
      .filter(a => a.checkVisibility() && a.getAttribute('href').length > 1) : [];
  const a = links[Math.min(1, links.length - 1)];
  return a ? a.getAttribute('href') : null;
}"""

JS_TARGET_IN_VIEW = """(hash) => {
  const t = document.getElementById(decodeURIComponent(hash.slice(1)));
  if (!t) return null;
  const r = t.getBoundingClientRect();
  return r.top >= -2 && r.top < innerHeight * 0.5;
}"""

# Scroll the worst instance of one kind of defect into view, for its screenshot.
JS_SHOW_WORST = """([kind, src]) => {
  const show = el => { if (el) el.scrollIntoView({block: 'center'}); return !!el; };
  const wider = el => el.checkVisibility() && el.scrollWidth > el.clientWidth + 1;
  if (kind === 'code') {
    const pres = Array.from(document.querySelectorAll('div.cell_input pre, div.cell_output pre'))
        .filter(wider)
        .sort((a, b) => (b.scrollWidth - b.clientWidth) - (a.scrollWidth - a.clientWidth));
    return show(pres[0]);
  }
  if (kind === 'equation')
    return show(Array.from(document.querySelectorAll('mjx-container[display="true"]'))
                .filter(wider).sort((a, b) => b.scrollWidth - a.scrollWidth)[0]);
  if (kind === 'figure')
    return show(Array.from(document.querySelectorAll('div.cell_output img'))
                .find(img => (img.getAttribute('src') || '') === src));
  if (kind === 'escape') {
    const doc = window.MathJax && MathJax.startup && MathJax.startup.document;
    for (const item of (doc ? doc.math : [])) {
      let found = false;
      item.root.walkTree(n => {
        if (n.isToken && n.getText && n.getText().includes('\\\\')) found = true;
      });
      if (found) return show(item.typesetRoot);
    }
    return false;
  }
  if (kind === 'inline')
    return show(Array.from(document.querySelectorAll('mjx-container:not([display="true"])'))
                .sort((a, b) => b.getBoundingClientRect().right
                                - a.getBoundingClientRect().right)[0]);
  return false;
}"""

# --------------------------------------------------------------------------------------
# Raw TeX left in the prose. Each pattern: (description, regex).
RAW_TEX = [
    ("display delimiter $$", re.compile(r"\$\$")),
    ("delimiter \\( or \\)", re.compile(r"\\[()]")),
    ("delimiter \\[ or \\]", re.compile(r"\\[\[\]]")),
    ("environment \\begin/\\end", re.compile(r"\\(?:begin|end)\{")),
    ("TeX command", re.compile(r"\\[A-Za-z]{2,}")),
    ("inline $...$", re.compile(r"(?<![\w$])\$[^\s$](?:[^$\n]{0,200}?[^\s$])?\$(?![\w$])")),
]


def machine_path_line(text: str) -> str | None:
    """The first line of `text` that shows a machine path (MACHINE_PATH), or None."""
    m = MACHINE_PATH.search(text)
    if m is None:
        return None
    return text[text.rfind("\n", 0, m.start()) + 1 :].split("\n", 1)[0].strip()[:160]


def raw_tex(text: str) -> list[str]:
    """Snippets of `text` that look like TeX the browser did not render."""
    flat = re.sub(r"\s+", " ", text)
    found, spans = [], []
    for what, rx in RAW_TEX:
        for m in rx.finditer(flat):
            if any(a - 20 <= m.start() < b + 20 for a, b in spans):
                continue  # one report per spot
            spans.append((m.start(), m.end()))
            a, b = max(0, m.start() - 30), min(len(flat), m.end() + 30)
            found.append(f"{what}: ...{flat[a:b]}...")
    return found


# --------------------------------------------------------------------------------------
# The table of contents.


@dataclass
class Toc:
    root: str
    pages: list[str]  # every docname in reading order, root first
    chapters: list[str]  # the top-level entries of the sidebar (not nested sections)


def _docname(entry: str) -> str:
    return re.sub(r"\.(md|ipynb|rst|myst)$", "", entry.strip().lstrip("/"))


def read_toc(path: Path) -> Toc:
    """Pages of a Jupyter Book 1 `_toc.yml` (format jb-book or jb-article)."""
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict) or "root" not in data:
        raise ValueError(f"{path}: no 'root' entry; is this a Jupyter Book _toc.yml?")
    root = _docname(data["root"])
    pages, chapters = [root], []

    def walk(items, top: bool) -> None:
        for item in items or []:
            if "glob" in item:
                raise ValueError(f"{path}: 'glob' entries are not supported by this check")
            if "file" in item:
                name = _docname(item["file"])
                pages.append(name)
                if top:
                    chapters.append(name)
            walk(item.get("sections"), top=False)
            walk(item.get("chapters"), top=top)  # a part's chapters

    if "parts" in data:
        for part in data["parts"] or []:
            walk(part.get("chapters"), top=True)
    walk(data.get("chapters"), top=True)
    walk(data.get("sections"), top=True)
    return Toc(root=root, pages=pages, chapters=chapters)


def find_toc(build: Path) -> Path | None:
    for d in [build, *build.resolve().parents]:
        if (d / "_toc.yml").is_file():
            return d / "_toc.yml"
    return None


# --------------------------------------------------------------------------------------
# Static scan: external URLs for scripts, stylesheets, fonts and images.

EXTERNAL = r"""(?:https?:)?//(?!127\.0\.0\.1|localhost)[^"'\s)]+"""
STATIC_PATTERNS = [
    ("script", re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"'](" + EXTERNAL + ")", re.I)),
    (
        "stylesheet/preload/icon",
        re.compile(
            r"<link\b(?=[^>]*\brel\s*=\s*[\"'][^\"']*(?:stylesheet|preload|icon|modulepreload))"
            r"[^>]*\bhref\s*=\s*[\"'](" + EXTERNAL + ")",
            re.I,
        ),
    ),
    ("image", re.compile(r"<(?:img|source)\b[^>]*\bsrc\s*=\s*[\"'](" + EXTERNAL + ")", re.I)),
    ("css url()", re.compile(r"url\(\s*[\"']?(" + EXTERNAL + ")", re.I)),
    ("css @import", re.compile(r"@import\s+[\"'](" + EXTERNAL + ")", re.I)),
]


def external_references(build: Path, pages: list[str] | None = None) -> list[str]:
    """'file: kind URL' for every external resource an HTML or CSS file of the build loads.

    `pages` (paths relative to `build`) limits the HTML files scanned; all CSS is scanned.
    """
    out = []
    html = [build / p for p in pages] if pages is not None else sorted(build.rglob("*.html"))
    files = html + sorted(build.rglob("*.css"))
    for f in files:
        text = f.read_text(errors="replace")
        if f.suffix == ".html":  # url() and @import only count inside <style> in HTML
            styles = " ".join(re.findall(r"<style\b[^>]*>(.*?)</style>", text, re.S | re.I))
        for kind, rx in STATIC_PATTERNS:
            source = styles if f.suffix == ".html" and kind.startswith("css") else text
            if f.suffix == ".css" and not kind.startswith("css"):
                continue
            for m in rx.finditer(source):
                out.append(f"{f.relative_to(build)}: {kind} {m.group(1)}")
    return sorted(set(out))


# --------------------------------------------------------------------------------------
# Static scan: the bibliography's labels and the citations that link to them.

CITATION_ENTRY = re.compile(
    r'<div class="citation" id="([^"]+)"[^>]*>\s*<span class="label">(.*?)<p>', re.S
)
LINK = re.compile(r"<a\b([^>]*)>(.*?)</a>", re.S)
AUTHOR_YEAR = re.compile(r"^(?P<authors>\D.*?), (?P<year>\d{4}[a-z]?)$")


def _text(html_fragment: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", html_fragment))).strip()


def citation_problems(build: Path, pages: list[str]) -> tuple[int, int, list[str]]:
    """(entries, citations, problems): every bibliography label must be author-year, and every
    citation in the text must show its entry's label, or that label's year or authors."""
    labels: dict[tuple[str, str], str] = {}  # (page, id) -> label
    texts = {p: (build / p).read_text(errors="replace") for p in pages}
    not_author_year, mismatched = [], []
    for page, text in texts.items():
        for ident, label_html in CITATION_ENTRY.findall(text):
            label = _text(label_html).strip("[] ")
            labels[(page, ident)] = label
            if not AUTHOR_YEAR.match(label):
                not_author_year.append(f"{page}#{ident}: [{label}]")
    n_citations = 0
    for page, text in texts.items():
        for attrs, inner in LINK.findall(text):
            href = re.search(r'\bhref="([^"]*)"', attrs)
            if not href or "doc-backlink" in attrs or "#" not in href.group(1):
                continue
            target, _, ident = href.group(1).partition("#")
            target = (Path(page).parent / target).as_posix() if target else page
            target = os.path.normpath(target)
            label = labels.get((target, ident))
            if label is None:
                continue
            n_citations += 1
            shown = _text(inner)
            m = AUTHOR_YEAR.match(label)
            allowed = {label} | ({m["year"], m["authors"]} if m else set())
            if shown not in allowed:
                mismatched.append(f"{page}: {shown!r} cites [{label}]")
    problems = []
    for what, items in [
        ("bibliography labels are not author-year (like 'Vaswani et al., 2017')", not_author_year),
        (
            "citations in the text do not show their entry's label (or its year or authors)",
            sorted(set(mismatched)),
        ),
    ]:
        if items:
            more = f" (and {len(items) - MAX_SHOWN} more)" if len(items) > MAX_SHOWN else ""
            problems.append(
                f"{len(items)} {what}{more}" + "".join(f"\n        {i}" for i in items[:MAX_SHOWN])
            )
    return len(labels), n_citations, problems


# --------------------------------------------------------------------------------------
# The local server.


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # no access log on stderr
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            super().handle_error(request, client_address)


class LocalServer:
    """Serves a folder on 127.0.0.1 on a free port, in a background thread."""

    def __init__(self, folder: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(folder))
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.origin = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> LocalServer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


# --------------------------------------------------------------------------------------
# One page.


@dataclass
class PageResult:
    path: str  # relative to the build, e.g. "book/warmup.html"
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    seconds: float = 0.0

    def fail(self, what: str, items: list[str] | None = None) -> None:
        if items is None:
            self.failures.append(what)
            return
        shown = items[:MAX_SHOWN]
        more = f" (and {len(items) - MAX_SHOWN} more)" if len(items) > MAX_SHOWN else ""
        self.failures.append(what + more + "".join(f"\n        {s}" for s in shown))


def page_docname(url: str, origin: str) -> str | None:
    """'book/warmup' for http://127.0.0.1:port/book/warmup.html#x; None if not a local page."""
    parts = urlsplit(url)
    if f"{parts.scheme}://{parts.netloc}" != origin:
        return None
    path = unquote(parts.path).lstrip("/")
    if path == "" or path.endswith("/"):
        path += "index.html"
    return path[: -len(".html")] if path.endswith(".html") else path


def benign(message: str, seen: set[str]) -> bool:
    """True (and remember why in `seen`) if `message` is a known harmless browser error."""
    for rx, why in KNOWN_BENIGN:
        if rx.search(message):
            seen.add(f"{message[:100]} ({why})")
            return True
    return False


def check_navigation(
    links: list[dict] | None, where: str, origin: str, docname: str, toc: Toc, res: PageResult
) -> str:
    """Check the site navigation's links (JS_SIDEBAR's answer); return 'linked/all' pages."""
    if links is None:
        res.fail(f"no site navigation (nav.bd-docs-nav) in {where}")
        return "-"
    targets: dict[str, list[dict]] = {}
    for a in links:
        name = page_docname(a["href"], origin)
        if name is not None:
            targets.setdefault(name, []).append(a)
    missing = [p for p in toc.pages if p not in targets]
    hidden = [c for c in toc.chapters if c in targets and not any(a["visible"] for a in targets[c])]
    if not links:
        res.fail(f"{where} has no links at all")
    if missing:
        res.fail(
            f"{where} does not link to {len(missing)} of the {len(toc.pages)} pages in _toc.yml",
            missing,
        )
    if hidden:
        res.fail(f"chapters linked but not visible in {where}", hidden)
    if (
        docname in toc.pages
        and docname != toc.root
        and docname in targets
        and not any(a["current"] for a in targets[docname])
    ):
        res.fail(f"{where} does not mark this page as the current one (stale build?)")
    return f"{len(toc.pages) - len(missing)}/{len(toc.pages)}"


def check_equations_and_errors(page, res: PageResult, width: str) -> None:
    """Display equations not clipped, error outputs wrapped (both widths; `width` names the
    narrow one in the messages)."""
    eqs = page.evaluate(JS_EQUATIONS)
    res.stats["equations" + width] = eqs["n"]
    res.stats["equations_scrolling" + width] = eqs["scrolling"]
    at = f" at {width} px" if width else ""
    if eqs["clipped"]:
        res.fail(
            f"{len(eqs['clipped'])} of {eqs['n']} display equations clipped{at}", eqs["clipped"]
        )
    unwrapped = page.evaluate(JS_UNWRAPPED_ERRORS)
    if unwrapped:
        res.fail(
            f"{len(unwrapped)} error output(s) do not wrap{at}: the end of the message is "
            "out of view",
            unwrapped,
        )


#: The smallest figure text a reader can read, in CSS px (at the width the page shows it).
MIN_FIGURE_TEXT_PX = 9.0
#: The PNG text chunk where minitransformer.plotting.show() stores a figure's smallest text.
FIGURE_TEXT_KEY = "minitransformer:smallest-text-px"


def smallest_text_px(image: Path) -> float | None:
    """The smallest text of a figure's PNG, in image pixels, as plotting.show() recorded it."""
    from PIL import Image

    try:
        with Image.open(image) as im:
            value = im.text.get(FIGURE_TEXT_KEY) if hasattr(im, "text") else None
    except OSError:
        return None
    try:
        return float(value) if value else None
    except ValueError:
        return None


def check_code_boxes(page, res: PageResult, width: str) -> None:
    """At desk width no code cell, code block or printed output is wider than its box; at
    phone width one may scroll inside its box, but none is clipped (a box that does not scroll,
    or an enclosing box that cuts it)."""
    boxes = page.evaluate(JS_CODE_BOXES)
    at = f" at {width} px" if width else ""
    clipped = [
        f"{b['kind']}: "
        + (
            f"cut by {b['cut']}"
            if b["cut"]
            else f"{b['px']} px hidden, and its box does not scroll"
        )
        + f": {b['line']}"
        for b in boxes
        if b["cut"] or not b["scrolls"]
    ]
    if clipped:
        res.fail(f"{len(clipped)} code or output boxes clipped{at}", clipped)
    if not width:
        wide = [
            f"{b['kind']} {b['px']} px wider than its {b['box']} px box "
            f"({b['chars']} characters): {b['line']}"
            for b in boxes
            if not b["cut"]
        ]
        res.stats["code_overflow"] = len(wide)
        res.stats["code_overflow_inputs"] = sum(
            1 for b in boxes if not b["cut"] and b["kind"] != "output"
        )
        res.stats["code_overflow_px"] = max((b["px"] for b in boxes), default=0)
        if wide:
            res.fail(
                f"{len(wide)} code cells or outputs scroll sideways at desk width "
                "(format code to 76 columns, print shorter lines)",
                wide,
            )


def check_inline_math(page, res: PageResult, width: str) -> None:
    """No inline formula is cut by the window or by an enclosing box."""
    cut = page.evaluate(JS_INLINE_MATH)
    res.stats["inline_clipped" + width] = len(cut)
    if cut:
        at = f" at {width} px" if width else ""
        res.fail(f"{len(cut)} inline formulas clipped{at}", cut)


def check_math_backslashes(page, res: PageResult) -> None:
    """No formula shows a backslash: a TeX escape that MathJax printed as it is (\\_ in a
    \\text{...}), or a macro it does not know. JupyterLab renders these differently."""
    found = page.evaluate(JS_MATH_BACKSLASHES)
    if found is None:
        return
    res.stats["tex_escapes"] = len(found)
    if found:
        res.fail(
            f"{len(found)} formulas show a backslash (a TeX escape rendered as it is: write "
            "\\text{warmup steps}, not \\text{warmup\\_steps})",
            [f"shows {f['text']!r} in {f['tex']}" for f in found],
        )


def check_figures(page, res: PageResult, build: Path, rel: str, width: str) -> None:
    """Every figure of a cell output shows its smallest text at MIN_FIGURE_TEXT_PX or more
    (the size plotting.show() recorded in the PNG, times the scale the page shows it at), and
    a figure that is wider than its box scrolls inside it."""
    small, unknown, cut, sizes = [], [], [], []
    for fig in page.evaluate(JS_FIGURES):
        src = fig["src"].split("?")[0]
        if not src or src.startswith("data:") or not fig["natural"]:
            continue
        path = (build / Path(rel).parent / unquote(src)).resolve()
        px = smallest_text_px(path)
        if px is None:
            unknown.append(src)
            continue
        shown = px * fig["shown"] / fig["natural"]
        if not sizes or shown < min(sizes):
            res.stats["figure_text_min_src" + width] = fig["src"]
        sizes.append(shown)
        if shown < MIN_FIGURE_TEXT_PX - 0.05:
            small.append(
                f"{Path(src).name}: smallest text {shown:.1f} px (the image is shown at "
                f"{fig['shown']:.0f} of its {fig['natural']} px)"
            )
        if fig["cut"]:
            cut.append(f"{Path(src).name}: cut by {fig['cut']}")
    at = f" at {width} px" if width else ""
    res.stats["figure_text_min" + width] = min(sizes) if sizes else None
    res.stats["figures_small" + width] = len(small)
    if small:
        res.fail(
            f"{len(small)} figures show text smaller than {MIN_FIGURE_TEXT_PX:g} px{at}", small
        )
    if unknown:
        res.fail(
            f"{len(unknown)} figures record no text size (draw them with "
            "minitransformer.plotting and show them with plotting.show)",
            unknown,
        )
    if cut:
        res.fail(f"{len(cut)} figures clipped{at}", cut)


def check_contents_drawer(page, res: PageResult, width: str) -> None:
    """At phone width, a tap on a section in the page's contents closes the drawer and shows
    that section."""
    dialog = "pst-secondary-sidebar-modal"
    href = page.evaluate(JS_CONTENTS_LINK, dialog)
    if href is None:
        return
    page.locator(f'#{dialog} a[href="{href}"]').first.click()
    page.wait_for_timeout(500)
    if page.evaluate(JS_DIALOG_OPEN, dialog):
        res.fail(f"at {width} px the page's contents stay open after a tap on {href}")
        page.keyboard.press("Escape")
        return
    res.stats["drawer"] = "closes"
    if page.evaluate(JS_TARGET_IN_VIEW, href) is False:
        res.fail(f"at {width} px a tap on {href} in the contents does not show that section")


# The screenshots of the worst page of each kind: (file name, what, the page's stat, which
# end is worst, the width, the JS_SHOW_WORST kind).
WORST = [
    (
        "worst-code-desk",
        "code wider than its box at 1280 px",
        "code_overflow_px",
        max,
        "desk",
        "code",
    ),
    (
        "worst-equation-phone",
        "display equations that scroll at 390 px",
        "equations_scrolling390",
        max,
        "phone",
        "equation",
    ),
    (
        "worst-inline-math-phone",
        "inline formulas clipped at 390 px",
        "inline_clipped390",
        max,
        "phone",
        "inline",
    ),
    (
        "worst-figure-text-phone",
        "the smallest figure text at 390 px",
        "figure_text_min390",
        min,
        "phone",
        "figure",
    ),
    ("worst-tex-escapes", "formulas that show a backslash", "tex_escapes", max, "desk", "escape"),
]


def shoot_worst(
    contexts: dict, origin: str, results: list[PageResult], shots: Path, args
) -> list[str]:
    """A screenshot of the worst page of each kind of WORST, its worst instance in view.
    Returns one line per screenshot taken."""
    lines = []
    for name, what, stat, worst, width, kind in WORST:
        scored = [(r.stats[stat], r) for r in results if r.stats.get(stat) is not None]
        if not scored:
            continue
        value, res = worst(scored, key=lambda pair: pair[0])
        page = contexts[width].new_page()
        page.set_default_timeout(args.timeout * 1000)
        try:
            page.goto(f"{origin}/{res.path}", wait_until="load")
            page.evaluate(JS_FONTS_READY, int(args.timeout * 1000))
            page.evaluate(JS_MATHJAX_READY, int(args.timeout * 1000))
            page.evaluate(JS_IMAGES)
            page.wait_for_timeout(300)
            page.evaluate(JS_SHOW_WORST, [kind, res.stats.get("figure_text_min_src390", "")])
            page.wait_for_timeout(300)
            page.screenshot(path=str(shots / f"{name}.png"))
            shown = f"{value:.1f}" if isinstance(value, float) else str(value)
            lines.append(f"{name}.png: {what}, worst on {res.path} ({shown})")
        except Exception as exc:
            lines.append(f"{name}.png: not taken ({type(exc).__name__})")
        finally:
            page.close()
    return lines


def open_dialog(page, button, dialog: str, failure: str, res: PageResult) -> bool:
    """Click `button`; True if the <dialog id=`dialog`> opened, else record `failure`."""
    button.click()
    try:
        page.wait_for_function(JS_DIALOG_OPEN, arg=dialog, timeout=3000)
    except Exception:
        res.fail(failure)
        return False
    page.wait_for_timeout(300)  # the dialog's opening transition
    return True


def close_dialog(page, dialog: str, failure: str, res: PageResult) -> None:
    """Press Escape; record `failure` if the <dialog id=`dialog`> stays open."""
    page.keyboard.press("Escape")
    if page.evaluate(JS_DIALOG_OPEN, dialog):
        res.fail(failure)


def report(tool: str, what: str, results: list[PageResult], book_failures: list[str]) -> int:
    """Print the verdict and every failure; return the exit status (0 passed, 1 failed)."""
    n_failed = sum(1 for r in results if r.failures)
    if not n_failed and not book_failures:
        print(f"{tool}: all checks passed.")
        return 0
    print(f"\n{tool}: FAILED ({n_failed} {what}, {len(book_failures)} book-wide problems)")
    for r in results:
        for f in r.failures:
            print(f"  {r.path}: {f}")
    for f in book_failures:
        print(f"  book: {f}")
    return 1


def check_phone(
    context,
    origin: str,
    rel: str,
    toc: Toc,
    shots: Path | None,
    args,
    known: set[str],
    res: PageResult,
) -> None:
    """The checks at phone width (see the module docstring), added to `res`."""
    docname = rel[: -len(".html")]
    width = str(PHONE_VIEWPORT["width"])
    page = context.new_page()
    page.set_default_timeout(args.timeout * 1000)
    js_errors: list[str] = []
    page.on("pageerror", lambda e: js_errors.append(str(e).splitlines()[0][:200]))
    try:
        page.goto(f"{origin}/{rel}", wait_until="load")
        ms = int(args.timeout * 1000)
        page.evaluate(JS_FONTS_READY, ms)
        page.evaluate(JS_MATHJAX_READY, ms)
        page.evaluate(JS_IMAGES)  # wait for the images: they set the page's width

        sideways = page.evaluate(JS_PAGE_WIDTH)
        res.stats["phone_width"] = sideways["width"]
        if sideways["width"] > sideways["innerWidth"] + 1:
            res.fail(
                f"at {width} px the page scrolls sideways: it is {sideways['width']} px wide",
                sideways["culprits"],
            )
        check_equations_and_errors(page, res, width)
        check_code_boxes(page, res, width)
        check_inline_math(page, res, width)
        check_figures(page, res, args.build, rel, width)
        if shots is not None:
            page.screenshot(
                path=str(shots / (docname.replace("/", "-") + "-phone.png")), full_page=True
            )

        # The site navigation: the visible ☰ button must open it, Escape close it.
        toggle = page.locator(".primary-toggle:visible")
        if toggle.count() == 0:
            res.fail(f"at {width} px there is no visible site-navigation button (☰)")
        elif open_dialog(
            page,
            toggle.first,
            "pst-primary-sidebar-modal",
            f"at {width} px the site-navigation button (☰) does not open the navigation",
            res,
        ):
            res.stats["phone_nav"] = check_navigation(
                page.evaluate(JS_SIDEBAR),
                f"the navigation at {width} px",
                origin,
                docname,
                toc,
                res,
            )
            if shots is not None and docname == toc.root:
                page.screenshot(path=str(shots / (docname.replace("/", "-") + "-phone-nav.png")))
            close_dialog(
                page,
                "pst-primary-sidebar-modal",
                f"at {width} px Escape does not close the navigation",
                res,
            )

        # The page's contents, where the page has some.
        contents = page.locator(".secondary-toggle:visible")
        has_toc = page.evaluate("() => !!document.querySelector('#pst-secondary-sidebar a[href]')")
        if has_toc and contents.count() == 0:
            res.fail(f"at {width} px the page has contents but no visible button to show them")
        elif contents.count() and open_dialog(
            page,
            contents.first,
            "pst-secondary-sidebar-modal",
            f"at {width} px the contents button does not open the page's contents",
            res,
        ):
            if not page.evaluate(JS_DIALOG_LINKS, "pst-secondary-sidebar-modal"):
                res.fail(f"at {width} px the page's contents open empty")
            close_dialog(
                page,
                "pst-secondary-sidebar-modal",
                f"at {width} px Escape does not close the page's contents",
                res,
            )
            if open_dialog(
                page,
                contents.first,
                "pst-secondary-sidebar-modal",
                f"at {width} px the contents button does not open the contents a second time",
                res,
            ):
                check_contents_drawer(page, res, width)

        js_errors = [e for e in js_errors if not benign(e, known)]
        if js_errors:
            res.fail(f"{len(js_errors)} JavaScript error(s) at {width} px", js_errors)
    except Exception as exc:
        res.fail(
            f"could not check the page at {width} px: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        )
    finally:
        page.close()


def check_page(
    context, origin: str, rel: str, toc: Toc, shots: Path | None, args, known: set[str]
) -> PageResult:
    res = PageResult(rel)
    t0 = time.perf_counter()
    docname = rel[: -len(".html")]
    page = context.new_page()
    page.set_default_timeout(args.timeout * 1000)
    js_errors: list[str] = []
    console_errors: list[str] = []
    bad_responses: list[str] = []
    failed_requests: list[str] = []
    page.on("pageerror", lambda e: js_errors.append(str(e).splitlines()[0][:200]))
    page.on("console", lambda m: console_errors.append(m.text[:200]) if m.type == "error" else None)
    page.on(
        "response",
        lambda r: (
            bad_responses.append(f"HTTP {r.status} {r.url}")
            if r.status >= 400 and r.url.startswith(origin)
            else None
        ),
    )
    page.on(
        "requestfailed",
        lambda r: (
            failed_requests.append(f"{r.failure} {r.url}") if r.url.startswith(origin) else None
        ),
    )
    try:
        page.goto(f"{origin}/{rel}", wait_until="load")
        ms = int(args.timeout * 1000)
        if page.evaluate(JS_FONTS_READY, ms) != "ready":
            res.fail(f"web fonts still loading after {args.timeout:g} s")

        # Math.
        mathjax = page.evaluate(JS_MATHJAX_READY, ms)
        math = page.evaluate(JS_MATH)
        res.stats["math"] = math["n_math"]
        if mathjax == "timeout":
            res.fail(f"MathJax did not finish typesetting within {args.timeout:g} s")
        elif math["n_math"] and mathjax != "ready":
            res.fail(
                f"{math['n_math']} math elements but MathJax did not load "
                "(blocked CDN? missing _static/mathjax?)"
            )
        elif math["untypeset"]:
            res.fail(
                f"{len(math['untypeset'])} of {math['n_math']} math elements were not "
                "typeset by MathJax",
                math["untypeset"],
            )
        if math["errors"]:
            res.fail(f"MathJax reported {len(math['errors'])} TeX error(s)", math["errors"])
        res.stats["mathjax"] = mathjax
        tex = raw_tex(page.evaluate(JS_PROSE_TEXT))
        if tex:
            res.fail(f"raw TeX left in the page text ({len(tex)})", tex)

        # Images and figures.
        imgs = page.evaluate(JS_IMAGES)
        broken = [
            f"{i['src']!r} (alt {i['alt']!r}, complete={i['complete']}, naturalWidth={i['width']})"
            for i in imgs["images"]
            if not (i["complete"] and i["width"] > 0)
        ]
        res.stats["images"] = len(imgs["images"])
        if broken:
            res.fail(f"{len(broken)} of {len(imgs['images'])} images did not load", broken)
        no_alt = [
            f"{i['src'][:80]!r} (alt {i['alt'][:80]!r})"
            for i in imgs["images"]
            if not i["alt"].strip() or FILE_NAME_ALT.search(i["alt"].strip())
        ]
        if no_alt:
            res.fail(
                f"{len(no_alt)} of {len(imgs['images'])} images have no alt text but a file name "
                "(or nothing): give the figure's caption cell an :alt:",
                no_alt,
            )
        if imgs["empty_figures"]:
            res.fail("figures with no image", imgs["empty_figures"])

        # Cell errors.
        cells = page.evaluate(JS_CELL_ERRORS)
        unexpected = [
            f"[{e['kind']}] {e['line']}"
            + (f"  (tags: {', '.join(e['tags'])})" if e["tags"] else "")
            for e in cells["errors"]
            if not e["allowed"]
        ]
        res.stats["errors_allowed"] = sum(e["allowed"] for e in cells["errors"])
        if unexpected:
            res.fail(
                f"{len(unexpected)} cell error output(s) in cells not tagged raises-exception",
                unexpected,
            )
        if cells["silent"]:
            res.fail(
                f"{len(cells['silent'])} cell(s) tagged raises-exception show no error",
                cells["silent"],
            )
        for line in cells["stderr"]:
            res.notes.append(f"stderr output: {line}")
        paths = [line for line in map(machine_path_line, page.evaluate(JS_OUTPUT_TEXTS)) if line]
        if paths:
            res.fail(
                f"{len(paths)} cell output(s) show a machine path (print the error's message "
                "instead of its traceback)",
                paths,
            )

        # The favicon.
        icons = page.evaluate(JS_FAVICON)
        if not icons:
            res.fail('no favicon (<link rel="icon">): the browser asks for /favicon.ico')
        for url in icons:
            response = context.request.get(url)
            if response.status != 200 or not response.body():
                res.fail(f"the favicon {url} does not load (HTTP {response.status})")

        check_equations_and_errors(page, res, "")
        check_code_boxes(page, res, "")
        check_inline_math(page, res, "")
        check_math_backslashes(page, res)
        check_figures(page, res, args.build, rel, "")

        # Sidebar.
        res.stats["sidebar"] = check_navigation(
            page.evaluate(JS_SIDEBAR), "the sidebar", origin, docname, toc, res
        )

        # Solutions, as the page opens.
        sols = page.evaluate(JS_SOLUTIONS)
        res.stats["solutions"] = len(sols)
        for s in sols:
            label = f"{s['title'] or 'solution'} (#{s['id'] or s['index'] + 1})"
            if "dropdown" not in s["classes"].split():
                res.fail(f"solution not a dropdown (add ':class: dropdown'): {label}")
            elif s["n_body"] == 0:
                res.fail(f"solution has no body: {label}")
            elif s["n_shown"]:
                res.fail(
                    f"solution visible when the page opens ({s['n_shown']} of "
                    f"{s['n_body']} parts shown; is sphinx-togglebutton loaded?): {label}"
                )

        if shots is not None:
            shot = shots / (rel[: -len(".html")].replace("/", "-") + ".png")
            page.screenshot(path=str(shot), full_page=True)

        # Clicking a solution's title must reveal it.
        if not args.no_click:
            for s in sols:
                if not s["id"] or "dropdown" not in s["classes"].split() or not s["has_title"]:
                    continue
                label = f"{s['title'] or 'solution'} (#{s['id']})"
                # The toggle button (the chevron) that sphinx-togglebutton puts in the title.
                # Not the title's centre: sphinx-exercise makes part of the title a link to
                # the exercise, and a click there follows the link instead.
                button = page.locator(f'[id="{s["id"]}"] > .admonition-title > .toggle-button')
                if button.count() != 1:
                    res.fail(
                        f"solution has no toggle button (sphinx-togglebutton not active?): {label}"
                    )
                    continue
                button.click()
                try:
                    page.wait_for_function(JS_SOLUTION_SHOWN, arg=s["id"], timeout=3000)
                except Exception:
                    res.fail(f"clicking the solution's toggle button does not reveal it: {label}")
                else:
                    button.click()  # collapse it again

        # The search page must find something offline (Sphinx's searchindex.js is local).
        if rel == "search.html" and args.search_word:
            page.goto(f"{origin}/search.html?q={args.search_word}", wait_until="load")
            try:
                page.wait_for_function(
                    "() => document.querySelectorAll('#search-results ul.search li').length > 0",
                    timeout=15000,
                )
                res.stats["search"] = page.evaluate(
                    "() => document.querySelectorAll('#search-results ul.search li').length"
                )
            except Exception:
                res.fail(
                    f"searching for {args.search_word!r} (a word of the root page's title) "
                    "finds nothing"
                )

        # Loading problems (collected by the listeners above).
        js_errors = [e for e in js_errors if not benign(e, known)]
        console_errors = [e for e in console_errors if not benign(e, known)]
        if js_errors:
            res.fail(f"{len(js_errors)} JavaScript error(s)", js_errors)
        if bad_responses or failed_requests:
            res.fail("local requests that failed", sorted(set(bad_responses + failed_requests)))
        other_console = [c for c in console_errors if "Failed to load resource" not in c]
        if other_console:
            res.fail(f"{len(other_console)} console error(s)", other_console)
    except Exception as exc:  # a timeout or a crash: report it, go on with the next page
        res.fail(f"could not check the page: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    finally:
        page.close()
        res.seconds = time.perf_counter() - t0
    return res


# --------------------------------------------------------------------------------------


def local_only(origin: str, blocked: dict[str, set[str]], current: dict[str, str]):
    """A Playwright route handler that lets through requests to `origin` (and data:, blob:,
    about: URLs) and aborts any other, recording it in `blocked` with current["page"]."""

    def gate(route, request) -> None:
        url = request.url
        if url.startswith(origin + "/") or url.startswith(("data:", "blob:", "about:")):
            route.continue_()
        else:
            blocked.setdefault(url, set()).add(current["page"])
            route.abort("blockedbyclient")

    return gate


def empty_folder(folder: Path | None) -> None:
    """Create `folder` for screenshots, or remove the PNGs of a previous run from it."""
    if folder is not None:
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("*.png"):
            old.unlink()


def html_pages(build: Path) -> list[str]:
    out = []
    for f in build.rglob("*.html"):
        rel = f.relative_to(build)
        if rel.parts[0] in ASSET_DIRS or any(p.startswith(".") for p in rel.parts):
            continue
        out.append(rel.as_posix())
    return out


def find_chromium(explicit: str | None) -> str | None:
    for c in [
        explicit,
        os.environ.get("CHROMIUM"),
        shutil.which("chromium"),
        shutil.which("chromium-browser"),
        "/usr/bin/chromium",
    ]:
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("build", type=Path, help="the built HTML book, e.g. _build/html")
    ap.add_argument("--screenshots", type=Path, help="save a full-page PNG of each page here")
    ap.add_argument("--toc", type=Path, help="_toc.yml (default: found above the build folder)")
    ap.add_argument("--chromium", help="Chromium executable (default: chromium on PATH)")
    ap.add_argument(
        "--page",
        action="append",
        default=[],
        help="check only pages whose path contains this (repeatable); "
        "skips the book-wide minimum counts",
    )
    ap.add_argument("--timeout", type=float, default=60, help="seconds per page step (default 60)")
    ap.add_argument("--no-click", action="store_true", help="do not click solutions open")
    ap.add_argument("--json", type=Path, help="write each page's counts and failures here")
    ap.add_argument(
        "--min-solutions",
        type=int,
        default=1,
        help="fail if the book has fewer collapsed solutions (default 1)",
    )
    ap.add_argument(
        "--min-math-pages",
        type=int,
        default=1,
        help="fail if fewer pages have rendered math (default 1)",
    )
    ap.add_argument(
        "--min-images",
        type=int,
        default=1,
        help="fail if the whole book has fewer images (default 1: its figures)",
    )
    ap.add_argument(
        "--min-equations",
        type=int,
        default=1,
        help="fail if the whole book has fewer display equations (default 1)",
    )
    ap.add_argument(
        "--min-citations",
        type=int,
        default=1,
        help="fail if the whole book has fewer bibliography entries or citations (default 1)",
    )
    args = ap.parse_args(argv)

    build = args.build
    if not (build / "index.html").is_file():
        print(f"check_html: no built book at {build} (no index.html): run 'make book' first.")
        return 2
    toc_path = args.toc or find_toc(build)
    if toc_path is None or not toc_path.is_file():
        print(f"check_html: no _toc.yml found above {build}; pass --toc.")
        return 2
    toc = read_toc(toc_path)
    chromium = find_chromium(args.chromium)
    if chromium is None:
        print("check_html: no Chromium found: apt-get install chromium (or pass --chromium).")
        return 2
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print(
            "check_html: the playwright Python package is missing: pip install -r requirements.txt"
        )
        return 2

    book_failures: list[str] = []
    pages = html_pages(build)
    missing = [f"{p}.html" for p in toc.pages if not (build / f"{p}.html").is_file()]
    if missing:
        book_failures.append("pages of _toc.yml missing from the build: " + ", ".join(missing))
    index = (build / "index.html").read_text(errors="replace")
    if f"{toc.root}.html" not in index and toc.root != "index":
        book_failures.append(f"index.html does not lead to the root page {toc.root}.html")
    # Reading order: the toc's pages first, then the rest (genindex, search, ...).
    order = {f"{p}.html": i for i, p in enumerate(toc.pages)}
    pages = sorted(
        (p for p in pages if p != "index.html" or toc.root == "index"),
        key=lambda p: (order.get(p, len(order)), p),
    )
    if args.page:
        pages = [p for p in pages if any(s in p for s in args.page)]
        if not pages:
            print(f"check_html: no page matches {args.page}")
            return 2
    # A word the search page must find: the longest one in the root page's title.
    h1 = re.search(
        r"<h1[^>]*>(.*?)</h1>",
        (build / f"{toc.root}.html").read_text(errors="replace")
        if (build / f"{toc.root}.html").is_file()
        else "",
        re.S,
    )
    words = re.findall(r"[A-Za-z]{4,}", re.sub(r"<[^>]+>", " ", h1.group(1)) if h1 else "")
    args.search_word = max(words, key=len) if words else None
    for ref in external_references(build, pages if args.page else None):
        book_failures.append(f"external resource (needs the network): {ref}")
    n_entries, n_citations, problems = citation_problems(build, html_pages(build))
    book_failures += problems

    shots = args.screenshots
    empty_folder(shots)

    t0 = time.perf_counter()
    blocked: dict[str, set[str]] = {}
    results: list[PageResult] = []
    known: set[str] = set()  # known harmless browser errors seen
    with LocalServer(build) as server, sync_playwright() as pw:
        try:
            browser = pw.chromium.launch(
                executable_path=chromium, headless=True, args=CHROMIUM_ARGS
            )
        except Exception as exc:
            print(f"check_html: could not start {chromium}: {str(exc).strip()[:2000]}")
            return 2
        version = browser.version
        context = browser.new_context(
            viewport=VIEWPORT, device_scale_factor=1, service_workers="block"
        )
        phone = browser.new_context(
            viewport=PHONE_VIEWPORT, device_scale_factor=1, service_workers="block"
        )
        current = {"page": ""}
        gate = local_only(server.origin, blocked, current)
        context.route("**/*", gate)
        phone.route("**/*", gate)
        print(
            f"check_html: {len(pages)} pages of {build} served at {server.origin}, "
            f"Chromium {version}, network blocked; toc {toc_path} lists {len(toc.pages)} pages"
        )
        for rel in pages:
            current["page"] = rel
            t_page = time.perf_counter()
            r = check_page(context, server.origin, rel, toc, shots, args, known)
            check_phone(phone, server.origin, rel, toc, shots, args, known, r)
            r.seconds = time.perf_counter() - t_page
            results.append(r)
            s = r.stats
            print(
                f"  {'PASS' if not r.failures else 'FAIL'}  {rel:<28} "
                f"math {s.get('math', '-'):>3}  "
                f"images {s.get('images', '-'):>2}  solutions {s.get('solutions', '-'):>2}  "
                f"expected errors {s.get('errors_allowed', '-'):>2}  "
                f"sidebar {s.get('sidebar', '-'):>5}  "
                f"equations {s.get('equations', '-'):>2} "
                f"({s.get('equations_scrolling390', '-')} scroll at 390)  "
                f"phone {s.get('phone_width', '-')} px, nav {s.get('phone_nav', '-')}  "
                f"{r.seconds:5.1f} s"
                + (
                    f"  (search {args.search_word!r}: {s['search']} results)"
                    if "search" in s
                    else ""
                ),
                flush=True,
            )
            for n in r.notes:
                print(f"        note: {n}")
        if shots is not None:
            for line in shoot_worst(
                {"desk": context, "phone": phone}, server.origin, results, shots, args
            ):
                print(f"check_html: {line}")
        context.close()
        phone.close()
        browser.close()

    for url, where in sorted(blocked.items()):
        book_failures.append(
            f"request to the network blocked: {url} (from {', '.join(sorted(where))})"
        )
    n_solutions = sum(r.stats.get("solutions", 0) for r in results)
    n_math_pages = sum(1 for r in results if r.stats.get("math", 0) > 0)
    n_images = sum(r.stats.get("images", 0) for r in results)
    n_equations = sum(r.stats.get("equations", 0) for r in results)
    if not args.page:
        if n_solutions < args.min_solutions:
            book_failures.append(
                f"found {n_solutions} solutions in the whole book, expected at "
                f"least {args.min_solutions}: is the check still finding them?"
            )
        if n_images < args.min_images:
            book_failures.append(
                f"found {n_images} images in the whole book, expected at least "
                f"{args.min_images} (its figures): is the check still finding them?"
            )
        if n_math_pages < args.min_math_pages:
            book_failures.append(
                f"found math on {n_math_pages} pages, expected at least "
                f"{args.min_math_pages}: is the check still finding it?"
            )
        if n_equations < args.min_equations:
            book_failures.append(
                f"found {n_equations} display equations, expected at least "
                f"{args.min_equations}: is the check still finding them?"
            )
        if min(n_entries, n_citations) < args.min_citations:
            book_failures.append(
                f"found {n_entries} bibliography entries and {n_citations} citations "
                f"linking to them, expected at least {args.min_citations} of each: "
                "is the check still finding them?"
            )
    for k in sorted(known):
        print(f"check_html: ignored a known harmless browser error: {k}")
    print(
        f"check_html: {len(results)} pages in {time.perf_counter() - t0:.1f} s; "
        f"{n_images} images, {n_solutions} solutions, "
        f"math on {n_math_pages} pages, {n_equations} display equations, "
        f"{n_entries} bibliography entries cited {n_citations} times, "
        f"{sum(r.stats.get('errors_allowed', 0) for r in results)} expected error outputs"
        + (f"; screenshots in {shots}" if shots else "")
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                [{"page": r.path, "stats": r.stats, "failures": r.failures} for r in results],
                indent=1,
            )
        )
    return report("check_html", "pages", results, book_failures)


if __name__ == "__main__":
    sys.exit(main())
