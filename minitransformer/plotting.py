"""The one plotting module of the book, so that every figure looks alike.

Chapters call :func:`use_style` once at the top (the only function that changes matplotlib's
global settings), make a figure with :func:`figure`, draw with the helpers below and show it
with :func:`show`. Each helper draws on an ``Axes`` it is given and
returns what it drew, so chapters make no matplotlib calls of their own. Data arguments
(``Numbers``) take a list, a NumPy array or a tensor.

Figures are read in a desk browser's 684 px column and in a phone's 358 px one, where a
figure is scaled down to fit. All text is :data:`FONT_SIZE` points (titles a point more), so
that a figure of the default 6.4 inches still shows its smallest text at 9 CSS px on a phone;
:func:`show` records that smallest size in the PNG, and the book never shows a wider figure
smaller than the width at which its text reads at 9 px (it scrolls sideways in its box
instead: ``book/_static/reading.js``). Figures stay at most :data:`MAX_WIDTH` inches wide.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PathCollection
from matplotlib.colors import Colormap
from matplotlib.container import BarContainer, ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch
from matplotlib.text import Annotation, Text
from matplotlib.typing import RcKeyType
from numpy.typing import ArrayLike
from torch import Tensor

from minitransformer import _checks

if TYPE_CHECKING:
    from minitransformer.training import TrainHistory

#: What the helpers accept as data: a list, a numpy array or a tensor (moved to the CPU).
Numbers: TypeAlias = ArrayLike | Tensor

__all__ = [
    "FONT_SIZE",
    "STYLE",
    "COLORS",
    "MAX_WIDTH",
    "use_style",
    "figure",
    "finish_axes",
    "heatmap",
    "attention_heatmaps",
    "mask_heatmap",
    "line_plot",
    "history_plot",
    "theory_vs_measurement",
    "reference_line",
    "bar_plot",
    "scatter_plot",
    "seeds_plot",
    "annotate",
    "diagram_axes",
    "box",
    "arrow",
    "note",
    "TEXT_SIZE_KEY",
    "smallest_text_px",
    "show",
]

#: The size, in points, of every label, tick label, legend and note. At 100 dpi a 6.4-inch
#: figure is 640 px wide; a phone's 358 px column shows it at 0.56 of that, and 12-point text
#: (16.7 px) at 9.3 px.
FONT_SIZE = 12

STYLE: dict[RcKeyType, Any] = {
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "figure.figsize": (6.4, 3.6),
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.titlesize": FONT_SIZE + 1,
    "figure.titlesize": FONT_SIZE + 1,
    "axes.labelsize": FONT_SIZE,
    "xtick.labelsize": FONT_SIZE,
    "ytick.labelsize": FONT_SIZE,
    "legend.fontsize": FONT_SIZE,
    "legend.title_fontsize": FONT_SIZE,
    "font.size": FONT_SIZE,
    "image.cmap": "viridis",
}

#: One colour per role, so that "measured" or "scaled" look the same in every chapter.
COLORS = {
    "measured": "#1f77b4",  # blue
    "theory": "#222222",  # near-black, dashed
    "second": "#d62728",  # red: the variant being compared (e.g. "without scaling")
    "third": "#2ca02c",  # green
    "fourth": "#9467bd",  # purple
    "reference": "#888888",  # grey: reference lines, chance levels, diagram strokes
}
_CYCLE = [
    COLORS["measured"],
    COLORS["second"],
    COLORS["third"],
    COLORS["fourth"],
    "#ff7f0e",
    "#8c564b",
]

#: The widest figure in inches. At 1000 px it is shown at 0.68 of its size in a desk
#: browser's column (labels at 11 px), and at 0.54 on a phone, in a box that scrolls sideways.
MAX_WIDTH = 10.0


def use_style() -> None:
    """Apply the course style to matplotlib's global settings (once, at a chapter's top)."""
    plt.rcParams.update(STYLE)


def figure(
    ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 3.6, **kwargs: Any
) -> tuple[Figure, Any]:
    """A new ``width x height``-inch figure with ``nrows x ncols`` axes; ``(fig, axes)``, where
    ``axes`` is one ``Axes`` or an array of them, as from ``plt.subplots``.

    It changes no global setting (call :func:`use_style` for the course style). ``width`` is
    capped at :data:`MAX_WIDTH`.
    """
    ncols, nrows = _checks.positive_int("ncols", ncols), _checks.positive_int("nrows", nrows)
    width = _checks.finite_float("width", width, low=0.0, low_open=True)
    height = _checks.finite_float("height", height, low=0.0, low_open=True)
    return plt.subplots(
        nrows, ncols, figsize=(min(width, MAX_WIDTH), height), constrained_layout=True, **kwargs
    )


def finish_axes(
    ax: Axes,
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    xlim: tuple[float | None, float | None] | None = None,
    ylim: tuple[float | None, float | None] | None = None,
    xticks: Iterable[float] | None = None,
    xticklabels: Sequence[str] | None = None,
    equal_aspect: bool = False,
    legend: bool | str = False,
    logx: bool = False,
    logy: bool = False,
) -> Axes:
    """Titles, labels, limits, ticks and a frameless legend (``legend`` may name its ``loc``,
    e.g. ``"lower left"``). Log scales print plain numbers (8, 64, 0.5, not 2^3). Returns
    ``ax``."""
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
    if title:
        ax.set_title(title)
    if xlabel:
        ax.set_xlabel(xlabel)
    if ylabel:
        ax.set_ylabel(ylabel)
    if xlim is not None:
        ax.set_xlim(*xlim)
    if ylim is not None:
        ax.set_ylim(*ylim)
    if xticks is not None:
        ax.set_xticks(list(xticks), labels=None if xticklabels is None else list(xticklabels))
    if equal_aspect:
        ax.set_aspect("equal")
    if legend:
        where: dict[str, Any] = {} if legend is True else {"loc": legend}
        ax.legend(frameon=False, **where)
    return ax


def _as_array(values: Numbers, name: str = "values") -> np.ndarray:
    if isinstance(values, Tensor):
        values = values.detach().cpu()
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):
        raise TypeError(
            f"{name} must be numbers (a list, array or tensor), got {type(values).__name__}"
        ) from None


def heatmap(
    ax: Axes,
    matrix: Numbers,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    cmap: str | Colormap = "viridis",
    vmin: float | None = None,
    vmax: float | None = None,
    annotate: bool = False,
    colorbar: bool = True,
    fmt: str = "{:.2f}",
) -> AxesImage:
    """Draw a 2-D ``matrix`` on ``ax``, rows top to bottom as printed (row = query, column =
    key for attention weights); ``annotate`` writes each value in its cell. Returns the image."""
    m = _as_array(matrix, "matrix")
    if m.ndim != 2 or m.size == 0:
        raise ValueError(f"heatmap needs a non-empty 2-D matrix, got shape {m.shape}")
    for name, labels, n, what in (
        ("xlabels", xlabels, m.shape[1], "columns"),
        ("ylabels", ylabels, m.shape[0], "rows"),
    ):
        if labels is not None and len(labels) != n:
            raise ValueError(
                f"{name} has {len(labels)} entries for the {n} {what} of a matrix "
                f"of shape {m.shape}"
            )
    im = ax.imshow(m, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.grid(False)
    if xlabels is not None:
        ax.set_xticks(range(len(xlabels)), labels=list(xlabels))
    if ylabels is not None:
        ax.set_yticks(range(len(ylabels)), labels=list(ylabels))
    finish_axes(ax, title=title, xlabel=xlabel, ylabel=ylabel)
    if annotate:
        mid = (np.nanmin(m) + np.nanmax(m)) / 2
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(
                    j,
                    i,
                    fmt.format(m[i, j]),
                    ha="center",
                    va="center",
                    fontsize=FONT_SIZE,
                    color="white" if m[i, j] < mid else "black",
                )
    if colorbar:
        ax.figure.colorbar(im, ax=ax, shrink=0.8)
    return im


def attention_heatmaps(
    weights: Numbers,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    *,
    titles: Sequence[str] | None = None,
    suptitle: str | None = None,
    xlabel: str | None = None,
    ylabel: str | None = None,
    max_cols: int = 4,
    width_per_map: float = 2.4,
    height_per_row: float = 2.6,
) -> tuple[Figure, np.ndarray]:
    """One heatmap per head for weights ``(h, T, S)`` (or one for ``(T, S)``), colour 0 to 1.

    The maps wrap into rows of at most ``max_cols``; the figure is at most :data:`MAX_WIDTH`
    wide. ``xlabel`` goes under the bottom map of each column, ``ylabel`` and ``ylabels``
    beside the first map of each row. Returns ``(fig, axes)``, one axes per head.
    """
    w = _as_array(weights, "weights")
    if w.ndim == 2:
        w = w[None]
    if w.ndim != 3 or w.size == 0:
        raise ValueError(
            "attention_heatmaps needs non-empty weights of shape (h, T, S) or (T, S), "
            f"got shape {w.shape}"
        )
    h = w.shape[0]
    if titles is not None and len(titles) != h:
        raise ValueError(f"titles has {len(titles)} entries for {h} heads")
    ncols = min(h, _checks.positive_int("max_cols", max_cols))
    nrows = math.ceil(h / ncols)
    fig, grid = figure(
        ncols=ncols,
        nrows=nrows,
        width=width_per_map * ncols + 0.8,
        height=height_per_row * nrows,
        squeeze=False,
    )
    axes = grid.ravel()
    for ax in axes[h:]:  # the unused places of the last row
        ax.remove()
    axes = axes[:h]
    images = []
    for i, ax in enumerate(axes):
        row, col = divmod(i, ncols)
        bottom = i + ncols >= h  # no map below this one
        images.append(
            heatmap(
                ax,
                w[i],
                xlabels,
                ylabels if col == 0 else None,
                vmin=0.0,
                vmax=1.0,
                title=titles[i] if titles else (f"head {i}" if h > 1 else None),
                xlabel=xlabel if bottom else None,
                ylabel=ylabel if col == 0 else None,
                colorbar=False,
            )
        )
        if col:
            ax.set_yticks([])
    fig.colorbar(images[0], ax=list(axes), shrink=0.8)  # every map has the same scale, 0 to 1
    if suptitle:
        fig.suptitle(suptitle)
    return fig, axes


def mask_heatmap(
    ax: Axes,
    mask: Numbers,
    xlabels: Sequence[str] | None = None,
    ylabels: Sequence[str] | None = None,
    *,
    title: str | None = None,
    xlabel: str | None = "key position",
    ylabel: str | None = "query position",
) -> AxesImage:
    """Draw a boolean ``(T, S)`` mask: dark = may attend (True), light = blocked; cells show
    "1" / "0" when there are at most 144. Returns the image."""
    m = np.asarray(mask.detach().cpu() if isinstance(mask, Tensor) else mask)
    if m.ndim != 2:
        raise ValueError(f"mask_heatmap needs a 2-D (T, S) mask, got shape {m.shape}")
    if m.dtype != bool:
        raise ValueError(
            f"mask_heatmap needs a boolean mask (True = may attend), got dtype {m.dtype}"
        )
    from matplotlib.colors import ListedColormap

    im = heatmap(
        ax,
        m.astype(float),
        xlabels,
        ylabels,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        cmap=ListedColormap(["#eeeeee", COLORS["measured"]]),
        vmin=0.0,
        vmax=1.0,
        colorbar=False,
    )
    if m.size <= 144:
        for i in range(m.shape[0]):
            for j in range(m.shape[1]):
                ax.text(
                    j,
                    i,
                    "1" if m[i, j] else "0",
                    ha="center",
                    va="center",
                    fontsize=FONT_SIZE,
                    color="white" if m[i, j] else "#777777",
                )
    return im


def line_plot(
    ax: Axes,
    x: Numbers,
    series: Mapping[str, Numbers | Mapping[str, Any]],
    *,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    logx: bool = False,
    logy: bool = False,
    markers: bool = True,
    legend: bool | str = True,
    xlim: tuple[float | None, float | None] | None = None,
    ylim: tuple[float | None, float | None] | None = None,
    xticks: Iterable[float] | None = None,
) -> list[Line2D]:
    """Curves on ``ax``: ``series`` maps each label to its y values over ``x``.

    Colours follow :data:`COLORS` in order. A value may also be a dict with the data under
    ``"y"``, optionally its own ``"x"``, and matplotlib keyword arguments (``{"y": ys,
    "linestyle": "--"}``). A label starting with ``_`` stays out of the legend. ``xticks``
    puts the ticks at these values (``x`` itself, say, where a log axis would label 256 for a
    point at 258). Returns the lines.
    """
    if not isinstance(series, Mapping):
        raise TypeError(f"series must be a dict label -> values, got {type(series).__name__}")
    xs = _as_array(x, "x")
    lines = []
    for i, (label, ys) in enumerate(series.items()):
        kwargs: dict[str, Any] = {
            "color": _CYCLE[i % len(_CYCLE)],
            "marker": "o" if markers else None,
            "markersize": 4,
            "linewidth": 1.5,
        }
        x_i = xs
        if isinstance(ys, Mapping):
            if "y" not in ys:
                raise ValueError(f"series {label!r} is a dict without its values under 'y'")
            kwargs.update({k: v for k, v in ys.items() if k not in ("x", "y")})
            x_i = _as_array(ys["x"], f"series {label!r} x") if "x" in ys else xs
            ys = ys["y"]
        y = _as_array(ys, f"series {label!r}")
        if y.shape != x_i.shape:
            raise ValueError(f"series {label!r} has shape {y.shape}, x has shape {x_i.shape}")
        (line,) = ax.plot(x_i, y, label=label, **kwargs)
        lines.append(line)
    finish_axes(
        ax,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        xlim=xlim,
        ylim=ylim,
        xticks=xticks,
        logx=logx,
        logy=logy,
        legend=legend,
    )
    return lines


def history_plot(
    ax: Axes,
    history: TrainHistory,
    *,
    window: int = 20,
    floor: float | None = None,
    ylabel: str = "loss (nats)",
    title: str | None = None,
) -> list[Line2D]:
    """A :class:`~minitransformer.training.TrainHistory`'s losses on ``ax``: each batch (light),
    their running mean over ``window`` updates, the held-out loss (if recorded), and the
    optional ``floor`` as a dashed line. Returns the lines."""
    steps = np.arange(1, len(history.loss) + 1)
    blue, red = COLORS["measured"], COLORS["second"]
    series: dict[str, Numbers | Mapping[str, Any]] = {
        "training batch": {"y": history.loss, "color": blue, "alpha": 0.3, "linewidth": 0.8},
        f"training (mean of {window})": {"y": history.smoothed(window), "color": blue},
    }
    if history.eval_loss:
        series["held-out"] = {
            "x": history.eval_steps,
            "y": history.eval_loss,
            "color": red,
            "marker": "o",
        }
    lines = line_plot(
        ax,
        steps,
        series,
        xlabel="update",
        ylabel=ylabel,
        title=title,
        markers=False,
        legend=floor is None,
    )
    if floor is not None:
        lines.append(reference_line(ax, y=floor, label="floor", style="--"))
        finish_axes(ax, legend=True)
    return lines


def theory_vs_measurement(
    ax: Axes,
    x: Numbers,
    measured: Numbers,
    theory: Numbers | Callable[[np.ndarray], Numbers],
    *,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    measured_label: str = "measured",
    theory_label: str = "theory",
    spread: Numbers | None = None,
    logx: bool = False,
    logy: bool = False,
    color: str | None = None,
) -> tuple[Line2D, Line2D]:
    """Measured values as markers (with a +- ``spread`` band) and the theory as a dashed line:
    the course's "does the claim hold?" plot. ``theory`` is an array over ``x`` or a function
    of ``x``. Returns ``(measured_line, theory_line)``."""
    xs = _as_array(x, "x")
    ys = _as_array(measured, "measured")
    if ys.shape != xs.shape:
        raise ValueError(f"measured has shape {ys.shape}, x has shape {xs.shape}")
    color = color or COLORS["measured"]
    if callable(theory):
        grid = (
            np.geomspace(xs.min(), xs.max(), 200)
            if logx and xs.min() > 0
            else np.linspace(xs.min(), xs.max(), 200)
        )
        theory_x, theory_y = grid, _as_array(theory(grid), "theory(x)")
    else:
        theory_x, theory_y = xs, _as_array(theory, "theory")
        if theory_y.shape != xs.shape:
            raise ValueError(f"theory has shape {theory_y.shape}, x has shape {xs.shape}")
    (theory_line,) = ax.plot(
        theory_x,
        theory_y,
        "--",
        color=COLORS["theory"],
        linewidth=1.2,
        label=theory_label,
        zorder=1,
    )
    if spread is not None:
        sp = _as_array(spread, "spread")
        ax.fill_between(xs, ys - sp, ys + sp, color=color, alpha=0.15, linewidth=0)
    (measured_line,) = ax.plot(
        xs, ys, "o-", color=color, markersize=5, linewidth=1.0, label=measured_label, zorder=2
    )
    finish_axes(ax, title=title, xlabel=xlabel, ylabel=ylabel, logx=logx, logy=logy, legend=True)
    return measured_line, theory_line


def reference_line(
    ax: Axes,
    *,
    x: float | None = None,
    y: float | None = None,
    label: str | None = None,
    text: str | None = None,
    style: str = ":",
) -> Line2D:
    """A grey horizontal (``y=``) or vertical (``x=``) line across ``ax``, e.g. a chance level
    or a loss floor; ``label`` names it in the legend, ``text`` writes beside it. Returns the
    line."""
    given = [v for v in (x, y) if v is not None]
    if len(given) != 1:
        raise ValueError("reference_line needs exactly one of x (vertical) or y (horizontal)")
    value = float(given[0])
    if not math.isfinite(value):
        raise ValueError(f"reference_line needs a finite position, got {value}")
    kwargs: dict[str, Any] = dict(
        color=COLORS["reference"], linestyle=style, linewidth=1.0, label=label
    )
    line = ax.axvline(value, **kwargs) if x is not None else ax.axhline(value, **kwargs)
    if text:
        if x is not None:
            ax.annotate(
                text,
                (value, 0.5),
                xycoords=("data", "axes fraction"),
                xytext=(4, 0),
                textcoords="offset points",
                color=COLORS["reference"],
                fontsize=FONT_SIZE,
            )
        else:
            ax.annotate(
                text,
                (0.01, value),
                xycoords=("axes fraction", "data"),
                xytext=(0, 3),
                textcoords="offset points",
                color=COLORS["reference"],
                fontsize=FONT_SIZE,
            )
    return line


def bar_plot(
    ax: Axes,
    categories: Sequence[object],
    series: Mapping[str, Numbers],
    *,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
    legend: bool | str = True,
) -> list[BarContainer]:
    """Grouped bars: for each label of ``series`` (label -> one value per category) one bar
    per category, side by side. Returns the bar containers, one per series."""
    if not isinstance(series, Mapping) or not series:
        raise ValueError("series must be a non-empty dict label -> values")
    positions = np.arange(len(categories))
    width = 0.8 / len(series)
    bars = []
    for i, (label, values) in enumerate(series.items()):
        v = _as_array(values, f"series {label!r}")
        if v.shape != positions.shape:
            raise ValueError(
                f"series {label!r} has shape {v.shape} for {len(categories)} categories"
            )
        offset = (i - (len(series) - 1) / 2) * width
        bars.append(
            ax.bar(positions + offset, v, width=width, label=label, color=_CYCLE[i % len(_CYCLE)])
        )
    finish_axes(
        ax,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        xticks=positions,
        xticklabels=[str(c) for c in categories],
        legend=legend,
    )
    return bars


def scatter_plot(
    ax: Axes,
    x: Numbers,
    y: Numbers,
    *,
    values: Numbers | None = None,
    label: str | None = None,
    size: float = 12,
    hollow: bool = False,
    color: str | None = None,
    cmap: str | Colormap = "viridis",
) -> PathCollection:
    """Points on ``ax``; ``values`` colours each by a number (through ``cmap``), ``hollow``
    draws rings (to mark points already drawn). Returns the collection."""
    xs, ys = _as_array(x, "x"), _as_array(y, "y")
    if xs.shape != ys.shape:
        raise ValueError(f"x has shape {xs.shape}, y has shape {ys.shape}")
    color = color or COLORS["measured"]
    if hollow:
        return ax.scatter(
            xs, ys, s=size, facecolors="none", edgecolors=color, label=label, zorder=3
        )
    if values is not None:
        c = _as_array(values, "values")
        if c.shape != xs.shape:
            raise ValueError(f"values has shape {c.shape}, x has shape {xs.shape}")
        return ax.scatter(xs, ys, c=c, cmap=cmap, s=size, label=label, zorder=2)
    return ax.scatter(xs, ys, s=size, color=color, label=label, zorder=2)


def seeds_plot(
    ax: Axes,
    categories: Sequence[object],
    values: Iterable[Numbers],
    *,
    xlabel: str | None = None,
    ylabel: str | None = None,
    title: str | None = None,
) -> tuple[PathCollection, ErrorbarContainer]:
    """Results of several seeds per setting: each seed as a faint dot, the mean +- one
    sample standard deviation (ddof = 1, the book's convention; none for a single seed) as a
    line with error bars. ``values`` holds one list of per-seed results per category. Returns
    ``(dots, errorbar)``."""
    rows = [_as_array(v, "values") for v in values]
    if len(rows) != len(categories) or any(r.ndim != 1 or r.size == 0 for r in rows):
        raise ValueError(
            f"values needs one non-empty list of per-seed results for each of the "
            f"{len(categories)} categories, got {len(rows)}"
        )
    positions = np.arange(len(categories))
    xs = np.concatenate(
        [np.full(r.size, p, dtype=float) for p, r in zip(positions, rows, strict=True)]
    )
    dots = ax.scatter(
        xs, np.concatenate(rows), color=COLORS["measured"], alpha=0.5, s=14, label="single seeds"
    )
    means = np.array([r.mean() for r in rows])
    sds = np.array([r.std(ddof=1) if r.size > 1 else 0.0 for r in rows])
    bars = ax.errorbar(
        positions, means, yerr=sds, fmt="o-", color=COLORS["second"], capsize=3, label="mean ± sd"
    )
    finish_axes(
        ax,
        title=title,
        xlabel=xlabel,
        ylabel=ylabel,
        xticks=positions,
        xticklabels=[str(c) for c in categories],
    )
    return dots, bars


def annotate(
    ax: Axes,
    text: str,
    xy: tuple[float, float],
    xytext: tuple[float, float] | None = None,
    *,
    arrow: bool = True,
    point: bool = False,
) -> Annotation:
    """Write ``text`` at ``xytext`` (data coordinates) with an arrow to ``xy``; ``point``
    also marks ``xy`` with a dot. Returns the annotation."""
    if point:
        ax.scatter([xy[0]], [xy[1]], color=COLORS["measured"], s=20, zorder=3)
    props = dict(arrowstyle="->", color=COLORS["theory"]) if arrow and xytext is not None else None
    return ax.annotate(text, xy, xytext=xytext, arrowprops=props, fontsize=FONT_SIZE)


# --------------------------------------------------------------------------------------------
# Diagrams: boxes and arrows on an axes without a frame
# --------------------------------------------------------------------------------------------


def diagram_axes(
    ax: Axes,
    *,
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
    title: str | None = None,
    equal_aspect: bool = True,
) -> Axes:
    """Turn ``ax`` into a canvas for :func:`box`, :func:`arrow` and :func:`note`: no frame,
    no ticks, the given data limits, equal scales by default. Returns ``ax``."""
    ax.set_axis_off()
    return finish_axes(ax, xlim=xlim, ylim=ylim, title=title, equal_aspect=equal_aspect)


def box(
    ax: Axes,
    xy: tuple[float, float],
    width: float,
    height: float,
    text: str | None = None,
    *,
    color: str = "#eeeeee",
    rounded: bool = False,
    fontsize: float = FONT_SIZE,
    text_color: str = "black",
) -> Patch:
    """A filled box with its lower-left corner at ``xy`` and ``text`` in its centre. Returns
    the patch."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    if width <= 0 or height <= 0:
        raise ValueError(f"box needs a positive width and height, got {width} x {height}")
    style: dict[str, Any] = dict(facecolor=color, edgecolor=COLORS["theory"], linewidth=0.8)
    patch: Patch = (
        FancyBboxPatch(xy, width, height, boxstyle="round,pad=0.02", **style)
        if rounded
        else Rectangle(xy, width, height, **style)
    )
    ax.add_patch(patch)
    if text:
        ax.text(
            xy[0] + width / 2,
            xy[1] + height / 2,
            text,
            ha="center",
            va="center",
            fontsize=fontsize,
            color=text_color,
        )
    return patch


def arrow(
    ax: Axes,
    start: tuple[float, float],
    end: tuple[float, float],
    *,
    via: Sequence[tuple[float, float]] = (),
    text: str | None = None,
    color: str = COLORS["theory"],
) -> FancyArrowPatch:
    """An arrow from ``start`` to ``end``, through the corners ``via`` (e.g. a residual path
    around a block); ``text`` labels the last segment. Returns the arrow patch."""
    points = [(p[0], p[1]) for p in (start, *via, end)]  # lists or arrays too
    if len(points) > 2:
        xs, ys = zip(*points[:-1], strict=True)
        ax.plot(xs, ys, color=color, linewidth=1.0)
    patch = FancyArrowPatch(
        points[-2], points[-1], arrowstyle="-|>", mutation_scale=12, color=color, linewidth=1.0
    )
    ax.add_patch(patch)
    if text:
        (x0, y0), (x1, y1) = points[-2], points[-1]
        ax.text((x0 + x1) / 2, (y0 + y1) / 2, text, ha="center", va="bottom", fontsize=FONT_SIZE)
    return patch


def note(
    ax: Axes,
    xy: tuple[float, float],
    text: str,
    *,
    fontsize: float = FONT_SIZE,
    color: str = "black",
    circled: bool = False,
    **kwargs: Any,
) -> Text:
    """Plain ``text`` centred at ``xy`` (data coordinates); ``circled`` draws it in a white
    circle (an adder "+" in a block diagram). Other keyword arguments go to ``ax.text``
    (``rotation``, ``ha``). Returns the text."""
    style: dict[str, Any] = dict(ha="center", va="center", fontsize=fontsize, color=color)
    if circled:
        style["bbox"] = dict(
            boxstyle="circle,pad=0.15", facecolor="white", edgecolor=COLORS["theory"]
        )
    style.update(kwargs)
    return ax.text(xy[0], xy[1], text, **style)


#: The PNG text chunk that holds a figure's smallest text, read by book/_static/reading.js and
#: tests/html/check_html.py.
TEXT_SIZE_KEY = "minitransformer:smallest-text-px"


def smallest_text_px(fig: Figure) -> float:
    """The size, in pixels of the figure's image, of the smallest visible text of ``fig``
    (labels, tick labels, legends, notes), as drawn now; 0.0 for a figure without text."""
    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be a matplotlib Figure, got {type(fig).__name__}")
    fig.canvas.draw()  # lays the figure out and makes its tick labels
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    sizes = [
        float(text.get_fontsize())
        for text in fig.findobj(Text)
        if text.get_visible()
        and text.get_text().strip()
        and text.get_window_extent(renderer).overlaps(fig.bbox)
    ]
    return min(sizes, default=0.0) * fig.dpi / 72


def show(fig: Figure) -> None:
    """Show ``fig`` once, as the output of the current notebook cell, and close it.

    Displayed as a PNG (JupyterLab and the HTML book, where the next caption cell makes it a
    numbered figure) that records the size of its smallest text (:func:`smallest_text_px`,
    under :data:`TEXT_SIZE_KEY`), then closed so the inline backend does not draw it again.
    nbval compares its text form, ``<Figure size 640x360 with 2 Axes>``: the layout, not the
    pixels.
    """
    from IPython.display import display  # notebooks only

    px = smallest_text_px(fig)
    png = io.BytesIO()
    fig.savefig(
        png,
        format="png",
        dpi=fig.dpi,
        bbox_inches="tight",
        facecolor=fig.get_facecolor(),
        metadata={TEXT_SIZE_KEY: f"{px:.2f}"},
    )
    image = base64.b64encode(png.getvalue()).decode("ascii")
    display({"image/png": image, "text/plain": repr(fig)}, raw=True)
    plt.close(fig)
