"""Stage 7's false-adopt rate: how often a comparison of candidates that are all equal to the baseline adopts one.

Issue #30: with 8 candidates all equal to the baseline, 2 of 15 comparisons adopted one. The acceptance is a
family-wise false-adopt rate of at most 5% with 1 and with 8 candidates, over at least 40 null comparisons each.

Each null comparison is synthetic paired scores judged by ``Comparison.decision()`` (the decision layer itself, no
training): 3 seeds (compare's default), score = 1.0 + a seed effect shared by every candidate on that seed
(sd 0.01) + each run's own noise (sd 0.02), the baseline and every candidate drawn alike. Printed per candidate count:

* the rule before issue 30 (paired t-test p < 0.05 and gain > the baseline's sd between seeds, no correction);
* today's rule judged one candidate at a time (no Holm correction);
* today's rule as ``compare`` applies it: Holm across the candidates, default ``min_effect`` (0.5% of the baseline);
* the same with ``min_effect=0`` (the statistical error alone);
* compare's full default: Holm, then the winner of two or more candidates re-run with the baseline on 3 fresh seeds
  (drawn from the same null model) and adopted only if they confirm it.

    .venv/bin/python benchmarks/bench_false_adopt.py [--repetitions 200]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # the synthetic comparisons the tests use

from support.confirm_comparisons import confirmed_false_adopt_rate  # noqa: E402
from support.synthetic_comparisons import false_adopt_rate, old_rule_rate  # noqa: E402

import tropt  # noqa: E402

CONFIRMED = "Holm + winner confirmed on 3 fresh seeds (compare's default)"


def interval(k: int, n: int) -> str:
    """A 95% Wilson interval of k successes in n, as percentages."""
    if n == 0:
        return "n/a"
    z, p = 1.96, k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return f"{100 * max(0.0, centre - half):.1f}..{100 * min(1.0, centre + half):.1f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repetitions", type=int, default=200, help="null comparisons per candidate count (>= 40)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n = args.repetitions
    rows = []
    t0 = time.perf_counter()
    for k in (1, 8):
        rates = {
            "before issue 30": old_rule_rate(k, n, seed=args.seed),
            "uncorrected": false_adopt_rate(k, n, seed=args.seed, corrected=False),
            "Holm, default min_effect": false_adopt_rate(k, n, seed=args.seed),
            "Holm, min_effect=0": false_adopt_rate(k, n, seed=args.seed,
                                                   guardrails=tropt.Guardrails(min_effect=0.0)),
            CONFIRMED: confirmed_false_adopt_rate(k, n, seed=args.seed),
        }
        rows.append((k, rates))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average (1 min) {load:.2f}")
    print(f"false-adopt rate over {n} null comparisons per row (3 seeds; family-wise: any candidate adopted), "
          f"{time.perf_counter() - t0:.1f} s")
    print("| candidates | rule | false-adopt rate | 95% interval |")
    print("|---|---|---|---|")
    for k, rates in rows:
        for rule, rate in rates.items():
            print(f"| {k} | {rule} | {100 * rate:.1f}% ({round(rate * n)}/{n}) | {interval(round(rate * n), n)} |")
    worst = max(max(rates["Holm, default min_effect"], rates[CONFIRMED]) for _, rates in rows)
    print(f"\nacceptance (<= 5% family-wise with 1 and 8 candidates, as compare decides): "
          f"{'met' if worst <= 0.05 else 'NOT met'} (worst {100 * worst:.1f}%)")


if __name__ == "__main__":
    main()
