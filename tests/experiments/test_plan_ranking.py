"""Which adopted candidate a plan picks, and what it advises next, on synthetic comparisons whose answer is known
(issue 30): ranked by the selection metric, never by timing; a combination advised only across different knobs."""

from __future__ import annotations

import numpy as np
from support.synthetic_comparisons import comparison

import tropt
from tropt.experiments.plan import OptimizationPlan

BASE = {0: 1.00, 1: 1.10, 2: 0.95, 3: 1.05, 4: 0.98}


def _report() -> tropt.Report:
    return tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "the loss decreases steadily")], {})


def _better(by: float, seed: int) -> dict[int, float]:
    rng = np.random.default_rng(seed)
    return {s: v - by + float(rng.normal(0, 0.002)) for s, v in BASE.items()}


def _plan(comp) -> OptimizationPlan:
    return OptimizationPlan.from_report(_report(), comp)


def test_equal_scores_are_not_split_by_timing():
    # Two learning rates with identical scores on every seed; one's runs are 20% faster. Timing noise at the same
    # compute must not decide: the pick is the same whichever of the two is faster.
    same = _better(0.1, seed=0)
    picks = []
    for fast in ("lr_a", "lr_b"):
        secs = {"baseline": 1.0, "lr_a": 1.0, "lr_b": 1.0, fast: 0.8}
        comp = comparison({"baseline": BASE, "lr_a": same, "lr_b": dict(same)}, seconds=secs,
                          overrides={"lr_a": {"lr": "0.1"}, "lr_b": {"lr": "0.2"}})
        d = comp.decision().set_index("candidate")
        assert (d["verdict"] == "adopt").all(), d["reason"].tolist()
        picks.append(_plan(comp).adopted[0]["name"])
    assert picks[0] == picks[1], picks


def test_the_winner_is_ranked_by_the_selection_metric_and_its_cost_is_reported():
    # big: twice the gain, but 2.5x as slow per run (a lower gain per second); small: half the gain, fast. Quality
    # decides; cost is shown beside it.
    comp = comparison({"baseline": BASE, "small": _better(0.1, 1), "big": _better(0.2, 2)},
                      seconds={"baseline": 1.0, "small": 1.0, "big": 2.5},
                      overrides={"small": {"grad_clip": "1.0"}, "big": {"optimizer": "Adam"}})
    plan = _plan(comp)
    assert [a["name"] for a in plan.adopted] == ["big"]
    first, second = plan.interventions[0], plan.interventions[1]
    assert first["name"] == "big" and second["name"] == "small"
    assert first["seconds"] == 2.5 and second["seconds"] == 1.0  # cost, as its own number beside the gain


def test_a_combination_is_advised_only_across_different_knobs():
    comp = comparison({"baseline": BASE, "lr_a": _better(0.2, 1), "lr_b": _better(0.1, 2)},
                      overrides={"lr_a": {"lr": "0.1"}, "lr_b": {"lr": "0.3"}})
    notes = " ".join(_plan(comp).notes)
    assert "compare the combination" not in notes
    assert "lr_b" in notes and "same knob" in notes and "alternatives" in notes  # it says why only one is adopted
    comp = comparison({"baseline": BASE, "lr_a": _better(0.2, 1), "clip": _better(0.1, 2)},
                      overrides={"lr_a": {"lr": "0.1"}, "clip": {"grad_clip": "1.0"}})
    notes = " ".join(_plan(comp).notes)
    assert "clip" in notes and "compare the combination" in notes
    # An optimizer and a learning rate both set the learning rate: not combinable either.
    comp = comparison({"baseline": BASE, "adam": _better(0.2, 1), "lr_b": _better(0.1, 2)},
                      overrides={"adam": {"optimizer": "Adam"}, "lr_b": {"lr": "0.3"}})
    assert "compare the combination" not in " ".join(_plan(comp).notes)
