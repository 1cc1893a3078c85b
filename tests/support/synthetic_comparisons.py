"""Comparisons built from synthetic paired scores, for testing the decision layer without training anything.

``comparison({"baseline": {seed: score}, "a": {...}})`` gives a :class:`tropt.experiments.comparison.Comparison`
whose records look like compare's; :func:`null_scores` draws candidates that are the baseline in distribution
(score = mean + a seed effect shared by every candidate on that seed + each run's own noise), and
:func:`false_adopt_rate` counts how often a comparison of such null candidates adopts one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from tropt.experiments.budget import Guardrails
from tropt.experiments.comparison import Comparison
from tropt.experiments.stats import ADOPT, decide


def records(name: str, scores: Mapping[int, float], seconds: float | Mapping[int, float] = 1.0) -> list[dict]:
    """One finished run per seed, as compare records it (no curves, no instability)."""
    out = []
    for s, v in scores.items():
        secs = seconds[s] if isinstance(seconds, Mapping) else seconds
        out.append({"candidate": name, "seed": s, "status": "ok", "reason": "", "stopped_by": "steps", "score": v,
                    "final": v, "best": v, "seconds": secs, "train_seconds": secs, "steps": 10, "samples": 320,
                    "samples_per_s": 320 / secs, "peak_memory_mb": math.nan, "cost": None, "unstable": False,
                    "non_finite": 0, "spikes": 0, "curve_class": "converging", "steps_saved": 0, "curves": {}})
    return out


def comparison(scores: Mapping[str, Mapping[int, float]], *, higher_is_better: bool = False,
               seconds: Mapping[str, float | Mapping[int, float]] | None = None,
               overrides: Mapping[str, Mapping[str, str]] | None = None,
               guardrails: Guardrails | None = None, metric: str = "val_loss") -> Comparison:
    """A Comparison of the given per-seed scores (``"baseline"`` among them)."""
    seconds = seconds or {}
    recs = [r for name, sc in scores.items() for r in records(name, sc, seconds.get(name, 1.0))]
    meta = {"metric": metric, "higher_is_better": higher_is_better, "seeds": sorted(scores["baseline"]),
            "candidates": {name: dict((overrides or {}).get(name, {"lr": name})) for name in scores},
            "guardrails": (guardrails or Guardrails()).to_dict(), "budget": {"steps": 10}}
    return Comparison(recs, meta)


def null_scores(rng: np.random.Generator, n_candidates: int, n_seeds: int = 3, *, mean: float = 1.0,
                seed_sd: float = 0.01, run_sd: float = 0.02) -> dict[str, dict[int, float]]:
    """The baseline and ``n_candidates`` candidates drawn from the same distribution (no candidate is better)."""
    seed_effect = rng.normal(0.0, seed_sd, n_seeds)
    names = ["baseline"] + [f"null_{i}" for i in range(n_candidates)]
    return {n: {s: float(mean + seed_effect[s] + rng.normal(0.0, run_sd)) for s in range(n_seeds)} for n in names}


def adopted(comp: Comparison) -> list[str]:
    d = comp.decision()
    return list(d.loc[d["verdict"] == ADOPT, "candidate"])


def false_adopt_rate(n_candidates: int, repetitions: int, *, seed: int = 0, n_seeds: int = 3,
                     corrected: bool = True, guardrails: Guardrails | None = None) -> float:
    """The share of null comparisons that adopt at least one candidate (the family-wise false-adopt rate).

    ``corrected=False`` judges every candidate in a comparison of its own (no correction for the others).
    """
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(repetitions):
        sc = null_scores(rng, n_candidates, n_seeds)
        if corrected:
            hits += bool(adopted(comparison(sc, guardrails=guardrails)))
        else:
            hits += bool(adopted_alone(comparison(sc, guardrails=guardrails)))
    return hits / repetitions


def adopted_alone(comp: Comparison) -> list[str]:
    """The candidates each adopted when judged alone (its own p-value, no correction for the others)."""
    base, g = comp._runs_of("baseline"), comp.guardrails
    return [n for n in comp.candidates if n != "baseline"
            if decide(n, comp._runs_of(n), base, comp.paired(n), metric=comp.metric, guardrails=g,
                      higher_is_better=comp.higher_is_better)["verdict"] == ADOPT]


def old_rule_rate(n_candidates: int, repetitions: int, *, seed: int = 0, n_seeds: int = 3) -> float:
    """The same null comparisons judged by the rule before issue 30: adopt when the paired t-test's p < 0.05 and the
    gain exceeds the baseline's standard deviation between seeds, with no correction for the other candidates."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(repetitions):
        comp = comparison(null_scores(rng, n_candidates, n_seeds))
        tests = [comp.paired(n) for n in comp.candidates if n != "baseline"]
        hits += any(t.p_value < 0.05 and t.gain > t.noise for t in tests)
    return hits / repetitions
