"""Pictures of a :class:`tropt.Comparison`: validation curves with seed bands, and the quality/cost trade-off."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import TroptError
from ..experiments.costs import pareto_front
from . import new_axes

__all__ = ["pareto_front", "plot_cost_quality", "plot_curves", "plot_tradeoff"]

_VERDICT = {"adopt": "#1a7f37", "reject: quality": "#cf222e", "reject: instability": "#cf222e",
            "escalate: budget": "#9a6700", "inconclusive": "#6e7781", "baseline": "#0969da"}


def _seed_curves(comparison: Any, name: str, key: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, values[seed, eval]) of one candidate's ``key`` curve, cut to the shortest run (early stopping)."""
    xs, ys = [], []
    for r in comparison.records:
        if r["candidate"] != name or (r.get("phase") or "select") != "select":  # the selection seeds' runs
            continue
        c = r["curves"]
        x_key = "step" if key in ("train_loss", "lr") else "eval_step"
        x, y = np.asarray(c.get(x_key, []), float), np.asarray(c.get(key, []), float)
        if y.size and x.size == y.size:
            xs.append(x)
            ys.append(y)
    if not ys:
        return None
    n = min(y.size for y in ys)
    return xs[0][:n], np.vstack([y[:n] for y in ys])


def plot_curves(comparison: Any, metric: str | None = None, ax: Any = None) -> Any:
    """Per candidate: the mean over seeds of ``metric`` (default the selection metric; ``"train_loss"`` or ``"lr"``
    work too) and a band from the lowest to the highest seed."""
    key = metric or comparison.metric
    ax = new_axes(ax)
    drawn = 0
    for i, name in enumerate(comparison.candidates):
        got = _seed_curves(comparison, name, key)
        if got is None:
            continue
        x, y = got
        with np.errstate(all="ignore"):
            mean = np.nanmean(y, axis=0)
            lo, hi = np.nanmin(y, axis=0), np.nanmax(y, axis=0)
        colour = f"C{i}"
        ax.plot(x, mean, color=colour, lw=1.8, label=f"{name} ({y.shape[0]} seeds)")
        if y.shape[0] > 1:
            ax.fill_between(x, lo, hi, color=colour, alpha=0.2, lw=0)
        drawn += 1
    if not drawn:
        raise TroptError(f"no run has a {key!r} curve to plot",
                         f"use one of the curve names: {_curve_names(comparison)}")
    finite = [v for line in ax.lines for v in np.asarray(line.get_ydata(), float) if math.isfinite(v)]
    if finite and min(finite) > 0 and max(finite) / min(finite) > 50:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    better = "higher" if comparison.higher_is_better and key == comparison.metric else "lower"
    ax.set_title(f"tropt.compare — {key} (mean over seeds, band min..max; {better} is better)"
                 if key == comparison.metric else f"tropt.compare — {key}", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    return ax


def _curve_names(comparison: Any) -> list[str]:
    return sorted({k for r in comparison.records for k in r.get("curves", {}) if k not in ("step", "eval_step")})


def plot_tradeoff(comparison: Any, ax: Any = None) -> Any:
    """Quality (mean ± std of the selection metric over seeds) against the cost per run (the mean over its runs; the
    seconds per run without a price), coloured by verdict, with the Pareto front marked."""
    frame = comparison.to_frame()
    m = comparison.metric
    use_cost = frame["cost"].notna().any()
    x_col = "cost" if use_cost else "seconds"
    x = frame[x_col].to_numpy(float)  # per run: to_frame averages every cost column over the runs
    y = frame[f"{m}_mean"].to_numpy(float)
    err = np.nan_to_num(frame[f"{m}_std"].to_numpy(float))
    ok = np.isfinite(x) & np.isfinite(y)
    ax = new_axes(ax)
    colours = [_VERDICT.get(v, "#6e7781") for v in frame["verdict"]]
    ax.errorbar(x[ok], y[ok], yerr=err[ok], fmt="none", ecolor="#8c959f", lw=1)
    ax.scatter(x[ok], y[ok], c=[c for c, k in zip(colours, ok) if k], s=50, zorder=3)
    for name, xi, yi, v, k in zip(frame.index, x, y, frame["verdict"], ok):
        if k:
            ax.annotate(name if v == "baseline" else f"{name}\n{v}", (xi, yi), fontsize=7, xytext=(4, 4),
                        textcoords="offset points")
    idx = np.flatnonzero(ok)
    if idx.size:
        front = idx[pareto_front(x[ok], y[ok], comparison.higher_is_better)]
        ax.plot(x[front], y[front], "--", color="#0969da", lw=1, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set_xlabel("cost per run" if use_cost else "seconds per run")
    ax.set_ylabel(f"{m} ({'higher' if comparison.higher_is_better else 'lower'} is better)")
    ax.set_title("tropt.compare — quality vs cost", fontsize=10, loc="left")
    return ax


def plot_cost_quality(rows: list[dict[str, Any]], metric: str, higher_is_better: bool, ax: Any = None) -> Any:
    """The plan's Pareto view: each candidate's mean score against its seconds per run, from the plan's cost table
    (:func:`tropt.experiments.costs.cost_rows`), coloured by verdict; the Pareto front dashed."""
    pts = [r for r in rows if all(isinstance(r.get(k), (int, float)) and math.isfinite(r[k])
                                  for k in ("seconds", "mean"))]
    if not pts:
        raise TroptError("no candidate has both a score and a time to plot", "run the comparison first")
    ax = new_axes(ax)
    x = np.array([r["seconds"] for r in pts], float)
    y = np.array([r["mean"] for r in pts], float)
    ax.scatter(x, y, c=[_VERDICT.get(r["verdict"], "#6e7781") for r in pts], s=50, zorder=3)
    for r in pts:
        ax.annotate(r["name"], (r["seconds"], r["mean"]), fontsize=7, xytext=(4, 4), textcoords="offset points")
    front = [r for r in pts if r.get("pareto")]
    front.sort(key=lambda r: r["seconds"])
    ax.plot([r["seconds"] for r in front], [r["mean"] for r in front], "--", color="#0969da", lw=1,
            label="Pareto front")
    ax.legend(fontsize=8)
    ax.set_xlabel("seconds per run (mean over seeds)")
    ax.set_ylabel(f"{metric} ({'higher' if higher_is_better else 'lower'} is better)")
    ax.set_title("cost and quality per candidate", fontsize=10, loc="left")
    return ax
