"""Cost and quality side by side: one row per candidate for the plan, and the Pareto front over the two.

Values only (the picture is :func:`tropt.plots.experiments.plot_cost_quality`). Cost is its own objective: it is
shown beside the gain and marks the Pareto front, and never ranks the candidates.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .budget import Guardrails
from .candidates import BASELINE

COLUMNS = ("name", "changes", "verdict", "gain", "ci_low", "ci_high", "steps", "samples", "seconds_per_step",
           "seconds", "relative_cost", "cost", "pareto")


def pareto_front(cost: np.ndarray, quality: np.ndarray, higher_is_better: bool) -> np.ndarray:
    """Indices of the points no other point beats on both cost (lower) and quality, cheapest first."""
    q = quality if higher_is_better else -quality
    order = np.lexsort((-q, cost))
    front, best = [], -np.inf
    for i in order:
        if q[i] > best:
            front.append(i)
            best = q[i]
    return np.asarray(front, dtype=int)


def _num(x: Any) -> float:
    return float(x) if isinstance(x, (int, float, np.floating)) and math.isfinite(float(x)) else math.nan


def cost_rows(comp: Any, g: Guardrails | None = None) -> list[dict[str, Any]]:
    """Per candidate (the baseline first): what it changes, its verdict, its paired gain with the interval, and its
    cost per run (steps, samples, seconds per step, seconds, relative cost, priced cost); ``pareto`` marks the
    candidates no other beats on both the mean score and the seconds per run."""
    frame = comp.to_frame(g)
    m = comp.metric
    x = frame["seconds"].to_numpy(float)
    y = frame[f"{m}_mean"].to_numpy(float)
    ok = np.flatnonzero(np.isfinite(x) & np.isfinite(y))
    front = set(ok[pareto_front(x[ok], y[ok], comp.higher_is_better)].tolist()) if ok.size else set()
    rows = []
    for i, (name, r) in enumerate(frame.iterrows()):
        rows.append({
            "name": name, "changes": r["overrides"], "verdict": r["verdict"],
            "gain": 0.0 if name == BASELINE else _num(r["gain"]), "ci_low": _num(r["ci_low"]),
            "ci_high": _num(r["ci_high"]), "mean": _num(r[f"{m}_mean"]), "steps": _num(r["steps"]),
            "samples": _num(r["samples"]), "seconds_per_step": _num(r["seconds_per_step"]),
            "seconds": _num(r["seconds"]), "relative_cost": _num(r["relative_cost"]), "cost": _num(r["cost"]),
            "pareto": i in front,
        })
    return rows
