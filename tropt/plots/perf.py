"""Pictures of the stage-6 checks: per-step data wait vs compute, and precisions compared."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import new_axes, plain, register_plot, titled


def ms_text(ms: float) -> str:
    """A duration in milliseconds as a plain number with its unit: "1,660 ms", "12.3 ms", "0.81 ms" (never 1.66e+03)."""
    if not np.isfinite(ms):
        return "n/a"
    if ms >= 1000:
        return f"{ms:,.0f} ms"
    return f"{ms:.3g} ms" if ms >= 0.01 else f"{ms:.4f} ms"


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
    ax.set_ylabel("ms per step")
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.legend(fontsize=8)
    share = result.metrics.get("data_wait_share")
    return titled(ax, result, f"data wait {share:.0%} of the step" if share is not None else None)


@register_plot("perf.precision")
def plot_precision(result: Any, ax: Any = None) -> Any:
    """Median step time per precision (unstable ones hatched, skipped ones marked n/a)."""
    table = result.tables.get("precisions")
    if table is None or int((table["status"] == "measured").sum()) < 2:  # a single bar compares nothing
        from ..errors import TroptError

        raise TroptError("perf.precision measured fewer than two precisions: nothing to compare", "read result.summary")
    ax = new_axes(ax)
    names, times, hatches, labels = [], [], [], []
    if table is not None:
        for _, row in table.iterrows():
            names.append(plain(row["precision"]))
            measured = row["status"] == "measured"
            t = float(row["step_ms"]) if measured else 0.0
            times.append(t)
            stable = bool(row["stable"]) if measured else False
            hatches.append("" if stable or not measured else "//")
            labels.append(ms_text(t) + ("" if stable else " unstable") if measured else "n/a")
    colours = ["#1a7f37" if n == result.metrics.get("recommended") else "#0969da" for n in names]
    bars = ax.bar(names, times, color=colours)
    for b, h, text in zip(bars, hatches, labels):
        b.set_hatch(h)
        ax.annotate(text, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("median step time (ms)")
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    return titled(ax, result, f"recommended: {result.metrics.get('recommended')}")


_PARTS = {"parameters": "#0969da", "gradients": "#54aeff", "optimizer state": "#8250df", "activations": "#1a7f37",
          "remainder": "#afb8c1"}


def _two_panels(ax: Any, ratios: tuple[float, float] = (1.0, 2.4)) -> tuple[Any, Any, Any]:
    """Two side-by-side Axes: in a new figure, or carved out of ``ax``'s place. Returns (left, right, title_axes)."""
    if ax is None:
        import matplotlib.pyplot as plt

        _, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), layout="constrained", width_ratios=list(ratios))
        return left, right, left
    fig = ax.get_figure()
    ax.axis("off")
    gs = ax.get_subplotspec().subgridspec(1, 2, width_ratios=list(ratios), wspace=0.35)
    return fig.add_subplot(gs[0]), fig.add_subplot(gs[1]), ax


@register_plot("perf.memory")
def plot_memory(result: Any, ax: Any = None) -> Any:
    """Left: the step's peak as one stacked bar of its parts. Right: the estimated peak against the batch size, the
    measured points, the limit and the largest batch that fits."""
    left, right, head = _two_panels(ax)
    limit = result.metrics.get("memory_limit_mib")
    limit = float(limit) if limit is not None and np.isfinite(float(limit)) else None
    table = result.tables.get("breakdown")
    bottom = 0.0
    if table is not None:
        for _, row in table.iterrows():
            # a negative remainder (parts alive at different instants) is not drawn
            height = max(0.0, float(row["mib"]))
            left.bar(["peak"], [height], bottom=bottom, color=_PARTS.get(str(row["part"]), "#6e7781"),
                     label=f"{row['part']} {float(row['mib']):,.1f}")
            bottom += height
    if limit is not None:
        left.axhline(limit, color="#cf222e", ls="--", lw=1)
    left.set_ylabel("MiB")
    left.set_xticks([])
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), frameon=False)
    curve = result.tables.get("batch_curve")
    if curve is not None and len(curve):
        x = curve["batch_size"].to_numpy(dtype=float)
        right.plot(x, curve["peak_mib"].to_numpy(dtype=float), color="#0969da", marker=".", label="estimated peak")
        measured = curve["measured_mib"].to_numpy(dtype=float)
        ok = np.isfinite(measured)
        right.scatter(x[ok], measured[ok], color="k", zorder=3, s=18, label="measured")
        right.set_xscale("log", base=2)
    if limit is not None:
        right.axhline(limit, color="#cf222e", ls="--", lw=1, label=f"limit {limit:,.0f} MiB")
    best = result.metrics.get("max_batch")
    if best is not None and np.isfinite(float(best)) and float(best) > 0:
        right.axvline(float(best), color="#9a6700", ls=":", lw=1, label=f"largest batch that fits: {int(best)}")
    right.set_xlabel("batch size")
    right.set_ylabel("peak MiB")
    right.legend(fontsize=7)
    peak = result.metrics.get("peak_mib")
    titled(left, result,
           f"peak {float(peak):,.1f} MiB ({result.metrics.get('peak_phase')})" if peak is not None else None)
    return head
