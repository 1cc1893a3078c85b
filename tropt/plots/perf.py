"""Pictures of the stage-6 checks: per-step data wait vs compute, and precisions compared."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import new_axes, plain, register_plot, titled


@register_plot("perf.throughput")
def plot_throughput(result: Any, ax: Any = None) -> Any:
    """Stacked bars per timed step: waiting for data, then the step itself."""
    ax = new_axes(ax)
    wait = np.asarray(result.series.get("data_wait_ms", []), dtype=float)
    comp = np.asarray(result.series.get("compute_ms", []), dtype=float)
    x = np.arange(wait.size)
    ax.bar(x, wait, color="#cf222e", label="waiting for data")
    ax.bar(x, comp, bottom=wait, color="#0969da", label="forward / backward / optimizer")
    ax.set_xlabel("timed step")
    ax.set_ylabel("ms")
    ax.legend(fontsize=8)
    share = result.metrics.get("data_wait_share")
    return titled(ax, result, f"data wait {share:.0%} of the step" if share is not None else None)


@register_plot("perf.precision")
def plot_precision(result: Any, ax: Any = None) -> Any:
    """Median step time per precision (unstable ones hatched, skipped ones marked n/a)."""
    ax = new_axes(ax)
    table = result.tables.get("precisions")
    names, times, hatches, labels = [], [], [], []
    if table is not None:
        for _, row in table.iterrows():
            names.append(plain(row["precision"]))
            measured = row["status"] == "measured"
            t = float(row["step_ms"]) if measured else 0.0
            times.append(t)
            stable = bool(row["stable"]) if measured else False
            hatches.append("" if stable or not measured else "//")
            labels.append(f"{t:.3g} ms" + ("" if stable else " unstable") if measured else "n/a")
    colours = ["#1a7f37" if n == result.metrics.get("recommended") else "#0969da" for n in names]
    bars = ax.bar(names, times, color=colours)
    for b, h, text in zip(bars, hatches, labels):
        b.set_hatch(h)
        ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("median step time (ms)")
    return titled(ax, result, f"recommended: {result.metrics.get('recommended')}")
