"""Plots a person can read (#15): clipped LR sweeps with marked suggestions, LR against step for both cadence runs,
no single-bar charts, similarity in words, durations as plain numbers."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest

from tropt.errors import TroptError
from tropt.plots.perf import ms_text
from tropt.result import CheckResult, _fmt


def test_lr_range_clips_the_divergent_tail_and_marks_suggestions():
    lr = np.logspace(-7, 1, 100)
    smoothed = np.r_[np.full(60, 0.75), np.linspace(0.75, 0.5, 25), np.geomspace(0.5, 125.0, 15)]  # blows up at the top
    r = CheckResult("dynamics.lr_range", "pass", "s",
                    {"suggested_steepest": 1e-3, "suggested_valley": 3e-3, "setup_lr": 2e-3},
                    series={"lr_seed0": lr, "loss_seed0": smoothed, "smoothed_seed0": smoothed})
    ax = r.plot()
    low, high = ax.get_ylim()
    assert high < 1.0 and low < 0.5  # the useful range fills the axis; 125 runs off the top
    marks = [line for line in ax.lines if line.get_marker() == "o"]
    assert len(marks) == 2 and all(low < line.get_ydata()[0] < high for line in marks)
    assert any("clipped" in t.get_text() for t in ax.texts)
    plt.close(ax.figure)


def test_cadence_draws_learning_rate_against_whole_steps_from_zero():
    r = CheckResult("loop.scheduler_cadence", "pass", "s",
                    series={"lr_k1": np.array([0.003]), "lr_k4": np.array([0.003])})
    ax = r.plot()
    assert ax.get_ylim()[0] == 0 and [t.get_text() for t in ax.get_xticklabels()] == ["1"]
    plt.close(ax.figure)
    r = CheckResult("loop.scheduler_cadence", "fail", "s",
                    series={"lr_k1": np.linspace(1, 0.5, 4), "lr_k4": np.linspace(1, 0.1, 4)})
    ax = r.plot()
    assert len([line for line in ax.lines if len(line.get_xdata()) == 4]) == 2  # both runs drawn
    plt.close(ax.figure)


def test_single_bar_charts_are_not_drawn():
    pairs = pd.DataFrame({"split": ["test"], "earlier_split": ["train"], "leaked_fraction": [0.03]})
    with pytest.raises(TroptError, match="one pair of splits"):
        CheckResult("data.exact_duplicates", "fail", "s", tables={"pairs": pairs}).plot()
    table = pd.DataFrame({"precision": ["fp32", "bf16"], "status": ["measured", "skipped"], "step_ms": [1.0, np.nan],
                          "stable": [True, False]})
    with pytest.raises(TroptError, match="fewer than two precisions"):
        CheckResult("perf.precision", "pass", "s", tables={"precisions": table}).plot()


def test_near_duplicate_axis_speaks_of_similarity():
    edges = np.arange(-6.0, 1.0)
    r = CheckResult("data.near_duplicates", "pass", "s", {"threshold": 0.95},
                    series={"log10_distance_edges": edges, "log10_distance_counts": np.ones(edges.size - 1)})
    ax = r.plot()
    plt.gcf().canvas.draw()
    assert "similarity" in ax.get_xlabel() and "log10" not in ax.get_xlabel()
    labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
    assert "0.99" in labels and "0.9" in labels  # -2 -> 1 - 1e-2, -1 -> 1 - 1e-1
    plt.close(ax.figure)


def test_durations_and_large_numbers_are_plain():
    assert ms_text(1660.4) == "1,660 ms" and ms_text(12.34) == "12.3 ms" and ms_text(0.812) == "0.812 ms"
    assert _fmt(106088.3) == "106,088" and _fmt(1.5e-7) == "1.500e-07" and _fmt(0.25) == "0.25"
