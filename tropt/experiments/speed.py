"""Adopting a candidate for speed: quality non-inferior within the guardrail, and faster beyond timing noise.

The rule (the same for tropt's suggestions and the user's own candidates):

* **Compute can differ.** A candidate that changes nothing, or only the learning rate or the schedule (``lr``,
  ``scheduler``), does the same compute per step as the baseline: any difference in its time is timing noise, so it
  is never adopted for speed (and time never ranks candidates, see :func:`tropt.experiments.interventions.priority`).
* **Non-inferior quality.** The paired 95% interval of the gain lies above minus the margin: the larger of the
  guardrail's allowed drop and ``min_effect`` (a change smaller than the smallest effect worth acting on is no
  change), over at least ``MIN_SEEDS`` seeds.
* **Faster beyond timing noise.** Seconds per step measured inside each run (training only, evaluations excluded)
  are paired by seed; the 95% t interval of the mean log time ratio (candidate / baseline) must lie below 0 (faster
  on the seeds' evidence), and the mean speed-up must reach ``SPEEDUP`` (1.1×).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np

from .stats import ALPHA, MIN_SEEDS, Paired

SPEEDUP = 1.1
SAME_COMPUTE = frozenset({"lr", "scheduler"})


@dataclass
class Speed:
    """Paired seconds per step of a candidate against the baseline."""

    n: int
    speedup: float  # baseline time / candidate time (geometric mean over seeds); > 1 is faster
    ratio_high: float  # upper bound of the 95% interval of the time ratio (candidate / baseline)
    p_value: float


def step_seconds(run: dict) -> float:
    """A run's training seconds per step (evaluations excluded), NaN when it took no step."""
    v = run.get("seconds_per_step")
    if _finite(v) and v > 0:
        return float(v)
    secs = run.get("train_seconds", run.get("seconds"))
    steps = run.get("steps")
    return float(secs) / steps if _finite(secs) and secs > 0 and isinstance(steps, int) and steps > 0 else math.nan


def paired_speed(cand_runs: list[dict], base_runs: list[dict]) -> Speed:
    """The paired time ratio over the seeds both completed."""
    base = {r["seed"]: step_seconds(r) for r in base_runs if r["status"] == "ok"}
    cand = {r["seed"]: step_seconds(r) for r in cand_runs if r["status"] == "ok"}
    seeds = [s for s in sorted(cand) if s in base and _finite(cand[s]) and _finite(base[s])]
    d = np.log(np.array([cand[s] / base[s] for s in seeds], dtype=float))
    n = int(d.size)
    if n < MIN_SEEDS:
        return Speed(n, math.exp(-float(d.mean())) if n else math.nan, math.nan, math.nan)
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return Speed(n, math.exp(-mean), math.exp(mean), 0.0 if mean != 0 else 1.0)
    from scipy import stats

    se = sd / math.sqrt(n)
    p = float(min(1.0, 2 * stats.t.sf(abs(mean) / se, n - 1)))
    return Speed(n, math.exp(-mean), math.exp(mean + float(stats.t.ppf(1 - ALPHA / 2, n - 1)) * se), p)


def speed_verdict(cand_runs: list[dict], base_runs: list[dict], quality: Paired, overrides: Any,
                  margin: float) -> tuple[bool, str, Speed | None]:
    """(adopted for speed, why not or why, the paired speed) for a candidate not adopted or rejected on quality."""
    keys = set(overrides or {})
    if keys <= SAME_COMPUTE:
        what = f"it changes only {', '.join(sorted(keys))}" if keys else "it changes nothing"
        return False, (f"{what}, the same compute per step as the baseline: its time differs by timing noise "
                       "alone, so it is never adopted for speed"), None
    if not (_finite(quality.ci_low) and quality.n >= MIN_SEEDS and quality.ci_low > -margin):
        return False, "", None
    sp = paired_speed(cand_runs, base_runs)
    if not (_finite(sp.ratio_high) and sp.ratio_high < 1.0 and sp.speedup >= SPEEDUP):
        return False, "", sp
    return True, (f"faster: {sp.speedup:.2f}× the baseline's speed per step (paired over {sp.n} seeds, the time "
                  f"ratio's 95% interval below {sp.ratio_high:.3g}, beyond timing noise), with quality non-inferior: "
                  f"the gain's 95% interval ({quality.ci_low:.4g}..{quality.ci_high:.4g}) lies above -{margin:.4g} "
                  "(the larger of the allowed drop and min_effect)"), sp


def _finite(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
