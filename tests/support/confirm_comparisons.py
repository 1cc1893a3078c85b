"""Null comparisons judged as ``compare`` judges them by default: Holm across the candidates, then the winner of two
or more re-run with the baseline on fresh seeds (:mod:`tropt.experiments.confirmation`), all drawn from one null
model (:func:`support.synthetic_comparisons.null_scores`)."""

from __future__ import annotations

import numpy as np

from support.synthetic_comparisons import adopted, comparison, null_scores, records
from tropt.experiments.confirmation import winner


def confirmed_comparison(scores: dict[str, dict[int, float]], n_seeds: int):
    """The comparison of seeds ``0..n_seeds-1``, its winner (if any) confirmed on the seeds after them."""
    select = {n: {s: v for s, v in sc.items() if s < n_seeds} for n, sc in scores.items()}
    comp = comparison(select)
    best = winner(comp.decision().to_dict("records"))
    if best is not None:
        for name in ("baseline", best):
            for r in records(name, {s: v for s, v in scores[name].items() if s >= n_seeds}):
                r["phase"] = "confirm"
                comp.records.append(r)
        comp.meta["confirmation"] = {"candidate": best, "seeds": list(range(n_seeds, 2 * n_seeds))}
    return comp


def confirmed_false_adopt_rate(n_candidates: int, repetitions: int, *, seed: int = 0, n_seeds: int = 3) -> float:
    """The share of null comparisons that adopt a candidate after Holm and the fresh-seed confirmation."""
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(repetitions):
        hits += bool(adopted(confirmed_comparison(null_scores(rng, n_candidates, 2 * n_seeds), n_seeds)))
    return hits / repetitions
