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
    plt.close(fig)


def test_attention_heatmaps_one_axis_per_head() -> None:
    fig, axes = plotting.attention_heatmaps(torch.softmax(torch.randn(3, 4, 5), -1))
    assert len(axes) == 3
    fig2, axes2 = plotting.attention_heatmaps(torch.eye(4))
    assert len(axes2) == 1
    with pytest.raises(ValueError, match=r"\(h, T, S\) or \(T, S\), got shape \(4,\)"):
        plotting.attention_heatmaps(torch.ones(4))
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
    lines = plotting.line_plot(ax1, [1, 2, 4], {"a": [1.0, 2.0, 3.0],
                                                "b": {"y": torch.tensor([3.0, 2.0, 1.0]),
                                                      "linestyle": "--"}}, logx=True)
    assert [line.get_label() for line in lines] == ["a", "b"]
    np.testing.assert_array_equal(lines[1].get_ydata(), [3.0, 2.0, 1.0])
    assert lines[1].get_linestyle() == "--"
    with pytest.raises(ValueError, match=r"series 'c' has shape \(2,\), x has shape \(3,\)"):
        plotting.line_plot(ax1, [1, 2, 3], {"c": [1, 2]})

    measured, theory = plotting.theory_vs_measurement(ax2, [1, 2, 4], [1.1, 1.9, 4.2],
                                                      lambda d: d, logx=True, logy=True)
    np.testing.assert_allclose(measured.get_ydata(), [1.1, 1.9, 4.2])
    np.testing.assert_allclose(theory.get_ydata(), theory.get_xdata())  # theory(x) = x
    _, th = plotting.theory_vs_measurement(ax2, [1, 2], [1, 2], [1, 2], spread=[0.1, 0.1])
    np.testing.assert_array_equal(th.get_ydata(), [1, 2])
    with pytest.raises(ValueError, match=r"theory has shape \(3,\), x has shape \(2,\)"):
        plotting.theory_vs_measurement(ax2, [1, 2], [1, 2], [1, 2, 3])
    plt.close(fig)
