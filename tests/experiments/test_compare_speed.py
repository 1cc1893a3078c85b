"""Issue #30: a candidate adopted for speed (the user's own too) only when its quality is non-inferior and it is
faster beyond timing noise, paired by seed; timing noise never decides between candidates of equal compute."""

from __future__ import annotations

from support.synthetic_comparisons import comparison

import tropt
from tropt.experiments.plan import OptimizationPlan
from tropt.experiments.stats import ADOPT, INCONCLUSIVE

BASE = {0: 1.00, 1: 1.03, 2: 0.98}
SAME = {0: 1.001, 1: 1.029, 2: 0.981}  # the baseline's quality, to well within min_effect
SMALL = {"baseline": {}, "tiny": {"model": "TinyNet (10 parameters)"}}


def _report():
    return tropt.Report([tropt.CheckResult("dynamics.loss_curve", "pass", "healthy")],
                        {"tropt": tropt.__version__, "config_hash": "c0ffee", "data_fingerprint": "fp-diagnosis"})


def test_a_users_faster_candidate_at_equal_quality_is_adopted_for_speed():
    comp = comparison({"baseline": BASE, "tiny": SAME}, seconds={"tiny": {0: 0.50, 1: 0.52, 2: 0.49}},
                      overrides=SMALL)
    d = comp.decision().iloc[0]
    assert d["verdict"] == ADOPT and d["adopted_for"] == "speed" and d["speedup"] > 1.9
    plan = OptimizationPlan.from_report(_report(), comp)
    assert plan.outcome == "adopt" and plan.adopted[0]["name"] == "tiny"
    assert plan.adopted[0]["observed"].startswith("adopt (speed)")


def test_faster_within_timing_noise_is_not_adopted():
    comp = comparison({"baseline": BASE, "tiny": SAME}, seconds={"tiny": {0: 0.55, 1: 1.30, 2: 0.80}},
                      overrides=SMALL)
    assert comp.decision().iloc[0]["verdict"] == INCONCLUSIVE


def test_faster_but_not_shown_non_inferior_is_not_adopted_for_speed():
    # Worse by 0.05, 0.00 and 0.02: the interval of the change reaches beyond the allowed drop of 0.03, so quality is
    # not shown non-inferior (nor rejected): twice as fast is not enough.
    worse = {0: 1.05, 1: 1.03, 2: 1.00}
    comp = comparison({"baseline": BASE, "tiny": worse}, seconds={"tiny": 0.5}, overrides=SMALL,
                      guardrails=tropt.Guardrails(max_quality_drop=0.03))
    assert comp.decision().iloc[0]["verdict"] == INCONCLUSIVE
    within = comparison({"baseline": BASE, "tiny": {s: v + 0.01 for s, v in BASE.items()}}, seconds={"tiny": 0.5},
                        overrides=SMALL, guardrails=tropt.Guardrails(max_quality_drop=0.03))
    assert within.decision().iloc[0]["adopted_for"] == "speed"  # a drop the guardrail allows is non-inferior


def test_timing_never_decides_between_candidates_of_equal_compute():
    # Four learning rates, identical scores; one's times 20% lower on every seed: same compute, so timing noise.
    names = ["lr_a", "lr_b", "lr_c", "lr_d"]
    comp = comparison({"baseline": BASE, **{n: SAME for n in names}}, seconds={"lr_c": 0.8},
                      overrides={"baseline": {}, **{n: {"lr": n} for n in names}})
    d = comp.decision().set_index("candidate")
    assert (d["verdict"] == INCONCLUSIVE).all() and "never adopted for speed" in d.loc["lr_c", "reason"]
    plan = OptimizationPlan.from_report(_report(), comp)
    assert [iv["name"] for iv in plan.interventions] == names and not plan.adopted


def test_a_placebo_that_looks_faster_is_never_adopted_for_speed():
    # The placebo: identical to the baseline, its times moved by machine load alone.
    comp = comparison({"baseline": BASE, "placebo": SAME}, seconds={"placebo": 0.45},
                      overrides={"baseline": {}, "placebo": {}})
    d = comp.decision().iloc[0]
    assert d["verdict"] == INCONCLUSIVE and "it changes nothing" in d["reason"]
