"""The shared plotting helpers draw what they are given and reject malformed input."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from minitransformer import plotting  # noqa: E402
from minitransformer.attention import causal_mask  # noqa: E402


def test_heatmap_draws_the_matrix_and_rejects_3d() -> None:
    fig, ax = plotting.figure()
    m = torch.rand(3, 4)
    im = plotting.heatmap(ax, m, xlabels=list("abcd"), annotate=True)
    np.testing.assert_allclose(im.get_array(), m.numpy(), rtol=1e-6)
    assert len(ax.texts) == 12  # one annotation per cell
    with pytest.raises(ValueError, match=r"2-D matrix, got shape \(2, 3, 4\)"):
        plotting.heatmap(ax, np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match=r"non-empty 2-D matrix, got shape \(0, 3\)"):
        plotting.heatmap(ax, np.zeros((0, 3)))
    plt.close(fig)


def test_attention_heatmaps_one_axis_per_head() -> None:
    fig, axes = plotting.attention_heatmaps(torch.softmax(torch.randn(3, 4, 5), -1))
    assert len(axes) == 3
    fig2, axes2 = plotting.attention_heatmaps(torch.eye(4))
    assert len(axes2) == 1
    with pytest.raises(ValueError, match=r"\(h, T, S\) or \(T, S\), got shape \(4,\)"):
        plotting.attention_heatmaps(torch.ones(4))
    with pytest.raises(ValueError, match=r"got shape \(0, 2, 2\)"):
        plotting.attention_heatmaps(torch.ones(0, 2, 2))  # no heads
    with pytest.raises(ValueError, match="max_cols must be positive, got 0"):
        plotting.attention_heatmaps(torch.ones(2, 2, 2), max_cols=0)
    plt.close("all")


def test_mask_heatmap_shows_true_as_one() -> None:
    fig, ax = plotting.figure()
    im = plotting.mask_heatmap(ax, causal_mask(3))
    np.testing.assert_array_equal(im.get_array(), np.tril(np.ones((3, 3))))
    assert [t.get_text() for t in ax.texts[:3]] == ["1", "0", "0"]
    with pytest.raises(ValueError, match="boolean mask"):
        plotting.mask_heatmap(ax, np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"2-D \(T, S\) mask, got shape \(1, 2, 2\)"):
        plotting.mask_heatmap(ax, np.ones((1, 2, 2), dtype=bool))
    plt.close(fig)


def test_line_plot_and_theory_vs_measurement() -> None:
    fig, (ax1, ax2) = plotting.figure(ncols=2)
    lines = plotting.line_plot(
        ax1,
        [1, 2, 4],
        {"a": [1.0, 2.0, 3.0], "b": {"y": torch.tensor([3.0, 2.0, 1.0]), "linestyle": "--"}},
        logx=True,
    )
    assert [line.get_label() for line in lines] == ["a", "b"]
    np.testing.assert_array_equal(lines[1].get_ydata(), [3.0, 2.0, 1.0])
    assert lines[1].get_linestyle() == "--"
    with pytest.raises(ValueError, match=r"series 'c' has shape \(2,\), x has shape \(3,\)"):
        plotting.line_plot(ax1, [1, 2, 3], {"c": [1, 2]})

    measured, theory = plotting.theory_vs_measurement(
        ax2, [1, 2, 4], [1.1, 1.9, 4.2], lambda d: d, logx=True, logy=True
    )
    np.testing.assert_allclose(measured.get_ydata(), [1.1, 1.9, 4.2])
    np.testing.assert_allclose(theory.get_ydata(), theory.get_xdata())  # theory(x) = x
    _, th = plotting.theory_vs_measurement(ax2, [1, 2], [1, 2], [1, 2], spread=[0.1, 0.1])
    np.testing.assert_array_equal(th.get_ydata(), [1, 2])
    with pytest.raises(ValueError, match=r"theory has shape \(3,\), x has shape \(2,\)"):
        plotting.theory_vs_measurement(ax2, [1, 2], [1, 2], [1, 2, 3])
    plt.close(fig)


def _label_px(fig, text) -> float:
    """How tall ``text`` is, in px, once the figure is fitted into a 730 px column."""
    width_px = fig.get_size_inches()[0] * fig.dpi
    return text.get_fontsize() / 72 * fig.dpi * min(1.0, 730 / width_px)


def test_figure_changes_no_global_setting() -> None:
    before = dict(plt.rcParams)
    fig, _ = plotting.figure(ncols=2, width=30)
    assert dict(plt.rcParams) == before  # nothing changed behind the caller's back
    assert fig.get_size_inches()[0] == plotting.MAX_WIDTH  # capped
    with pytest.raises(ValueError, match="width must be > 0, got 0"):
        plotting.figure(width=0)
    with pytest.raises(TypeError, match="ncols must be an int"):
        plotting.figure(ncols=2.0)
    with plt.rc_context():  # use_style is the one explicit, global switch
        plotting.use_style()
        assert plt.rcParams["axes.grid"] and not plt.rcParams["axes.spines.top"]
    assert dict(plt.rcParams) == before
    plt.close("all")


def test_attention_heatmaps_wrap_into_rows_and_keep_labels_readable() -> None:
    w = torch.softmax(torch.randn(7, 5, 6), -1)
    labels = list("abcdef")
    fig, axes = plotting.attention_heatmaps(
        w, xlabels=labels, ylabels=list("vwxyz"), xlabel="key", ylabel="query"
    )
    assert len(axes) == 7 and len(fig.axes) == 7 + 1  # 7 maps and one colour bar
    assert fig.get_size_inches()[0] <= plotting.MAX_WIDTH
    rows = sorted({round(ax.get_position().y0, 3) for ax in axes})
    assert len(rows) == 2  # 4 + 3 maps
    ticks = axes[0].get_xticklabels()
    assert [t.get_text() for t in ticks] == labels
    assert _label_px(fig, ticks[0]) >= 9
    assert [ax.get_ylabel() for ax in axes] == ["query", "", "", "", "query", "", ""]
    # xlabel under the bottom map of each column: maps 3 (no map below it) and 4-6
    assert [ax.get_xlabel() for ax in axes] == ["", "", "", "key", "key", "key", "key"]
    np.testing.assert_allclose(axes[6].images[0].get_array(), w[6].numpy(), rtol=1e-6)
    with pytest.raises(ValueError, match="titles has 2 entries for 7 heads"):
        plotting.attention_heatmaps(w, titles=["a", "b"])
    with pytest.raises(ValueError, match="xlabels has 2 entries for the 6 columns"):
        plotting.attention_heatmaps(w, xlabels=["a", "b"])
    plt.close("all")


def test_line_plot_with_own_x_limits_and_legend_place() -> None:
    fig, ax = plotting.figure()
    series = {"all": [1, 2, 3], "_hidden": {"x": [1, 3], "y": [0, 5], "marker": "."}}
    lines = plotting.line_plot(
        ax, [1, 2, 3], series, ylim=(0, None), legend="lower left", title="t", xlabel="x"
    )
    np.testing.assert_array_equal(lines[1].get_xdata(), [1, 3])
    assert ax.get_ylim()[0] == 0 and ax.get_title() == "t" and ax.get_xlabel() == "x"
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["all"]
    with pytest.raises(TypeError, match="series must be a dict"):
        plotting.line_plot(ax, [1], [[1]])
    with pytest.raises(ValueError, match="without its values under 'y'"):
        plotting.line_plot(ax, [1], {"a": {"x": [1]}})
    with pytest.raises(TypeError, match="series 'a' must be numbers"):
        plotting.line_plot(ax, [1], {"a": ["one"]})
    plt.close(fig)


def test_line_plot_ticks_at_the_points_of_a_log_axis() -> None:
    # A log axis labels powers of two: a first point at V = 258 sat on a tick "256".
    fig, ax = plotting.figure()
    sizes = [258, 512, 1024, 4096]
    plotting.line_plot(ax, sizes, {"a": [1.0, 0.5, 0.3, 0.2]}, logx=True, xticks=sizes)
    fig.canvas.draw()
    assert list(ax.get_xticks()) == sizes
    assert [t.get_text() for t in ax.get_xticklabels()] == ["258", "512", "1024", "4096"]
    plt.close(fig)


def test_reference_line_bar_scatter_seeds_annotate() -> None:
    fig, (ax1, ax2, ax3) = plotting.figure(ncols=3, width=9)
    line = plotting.reference_line(ax1, y=0.25, label="chance", text="chance level")
    assert line.get_ydata()[0] == 0.25 and line.get_label() == "chance"
    assert ax1.texts[-1].get_text() == "chance level"
    assert plotting.reference_line(ax1, x=3).get_xdata()[0] == 3
    with pytest.raises(ValueError, match="exactly one of x"):
        plotting.reference_line(ax1, x=1, y=1)
    with pytest.raises(ValueError, match="finite"):
        plotting.reference_line(ax1, y=float("nan"))

    bars = plotting.bar_plot(
        ax2,
        range(3),
        {"one-hot": [0, 1, 0], "smoothed": [0.1, 0.8, 0.1]},
        xlabel="token",
        ylabel="p",
    )
    assert [b.get_height() for b in bars[1]] == pytest.approx([0.1, 0.8, 0.1])
    assert bars[0][0].get_x() < bars[1][0].get_x()  # side by side
    assert [t.get_text() for t in ax2.get_xticklabels()] == ["0", "1", "2"]
    assert ax2.get_legend() is not None and ax2.get_ylabel() == "p"
    with pytest.raises(ValueError, match="for 3 categories"):
        plotting.bar_plot(ax2, range(3), {"a": [1, 2]})

    points = plotting.scatter_plot(ax3, [0, 1], [1, 0], values=[0, 1])
    np.testing.assert_array_equal(points.get_offsets(), [[0, 1], [1, 0]])
    ring = plotting.scatter_plot(ax3, [0], [1], hollow=True, size=90)
    assert ring.get_facecolors().size == 0  # no fill
    with pytest.raises(ValueError, match=r"y has shape \(1,\)"):
        plotting.scatter_plot(ax3, [0, 1], [1])

    dots, err = plotting.seeds_plot(ax1, ["h=1", "h=2"], [[1.0, 3.0], [2.0, 2.0, 2.0]])
    assert len(dots.get_offsets()) == 5
    np.testing.assert_allclose(err.lines[0].get_ydata(), [2.0, 2.0])  # the means
    # the error bars: mean -+ the sample standard deviation (ddof = 1): sqrt(2) and 0
    (bar,) = err.lines[2]
    ends = [s[:, 1] for s in bar.get_segments()]
    np.testing.assert_allclose(ends, [[2 - 2**0.5, 2 + 2**0.5], [2.0, 2.0]])
    assert [t.get_text() for t in ax1.get_xticklabels()] == ["h=1", "h=2"]
    with pytest.raises(ValueError, match="one non-empty list"):
        plotting.seeds_plot(ax1, ["a", "b"], [[1.0]])

    note = plotting.annotate(ax1, "peak", (1, 2), (3, 4), point=True)
    assert note.get_text() == "peak" and note.arrow_patch is not None
    plt.close(fig)


def test_history_plot_draws_a_train_history() -> None:
    from minitransformer.training import TrainHistory

    history = TrainHistory(
        loss=[3.0, 2.0, 1.0, 1.0], lr=[0.1] * 4, eval_steps=[2, 4], eval_loss=[2.5, 1.2]
    )
    fig, ax = plotting.figure()
    lines = plotting.history_plot(ax, history, window=2, floor=0.5)
    assert [ln.get_label() for ln in lines] == [
        "training batch",
        "training (mean of 2)",
        "held-out",
        "floor",
    ]
    np.testing.assert_allclose(lines[1].get_ydata(), [3.0, 2.5, 1.5, 1.0])
    np.testing.assert_array_equal(lines[2].get_xdata(), [2, 4])
    assert ax.get_xlabel() == "update" and ax.get_legend() is not None
    plt.close(fig)


def test_diagram_helpers() -> None:
    fig, ax = plotting.figure()
    plotting.diagram_axes(ax, xlim=(0, 4), ylim=(0, 2), title="block")
    assert not ax.axison and ax.get_xlim() == (0, 4) and ax.get_title() == "block"
    patch = plotting.box(ax, (0.5, 0.5), 1.0, 0.5, "Sublayer", color="#cfe2f3", rounded=True)
    assert patch in ax.patches and ax.texts[-1].get_text() == "Sublayer"
    before = len(ax.lines)
    plotting.arrow(ax, (1, 0), (1.2, 1.5), via=[(3, 0), (3, 1.5)], text="residual")
    assert len(ax.lines) == before + 1  # the path through the corners
    np.testing.assert_array_equal(ax.lines[-1].get_xdata(), [1, 3, 3])
    assert ax.texts[-1].get_text() == "residual"
    plus = plotting.note(ax, (2, 1), "+", circled=True, rotation=0)
    assert plus.get_bbox_patch() is not None
    with pytest.raises(ValueError, match="positive width"):
        plotting.box(ax, (0, 0), 0, 1)
    plt.close(fig)


def test_text_is_readable_on_a_phone_and_show_records_its_size(capsys) -> None:
    """Every helper writes its text at FONT_SIZE or more, so that a 6.4-inch figure, shown in
    a phone's 358 px column at 358/640 of its size, still reads at 9 px or more; show() stores
    the smallest size in the PNG for the book's page and its browser check."""
    import base64
    import io

    from PIL import Image

    with plt.rc_context(plotting.STYLE):
        fig, (ax1, ax2) = plotting.figure(ncols=2)
        plotting.heatmap(ax1, torch.rand(3, 3), annotate=True, title="weights", xlabel="key")
        plotting.line_plot(ax2, [1, 2, 3], {"a": [1, 2, 3]})
        plotting.reference_line(ax2, y=2.0, text="chance")
        plotting.annotate(ax2, "peak", (2, 2), xytext=(1, 3))
        plotting.finish_axes(ax2, legend=True, xlabel="step", ylabel="loss")
        px = plotting.smallest_text_px(fig)
        assert px == pytest.approx(plotting.FONT_SIZE * fig.dpi / 72)
        assert px * 358 / 640 >= 9.0
        plotting.show(fig)
    shown = capsys.readouterr().out
    bundle = eval(shown)  # show() outside a kernel prints the bundle it displays
    assert bundle["text/plain"] == "<Figure size 640x360 with 3 Axes>"
    with Image.open(io.BytesIO(base64.b64decode(bundle["image/png"]))) as im:
        assert float(im.text[plotting.TEXT_SIZE_KEY]) == pytest.approx(px, abs=0.01)
    assert not plt.get_fignums()  # closed


def test_smallest_text_counts_only_visible_text() -> None:
    fig, ax = plotting.figure()
    ax.set_axis_off()
    assert plotting.smallest_text_px(fig) == 0.0
    ax.text(0.5, 0.5, "small", fontsize=6)
    ax.text(0.5, 0.5, "hidden", fontsize=3, visible=False)
    ax.text(0.5, 0.5, "   ", fontsize=2)
    assert plotting.smallest_text_px(fig) == pytest.approx(6 * fig.dpi / 72)
    plt.close(fig)


def test_smallest_text_px_needs_a_figure():
    with pytest.raises(TypeError, match="fig must be a matplotlib Figure"):
        plotting.smallest_text_px("not a figure")
