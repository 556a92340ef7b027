"""The one plotting module every chapter uses, so that all figures look alike.

Chapters call these helpers instead of styling matplotlib themselves. Each helper draws on an
``Axes`` it is given (or makes a figure) and returns what it drew, so a notebook cell can end
with ``plt.show()`` and nothing with a memory address is printed.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

__all__ = [
    "STYLE",
    "COLORS",
    "use_style",
    "figure",
    "heatmap",
    "attention_heatmaps",
    "mask_heatmap",
    "line_plot",
    "theory_vs_measurement",
    "show",
    "glue_figure",
]

STYLE = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "figure.figsize": (6.4, 3.6),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "legend.fontsize": 9,
    "font.size": 10,
    "image.cmap": "viridis",
}

#: One colour per role, so that "measured" or "scaled" look the same in every chapter.
COLORS = {
    "measured": "#1f77b4",  # blue
    "theory": "#222222",  # near-black, dashed
    "second": "#d62728",  # red: the variant being compared (e.g. "without scaling")
    "third": "#2ca02c",  # green
    "fourth": "#9467bd",  # purple
}
_CYCLE = [COLORS["measured"], COLORS["second"], COLORS["third"], COLORS["fourth"], "#ff7f0e", "#8c564b"]


def use_style() -> None:
    """Apply the course style to matplotlib (chapters call this once, at the top)."""
    plt.rcParams.update(STYLE)


def figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 3.6, **kwargs):
    """A new figure with ``nrows x ncols`` axes in the course style; returns ``(fig, axes)``."""
    use_style()
    return plt.subplots(nrows, ncols, figsize=(width, height), constrained_layout=True, **kwargs)


def _label(ax, title: str | None, xlabel: str | None, ylabel: str | None) -> None:
    """Set whichever of the title and axis labels are given."""
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)


def heatmap(
    ax,
    matrix,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    cmap: str = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar: bool = True,
    fmt: str = "{:.2f}",
):
    """Draw ``matrix`` (a 2-D array or tensor) as a heatmap on ``ax``; returns the image.

    Rows are drawn top to bottom, as in the printed matrix (row = query, column = key for
    attention weights). ``annotate`` writes each value into its cell (for small matrices).
    """
    m = np.asarray(matrix.detach().cpu() if hasattr(matrix, "detach") else matrix, dtype=float)
    if m.ndim != 2:
        raise ValueError(f"heatmap needs a 2-D matrix, got shape {m.shape}")
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.grid(False)
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), labels=list(xlabels))
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), labels=list(ylabels))
    _label(ax, title, xlabel, ylabel)
    if annotate:
        lo, hi = np.nanmin(m), np.nanmax(m)
        mid = (lo + hi) / 2
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(j, i, fmt.format(m[i, j]), ha="center", va="center", fontsize=8,
                        color="white" if m[i, j] < mid else "black")
    if colorbar:
        ax.figure.colorbar(im, ax=ax, shrink=0.8)
    return im


def attention_heatmaps(
    weights,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
    width_per_map: float = 2.6,
):
    """One heatmap per head for weights of shape ``(h, T, S)`` (or one map for ``(T, S)``).

    Returns ``(fig, axes)``. Colour runs from 0 to 1, the range of attention weights.
    """
    w = np.asarray(weights.detach().cpu() if hasattr(weights, "detach") else weights, dtype=float)
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3:
        raise ValueError(f"attention_heatmaps needs (h, T, S) or (T, S), got shape {w.shape}")
    h = w.shape[0]
    fig, axes = figure(ncols=h, width=width_per_map * h + 0.8, height=2.8)
    axes = np.atleast_1d(axes)
    for i, ax in enumerate(axes):
        im = heatmap(ax, w[i], xlabels, ylabels if i == 0 else None, vmin=0.0, vmax=1.0,
                     title=titles[i] if titles else (f"head {i}" if h > 1 else None),
                     colorbar=False)
        if i:
            ax.set_yticks([])
    fig.colorbar(im, ax=list(axes), shrink=0.8)
    if suptitle:
        fig.suptitle(suptitle)
    return fig, axes


def mask_heatmap(
    ax,
    mask,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    title: str | None = None,
    xlabel: str | None = "key position",
    ylabel: str | None = "query position",
):
    """Draw a boolean ``(T, S)`` mask: dark = may attend (True), light = blocked (False).

    The cells show "1" / "0" when the mask is small enough to read. Returns the image.
    """
    m = np.asarray(mask.detach().cpu() if hasattr(mask, "detach") else mask)
    if m.ndim != 2:
        raise ValueError(f"mask_heatmap needs a 2-D (T, S) mask, got shape {m.shape}")
    if m.dtype != bool:
        raise ValueError(f"mask_heatmap needs a boolean mask (True = may attend), got dtype {m.dtype}")
    from matplotlib.colors import ListedColormap

    im = heatmap(ax, m.astype(float), xlabels, ylabels, title=title, xlabel=xlabel, ylabel=ylabel,
                 cmap=ListedColormap(["#eeeeee", COLORS["measured"]]), vmin=0.0, vmax=1.0,
                 colorbar=False)
    if m.size <= 144:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(j, i, "1" if m[i, j] else "0", ha="center", va="center", fontsize=8,
                        color="white" if m[i, j] else "#777777")
    return im


def _as_array(values) -> np.ndarray:
    return np.asarray(values.detach().cpu() if hasattr(values, "detach") else values, dtype=float)


def line_plot(
    ax,
    x,
    series,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    logx: bool = False,
    logy: bool = False,
    markers: bool = True,
    legend: bool = True,
):
    """Plot several curves over the same ``x`` on ``ax``: ``series`` maps label -> y values.

    Colours follow :data:`COLORS` in order (first curve blue, second red, ...). A value of
    ``series`` may also be a dict of matplotlib keyword arguments with the data under ``"y"``
    (e.g. ``{"y": ys, "linestyle": "--"}``). Returns the list of lines.
    """
    xs = _as_array(x)
    lines = []
    for i, (label, ys) in enumerate(series.items()):
        kwargs = {"color": _CYCLE[i % len(_CYCLE)], "marker": "o" if markers else None,
                  "markersize": 4, "linewidth": 1.5}
        if isinstance(ys, dict):
            ys = dict(ys)
            kwargs.update({k: v for k, v in ys.items() if k != "y"})
            ys = ys["y"]
        y = _as_array(ys)
        if y.shape != xs.shape:
            raise ValueError(f"series {label!r} has shape {y.shape}, x has shape {xs.shape}")
        (line,) = ax.plot(xs, y, label=label, **kwargs)
        lines.append(line)
    _finish(ax, xlabel, ylabel, title, logx, logy, legend)
    return lines


def theory_vs_measurement(
    ax,
    x,
    measured,
    theory,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    measured_label: str = "measured",
    theory_label: str = "theory",
    spread=None,
    logx: bool = False,
    logy: bool = False,
    color: str | None = None,
):
    """Measured values as markers (optionally with a +- ``spread`` band) and the theoretical
    curve as a dashed line, on ``ax``: the course's standard "does the claim hold?" plot.

    ``theory`` is either an array over ``x`` or a function of ``x`` (then drawn on a fine grid).
    Call it several times on one axes to compare variants (pass ``color`` and labels).
    Returns ``(measured_line, theory_line)``.
    """
    xs = _as_array(x)
    ys = _as_array(measured)
    if ys.shape != xs.shape:
        raise ValueError(f"measured has shape {ys.shape}, x has shape {xs.shape}")
    color = color or COLORS["measured"]
    if callable(theory):
        grid = (np.geomspace(xs.min(), xs.max(), 200) if logx and xs.min() > 0
                else np.linspace(xs.min(), xs.max(), 200))
        (theory_line,) = ax.plot(grid, _as_array(theory(grid)), "--", color=COLORS["theory"],
                                 linewidth=1.2, label=theory_label, zorder=1)
    else:
        th = _as_array(theory)
        if th.shape != xs.shape:
            raise ValueError(f"theory has shape {th.shape}, x has shape {xs.shape}")
        (theory_line,) = ax.plot(xs, th, "--", color=COLORS["theory"], linewidth=1.2,
                                 label=theory_label, zorder=1)
    if spread is not None:
        sp = _as_array(spread)
        ax.fill_between(xs, ys - sp, ys + sp, color=color, alpha=0.15, linewidth=0)
    (measured_line,) = ax.plot(xs, ys, "o-", color=color, markersize=5, linewidth=1.0,
                               label=measured_label, zorder=2)
    _finish(ax, xlabel, ylabel, title, logx, logy, True)
    return measured_line, theory_line


def _finish(ax, xlabel, ylabel, title, logx, logy, legend) -> None:
    """Labels, log scales with plain numbers as tick labels (8, 64, 0.5 rather than 2^3,
    6.4 x 10^1), and a frameless legend."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    plain = FuncFormatter(lambda v, _: f"{v:g}")
    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if logy:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(plain)
        lo, hi = ax.get_ylim()
        ax.yaxis.set_minor_formatter(plain if hi / lo < 30 else NullFormatter())
    _label(ax, title, xlabel, ylabel)
    if legend:
        ax.legend(frameon=False)


def show(fig) -> None:
    """Show ``fig`` once, as the output of the current notebook cell, and close it.

    The figure is displayed as a plain image (visible in JupyterLab and in the HTML book, where
    the caption cell that follows turns it into a numbered figure) and then closed, so that
    the inline backend does not draw it a second time and nothing with a memory address is
    printed. nbval compares the figure's text form, ``<Figure size 640x360 with 2 Axes>``,
    which checks that it was drawn with the expected layout without comparing pixels.
    """
    from IPython.display import display  # notebooks only

    display(fig)
    plt.close(fig)


def glue_figure(name: str, fig) -> None:
    """Hand ``fig`` to myst-nb under ``name`` and close it, so it appears once: in the book
    where a ``{glue:figure}`` directive with a caption places it, not also under the cell."""
    from myst_nb import glue  # imported here: only notebooks need myst-nb

    glue(name, fig, display=False)
    plt.close(fig)
