"""The one plotting module every chapter uses, so that all figures look alike.

Chapters call these helpers instead of styling matplotlib themselves. Each helper draws on an
``Axes`` it is given (or makes a figure) and returns what it drew, so a notebook cell can end
with ``plt.show()`` and nothing with a memory address is printed.
"""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["STYLE", "use_style", "figure", "heatmap", "attention_heatmaps", "glue_figure"]

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


def use_style() -> None:
    """Apply the course style to matplotlib (chapters call this once, at the top)."""
    plt.rcParams.update(STYLE)


def figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 3.6, **kwargs):
    """A new figure with ``nrows x ncols`` axes in the course style; returns ``(fig, axes)``."""
    use_style()
    return plt.subplots(nrows, ncols, figsize=(width, height), constrained_layout=True, **kwargs)


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
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
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


def glue_figure(name: str, fig) -> None:
    """Hand ``fig`` to myst-nb under ``name`` and close it, so it appears once: in the book
    where a ``{glue:figure}`` directive with a caption places it, not also under the cell."""
    from myst_nb import glue  # imported here: only notebooks need myst-nb

    glue(name, fig, display=False)
    plt.close(fig)
